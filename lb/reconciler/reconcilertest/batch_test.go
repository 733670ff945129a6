// SPDX-License-Identifier: Apache-2.0

package reconcilertest_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/l4lb/l4lb/lb/reconciler"
	"github.com/l4lb/l4lb/lb/reconciler/reconcilertest"
)

func opStrings(ops []reconcilertest.Op) []string {
	var out []string
	for _, op := range ops {
		out = append(out, op.String())
	}
	return out
}

func TestBatchRecordingAndFaults(t *testing.T) {
	boom := errors.New("boom")
	tables := [][]reconciler.BackendID{{2, 1, 2}, {}}
	tests := []struct {
		name    string
		fail    func(f *reconcilertest.Fake)
		want    []string
		wantErr []error
	}{
		{
			name: "applied",
			fail: func(*reconcilertest.Fake) {},
			want: []string{
				"SetTables(2 entries)",
				"SetTable(1, [2 1 2]) in batch",
				"SetTable(3, []) in batch",
			},
			wantErr: []error{nil, nil},
		},
		{
			name: "whole batch fails",
			fail: func(f *reconcilertest.Fake) { f.FailNth(1, boom) },
			want: []string{
				"SetTables(2 entries) failed: boom",
			},
			wantErr: []error{boom, boom},
		},
		{
			name: "one entry fails, the next still applies",
			fail: func(f *reconcilertest.Fake) { f.FailNth(2, boom) },
			want: []string{
				"SetTables(2 entries)",
				"SetTable(1, [2 1 2]) in batch failed: boom",
				"SetTable(3, []) in batch",
			},
			wantErr: []error{boom, nil},
		},
		{
			name: "FailOn sees entries with their position",
			fail: func(f *reconcilertest.Fake) {
				f.FailOn(func(op reconcilertest.Op) error {
					if op.Kind == reconcilertest.OpSetTable && op.Batch == 2 {
						return boom
					}
					return nil
				})
			},
			want: []string{
				"SetTables(2 entries)",
				"SetTable(1, [2 1 2]) in batch",
				"SetTable(3, []) in batch failed: boom",
			},
			wantErr: []error{nil, boom},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := programmed(t)
			f.ResetOps()
			tt.fail(f)
			errs := f.SetTables([]reconciler.ServiceID{1, 3}, tables)
			if len(errs) != len(tt.wantErr) {
				t.Fatalf("SetTables returned %d errors, want %d", len(errs), len(tt.wantErr))
			}
			for i := range errs {
				if !errors.Is(errs[i], tt.wantErr[i]) || (errs[i] == nil) != (tt.wantErr[i] == nil) {
					t.Errorf("entry %d: %v, want %v", i, errs[i], tt.wantErr[i])
				}
			}
			if diff := cmp.Diff(tt.want, opStrings(f.Ops())); diff != "" {
				t.Errorf("ops (-want +got):\n%s", diff)
			}
			// Each entry that succeeded is in the maps, and only those.
			st := map[reconciler.ServiceID][]reconciler.BackendID{}
			for _, s := range f.State().Services {
				if s.HasTable {
					st[s.ID] = s.Table
				}
			}
			want1 := "[1 2 1]" // as programmed
			if tt.wantErr[0] == nil {
				want1 = "[2 1 2]"
			}
			if got := fmt.Sprint(st[1]); got != want1 {
				t.Errorf("table 1 = %s, want %s", got, want1)
			}
			if _, ok := st[3]; ok != (tt.wantErr[1] == nil) {
				t.Errorf("table 3 present = %v, want %v", ok, tt.wantErr[1] == nil)
			}
		})
	}
}

func TestDeleteTablesRecordsEntries(t *testing.T) {
	f := programmed(t)
	if err := f.SetTable(2, nil); err != nil {
		t.Fatal(err)
	}
	if err := f.DeleteService(1, fe); err != nil {
		t.Fatal(err)
	}
	f.ResetOps()
	errs := f.DeleteTables([]reconciler.ServiceID{1, 9, 2})
	if errs[0] != nil || errs[1] == nil || errs[2] != nil {
		t.Errorf("DeleteTables = %v, want only the missing table 9 refused", errs)
	}
	want := []string{
		"DeleteTables(3 entries)",
		"DeleteTable(1) in batch",
		"DeleteTable(9) in batch failed: table of service id 9: no such entry",
		"DeleteTable(2) in batch",
	}
	if diff := cmp.Diff(want, opStrings(f.Ops())); diff != "" {
		t.Errorf("ops (-want +got):\n%s", diff)
	}
	if got := f.Dump(); strings.Contains(got, "tables:\n  ") {
		t.Errorf("tables left:\n%s", got)
	}
}

func TestBatchRefusals(t *testing.T) {
	f := programmed(t)
	f.ResetOps()
	before := f.Dump()
	for name, errs := range map[string][]error{
		"duplicate id":      f.SetTables([]reconciler.ServiceID{2, 2}, [][]reconciler.BackendID{{1}, {1}}),
		"length mismatch":   f.SetTables([]reconciler.ServiceID{2, 3}, [][]reconciler.BackendID{{1}}),
		"duplicate deletes": f.DeleteTables([]reconciler.ServiceID{1, 1}),
	} {
		for i, err := range errs {
			if err == nil {
				t.Errorf("%s: entry %d accepted", name, i)
			}
		}
	}
	if got := f.Dump(); got != before {
		t.Errorf("refused batches changed the maps:\n%s", got)
	}
	for _, op := range f.Ops() {
		if !op.IsBatch() || op.Err == nil {
			t.Errorf("op %s: want only failed batch openings", op)
		}
	}
}

// CheckEachOp looks at every entry boundary: a batch whose first entry
// breaks the rules and whose second repairs them is still caught.
func TestCheckEachOpInsideBatch(t *testing.T) {
	f := programmed(t)
	f.CheckEachOp(true)
	f.ResetOps()
	if err := f.SetBackend(3, backend("10.1.0.3:80", 2)); err != nil {
		t.Fatal(err)
	}
	// Entry 1 gives service 1 a table naming service 2's backend; entry 2
	// cannot undo that, but a later SetTable does.
	errs := f.SetTables([]reconciler.ServiceID{1, 2}, [][]reconciler.BackendID{{3, 3, 3}, {3}})
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	if err := f.SetTable(1, []reconciler.BackendID{1, 2, 1}); err != nil {
		t.Fatal(err)
	}
	err := f.CheckInvariants()
	if err == nil || !strings.Contains(err.Error(), "after op 3 SetTable(1, [3 3 3]) in batch") {
		t.Errorf("CheckInvariants = %v, want the violation after the batch's first entry", err)
	}
}

func TestUnbatched(t *testing.T) {
	f := reconcilertest.NewFake()
	var dp reconciler.Datapath = f
	if _, ok := dp.(reconciler.TableBatcher); !ok {
		t.Error("Fake does not batch")
	}
	if _, ok := reconcilertest.Unbatched(f).(reconciler.TableBatcher); ok {
		t.Error("Unbatched(f) still batches")
	}
	if err := reconcilertest.Unbatched(f).SetTable(1, nil); err != nil {
		t.Fatal(err)
	}
	if got := opStrings(f.Ops()); len(got) != 1 || got[0] != "SetTable(1, [])" {
		t.Errorf("ops through Unbatched = %v", got)
	}
}
