// SPDX-License-Identifier: Apache-2.0

package e2e

import (
	"fmt"
	"net/netip"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"

	"github.com/l4lb/l4lb/bpf"
	"github.com/l4lb/l4lb/lb"
	"github.com/l4lb/l4lb/tests/topo"
)

// selfCheckConfig is dsrConfig with three backends, metrics on, and the
// self-check every interval.
func selfCheckConfig(interval string) string {
	cfg := withMetrics(dsrConfig(21, 22, 23))
	return strings.Replace(cfg, "[daemon]\n", fmt.Sprintf("[daemon]\nself_check_interval = %q\n", interval), 1)
}

// pins opens the maps l4lbd pinned under dir, as an operator's bpftool
// would.
type pins struct {
	t   *testing.T
	dir string
}

func (p pins) open(name ...string) *ebpf.Map {
	p.t.Helper()
	m, err := ebpf.LoadPinnedMap(filepath.Join(append([]string{p.dir}, name...)...), nil)
	if err != nil {
		p.t.Fatalf("open pinned map %v: %v", name, err)
	}
	p.t.Cleanup(func() { m.Close() })
	return m
}

// rotateRow rotates the 16 slots of chunk key of the table of the service
// s is a snapshot of.
func (p pins) rotateRow(s snapshot, key uint32) {
	p.t.Helper()
	table := p.open("maglev_tables", strconv.FormatUint(uint64(s.entry.Id), 10))
	row := s.table[key]
	rot := [16]uint32(append(row[1:], row[0]))
	if err := table.Update(&key, &rot, ebpf.UpdateExist); err != nil {
		p.t.Fatal(err)
	}
}

func svcMapKey(fe lb.Frontend) bpf.LbSvcKey {
	port := [2]byte{byte(fe.Port >> 8), byte(fe.Port)}
	return bpf.LbSvcKey{Addr: fe.Addr.As16(), Port: uint16(port[0]) | uint16(port[1])<<8, Proto: uint8(fe.Proto)}
}

// snapshot is what the control-plane maps hold for one service: its entry,
// its table's chunks and its backends' entries.
type snapshot struct {
	entry    bpf.LbSvcValue
	table    [][16]uint32
	backends map[uint32]bpf.LbBackend
}

func (p pins) snapshot(fe lb.Frontend) (snapshot, error) {
	var s snapshot
	k := svcMapKey(fe)
	if err := p.open(bpf.LbMapServices).Lookup(&k, &s.entry); err != nil {
		return s, fmt.Errorf("service entry %s: %w", fe, err)
	}
	table := p.open("maglev_tables", strconv.FormatUint(uint64(s.entry.Id), 10))
	s.backends = map[uint32]bpf.LbBackend{}
	bm := p.open(bpf.LbMapBackends)
	for key := uint32(0); key < table.MaxEntries(); key++ {
		var row [16]uint32
		if err := table.Lookup(&key, &row); err != nil {
			return s, err
		}
		s.table = append(s.table, row)
		for i, id := range row {
			if (key == 0 && i == 0) || id == 0 {
				continue
			}
			if _, ok := s.backends[id]; !ok {
				var b bpf.LbBackend
				if err := bm.Lookup(&id, &b); err != nil {
					return s, err
				}
				s.backends[id] = b
			}
		}
	}
	return s, nil
}

func (s snapshot) equal(o snapshot) bool {
	if s.entry.Id != o.entry.Id || s.entry.Mode != o.entry.Mode || s.entry.Dispatch != o.entry.Dispatch ||
		s.entry.Flags != o.entry.Flags || s.entry.TableSize != o.entry.TableSize || s.entry.AffinityNs != o.entry.AffinityNs {
		return false
	}
	if !slices.Equal(s.table, o.table) || len(s.backends) != len(o.backends) {
		return false
	}
	for id, b := range s.backends {
		if o.backends[id] != b {
			return false
		}
	}
	return true
}

// driftCount reads l4lb_datapath_drift_total{map=m}.
func driftCount(t *testing.T, d *topo.L4LBD, m string) int {
	t.Helper()
	re := regexp.MustCompile(`(?m)^l4lb_datapath_drift_total\{map="` + m + `"\} (\d+)$`)
	got := re.FindStringSubmatch(scrape(t, d.Host, metricsAddr))
	if got == nil {
		t.Fatalf("no l4lb_datapath_drift_total{map=%q} in the metrics", m)
	}
	n, _ := strconv.Atoi(got[1])
	return n
}

// TestSelfCheckRepairsDrift changes l4lbd's pinned maps behind its back as
// an operator with bpftool would: a Maglev table row, a backend entry, a
// service entry, a deleted service entry. Each change is repaired within
// a few check intervals and reported in the metric and in `l4lbctl
// status`; a connection established before keeps working, its
// connection-table entry untouched.
func TestSelfCheckRepairsDrift(t *testing.T) {
	tp, d := vip4Rig(t, 3, selfCheckConfig("500ms"))
	p := pins{t: t, dir: d.PinDir}
	web := lb.Frontend{Addr: vip4, Port: 80, Proto: lb.TCP}
	dns := lb.Frontend{Addr: vip4, Port: 53, Proto: lb.UDP}
	conn, err := tp.Client.DialTCP(0, netip.AddrPortFrom(vip4, 80))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Abort()
	if err := conn.Echo("before"); err != nil {
		t.Fatal(err)
	}
	ct, err := d.API().Conntrack(t.Context())
	if err != nil {
		t.Fatal(err)
	}

	for _, tc := range []struct {
		name   string
		fe     lb.Frontend
		m      string
		tamper func(s snapshot)
	}{
		{"Maglev table row rotated", web, "maglev", func(s snapshot) { p.rotateRow(s, 3) }},
		{"backend entry rewritten", web, "backends", func(s snapshot) {
			for id, b := range s.backends {
				b.Port ^= 0x100
				if err := p.open(bpf.LbMapBackends).Update(&id, &b, ebpf.UpdateExist); err != nil {
					t.Fatal(err)
				}
				return
			}
		}},
		{"service entry rewritten", web, "services", func(s snapshot) {
			k, v := svcMapKey(web), s.entry
			v.TableSize = 7
			if err := p.open(bpf.LbMapServices).Update(&k, &v, ebpf.UpdateExist); err != nil {
				t.Fatal(err)
			}
		}},
		{"service entry deleted", dns, "services", func(snapshot) {
			k := svcMapKey(dns)
			if err := p.open(bpf.LbMapServices).Delete(&k); err != nil {
				t.Fatal(err)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			want, err := p.snapshot(tc.fe)
			if err != nil {
				t.Fatal(err)
			}
			before := driftCount(t, d, tc.m)
			tc.tamper(want)
			if now, err := p.snapshot(tc.fe); err == nil && now.equal(want) {
				t.Fatal("the change did not change the maps")
			}
			deadline := time.Now().Add(30 * time.Second)
			for {
				now, err := p.snapshot(tc.fe)
				if err == nil && now.equal(want) && driftCount(t, d, tc.m) > before {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("not repaired and counted within 30s (%v)\n%s", err, d.Log())
				}
				time.Sleep(100 * time.Millisecond)
			}
			st, err := d.API().Status(t.Context())
			if err != nil {
				t.Fatal(err)
			}
			if st.SelfCheck == nil || st.SelfCheck.Drifts[tc.m] == 0 || !strings.Contains(st.SelfCheck.LastDrift, tc.m) {
				t.Errorf("status does not report the %s drift: %+v", tc.m, st.SelfCheck)
			}
			out, err := l4lbctl(t, d.Socket, "status")
			if err != nil || !strings.Contains(out, "self-check") || !strings.Contains(out, tc.m) {
				t.Errorf("l4lbctl status does not show the drift: %v\n%s", err, out)
			}
		})
	}
	if err := conn.Echo("after"); err != nil {
		t.Errorf("the connection established before the changes broke: %v", err)
	}
	if ct2, err := d.API().Conntrack(t.Context()); err != nil || ct2.Entries < ct.Entries {
		t.Errorf("connection entries went from %d to %d (%v): the check touched the connection table", ct.Entries, ct2.Entries, err)
	}
	if !strings.Contains(d.Log(), "datapath drift repaired") {
		t.Errorf("no drift in the log")
	}
}

// TestSelfCheckBeforeReady: a restarted l4lbd that adopts the pinned maps
// takes one whole self-check pass before it tells systemd it is ready (the
// background check is an hour off, so a pass seen at READY is that one),
// and a table row changed behind the old l4lbd's back is right by then: the
// adoption read it back as it was and the first reconcile rewrote it, and
// the pass found nothing left to repair.
func TestSelfCheckBeforeReady(t *testing.T) {
	sock, ch := notifications(t)
	tp := vip4Topo(t, 3)
	d := tp.LBs[0].StartL4LBDWrapped([]string{"env", "NOTIFY_SOCKET=" + sock}, l4lbd(), selfCheckConfig("1h"))
	nextNotify(t, ch, "READY=1")
	p := pins{t: t, dir: d.PinDir}
	web := lb.Frontend{Addr: vip4, Port: 80, Proto: lb.TCP}
	want, err := p.snapshot(web)
	if err != nil {
		t.Fatal(err)
	}
	// The running l4lbd checks next in an hour: the change stays.
	p.rotateRow(want, 5)
	d.Restart()
	nextNotify(t, ch, "READY=1")
	if now, err := p.snapshot(web); err != nil || !now.equal(want) {
		t.Fatalf("table not repaired when l4lbd said ready (%v)\n%s", err, d.Log())
	}
	st, err := d.API().Status(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if st.SelfCheck == nil || st.SelfCheck.Passes != 1 || st.SelfCheck.LastPassDrifts != 0 {
		t.Errorf("status after the restart: %+v; want the one pass before ready, clean", st.SelfCheck)
	}
}
