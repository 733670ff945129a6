// SPDX-License-Identifier: Apache-2.0

package datapath_test

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/l4lb/l4lb/internal/testnet"
	"github.com/l4lb/l4lb/lb"
	"github.com/l4lb/l4lb/lb/datapath"
	"github.com/l4lb/l4lb/lb/reconciler"
)

// Addresses of the real-traffic topology: client -- LB box -- backend.
var (
	trafficClient4  = netip.MustParseAddr("10.9.1.2")
	trafficClient6  = netip.MustParseAddr("fd09:1::2")
	trafficBackend4 = netip.MustParseAddr("10.9.2.2")
	trafficBackend6 = netip.MustParseAddr("fd09:2::2")
)

// trafficTopo is a client, an LB box and a backend in three namespaces,
// linked by veth pairs, with the real LB program attached at one hook on
// the LB box and the companion on the backend. Checksum offload is off on
// every veth, so each kernel computes and verifies checksums in software:
// a rewrite that leaves a wrong checksum loses the packet.
type trafficTopo struct {
	cli, box, be *testnet.NS
	lb           *datapath.LB
	rec          *reconciler.Reconciler
	comp         *datapath.Companion
}

func newTrafficTopo(t *testing.T, k hook) *trafficTopo {
	t.Helper()
	testnet.RequireRoot(t)
	tp := &trafficTopo{cli: testnet.NewNS(t, "cli"), box: testnet.NewNS(t, "box"), be: testnet.NewNS(t, "be")}
	for _, ns := range []*testnet.NS{tp.cli, tp.box, tp.be} {
		// Replies come from a VIP the LB box has no route back to.
		ns.Sysctl(t, "net.ipv4.conf.all.rp_filter", "0")
		ns.Sysctl(t, "net.ipv4.conf.default.rp_filter", "0")
	}
	tp.box.Sysctl(t, "net.ipv4.conf.all.forwarding", "1")
	tp.box.Sysctl(t, "net.ipv6.conf.all.forwarding", "1")
	testnet.Veth(t, tp.cli, "cli0", tp.box, "lbc0")
	testnet.Veth(t, tp.box, "lbb0", tp.be, "be0")
	for _, l := range []struct {
		ns   *testnet.NS
		name string
	}{{tp.cli, "cli0"}, {tp.box, "lbc0"}, {tp.box, "lbb0"}, {tp.be, "be0"}} {
		l.ns.Run(t, "ethtool", "-K", l.name, "rx", "off", "tx", "off")
	}
	tp.cli.AddAddr(t, "cli0", "10.9.1.2/24")
	tp.cli.AddAddr(t, "cli0", "fd09:1::2/64")
	tp.box.AddAddr(t, "lbc0", "10.9.1.1/24")
	tp.box.AddAddr(t, "lbc0", "fd09:1::1/64")
	tp.box.AddAddr(t, "lbb0", "10.9.2.1/24")
	tp.box.AddAddr(t, "lbb0", "fd09:2::1/64")
	tp.be.AddAddr(t, "be0", "10.9.2.2/24")
	tp.be.AddAddr(t, "be0", "fd09:2::2/64")
	// Geneve (like IPIP) delivers the client's packet to the VIP itself.
	tp.be.AddAddr(t, "lo", vip4.String()+"/32")
	tp.be.AddAddr(t, "lo", vip6.String()+"/128")
	tp.cli.AddRoute(t, vip4.String()+"/32", "10.9.1.1", "cli0")
	tp.cli.AddRoute(t, vip6.String()+"/128", "fd09:1::1", "cli0")
	tp.be.AddRoute(t, "default", "10.9.2.1", "be0")
	tp.be.AddRoute(t, "default", "fd09:2::1", "be0")
	beMAC := tp.be.MAC(t, "be0")
	tp.box.AddNeigh(t, "lbb0", trafficBackend4.String(), beMAC)
	tp.box.AddNeigh(t, "lbb0", trafficBackend6.String(), beMAC)

	var err error
	tp.lb, err = datapath.Load(datapath.Config{
		Seed: testSeed, MaxServices: 16, MaxBackends: 64, ConntrackMax: 4096,
		Netns: tp.box.Handle(),
		Log:   slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
	})
	if err != nil {
		t.Fatalf("load datapath: %v", err)
	}
	t.Cleanup(func() { tp.lb.Close() })
	err = tp.box.Do(func() error {
		if k == hookTC {
			return tp.lb.AttachTC("lbc0")
		}
		for _, l := range []string{"lbc0", "lbb0"} {
			if err := tp.lb.AttachXDP(l, datapath.XDPGeneric); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatalf("attach LB at %s: %v", k, err)
	}
	tp.rec = reconciler.New(reconciler.Config{Seed: testSeed, MaxServices: 16, MaxBackends: 64}, tp.lb, nil)

	tp.comp, err = datapath.LoadCompanion(datapath.CompanionConfig{MaxFlows: 1024})
	if err != nil {
		t.Fatalf("load companion: %v", err)
	}
	t.Cleanup(func() { tp.comp.Close() })
	if err := tp.comp.SetVIPs([]netip.Addr{vip4, vip6}); err != nil {
		t.Fatal(err)
	}
	if err := tp.be.Do(func() error { return tp.comp.Attach("be0") }); err != nil {
		t.Fatalf("attach companion: %v", err)
	}
	tp.serve(t)
	return tp
}

// serve starts echo servers on the backend: TCP on any address, ports 80
// (geneve: the service port) and 8080 (opt); UDP on the VIPs port 53
// (geneve: a UDP reply's source is the address the socket is bound to) and
// on any address port 5353 (opt). Each answers "<peer> <local> <data>", so
// the client learns what the backend saw.
func (tp *trafficTopo) serve(t *testing.T) {
	t.Helper()
	err := tp.be.Do(func() error {
		for _, port := range []string{":80", ":8080"} {
			l, err := net.Listen("tcp", port)
			if err != nil {
				return err
			}
			t.Cleanup(func() { l.Close() })
			go func() {
				for {
					c, err := l.Accept()
					if err != nil {
						return
					}
					go func() {
						defer c.Close()
						buf := make([]byte, 512)
						n, _ := c.Read(buf)
						fmt.Fprintf(c, "%s %s %s", c.RemoteAddr(), c.LocalAddr(), buf[:n])
					}()
				}
			}()
		}
		for _, addr := range []string{netip.AddrPortFrom(vip4, 53).String(), netip.AddrPortFrom(vip6, 53).String(), ":5353"} {
			pc, err := net.ListenPacket("udp", addr)
			if err != nil {
				return err
			}
			t.Cleanup(func() { pc.Close() })
			go func() {
				buf := make([]byte, 512)
				for {
					n, from, err := pc.ReadFrom(buf)
					if err != nil {
						return
					}
					pc.WriteTo([]byte(fmt.Sprintf("%s %s %s", from, pc.LocalAddr(), buf[:n])), from)
				}
			}()
		}
		return nil
	})
	if err != nil {
		t.Fatalf("start backend servers: %v", err)
	}
}

// exchange sends msg from the client to fe and returns the reply. The
// client's socket is connected to fe, so a reply from any other address
// or port never reaches it.
func (tp *trafficTopo) exchange(t *testing.T, fe lb.Frontend, msg string) (string, error) {
	t.Helper()
	network := "tcp"
	if fe.Proto == lb.UDP {
		network = "udp"
	}
	var c net.Conn
	err := tp.cli.Do(func() (err error) {
		c, err = net.DialTimeout(network, netip.AddrPortFrom(fe.Addr, fe.Port).String(), 5*time.Second)
		return err
	})
	if err != nil {
		return "", fmt.Errorf("connect to %s: %w", fe, err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Write([]byte(msg)); err != nil {
		return "", fmt.Errorf("send to %s: %w", fe, err)
	}
	if fe.Proto == lb.UDP {
		buf := make([]byte, 512)
		n, err := c.Read(buf)
		return string(buf[:n]), err
	}
	b, err := io.ReadAll(c)
	if errors.Is(err, os.ErrDeadlineExceeded) && len(b) > 0 {
		err = nil
	}
	return string(b), err
}

// TestDSRTraffic sends real TCP connections and UDP exchanges from a client
// namespace through the LB (at each hook) to a backend running the
// companion, over DSR dispatch geneve and opt, IPv4 and IPv6. The backend
// must see the client's own address, and the reply must reach the client's
// socket from the VIP and service port, checksums verified by the kernels.
func TestDSRTraffic(t *testing.T) {
	for _, k := range hooks {
		t.Run(k.String(), func(t *testing.T) {
			tp := newTrafficTopo(t, k)
			for _, d := range []lb.Dispatch{lb.DispatchGeneve, lb.DispatchOpt} {
				var svcs []lb.Service
				for _, be := range []netip.Addr{trafficBackend4, trafficBackend6} {
					vip := familyOf(be).vip
					tcp := dsrService("web-"+familyOf(be).name, vip, 80, lb.TCP, be)
					udp := dsrService("dns-"+familyOf(be).name, vip, 53, lb.UDP, be)
					if d == lb.DispatchOpt {
						// opt reaches any backend port.
						tcp.Backends[0].Addr = netip.AddrPortFrom(be, 8080)
						udp.Backends[0].Addr = netip.AddrPortFrom(be, 5353)
					}
					for _, s := range []lb.Service{tcp, udp} {
						s.Mode, s.Dispatch = lb.ModeDSR, d
						svcs = append(svcs, withDefaults(s))
					}
				}
				if err := tp.rec.Reconcile(svcs); err != nil {
					t.Fatalf("reconcile: %v", err)
				}
				for _, svc := range svcs {
					t.Run(fmt.Sprintf("%s/%s", d, svc.Name), func(t *testing.T) {
						before, err := tp.comp.Counters()
						if err != nil {
							t.Fatal(err)
						}
						msg := "hello over " + d.String()
						reply, err := tp.exchange(t, svc.Frontend, msg)
						if err != nil {
							t.Fatalf("exchange with %s: %v (reply %q)", svc.Frontend, err, reply)
						}
						client := trafficClient4
						if svc.Frontend.Addr.Is6() {
							client = trafficClient6
						}
						local := svc.Backends[0].Addr
						if d == lb.DispatchGeneve {
							local = netip.AddrPortFrom(svc.Frontend.Addr, svc.Frontend.Port)
						}
						f := strings.Fields(reply)
						if len(f) < 2 {
							t.Fatalf("reply %q: want \"<peer> <local> <data>\"", reply)
						}
						if peer, err := netip.ParseAddrPort(f[0]); err != nil || peer.Addr().Unmap() != client {
							t.Errorf("backend saw the client as %s, want %s (DSR keeps the client's address)", f[0], client)
						}
						// A socket bound to any address reports only its port.
						got, err := netip.ParseAddrPort(f[1])
						if err == nil && got.Addr().IsUnspecified() {
							got = netip.AddrPortFrom(local.Addr(), got.Port())
						}
						if err != nil || netip.AddrPortFrom(got.Addr().Unmap(), got.Port()) != local {
							t.Errorf("backend received on %s, want %s", f[1], local)
						}
						if !strings.HasSuffix(reply, msg) {
							t.Errorf("reply %q does not end with %q", reply, msg)
						}
						after, err := tp.comp.Counters()
						if err != nil {
							t.Fatal(err)
						}
						moved := func(name string) uint64 { return after[name].Packets - before[name].Packets }
						if d == lb.DispatchGeneve && moved("decap_geneve") == 0 {
							t.Errorf("companion decapsulated no Geneve packet")
						}
						if d == lb.DispatchOpt && (moved("opt_record") == 0 || moved("opt_reply") == 0) {
							t.Errorf("companion recorded %d opt packets and rewrote %d replies, want both > 0", moved("opt_record"), moved("opt_reply"))
						}
					})
				}
			}
		})
	}
}
