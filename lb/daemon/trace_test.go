// SPDX-License-Identifier: Apache-2.0

package daemon

import (
	"errors"
	"net/netip"
	"testing"

	"github.com/l4lb/l4lb/internal/cow"
	"github.com/l4lb/l4lb/lb"
	"github.com/l4lb/l4lb/lb/api"
	"github.com/l4lb/l4lb/lb/datapath"
	"github.com/l4lb/l4lb/lb/plan"
)

// TestTraceFilter checks how a trace request becomes the datapath's
// filter: addresses and prefixes (IPv4-mapped ones unmapped), a service
// resolved to its frontend, and the refusals.
func TestTraceFilter(t *testing.T) {
	web := lb.Service{Name: "web", Frontend: lb.Frontend{Addr: netip.MustParseAddr("192.0.2.10"), Port: 80, Proto: lb.TCP}}
	v := &view{View: &plan.View{Services: cow.SliceOf([]lb.Service{web}), Pos: map[string]int{"web": 0}}}
	tests := []struct {
		name string
		req  api.TraceRequest
		want datapath.TraceFilter
		err  error
	}{
		{"empty", api.TraceRequest{}, datapath.TraceFilter{}, nil},
		{"client address", api.TraceRequest{Client: "198.51.100.7"}, datapath.TraceFilter{Client: netip.MustParsePrefix("198.51.100.7/32")}, nil},
		{"client prefix", api.TraceRequest{Client: "2001:db8::/32"}, datapath.TraceFilter{Client: netip.MustParsePrefix("2001:db8::/32")}, nil},
		{"mapped client", api.TraceRequest{Client: "::ffff:198.51.100.0/120"}, datapath.TraceFilter{Client: netip.MustParsePrefix("198.51.100.0/24")}, nil},
		{"frontend", api.TraceRequest{VIP: "192.0.2.10", Port: 443, Proto: "udp", Rate: 7},
			datapath.TraceFilter{VIP: netip.MustParseAddr("192.0.2.10"), Port: 443, Proto: lb.UDP, Rate: 7}, nil},
		{"service", api.TraceRequest{Service: "web", Proto: "tcp"}, datapath.TraceFilter{VIP: web.Frontend.Addr, Port: 80, Proto: lb.TCP}, nil},
		{"backend address", api.TraceRequest{Backend: "10.1.0.11"}, datapath.TraceFilter{Backend: netip.MustParseAddrPort("10.1.0.11:0")}, nil},
		{"backend", api.TraceRequest{Backend: "[fd00::11]:8080"}, datapath.TraceFilter{Backend: netip.MustParseAddrPort("[fd00::11]:8080")}, nil},
		{"bad client", api.TraceRequest{Client: "client"}, datapath.TraceFilter{}, api.ErrInvalid},
		{"bad vip", api.TraceRequest{VIP: "192.0.2.0/24"}, datapath.TraceFilter{}, api.ErrInvalid},
		{"bad proto", api.TraceRequest{Proto: "sctp"}, datapath.TraceFilter{}, api.ErrInvalid},
		{"bad backend", api.TraceRequest{Backend: "be1"}, datapath.TraceFilter{}, api.ErrInvalid},
		{"no service", api.TraceRequest{Service: "db"}, datapath.TraceFilter{}, api.ErrNotFound},
		{"service contradicted", api.TraceRequest{Service: "web", Port: 443}, datapath.TraceFilter{}, api.ErrInvalid},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := traceFilter(v, tt.req)
			if tt.err != nil {
				if !errors.Is(err, tt.err) {
					t.Fatalf("error %v, want %v", err, tt.err)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Errorf("filter %+v (%v), want %+v", got, err, tt.want)
			}
		})
	}
}

// TestTraceSent checks what an event says was sent, for each way out.
func TestTraceSent(t *testing.T) {
	client := netip.MustParseAddrPort("198.51.100.7:40000")
	fe := lb.Frontend{Addr: netip.MustParseAddr("192.0.2.10"), Port: 80, Proto: lb.TCP}
	be := netip.MustParseAddrPort("10.1.0.11:8080")
	snat := netip.MustParseAddrPort("10.0.0.1:33000")
	base := datapath.TraceEvent{Client: client, Frontend: fe, Backend: be, Verdict: "tx", Forwarded: true}
	with := func(f func(*datapath.TraceEvent)) datapath.TraceEvent { e := base; f(&e); return e }
	tests := []struct {
		name string
		ev   datapath.TraceEvent
		want string
	}{
		{"dropped", with(func(e *datapath.TraceEvent) { e.Verdict = "drop" }), ""},
		{"passed", with(func(e *datapath.TraceEvent) { e.Verdict = "next" }), ""},
		{"ipip", with(func(e *datapath.TraceEvent) { e.Mode, e.Dispatch = lb.ModeDSR, lb.DispatchIPIP }), "IPIP encapsulated to 10.1.0.11"},
		{"geneve", with(func(e *datapath.TraceEvent) { e.Mode, e.Dispatch = lb.ModeDSR, lb.DispatchGeneve }), "Geneve encapsulated to 10.1.0.11"},
		{"opt", with(func(e *datapath.TraceEvent) { e.Mode, e.Dispatch, e.Verdict = lb.ModeDSR, lb.DispatchOpt, "redirect" }),
			"destination rewritten to 10.1.0.11:8080, VIP in an IP option"},
		{"snat", with(func(e *datapath.TraceEvent) { e.Mode, e.SNAT = lb.ModeSNAT, snat }), "SNAT rewritten to 10.0.0.1:33000 -> 10.1.0.11:8080"},
		{"snat reply", with(func(e *datapath.TraceEvent) { e.Mode, e.SNAT, e.Reply = lb.ModeSNAT, snat, true }),
			"SNAT reply rewritten to 192.0.2.10:80 -> 198.51.100.7:40000"},
		{"too big", with(func(e *datapath.TraceEvent) { e.Mode, e.TooBig, e.Forwarded = lb.ModeDSR, true, false }),
			"ICMP too big (fragmentation needed / packet too big) to 198.51.100.7"},
		{"icmp error", with(func(e *datapath.TraceEvent) { e.Mode, e.ICMPError = lb.ModeDSR, true }), "ICMP error passed on along the flow"},
	}
	for _, tt := range tests {
		if got := traceSent(tt.ev); got != tt.want {
			t.Errorf("%s: sent %q, want %q", tt.name, got, tt.want)
		}
	}
	if got := tcpFlags(0x12); got != "SYN,ACK" {
		t.Errorf("flags 0x12: %q, want SYN,ACK", got)
	}
}
