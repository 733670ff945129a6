// SPDX-License-Identifier: Apache-2.0

package daemon

import (
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/l4lb/l4lb/discovery"
	"github.com/l4lb/l4lb/lb"
)

// fullService sets every field of lb.Service, so that the file must carry
// each one.
func fullService(name string, port uint16) lb.Service {
	return lb.Service{
		Name:         name,
		Frontend:     lb.Frontend{Addr: netip.MustParseAddr("192.0.2.1"), Port: port, Proto: lb.UDP},
		Mode:         lb.ModeDSR,
		Dispatch:     lb.DispatchGeneve,
		TableSize:    251,
		Algorithm:    lb.Random,
		Affinity:     lb.Affinity{ClientIP: true, Timeout: time.Minute},
		SourceRanges: []netip.Prefix{netip.MustParsePrefix("198.51.100.0/24")},
		Health: lb.HealthCheck{Type: lb.HealthHTTP, Port: 10256, Interval: time.Second, Timeout: time.Second / 2,
			Rise: 2, Fall: 3, Path: "/healthz", ExpectStatus: 200, Send: "s", Expect: "e"},
		DrainTimeout: time.Hour,
		Announce:     lb.Announce{Off: true, MinHealthy: 2},
		Backends: []lb.Backend{
			{Addr: netip.MustParseAddrPort("10.0.0.1:30080"), Weight: 3, State: lb.Draining},
			{Addr: netip.MustParseAddrPort("[2001:db8::1]:30080"), Weight: 1, State: lb.Active},
		},
		Source: kubernetesSource,
	}
}

// addrComparers let cmp compare services, whose addresses have unexported
// fields.
var addrComparers = []cmp.Option{cmp.Comparer(func(a, b netip.Addr) bool { return a == b }),
	cmp.Comparer(func(a, b netip.Prefix) bool { return a == b }), cmp.Comparer(func(a, b netip.AddrPort) bool { return a == b })}

func lastGoodDaemon(t *testing.T, socket string) *Daemon {
	t.Helper()
	return testDaemonAt(t, socket, "[datapath]\ninterfaces = [\"lo\"]\n")
}

// TestLastGood: a watched source's snapshot is kept on disk, a restarted
// daemon whose source has not answered gets back exactly the saved
// services it finds pinned, and a source turned off leaves nothing behind.
func TestLastGood(t *testing.T) {
	svc := fullService("e2e.web.80-udp", 80)
	v := reflect.ValueOf(svc)
	for i := range v.NumField() {
		if v.Field(i).IsZero() {
			t.Fatalf("fullService leaves lb.Service.%s unset: set it, so that the file is shown to carry it", v.Type().Field(i).Name)
		}
	}
	other := fullService("e2e.gone.81-udp", 81)
	socket := filepath.Join(t.TempDir(), "l4lb.sock")
	path := LastGoodPath(socket, kubernetesSource)

	d := lastGoodDaemon(t, socket)
	d.update(discovery.Snapshot{Source: d.file.Name(), Services: []lb.Service{{Name: "from-file"}}})
	d.lastGood.flush()
	if _, err := os.Stat(LastGoodPath(socket, d.file.Name())); err == nil {
		t.Error("the file source's snapshot was kept; only watched sources need it")
	}
	d.update(discovery.Snapshot{Source: kubernetesSource, Services: []lb.Service{svc, other}})
	d.lastGood.flush()
	first, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("the Kubernetes snapshot was not kept: %v", err)
	}
	// An unchanged snapshot is not written again.
	time.Sleep(10 * time.Millisecond) // a rewrite would carry a later time
	d.update(discovery.Snapshot{Source: kubernetesSource, Services: []lb.Service{svc, other}})
	d.lastGood.flush()
	if again, _ := os.ReadFile(path); string(again) != string(first) {
		t.Error("an unchanged snapshot was written again")
	}

	// A restart during an outage: only the services still pinned return,
	// unchanged, and the file keeps them all for the next restart.
	r := lastGoodDaemon(t, socket)
	r.adopted = map[lb.Frontend]bool{svc.Frontend: true}
	r.restoreLastGood(kubernetesSource)
	got, _ := r.merger.Desired()
	if diff := cmp.Diff([]lb.Service{svc}, got, addrComparers...); diff != "" {
		t.Errorf("restored services (-want +got):\n%s", diff)
	}
	if again, _ := os.ReadFile(path); string(again) != string(first) {
		t.Error("restoring rewrote the file; a second restart would lose the services not pinned")
	}

	// A broken file restores nothing (and says so in the log).
	if err := os.WriteFile(path, []byte("{"), 0o600); err != nil {
		t.Fatal(err)
	}
	b := lastGoodDaemon(t, socket)
	b.adopted = map[lb.Frontend]bool{svc.Frontend: true}
	b.restoreLastGood(kubernetesSource)
	if got, _ := b.merger.Desired(); len(got) != 0 {
		t.Errorf("a broken file restored %d services", len(got))
	}

	// Turned off: the file goes.
	b.forgetLastGood(kubernetesSource)
	b.lastGood.flush()
	if _, err := os.Stat(path); !os.IsNotExist(err) {
		t.Errorf("the file of a source turned off is still there: %v", err)
	}
	b.restoreLastGood(kubernetesSource)
	if got, _ := b.merger.Desired(); len(got) != 0 {
		t.Errorf("restored %d services without a file", len(got))
	}
}

// TestLastGoodWriterLatestWins: the file ends as the last call for its
// source said, whatever was queued before and unwritten.
func TestLastGoodWriterLatestWins(t *testing.T) {
	socket := filepath.Join(t.TempDir(), "l4lb.sock")
	w := newLastGoodWriter(slog.New(slog.DiscardHandler), socket)
	path := LastGoodPath(socket, consulSource)
	snap := func(name string) *discovery.Snapshot {
		return &discovery.Snapshot{Source: consulSource, Services: []lb.Service{{Name: name}}}
	}
	for i := range 50 {
		w.put(consulSource, snap(fmt.Sprint("s", i)))
	}
	w.flush()
	b, err := os.ReadFile(path)
	if err != nil || !strings.Contains(string(b), `"s49"`) {
		t.Fatalf("after 50 snapshots the file holds %q (%v), want the last one", b, err)
	}
	w.put(consulSource, snap("kept"))
	w.put(consulSource, nil)
	w.flush()
	if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a removal queued after a snapshot left the file: %v", err)
	}
	w.put(consulSource, nil)
	w.put(consulSource, snap("back"))
	w.flush()
	if b, err := os.ReadFile(path); err != nil || !strings.Contains(string(b), `"back"`) {
		t.Errorf("a snapshot queued after a removal: file %q (%v)", b, err)
	}
}

// TestLastGoodPatches: snapshots that name their changes are appended as
// patches, the file reads back as the newest snapshot after any mix of
// patches, whole snapshots, coalesced puts and removals, and it is written
// whole again before the patches outweigh it.
func TestLastGoodPatches(t *testing.T) {
	socket := filepath.Join(t.TempDir(), "l4lb.sock")
	w := newLastGoodWriter(slog.New(slog.DiscardHandler), socket)
	path := LastGoodPath(socket, consulSource)
	rng := rand.New(rand.NewPCG(1, 2))
	svcs := make([]lb.Service, 50)
	for i := range svcs {
		svcs[i] = fullService(fmt.Sprint("s", i), uint16(1000+i))
	}
	var put func([]string)
	snapOf := func(changed []string) *discovery.Snapshot {
		// A copy that later steps do not change under the writer.
		c := slices.Clone(svcs)
		for i := range c {
			c[i].Backends = slices.Clone(c[i].Backends)
		}
		return &discovery.Snapshot{Source: consulSource, Services: c, Changed: changed}
	}
	put = func(changed []string) { w.put(consulSource, snapOf(changed)) }
	check := func(step int) {
		t.Helper()
		w.flush()
		lg, torn, err := readLastGood(path)
		if err != nil || torn != nil {
			t.Fatalf("step %d: read the file: %v, %v", step, err, torn)
		}
		if diff := cmp.Diff(svcs, lg.Services, addrComparers...); diff != "" {
			t.Fatalf("step %d: the file reads back as (-want +got):\n%s", step, diff)
		}
	}
	put(nil)
	check(0)
	whole, _ := os.Stat(path)
	var sawPatch, sawRewrite bool
	last := whole.Size()
	for step := 1; step <= 400; step++ {
		var changed []string
		for range 1 + rng.IntN(3) {
			i := rng.IntN(len(svcs))
			svcs[i].Backends[0].Weight = uint32(1 + rng.IntN(100))
			changed = append(changed, svcs[i].Name)
		}
		switch r := rng.IntN(20); {
		case r == 0: // a snapshot that names nothing: written whole
			put(nil)
		case r == 1: // a removal and a snapshot queued behind it
			w.put(consulSource, nil)
			put(changed)
		case r < 5: // two patches coalesced before the writer runs
			w.mu.Lock()
			w.putLocked(consulSource, snapOf(changed))
			i := rng.IntN(len(svcs))
			svcs[i].DrainTimeout += time.Second
			w.putLocked(consulSource, snapOf([]string{svcs[i].Name}))
			w.mu.Unlock()
		default:
			put(changed)
		}
		check(step)
		st, err := os.Stat(path)
		if err != nil {
			t.Fatal(err)
		}
		if st.Size() > 2*whole.Size()+4096 {
			t.Fatalf("step %d: the file grew to %d bytes; written whole it is about %d", step, st.Size(), whole.Size())
		}
		sawPatch = sawPatch || st.Size() > last
		sawRewrite = sawRewrite || st.Size() < last
		last = st.Size()
	}
	if !sawPatch || !sawRewrite {
		t.Errorf("patched %v, written whole again %v: want both", sawPatch, sawRewrite)
	}
}

// TestLastGoodTornPatch: a patch cut short by a crash is left out, with a
// warning, and the services are restored as of the patch before.
func TestLastGoodTornPatch(t *testing.T) {
	socket := filepath.Join(t.TempDir(), "l4lb.sock")
	path := LastGoodPath(socket, kubernetesSource)
	svc := fullService("e2e.web.80-udp", 80)
	// Other services, so that a patch is small next to the whole file
	// and is appended, not written whole.
	others := []lb.Service{fullService("a", 81), fullService("b", 82), fullService("c", 83)}
	with := func(svc lb.Service) []lb.Service { return append([]lb.Service{svc}, others...) }
	d := lastGoodDaemon(t, socket)
	d.update(discovery.Snapshot{Source: kubernetesSource, Services: with(svc)})
	// Each snapshot gets its own backends: the writer encodes them
	// after update returns.
	svc.Backends = slices.Clone(svc.Backends)
	svc.Backends[0].Weight = 7
	d.update(discovery.Snapshot{Source: kubernetesSource, Services: with(svc), Changed: []string{svc.Name}})
	d.lastGood.flush()
	patched, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	svc.Backends = slices.Clone(svc.Backends)
	svc.Backends[0].Weight = 9
	d.update(discovery.Snapshot{Source: kubernetesSource, Services: with(svc), Changed: []string{svc.Name}})
	d.lastGood.flush()
	full, err := os.ReadFile(path)
	if err != nil || len(full) <= len(patched) {
		t.Fatalf("the second change was not appended: %d bytes, then %d (%v)", len(patched), len(full), err)
	}
	if err := os.WriteFile(path, full[:len(full)-10], 0o600); err != nil {
		t.Fatal(err)
	}
	r := lastGoodDaemon(t, socket)
	r.adopted = map[lb.Frontend]bool{svc.Frontend: true}
	r.restoreLastGood(kubernetesSource)
	got, _ := r.merger.Desired()
	if len(got) != 1 || got[0].Backends[0].Weight != 7 {
		t.Errorf("restored %+v, want the service as of the first patch (weight 7)", got)
	}
}
