// SPDX-License-Identifier: Apache-2.0

package maglev

import (
	"fmt"
	"net/netip"
	"strings"
	"testing"
)

// disruption compares two tables by backend address. moved counts slots
// whose owner changed; extra counts those that moved between two backends
// present in both sets, i.e. moves that the added or removed backend did not
// force. extra is what breaks established flows needlessly when the
// connection table does not cover them (another box, a restart).
func disruption(oldBs []Backend, oldT []int32, newBs []Backend, newT []int32) (moved, extra int) {
	inOld := make(map[netip.AddrPort]bool, len(oldBs))
	for _, b := range oldBs {
		if b.Weight > 0 {
			inOld[b.Addr] = true
		}
	}
	inNew := make(map[netip.AddrPort]bool, len(newBs))
	for _, b := range newBs {
		if b.Weight > 0 {
			inNew[b.Addr] = true
		}
	}
	for s := range oldT {
		o, n := oldBs[oldT[s]].Addr, newBs[newT[s]].Addr
		if o == n {
			continue
		}
		moved++
		if inNew[o] && inOld[n] {
			extra++
		}
	}
	return moved, extra
}

// disruptionRow is one line of the disruption report.
type disruptionRow struct {
	n, trials      int
	m              uint32
	removeForced   float64 // 100/N: the removed backend's share, in % of M
	removeMoved    float64 // mean % of M
	removeExtra    float64 // mean % of M
	removeExtraMax float64
	addForced      float64 // 100/(N+1): the added backend's share
	addMoved       float64
	addExtra       float64
	addExtraMax    float64
}

// measureDisruption removes and adds one backend, trials times each with a
// different backend, on N backends in a table of size m.
func measureDisruption(t testing.TB, m uint32, n, trials int) disruptionRow {
	row := disruptionRow{n: n, m: m, trials: trials, removeForced: 100 / float64(n), addForced: 100 / float64(n+1)}
	all := makeBackends(n + trials)
	base := all[:n]
	var b Builder
	baseT, err := b.Build(testSeed, m, base, nil)
	if err != nil {
		t.Fatal(err)
	}
	baseT = append([]int32(nil), baseT...)
	pct := func(x int) float64 { return 100 * float64(x) / float64(m) }
	var table []int32
	for k := range trials {
		// Remove backend k*n/trials: spread over the list.
		removed := make([]Backend, 0, n-1)
		removed = append(removed, base[:k*n/trials]...)
		removed = append(removed, base[k*n/trials+1:]...)
		if table, err = b.Build(testSeed, m, removed, table); err != nil {
			t.Fatal(err)
		}
		moved, extra := disruption(base, baseT, removed, table)
		row.removeMoved += pct(moved) / float64(trials)
		row.removeExtra += pct(extra) / float64(trials)
		row.removeExtraMax = max(row.removeExtraMax, pct(extra))

		added := append(append(make([]Backend, 0, n+1), base...), all[n+k])
		if table, err = b.Build(testSeed, m, added, table); err != nil {
			t.Fatal(err)
		}
		moved, extra = disruption(base, baseT, added, table)
		row.addMoved += pct(moved) / float64(trials)
		row.addExtra += pct(extra) / float64(trials)
		row.addExtraMax = max(row.addExtraMax, pct(extra))
	}
	return row
}

// disruptionReport formats rows as a Markdown table for the benchmark report.
func disruptionReport(rows []disruptionRow) string {
	var sb strings.Builder
	sb.WriteString("| N | M | trials | remove: forced | remove: moved | remove: extra (mean / max) | add: forced | add: moved | add: extra (mean / max) |\n")
	sb.WriteString("|---|---|---|---|---|---|---|---|---|\n")
	for _, r := range rows {
		fmt.Fprintf(&sb, "| %d | %d | %d | %.3f%% | %.3f%% | %.3f%% / %.3f%% | %.3f%% | %.3f%% | %.3f%% / %.3f%% |\n",
			r.n, r.m, r.trials, r.removeForced, r.removeMoved, r.removeExtra, r.removeExtraMax,
			r.addForced, r.addMoved, r.addExtra, r.addExtraMax)
	}
	return sb.String()
}

// TestDisruption measures how many slots change owner when one backend is
// added or removed, beyond the ones that must. Bounds were set from
// measurements with the fixed seed and backends of makeBackends; see the
// logged table (go test -run TestDisruption -v).
func TestDisruption(t *testing.T) {
	const m = 65521
	tests := []struct {
		n, trials int
		// Upper bounds on the extra disruption, in % of M, for the
		// worst trial.
		maxRemoveExtra, maxAddExtra float64
	}{
		// Measured worst trials: N=10 0.29% / 0.53%, N=100 0.58% /
		// 0.61%, N=1000 0.62% / 0.62%.
		{n: 10, trials: 10, maxRemoveExtra: 1.5, maxAddExtra: 1.5},
		{n: 100, trials: 10, maxRemoveExtra: 1.5, maxAddExtra: 1.5},
		{n: 1000, trials: 5, maxRemoveExtra: 1.5, maxAddExtra: 1.5},
	}
	var rows []disruptionRow
	for _, tt := range tests {
		if testing.Short() && tt.n > 100 {
			continue
		}
		r := measureDisruption(t, m, tt.n, tt.trials)
		rows = append(rows, r)
		if r.removeExtraMax >= tt.maxRemoveExtra {
			t.Errorf("N=%d M=%d: removing a backend moved %.3f%% of slots between surviving backends, want < %.1f%%",
				tt.n, m, r.removeExtraMax, tt.maxRemoveExtra)
		}
		if r.addExtraMax >= tt.maxAddExtra {
			t.Errorf("N=%d M=%d: adding a backend moved %.3f%% of slots between existing backends, want < %.1f%%",
				tt.n, m, r.addExtraMax, tt.maxAddExtra)
		}
		// The forced part alone is the removed or added backend's share
		// (give or take one slot); the total can never be below it.
		if r.removeMoved < r.removeForced*0.99 || r.addMoved < r.addForced*0.99 {
			t.Errorf("N=%d: moved %.3f%% (remove) and %.3f%% (add), less than the forced %.3f%% and %.3f%%: the measurement is broken",
				tt.n, r.removeMoved, r.addMoved, r.removeForced, r.addForced)
		}
	}
	t.Logf("Maglev disruption (seed %s):\n%s", testSeed, disruptionReport(rows))
}
