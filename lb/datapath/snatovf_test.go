// SPDX-License-Identifier: Apache-2.0

package datapath_test

import (
	"bytes"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/l4lb/l4lb/bpf"
	"github.com/l4lb/l4lb/internal/testnet"
	"github.com/l4lb/l4lb/lb"
	"github.com/l4lb/l4lb/lb/datapath"
	"github.com/l4lb/l4lb/lb/maglev"
)

// monoNow is the kernel's CLOCK_MONOTONIC, which the datapath's coarse
// clock follows a tick behind.
func monoNow(t testing.TB) uint64 {
	t.Helper()
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		t.Fatal(err)
	}
	return uint64(ts.Nano())
}

// clockPast waits until the monotonic clock reads more than d, so that a
// test can place a time d in the past. Only a machine booted seconds ago
// waits at all.
func clockPast(t testing.TB, d time.Duration) {
	t.Helper()
	if now := time.Duration(monoNow(t)); now <= d {
		time.Sleep(d - now + 100*time.Millisecond)
	}
}

func ovfMark(t testing.TB, maps map[string]*ebpf.Map) uint64 {
	t.Helper()
	var zero uint32
	var v uint64
	if err := maps[bpf.LbMapSnatOvfSeen].Lookup(&zero, &v); err != nil {
		t.Fatalf("read the SNAT overflow mark: %v", err)
	}
	return v
}

func setOvfMark(t testing.TB, maps map[string]*ebpf.Map, v uint64) {
	t.Helper()
	var zero uint32
	if err := maps[bpf.LbMapSnatOvfSeen].Update(&zero, &v, ebpf.UpdateExist); err != nil {
		t.Fatalf("write the SNAT overflow mark: %v", err)
	}
}

// markRecent fails unless mark is a time in the last two seconds (the
// datapath writes it at most once a second).
func markRecent(t testing.TB, what string, mark uint64) {
	t.Helper()
	now := monoNow(t)
	if mark == 0 || mark > now || now-mark > uint64(2*time.Second) {
		t.Errorf("%s: SNAT overflow mark %d, want within 2s before now (%d)", what, mark, now)
	}
}

// TestSNATOverflowMark checks the mark that lets new SNAT flows skip the
// overflow tables. A backend has two ports. New flows are sent, at an
// insert rate of one a second, until one is bound in the overflow tables,
// which marks them in use. For TCP that is the second flow (a SYN takes
// no connection entry, so the first took the one token), and both ports
// are then bound, one in each table set; a third SYN, sent once there is a
// token again so that it claims in the main tables, must find the overflow
// binding and be refused rather than share its port: that is the lookup
// the mark must never skip while a binding lives. Then the gate itself:
// with the mark set long ago the overflow binding's reply is not looked up
// (it goes to the stack), and with it current it is again.
func TestSNATOverflowMark(t *testing.T) {
	const lo, hi = 40000, 40001
	timeouts := datapath.SNATTimeouts{TCP: 30 * time.Second, TCPClosing: 30 * time.Second, UDP: 30 * time.Second}
	for _, c := range snatCases() {
		t.Run(c.String(), func(t *testing.T) {
			onOneCPU(t)
			e := newSNATEnv(t, envOptions{insertRate: 1, snatPortMin: lo, snatPortMax: hi, snatTimeouts: timeouts})
			svc := snatService("svc", c.fam.vip, 80, c.proto, c.fam.backends[0])
			e.reconcile(t, svc)
			maps := e.lb.Maps()
			be := netip.AddrPortFrom(c.fam.backends[0], snatBackendPort)
			if m := ovfMark(t, maps); m != 0 {
				t.Fatalf("new datapath: SNAT overflow mark %d, want 0 (no overflow binding made)", m)
			}

			type bound struct {
				f    maglev.Flow
				snat netip.AddrPort
			}
			var (
				f      maglev.Flow
				snat   netip.AddrPort
				sent   int
				opened []bound // the flows bound, with their SNAT address and port
			)
			for port := uint16(1000); ; port++ {
				if port == 1000+hi-lo+1 {
					t.Fatal("every port was bound in the main tables at one new flow a second (a machine so slow that seconds passed?)")
				}
				f = flowTo(svc.Frontend, c.fam.client, port)
				ev := e.events(t)
				snat = e.sendSNAT(t, c.hook, svc, f, clientPacket(f, c.proto == lb.TCP, false))
				sent++
				opened = append(opened, bound{f, snat})
				if e.events(t)["snat_overflow"] > ev["snat_overflow"] {
					break
				}
				if m := ovfMark(t, maps); m != 0 {
					t.Fatalf("a binding in the main tables set the overflow mark to %d", m)
				}
			}
			markRecent(t, "after an overflow binding", ovfMark(t, maps))

			if c.proto == lb.TCP {
				if sent != 2 {
					t.Fatalf("the first SYN overflowed; want it to take the one token")
				}
				// Both handshakes done, no token yet to promote the
				// overflow one: two open bindings, which a new flow
				// may not take (snat_preempt).
				for _, o := range opened {
					synAck(t, e, c.hook, be, o.snat, "handshake")
					e.sendSNAT(t, c.hook, svc, o.f, clientPacket(o.f, false, true))
				}
				// A token for the third flow: its claim goes to the
				// main tables, where the overflow binding's port
				// looks free.
				time.Sleep(1100 * time.Millisecond)
				f2 := flowTo(svc.Frontend, c.fam.client, 1002)
				before := e.reasons(t)
				if r := e.runOn(t, c.hook, e.frame(t, clientPacket(f2, true, false))); r.verdict != c.hook.drop() {
					t.Fatalf("third flow with both ports bound: verdict %s, want %s (it took the overflow binding's port?)",
						c.hook.verdictName(r.verdict), c.hook.verdictName(c.hook.drop()))
				}
				e.expectReasons(t, before, map[string]uint64{"drop_snat_exhausted": 1})
			}
			e.replySNAT(t, c.hook, f, be, snat, false, false)
			markRecent(t, "after a reply on the overflow binding", ovfMark(t, maps))

			// The gate: a mark older than the longest timeout (and the
			// mark's lateness) means no overflow binding can live, and
			// the reply is not looked up; a current one, and it is.
			clockPast(t, timeouts.TCP+5*time.Second)
			setOvfMark(t, maps, monoNow(t)-uint64(timeouts.TCP+4*time.Second))
			in := e.frame(t, replyPacket(be, snat, c.proto, false, false))
			if r := e.runOn(t, c.hook, in); r.verdict != c.hook.pass() || !bytes.Equal(r.out, in) {
				t.Errorf("reply with the mark long past: verdict %s, want it passed untouched", c.hook.verdictName(r.verdict))
			}
			setOvfMark(t, maps, monoNow(t))
			e.replySNAT(t, c.hook, f, be, snat, false, false)
		})
	}
}

// TestSNATOverflowMarkRestart loads datapaths over pinned maps as
// restarted and upgraded l4lbds do: the mark stays what the running
// programs keep, becomes "look always" (~0) while a program that does not
// keep it may have made or may still make overflow bindings, and Retire
// brings that down to now.
func TestSNATOverflowMarkRestart(t *testing.T) {
	testnet.RequireRoot(t)
	dir := pinDir(t, "ovfmark")
	// A binding last used 10s ago is dead by these timeouts (with the
	// mark's 2s of lateness), while one used before a load stays alive
	// through it even when a loaded box takes seconds to verify the
	// program.
	timeouts := datapath.SNATTimeouts{TCP: 5 * time.Second, TCPClosing: 5 * time.Second, UDP: 5 * time.Second}
	clockPast(t, 15*time.Second)
	cfg := datapath.Config{
		PinPath: dir, Seed: testSeed, MaxServices: 16, MaxBackends: 64, ConntrackMax: 4096,
		SNATAddresses: []netip.Addr{lbAddr4, lbAddr6}, SNATTimeouts: timeouts, Log: slog.New(slog.DiscardHandler),
	}
	key := maglev.FlowKey(flowTo(lb.Frontend{Addr: vip4, Port: 80, Proto: lb.TCP}, client4, 1000))
	revKey := bpf.LbSnatRevKey{SnatPort: htons(40000), Proto: 6}
	// binding puts an overflow binding last used at seen into d's tables,
	// as a program would have made it.
	binding := func(d *datapath.LB, seen uint64) {
		t.Helper()
		fwd := bpf.LbSnatFwdValue{BackendId: 1, SnatPort: htons(40000), LastSeen: seen}
		rev := bpf.LbSnatRevValue{SvcId: 1, ClientPort: htons(1000), LastSeen: seen}
		if err := d.Maps()[bpf.LbMapSnatFwdOvf].Put(key[:], &fwd); err != nil {
			t.Fatal(err)
		}
		if err := d.Maps()[bpf.LbMapSnatRevOvf].Put(&revKey, &rev); err != nil {
			t.Fatal(err)
		}
	}
	forget := func(d *datapath.LB) {
		t.Helper()
		_ = d.Maps()[bpf.LbMapSnatFwdOvf].Delete(key[:])
		_ = d.Maps()[bpf.LbMapSnatRevOvf].Delete(&revKey)
	}
	load := func() *datapath.LB {
		t.Helper()
		d, err := datapath.Load(cfg)
		if err != nil {
			t.Fatalf("load: %v", err)
		}
		return d
	}
	retire := func(d *datapath.LB) {
		t.Helper()
		if err := d.Retire(); err != nil {
			t.Fatalf("retire: %v", err)
		}
	}
	const unknown = ^uint64(0)

	d := load()
	if m := ovfMark(t, d.Maps()); m != 0 {
		t.Errorf("first load: mark %d, want 0", m)
	}

	// Restart after this version made a binding: the mark it kept stays.
	now := monoNow(t)
	setOvfMark(t, d.Maps(), now)
	binding(d, now)
	d.Close()
	d = load()
	retire(d)
	if m := ovfMark(t, d.Maps()); m != now {
		t.Errorf("restart with a marked binding: mark %d, want the kept %d", m, now)
	}

	// A dead binding nobody marked (0: never) costs nothing.
	setOvfMark(t, d.Maps(), 0)
	binding(d, monoNow(t)-uint64(10*time.Second))
	d.Close()
	d = load()
	if m := ovfMark(t, d.Maps()); m != 0 {
		t.Errorf("restart with only a dead unmarked binding: mark %d, want 0", m)
	}

	// A live binding the mark does not cover (an older program, after a
	// downgrade, made it): look always until Retire, then now.
	binding(d, monoNow(t))
	d.Close()
	d = load()
	if m := ovfMark(t, d.Maps()); m != unknown {
		t.Errorf("restart with a live unmarked binding: mark %d, want ~0 until Retire", m)
	}
	retire(d)
	markRecent(t, "Retire after a live unmarked binding", ovfMark(t, d.Maps()))

	// The same binding made by the old program after the load, before
	// this one replaced it: Retire finds it.
	setOvfMark(t, d.Maps(), 0)
	forget(d)
	d.Close()
	d = load()
	if m := ovfMark(t, d.Maps()); m != 0 {
		t.Errorf("restart with no overflow binding: mark %d, want 0", m)
	}
	binding(d, monoNow(t))
	retire(d)
	markRecent(t, "Retire after a binding made between load and Retire", ovfMark(t, d.Maps()))

	// An upgrade from an l4lbd before the mark: whatever the tables
	// hold, its program may still make bindings until Retire.
	forget(d)
	d.Close()
	if err := os.Remove(filepath.Join(dir, bpf.LbMapSnatOvfSeen)); err != nil {
		t.Fatalf("remove the mark's pin: %v", err)
	}
	d = load()
	defer d.Close()
	if m := ovfMark(t, d.Maps()); m != unknown {
		t.Errorf("upgrade from before the mark: mark %d, want ~0 until Retire", m)
	}
	retire(d)
	markRecent(t, "Retire after an upgrade", ovfMark(t, d.Maps()))
}
