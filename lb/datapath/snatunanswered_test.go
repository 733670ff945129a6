// SPDX-License-Identifier: Apache-2.0

package datapath_test

import (
	"fmt"
	"net/netip"
	"testing"
	"time"

	"github.com/l4lb/l4lb/bpf"
	"github.com/l4lb/l4lb/lb"
	"github.com/l4lb/l4lb/lb/datapath"
	"github.com/l4lb/l4lb/lb/maglev"
)

// TestSNATUnanswered checks that a TCP binding made by a client packet
// without SYN holds its port only for the closing timeout (1s here, open
// 1h) until the backend answers, whatever the client sends meanwhile: a
// spoofed ACK cannot hold a port for hours. Answered, it is open.
func TestSNATUnanswered(t *testing.T) {
	const port = 40000
	timeouts := datapath.SNATTimeouts{TCP: time.Hour, TCPClosing: time.Second}
	for _, k := range hooks {
		for _, fam := range families {
			t.Run(k.String()+"/"+fam.name, func(t *testing.T) {
				e := newSNATEnv(t, envOptions{snatPortMin: port, snatPortMax: port, snatTimeouts: timeouts})
				// One backend port each: each its own port space.
				var svcs []lb.Service
				for i, answered := range []bool{false, true} {
					s := snatService(fmt.Sprintf("svc%v", answered), fam.vip, uint16(80+i), lb.TCP, fam.backends[0])
					s.Backends[0].Addr = netip.AddrPortFrom(fam.backends[0], uint16(9000+i))
					svcs = append(svcs, s)
				}
				e.reconcile(t, svcs...)
				snats := make([]netip.AddrPort, len(svcs))
				for i, svc := range svcs {
					f := flowTo(svc.Frontend, fam.client, 1000)
					ack := func() netip.AddrPort {
						t.Helper()
						r := e.runOn(t, k, e.frame(t, clientPacket(f, false, true)))
						if r.verdict != k.tx() {
							t.Fatalf("ACK of %v: verdict %s", f, k.verdictName(r.verdict))
						}
						return source(t, r.out)
					}
					snats[i] = ack()
					expectState(t, e, "made by an ACK", f, bpf.LbL4lbSnatStateL4LB_SNAT_UNANSWERED)
					// More from the client moves nothing.
					ack()
					expectState(t, e, "a second ACK", f, bpf.LbL4lbSnatStateL4LB_SNAT_UNANSWERED)
					if i == 1 {
						r := e.runOn(t, k, e.frame(t, replyPacket(svc.Backends[0].Addr, snats[i], lb.TCP, false, false)))
						if r.verdict != k.tx() {
							t.Fatalf("reply: verdict %s", k.verdictName(r.verdict))
						}
						// The reply moves the reverse half, the client's
						// next packet the forward one.
						ack()
						expectState(t, e, "answered", f, bpf.LbL4lbSnatStateL4LB_SNAT_OPEN)
					}
				}

				time.Sleep(1500 * time.Millisecond)

				for i, svc := range svcs {
					g := flowTo(svc.Frontend, fam.client, 2000)
					r := e.runOn(t, k, e.frame(t, clientPacket(g, true, false)))
					if i == 1 {
						if r.verdict != k.drop() {
							t.Errorf("a new flow got the port of an answered binding (verdict %s)", k.verdictName(r.verdict))
						}
						continue
					}
					if r.verdict != k.tx() {
						t.Errorf("new flow after an unanswered binding's timeout: verdict %s, want %s", k.verdictName(r.verdict), k.verdictName(k.tx()))
						continue
					}
					if got := source(t, r.out); got != snats[i] {
						t.Errorf("new flow got %s, want the freed %s", got, snats[i])
					}
				}
			})
		}
	}
}

// TestSNATPreempt gives each service's backend two ports. With one binding
// open and one unproven (a SYN with a spoofed ACK after it, answered by
// the backend's SYN+ACK, or a datagram nobody answered), a new flow takes the
// unproven one's port rather than being refused, and both halves of the
// binding it displaced are gone; with both open, the next flow is
// refused. So the bindings a spoofed flood makes never hold the port space
// against a real client.
func TestSNATPreempt(t *testing.T) {
	const lo, hi = 40000, 40001
	for _, k := range hooks {
		for _, fam := range families {
			t.Run(k.String()+"/"+fam.name, func(t *testing.T) {
				e := newSNATEnv(t, envOptions{snatPortMin: lo, snatPortMax: hi})
				tcp := snatService("tcp", fam.vip, 80, lb.TCP, fam.backends[0])
				udp := snatService("udp", fam.vip, 53, lb.UDP, fam.backends[0])
				e.reconcile(t, tcp, udp)
				for _, svc := range []lb.Service{tcp, udp} {
					isTCP := svc.Frontend.Proto == lb.TCP
					be := svc.Backends[0].Addr
					open := flowTo(svc.Frontend, fam.client, 1000)
					openSNAT := e.sendSNAT(t, k, svc, open, clientPacket(open, isTCP, false))
					if isTCP {
						handshake(t, e, k, open, be, openSNAT, "open flow")
					} else {
						e.replySNAT(t, k, open, be, openSNAT, false, false)
					}
					victim := flowTo(svc.Frontend, fam.client, 1001)
					victimSNAT := e.sendSNAT(t, k, svc, victim, clientPacket(victim, isTCP, false))
					if isTCP {
						// A spoofer's ACK, then the backend's answer:
						// still unproven.
						e.sendSNAT(t, k, svc, victim, clientPacket(victim, false, true))
						synAck(t, e, k, be, victimSNAT, "victim")
						if b, _ := e.binding(t, victim); b.rev.State != bpf.LbL4lbSnatStateL4LB_SNAT_SYN_ANSWERED {
							t.Fatalf("victim: reverse state %v, want syn answered", b.rev.State)
						}
					}

					before := e.events(t)
					next := flowTo(svc.Frontend, fam.client, 1002)
					if got := e.sendSNAT(t, k, svc, next, clientPacket(next, isTCP, false)); got != victimSNAT {
						t.Errorf("%s: new flow got %s, want the unproven binding's %s", svc.Name, got, victimSNAT)
					}
					if n := e.events(t)["snat_preempted"] - before["snat_preempted"]; n != 1 {
						t.Errorf("%s: %d bindings preempted, want 1", svc.Name, n)
					}
					if _, ok := e.binding(t, victim); ok {
						t.Errorf("%s: the displaced flow still has its binding", svc.Name)
					}
					key := maglev.FlowKey(victim)
					var fwd bpf.LbSnatFwdValue
					if err := e.lb.Maps()[bpf.LbMapSnatFwd].Lookup(key[:], &fwd); err == nil {
						t.Errorf("%s: the displaced flow's forward half is left: %+v", svc.Name, fwd)
					}
					if isTCP {
						handshake(t, e, k, next, be, victimSNAT, "new flow")
					} else {
						e.replySNAT(t, k, next, be, victimSNAT, false, false)
					}

					// Both open: the space is exhausted for real.
					reasons := e.reasons(t)
					last := flowTo(svc.Frontend, fam.client, 1003)
					if r := e.runOn(t, k, e.frame(t, clientPacket(last, isTCP, false))); r.verdict != k.drop() {
						t.Errorf("%s: flow with both ports open: verdict %s, want %s", svc.Name, k.verdictName(r.verdict), k.verdictName(k.drop()))
					}
					e.expectReasons(t, reasons, map[string]uint64{"drop_snat_exhausted": 1})
					// The open flows keep their ports.
					for _, o := range []struct {
						f    maglev.Flow
						snat netip.AddrPort
					}{{open, openSNAT}, {next, victimSNAT}} {
						if got := e.sendSNAT(t, k, svc, o.f, clientPacket(o.f, false, isTCP)); got != o.snat {
							t.Errorf("%s: open flow %v moved from %s to %s", svc.Name, o.f, o.snat, got)
						}
					}
				}
			})
		}
	}
}
