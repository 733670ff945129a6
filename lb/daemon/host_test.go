// SPDX-License-Identifier: Apache-2.0

package daemon

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/l4lb/l4lb/internal/testnet"
	"github.com/l4lb/l4lb/lb/config"
	"github.com/l4lb/l4lb/lb/datapath"
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
