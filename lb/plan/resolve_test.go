// SPDX-License-Identifier: Apache-2.0

package plan

import (
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/l4lb/l4lb/lb"
	"github.com/l4lb/l4lb/lb/config"
	"github.com/l4lb/l4lb/lb/metrics"
)

// TestLocalVIPFromASource: a service of a discovery source (which file
// validation never sees) whose VIP is one of the box's addresses is
// refused with its own reason, as of the addresses of the last (re)load.
func TestLocalVIPFromASource(t *testing.T) {
	p := New(Config{})
	p.SetLocal(LocalAddrs(&config.Host{Addresses: []config.HostAddr{{Prefix: netip.MustParsePrefix("192.0.2.5/24"), Interface: "eth9"}}}))
	svc := lb.Service{Name: "ssh", Source: "consul", Frontend: lb.Frontend{Addr: netip.MustParseAddr("192.0.2.5"), Port: 22, Proto: lb.TCP},
		Backends: []lb.Backend{{Addr: netip.MustParseAddrPort("198.51.100.1:22"), Weight: 1}}}
	r := p.Resolve([]lb.Service{svc}, lb.Defaults{Mode: lb.ModeSNAT, Dispatch: lb.DispatchIPIP, TableSize: 251})
	if len(r.Desired) != 0 || len(r.Refused) != 1 || r.Refused[0].Reason != metrics.RefusedLocalVIP ||
		len(r.Rejected) != 1 || !strings.Contains(r.Rejected[0], "vip 192.0.2.5 is an address of this box (eth9)") {
		t.Fatalf("resolve: desired %v refused %+v rejected %q", r.Desired, r.Refused, r.Rejected)
	}
}

// TestCannotWorkFromASource: services of a discovery source meet the rules
// the file's meet at parse time (config.ServiceProblems,
// config.AcrossServices) and are refused with reason cannot_work; of a
// pair across sources, the file's service keeps serving whichever side of
// the pair it is.
func TestCannotWorkFromASource(t *testing.T) {
	p := New(Config{})
	p.SetLocal(LocalAddrs(&config.Host{Addresses: []config.HostAddr{{Prefix: netip.MustParsePrefix("192.0.2.5/24"), Interface: "eth9"}}}))
	defs := lb.Defaults{Mode: lb.ModeSNAT, Dispatch: lb.DispatchIPIP, TableSize: 251}
	svc := func(name, source, vip string, backends ...lb.Backend) lb.Service {
		return lb.Service{Name: name, Source: source, Frontend: lb.Frontend{Addr: netip.MustParseAddr(vip), Port: 80, Proto: lb.TCP}, Backends: backends}
	}
	be := func(a string, w uint32) lb.Backend {
		return lb.Backend{Addr: netip.MustParseAddrPort(a), Weight: w}
	}
	file := "file:/etc/l4lb/l4lb.toml"
	tests := []struct {
		name    string
		in      []lb.Service
		keep    []string
		refused string
		why     string
	}{
		{"backend on the box", []lb.Service{svc("a", "consul", "198.51.100.1", be("192.0.2.5:80", 1))},
			nil, "a", "backend 192.0.2.5:80: address 192.0.2.5 is an address of this box (eth9)"},
		{"backend at its own VIP", []lb.Service{svc("a", "kubernetes", "198.51.100.1", be("198.51.100.1:8080", 1))},
			nil, "a", "address 198.51.100.1 is the service's own VIP"},
		{"starved backend", []lb.Service{svc("a", "consul", "198.51.100.1", be("10.0.0.1:80", 1), be("10.0.0.2:80", 4294967295))},
			nil, "a", "backend 10.0.0.1:80: weight 1 gets none of the 251 slots"},
		{"backend at the file's VIP", []lb.Service{
			svc("web", file, "198.51.100.9", be("10.0.0.1:80", 1)),
			svc("a", "consul", "198.51.100.1", be("198.51.100.9:80", 1))},
			[]string{"web"}, "a", `address 198.51.100.9 is the VIP of service "web" (file:/etc/l4lb/l4lb.toml)`},
		{"VIP at the file's backend", []lb.Service{
			// Sorted first by frontend, the Consul service is still the one refused.
			svc("a", "consul", "10.0.0.1", be("10.0.0.2:80", 1)),
			svc("web", file, "198.51.100.9", be("10.0.0.1:80", 1))},
			[]string{"web"}, "a", `vip 10.0.0.1 is the address of backend 10.0.0.1:80 of service "web"`},
		{"fine", []lb.Service{svc("web", file, "198.51.100.9", be("10.0.0.1:80", 1), be("10.0.0.2:80", 3))},
			[]string{"web"}, "", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := p.Resolve(tt.in, defs)
			var kept []string
			for _, s := range r.Desired {
				kept = append(kept, s.Name)
			}
			if !slices.Equal(kept, tt.keep) {
				t.Errorf("kept %v, want %v (rejected %q)", kept, tt.keep, r.Rejected)
			}
			if tt.refused == "" {
				if len(r.Refused) != 0 {
					t.Errorf("refused %+v", r.Refused)
				}
				return
			}
			if len(r.Refused) != 1 || r.Refused[0].Service != tt.refused || r.Refused[0].Reason != metrics.RefusedCannotWork ||
				len(r.Rejected) != 1 || !strings.Contains(r.Rejected[0], tt.why) {
				t.Errorf("refused %+v rejected %q, want %s refused: %s", r.Refused, r.Rejected, tt.refused, tt.why)
			}
			for _, s := range r.Desired {
				if !r.vips.Has(s.Frontend.Addr) {
					t.Errorf("vips lacks %s", s.Frontend.Addr)
				}
			}
		})
	}
	// A pass over a few services leaves a backend moved to a VIP to the
	// full pass, which decides which service to refuse.
	vips := config.IndexVIPs([]lb.Service{svc("web", file, "198.51.100.9")})
	if !atVIP(svc("a", "consul", "198.51.100.1", be("198.51.100.9:80", 1)), vips) || atVIP(svc("b", "consul", "198.51.100.1", be("10.0.0.3:80", 1)), vips) {
		t.Error("atVIP does not find a backend at a VIP")
	}
}
