// SPDX-License-Identifier: Apache-2.0

package datapath_test

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/l4lb/l4lb/internal/pkttest"
	"github.com/l4lb/l4lb/lb"
	"github.com/l4lb/l4lb/lb/datapath"
)

// runHC runs the health-probe program on frame as if the LB sent it out of
// lb0 with the given socket mark.
func (e *env) runHC(t testing.TB, frame []byte, mark uint32) result {
	t.Helper()
	ctx := skbContext(e.ifindex)
	binary.LittleEndian.PutUint32(ctx[8:], mark) // __sk_buff.mark
	var res result
	err := e.ns.Do(func() error {
		opts := &ebpf.RunOptions{Data: frame, DataOut: make([]byte, len(frame)+256), Context: ctx, Repeat: 1}
		v, err := e.lb.ProgramHC().Run(opts)
		res = result{verdict: v, out: opts.DataOut}
		return err
	})
	if err != nil {
		t.Fatalf("run health-probe program: %v", err)
	}
	return res
}

// TestHealthProbeThroughVIP: a probe to the VIP marked for a backend goes to
// exactly that backend, dispatched as the service dispatches clients; an
// unmarked packet is untouched; a mark for another service's backend is
// dropped and counted.
func TestHealthProbeThroughVIP(t *testing.T) {
	const tcRedirect, tcxNext, tcxDrop = 7, 0xffffffff, 2
	for _, fam := range []struct {
		name     string
		vip, lb  netip.Addr
		backends []netip.Addr
	}{
		{"ipv4", vip4, netip.MustParseAddr("10.0.0.1"), backends4},
		{"ipv6", vip6, netip.MustParseAddr("fd00::1"), backends6},
	} {
		for _, dispatch := range []lb.Dispatch{lb.DispatchIPIP, lb.DispatchGeneve} {
			t.Run(fmt.Sprintf("%s/%s", fam.name, dispatch), func(t *testing.T) {
				e := newEnv(t)
				web := dsrService("web", fam.vip, 80, lb.TCP, fam.backends...)
				web.Dispatch = dispatch
				other := dsrService("other", fam.vip, 81, lb.TCP, fam.backends[0])
				e.reconcile(t, web, other)
				st := e.state(t, web.Frontend)
				probe := pkttest.Build(t, pkttest.Packet{
					SrcMAC: e.lbMAC, Src: netip.AddrPortFrom(fam.lb, 40000), Dst: netip.AddrPortFrom(fam.vip, 80), SYN: true,
				})
				for _, b := range st.Backends {
					r := e.runHC(t, probe, datapath.HealthMarkFor(b.ID))
					if r.verdict != tcRedirect {
						t.Fatalf("probe for %s: verdict %d, want redirect", b.Addr, r.verdict)
					}
					d := pkttest.Decode(r.out)
					var dst netip.Addr
					if d.Outer4 != nil {
						dst, _ = netip.AddrFromSlice(d.Outer4.DstIP.To4())
					} else if d.Outer6 != nil {
						dst, _ = netip.AddrFromSlice(d.Outer6.DstIP)
					}
					if dst != b.Addr.Addr() {
						t.Errorf("probe marked for %s went to %s", b.Addr, dst)
					}
					if got := d.Eth.DstMAC.String(); got != backendMAC(b.Addr.Addr()).String() {
						t.Errorf("probe for %s: Ethernet destination %s", b.Addr, got)
					}
				}
				if r := e.runHC(t, probe, 0); r.verdict != tcxNext || string(r.out) != string(probe) {
					t.Errorf("unmarked packet: verdict %d, changed %v", r.verdict, string(r.out) != string(probe))
				}
				before := e.reasons(t)
				otherID := e.state(t, other.Frontend).Backends[0].ID
				if r := e.runHC(t, probe, datapath.HealthMarkFor(otherID)); r.verdict != tcxDrop {
					t.Errorf("probe marked for another service's backend: verdict %d, want drop", r.verdict)
				}
				e.expectReasons(t, before, map[string]uint64{"drop_hc_no_backend": 1})
			})
		}
	}
}
