// SPDX-License-Identifier: Apache-2.0

package daemon

import (
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/l4lb/l4lb/lb"
	"github.com/l4lb/l4lb/lb/config"
	"github.com/l4lb/l4lb/lb/metrics"
)

// TestHostFactsRefuseOversizedMaps: with this machine's facts, a config
// whose maps need more kernel memory than the machine has is refused, with
// the estimate computed from the datapath's real map specs.
func TestHostFactsRefuseOversizedMaps(t *testing.T) {
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
	t.Logf("maps need %s, the machine has %s available", config.MiB(need), config.MiB(h.MemoryAvailable))
	if need <= h.MemoryAvailable {
		t.Fatalf("this machine has %s available, more than the largest config needs (%s): the refusal cannot be shown here", config.MiB(h.MemoryAvailable), config.MiB(need))
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
	if cfg.MapMemory < 100<<20 || cfg.MapMemory > 2<<30 {
		t.Errorf("default maps estimated at %s", config.MiB(cfg.MapMemory))
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
