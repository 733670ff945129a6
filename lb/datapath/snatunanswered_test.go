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
