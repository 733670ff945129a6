// SPDX-License-Identifier: Apache-2.0

package datapath_test

import (
	"bytes"
	"net/netip"
	"testing"

	"github.com/gopacket/gopacket/layers"

	"github.com/l4lb/l4lb/internal/pkttest"
	"github.com/l4lb/l4lb/lb"
)

// TestPassthrough checks that traffic to no frontend reaches the stack
// untouched and is counted by reason.
func TestPassthrough(t *testing.T) {
	e := newEnv(t)
	var svcs []lb.Service
	for _, fam := range families {
		svcs = append(svcs, dsrService("web-"+fam.name, fam.vip, 80, lb.TCP, fam.backends[:3]...))
	}
	e.reconcile(t, svcs...)

	mapped := netip.AddrFrom16(vip4.As16()) // ::ffff:192.0.2.10, same bytes as vip4's service key
	type tc struct {
		name   string
		frame  []byte
		reason string
	}
	tests := []tc{
		{name: "ARP request", frame: pkttest.BuildARP(t, pkttest.ClientMAC, client4, vip4), reason: "pass_not_ip"},
		{
			name:   "IPv6 to the IPv4-mapped VIP",
			frame:  e.frame(t, pkttest.Packet{Src: netip.AddrPortFrom(client6, 40000), Dst: netip.AddrPortFrom(mapped, 80), SYN: true}),
			reason: "pass_not_service",
		},
	}
	for _, fam := range families {
		other := fam.vip.Next()
		to := func(dst netip.Addr, port uint16, proto layers.IPProtocol) []byte {
			return e.frame(t, pkttest.Packet{Src: netip.AddrPortFrom(fam.client, 40000), Dst: netip.AddrPortFrom(dst, port), Proto: proto, SYN: proto == layers.IPProtocolTCP})
		}
		tests = append(tests,
			tc{name: fam.name + "/other address", frame: to(other, 80, layers.IPProtocolTCP), reason: "pass_not_service"},
			tc{name: fam.name + "/other port", frame: to(fam.vip, 81, layers.IPProtocolTCP), reason: "pass_not_service"},
			tc{name: fam.name + "/UDP to a TCP frontend", frame: to(fam.vip, 80, layers.IPProtocolUDP), reason: "pass_not_service"},
			tc{name: fam.name + "/ICMP echo to the VIP", frame: to(fam.vip, 0, fam.icmp), reason: "pass_not_service"},
			tc{name: fam.name + "/to the LB itself", frame: to(fam.lbAddr, 22, layers.IPProtocolTCP), reason: "pass_not_service"},
		)
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			in := bytes.Clone(tt.frame)
			before := e.reasons(t)
			r := e.run(t, in)
			if r.verdict != xdpPass {
				t.Errorf("verdict %s, want XDP_PASS", verdictName(r.verdict))
			}
			if !bytes.Equal(r.out, tt.frame) {
				t.Errorf("frame changed:\n got %x\nwant %x", r.out, tt.frame)
			}
			e.expectReasons(t, before, map[string]uint64{tt.reason: 1})
			if n := e.conntrackEntries(t); n != 0 {
				t.Errorf("connection table holds %d entries, want 0", n)
			}
		})
	}
}
