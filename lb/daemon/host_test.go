// SPDX-License-Identifier: Apache-2.0

package daemon

import (
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/l4lb/l4lb/internal/testnet"
	"github.com/l4lb/l4lb/lb"
	"github.com/l4lb/l4lb/lb/config"
	"github.com/l4lb/l4lb/lb/datapath"
	"github.com/l4lb/l4lb/lb/metrics"
)

// TestHostFactsRefuseOversizedMaps: with this machine's facts, a config
// whose maps need more kernel memory than the machine has is refused, with
// the estimate computed from the datapath's real map specs.
func TestHostFactsRefuseOversizedMaps(t *testing.T) {
	testnet.SkipShort(t, "checks this host's bpffs and memory")
	h := HostFacts()
	if h.MemoryAvailable == 0 {
		t.Fatal("no available memory found in /proc/meminfo")
	}
	doc := "[daemon]\nadmin_socket = \"" + filepath.Join(t.TempDir(), "s.sock") + "\"\n" +
		"[datapath]\ninterfaces = [\"eth0\"]\nconntrack_max = 134217728\nsnat_max = 134217728\n[maglev]\nhash_seed = \"5f1c0ffee0ddba11deadbeef00c0ffee\"\n"
	need, err := MapMemory(mustParse(t, doc))
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("maps need %s, the machine has %s available", config.MiB(need.New), config.MiB(h.MemoryAvailable))
	if need.New <= h.MemoryAvailable {
		t.Fatalf("this machine has %s available, more than the largest config needs (%s): the refusal cannot be shown here", config.MiB(h.MemoryAvailable), config.MiB(need.New))
	}
	_, err = config.Parse("big.toml", []byte(doc), config.Options{Host: h})
	if err == nil || !strings.Contains(err.Error(), "big.toml:3: the datapath maps need ≈") || !strings.Contains(err.Error(), "available") {
		t.Fatalf("oversized maps: %v", err)
	}
	// The defaults fit: the estimate is what config check prints.
	cfg, err := config.Parse("ok.toml", []byte(strings.NewReplacer("conntrack_max = 134217728\n", "", "snat_max = 134217728\n", "").Replace(doc)), config.Options{Host: h})
	if err != nil {
		t.Fatal(err)
	}
	if m := cfg.MapMemory; m.Total < 100<<20 || m.Total > 2<<30 || m.New != m.Total {
		t.Errorf("default maps estimated at %s, %s of it new; want all of it new with nothing pinned", config.MiB(m.Total), config.MiB(m.New))
	}
}

// TestMemoryCheckAdoptsPinnedMaps: the maps a running (or stopped) l4lbd
// pinned are charged already, so the memory check of a restart counts only
// what is not pinned. Counting them again refused the restart of a daemon
// whose maps take more than half of the memory left.
func TestMemoryCheckAdoptsPinnedMaps(t *testing.T) {
	testnet.RequireRoot(t)
	pins, err := os.MkdirTemp("/sys/fs/bpf", "l4lb-memory-test-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = datapath.Cleanup(pins); _ = os.RemoveAll(pins) })
	doc := "[daemon]\nbpffs = \"" + pins + "\"\nadmin_socket = \"" + filepath.Join(t.TempDir(), "s.sock") + "\"\n" +
		"[datapath]\ninterfaces = [\"eth0\"]\nconntrack_max = 131072\nsnat_max = 65536\nmax_services = 64\nmax_backends = 1024\n" +
		"[maglev]\nhash_seed = \"5f1c0ffee0ddba11deadbeef00c0ffee\"\n"
	cfg := mustParse(t, doc)
	before, err := MapMemory(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if before.New != before.Total {
		t.Fatalf("nothing is pinned yet, but only %d of %d bytes count as new", before.New, before.Total)
	}
	// A machine with three quarters of what the maps take: a first start
	// is refused, a restart over the pins is not.
	host := HostFacts()
	host.MemoryAvailable = before.Total * 3 / 4
	if _, err := config.Parse("l4lb.toml", []byte(doc), config.Options{Host: host}); err == nil || !strings.Contains(err.Error(), "the datapath maps need ≈") {
		t.Fatalf("first start with %s available for %s of maps: %v", config.MiB(host.MemoryAvailable), config.MiB(before.Total), err)
	}

	dp, err := datapath.Load(datapathConfig(cfg, nil))
	if err != nil {
		t.Fatal(err)
	}
	dp.Close() // the pins stay, as when l4lbd stops

	after, err := MapMemory(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("maps %s; new before the first start %s, for a restart %s", config.MiB(after.Total), config.MiB(before.New), config.MiB(after.New))
	if after.Total != before.Total || after.New > before.Total/10 {
		t.Errorf("after pinning: %d of %d bytes new, want the pinned maps not counted", after.New, after.Total)
	}
	got, err := config.Parse("l4lb.toml", []byte(doc), config.Options{Host: host})
	if err != nil {
		t.Fatalf("restart over the pinned maps refused: %v", err)
	}
	if got.MapMemory != after {
		t.Errorf("config reports %+v, MapMemory %+v", got.MapMemory, after)
	}
}

// TestHostFactsBPFFS: a bpffs path that is not on bpffs is refused by the
// config check, and nothing is created for it.
func TestHostFactsBPFFS(t *testing.T) {
	pins := filepath.Join(t.TempDir(), "not-bpffs", "l4lb")
	doc := "[daemon]\nbpffs = \"" + pins + "\"\nadmin_socket = \"" + filepath.Join(t.TempDir(), "s.sock") + "\"\n" +
		"[datapath]\ninterfaces = [\"eth0\"]\n[maglev]\nhash_seed = \"5f1c0ffee0ddba11deadbeef00c0ffee\"\n"
	_, err := config.Parse("f.toml", []byte(doc), config.Options{Host: HostFacts()})
	if err == nil || !strings.Contains(err.Error(), "f.toml:2: daemon.bpffs:") || !strings.Contains(err.Error(), "is not on a bpffs mount") ||
		!strings.Contains(err.Error(), "nsenter --net=/run/netns/NAME") {
		t.Fatalf("bpffs on tmpfs: %v", err)
	}
	if _, err := os.Stat(filepath.Dir(pins)); !os.IsNotExist(err) {
		t.Errorf("the check created %s: %v", filepath.Dir(pins), err)
	}
}

func mustParse(t *testing.T, doc string) *config.Config {
	t.Helper()
	cfg, err := config.Parse("t.toml", []byte(doc), config.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// TestLocalVIPFromASource: a service of a discovery source (which file
// validation never sees) whose VIP is one of the box's addresses is
// refused with its own reason, as of the addresses of the last (re)load.
func TestLocalVIPFromASource(t *testing.T) {
	d := &Daemon{overrides: &overrides{m: map[overrideKey]override{}}}
	d.setLocal(&config.Host{Addresses: []config.HostAddr{{Prefix: netip.MustParsePrefix("192.0.2.5/24"), Interface: "eth9"}}})
	svc := lb.Service{Name: "ssh", Source: "consul", Frontend: lb.Frontend{Addr: netip.MustParseAddr("192.0.2.5"), Port: 22, Proto: lb.TCP},
		Backends: []lb.Backend{{Addr: netip.MustParseAddrPort("198.51.100.1:22"), Weight: 1}}}
	r := d.resolve([]lb.Service{svc}, lb.Defaults{Mode: lb.ModeSNAT, Dispatch: lb.DispatchIPIP, TableSize: 251})
	if len(r.desired) != 0 || len(r.refused) != 1 || r.refused[0].Reason != metrics.RefusedLocalVIP ||
		len(r.rejected) != 1 || !strings.Contains(r.rejected[0], "vip 192.0.2.5 is an address of this box (eth9)") {
		t.Fatalf("resolve: desired %v refused %+v rejected %q", r.desired, r.refused, r.rejected)
	}
}

// TestCannotWorkFromASource: services of a discovery source meet the rules
// the file's meet at parse time (config.ServiceProblems,
// config.AcrossServices) and are refused with reason cannot_work; of a
// pair across sources, the file's service keeps serving whichever side of
// the pair it is.
func TestCannotWorkFromASource(t *testing.T) {
	d := &Daemon{overrides: &overrides{m: map[overrideKey]override{}}, supported: func(lb.Service) error { return nil }}
	d.setLocal(&config.Host{Addresses: []config.HostAddr{{Prefix: netip.MustParsePrefix("192.0.2.5/24"), Interface: "eth9"}}})
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
			r := d.resolve(tt.in, defs)
			var kept []string
			for _, s := range r.desired {
				kept = append(kept, s.Name)
			}
			if !slices.Equal(kept, tt.keep) {
				t.Errorf("kept %v, want %v (rejected %q)", kept, tt.keep, r.rejected)
			}
			if tt.refused == "" {
				if len(r.refused) != 0 {
					t.Errorf("refused %+v", r.refused)
				}
				return
			}
			if len(r.refused) != 1 || r.refused[0].Service != tt.refused || r.refused[0].Reason != metrics.RefusedCannotWork ||
				len(r.rejected) != 1 || !strings.Contains(r.rejected[0], tt.why) {
				t.Errorf("refused %+v rejected %q, want %s refused: %s", r.refused, r.rejected, tt.refused, tt.why)
			}
			for _, s := range r.desired {
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
