// SPDX-License-Identifier: Apache-2.0

package reconciler_test

import (
	"flag"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/l4lb/l4lb/lb"
	"github.com/l4lb/l4lb/lb/maglev"
	"github.com/l4lb/l4lb/lb/reconciler"
	"github.com/l4lb/l4lb/lb/reconciler/reconcilertest"
)

var update = flag.Bool("update", false, "rewrite testdata/*.golden from the current output")

var testSeed = maglev.Seed{0x00, 0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77, 0x88, 0x99, 0xaa, 0xbb, 0xcc, 0xdd, 0xee, 0xff}

func testConfig() reconciler.Config {
	return reconciler.Config{Seed: testSeed, MaxServices: 64, MaxBackends: 256}
}

// newFixture returns a reconciler on a fake that batches table swaps and
// checks the datapath rules after every single operation.
func newFixture(t testing.TB, cfg reconciler.Config) (*reconciler.Reconciler, *reconcilertest.Fake) {
	t.Helper()
	return newFixtureMode(t, cfg, batched)
}

// mode says whether the reconciler sees the fake's reconciler.TableBatcher.
type mode bool

const (
	batched   mode = true
	unbatched mode = false
)

var modes = []mode{batched, unbatched}

func (m mode) String() string {
	if m == batched {
		return "batched"
	}
	return "unbatched"
}

// newFixtureMode is newFixture with the reconciler driving the fake in
// mode m.
func newFixtureMode(t testing.TB, cfg reconciler.Config, m mode) (*reconciler.Reconciler, *reconcilertest.Fake) {
	t.Helper()
	f := reconcilertest.NewFake()
	f.SetLimits(cfg.MaxServices, cfg.MaxBackends)
	f.CheckEachOp(true)
	var dp reconciler.Datapath = f
	if m == unbatched {
		dp = reconcilertest.Unbatched(f)
	}
	return reconciler.New(cfg, dp, nil), f
}

// svc returns a resolved SNAT service on vip:port/tcp with table size 7.
func svc(name, vip string, port uint16, bs ...lb.Backend) lb.Service {
	return lb.Service{
		Name:      name,
		Frontend:  lb.Frontend{Addr: netip.MustParseAddr(vip), Port: port, Proto: lb.TCP},
		Mode:      lb.ModeSNAT,
		Dispatch:  lb.DispatchIPIP,
		TableSize: 7,
		Backends:  bs,
	}
}

// be returns an active backend of weight 1.
func be(addr string) lb.Backend {
	return lb.Backend{Addr: netip.MustParseAddrPort(addr), Weight: 1, State: lb.Active}
}

func weighted(b lb.Backend, w uint32) lb.Backend { b.Weight = w; return b }

func inState(b lb.Backend, s lb.BackendState) lb.Backend { b.State = s; return b }

// edit returns a deep copy of s changed by fn, so steps of a scenario never
// share backend slices.
func edit(s lb.Service, fn func(*lb.Service)) lb.Service {
	s = s.Clone()
	fn(&s)
	return s
}

func cloneAll(ss []lb.Service) []lb.Service {
	out := make([]lb.Service, len(ss))
	for i, s := range ss {
		out[i] = s.Clone()
	}
	return out
}

// short prints an op without table contents, so expected sequences read
// as the order of operations; table contents are checked by checkTables and
// by the golden dumps.
func short(op reconcilertest.Op) string {
	if op.Kind == reconcilertest.OpSetTable {
		s := fmt.Sprintf("SetTable(%d, %d slots)", op.Service, len(op.Table))
		if len(op.Table) == 0 {
			s = fmt.Sprintf("SetTable(%d, empty)", op.Service)
		}
		if op.Batch > 0 {
			s += " in batch"
		}
		if op.Err != nil {
			s += " failed: " + op.Err.Error()
		}
		return s
	}
	return op.String()
}

func shortOps(ops []reconcilertest.Op) []string {
	out := make([]string, 0, len(ops))
	for _, op := range ops {
		out = append(out, short(op))
	}
	return out
}

// succeeded counts the writes (ops other than those opening a batch) that
// were applied.
func succeeded(ops []reconcilertest.Op) int {
	n := 0
	for _, op := range ops {
		if op.Err == nil && !op.IsBatch() {
			n++
		}
	}
	return n
}

// writes counts the ops other than those opening a batch: the entries a
// datapath writes, whether or not they come in batches.
func writes(ops []reconcilertest.Op) int {
	n := 0
	for _, op := range ops {
		if !op.IsBatch() {
			n++
		}
	}
	return n
}

// flat returns ops as a datapath without batches would have received them:
// without the ops opening a batch, and with the entries as calls on their
// own.
func flat(ops []reconcilertest.Op) []reconcilertest.Op {
	var out []reconcilertest.Op
	for _, op := range ops {
		if op.IsBatch() {
			continue
		}
		op.Batch = 0
		out = append(out, op)
	}
	return out
}

// shape summarizes an op log as runs of one kind, e.g. "SetBackend*3", with
// a batch shown as its opening op, e.g. "SetTables(4 entries)", and its
// entries left out: it is the order of the phases and the number of
// datapath calls.
func shape(ops []reconcilertest.Op) []string {
	var out []string
	last, n := "", 0
	emit := func() {
		switch {
		case n == 1:
			out = append(out, last)
		case n > 1:
			out = append(out, fmt.Sprintf("%s*%d", last, n))
		}
	}
	for _, op := range ops {
		if op.Batch > 0 && !op.IsBatch() {
			continue
		}
		k := op.Kind.String()
		if op.IsBatch() {
			k = op.String()
		}
		if k != last {
			emit()
			last, n = k, 0
		}
		n++
	}
	emit()
	return out
}

// normalize reduces a State to what both the reconciler and the datapath
// know: names are control-plane only, and the frontend of a service whose
// entry is missing is unknown to the datapath.
func normalize(st reconciler.State) reconciler.State {
	out := reconciler.State{Services: slices.Clone(st.Services)}
	for i := range out.Services {
		s := &out.Services[i]
		s.Service.Name = ""
		if !s.HasEntry {
			s.Service = lb.Service{}
		}
	}
	slices.SortFunc(out.Services, func(a, b reconciler.ServiceState) int { return int(a.ID) - int(b.ID) })
	return out
}

// cmpOpts compares the netip types, whose fields are unexported, by value.
var cmpOpts = []cmp.Option{
	cmpopts.EquateEmpty(),
	cmp.Comparer(func(a, b netip.Addr) bool { return a == b }),
	cmp.Comparer(func(a, b netip.AddrPort) bool { return a == b }),
	cmp.Comparer(func(a, b netip.Prefix) bool { return a == b }),
}

// checkView fails when the reconciler's view is not exactly the fake's
// contents, i.e. when it did not record exactly the operations that
// succeeded.
func checkView(t testing.TB, r *reconciler.Reconciler, f *reconcilertest.Fake) {
	t.Helper()
	if diff := cmp.Diff(normalize(f.State()), normalize(r.Programmed()), cmpOpts...); diff != "" {
		t.Errorf("reconciler view differs from the datapath (-datapath +view):\n%s", diff)
	}
}

// checkTables recomputes every programmed table of the desired services
// with maglev.Build directly and compares it with the fake's table, through
// the backend ids the reconciler reports.
func checkTables(t testing.TB, desired []lb.Service, r *reconciler.Reconciler, f *reconcilertest.Fake) {
	t.Helper()
	tables := make(map[reconciler.ServiceID][]reconciler.BackendID)
	for _, s := range f.State().Services {
		if s.HasTable {
			tables[s.ID] = s.Table
		}
	}
	prog := make(map[lb.Frontend]reconciler.ServiceState)
	for _, s := range r.Programmed().Services {
		prog[s.Service.Frontend] = s
	}
	for _, d := range desired {
		p, ok := prog[d.Frontend]
		if !ok {
			continue
		}
		ids := make(map[netip.AddrPort]reconciler.BackendID)
		for _, b := range p.Backends {
			ids[b.Addr] = b.ID
		}
		var in []maglev.Backend
		var inIDs []reconciler.BackendID
		for _, b := range d.Backends {
			if b.State == lb.Active && b.Weight > 0 {
				in = append(in, maglev.Backend{Addr: b.Addr, Weight: b.Weight})
				inIDs = append(inIDs, ids[b.Addr])
			}
		}
		slots, err := maglev.Build(testSeed, d.TableSize, in)
		if err != nil {
			t.Fatalf("service %q: maglev.Build: %v", d.Name, err)
		}
		want := []reconciler.BackendID{}
		for _, s := range slots {
			want = append(want, inIDs[s])
		}
		if diff := cmp.Diff(want, tables[p.ID], cmpopts.EquateEmpty()); diff != "" {
			t.Errorf("service %q: table (-independent build +datapath):\n%s", d.Name, diff)
		}
	}
}

// golden compares got with testdata/name.golden, or rewrites the file
// under -update. Characters other than letters, digits and slashes in name
// become dashes.
func golden(t *testing.T, name, got string) {
	t.Helper()
	slug := strings.Map(func(r rune) rune {
		if r == '/' || ('a' <= r && r <= 'z') || ('A' <= r && r <= 'Z') || ('0' <= r && r <= '9') {
			return r
		}
		return '-'
	}, name)
	path := filepath.Join("testdata", slug+".golden")
	if *update {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run `go test ./lb/reconciler -update` to create it)", err)
	}
	if diff := cmp.Diff(string(want), got); diff != "" {
		t.Errorf("%s differs (-golden +got); if the change is intended, run `go test ./lb/reconciler -update`:\n%s", path, diff)
	}
}

// opsText prints ops one per line in full, tables included, with the
// entries of a batch indented under the op that opens it.
func opsText(ops []reconcilertest.Op) string {
	var sb strings.Builder
	for _, op := range ops {
		if op.Batch > 0 && !op.IsBatch() {
			sb.WriteString("  ")
		}
		sb.WriteString("  " + op.String() + "\n")
	}
	return sb.String()
}
