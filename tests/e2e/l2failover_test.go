// SPDX-License-Identifier: Apache-2.0

package e2e

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"slices"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"
	"github.com/mdlayher/packet"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/l4lb/l4lb/lb/api"
	"github.com/l4lb/l4lb/tests/topo"
)

// l2FailoverConfig is l2Config with failover on, under the box's name.
func l2FailoverConfig(name string, vips ...netip.Addr) string {
	return l2Config(vips...) + fmt.Sprintf("\n[l2.failover]\nname = %q\n", name)
}

// arpFrame is an ARP frame seen on the client: who sent it, when, and
// whether it was a reply for the VIP or a gratuitous announcement of it.
type arpFrame struct {
	mac        string
	at         time.Time
	gratuitous bool
}

// arpWatch records, on the client, every ARP reply and gratuitous ARP for
// one VIP, and can ask for the VIP.
type arpWatch struct {
	conn   *packet.Conn
	ifi    *net.Interface
	client netip.Addr
	vip    netip.Addr
	mu     sync.Mutex
	frames []arpFrame
}

func watchARP(t *testing.T, h *topo.Host, vip netip.Addr) *arpWatch {
	w := &arpWatch{vip: vip, client: h.Addr4}
	w.ifi, w.conn = captureFrames(t, h, unix.ETH_P_ARP, func(pkt gopacket.Packet) {
		arp, ok := pkt.Layer(layers.LayerTypeARP).(*layers.ARP)
		if !ok || len(arp.SourceProtAddress) != 4 || netip.AddrFrom4([4]byte(arp.SourceProtAddress)) != vip {
			return
		}
		f := arpFrame{mac: net.HardwareAddr(arp.SourceHwAddress).String(), at: time.Now()}
		switch {
		case arp.Operation == layers.ARPReply:
		case arp.Operation == layers.ARPRequest && slices.Equal(arp.SourceProtAddress, arp.DstProtAddress):
			f.gratuitous = true
		default:
			return
		}
		w.mu.Lock()
		w.frames = append(w.frames, f)
		w.mu.Unlock()
	})
	return w
}

// ask broadcasts an ARP request for the VIP from the client.
func (w *arpWatch) ask() error {
	eth := &layers.Ethernet{SrcMAC: w.ifi.HardwareAddr, DstMAC: layers.EthernetBroadcast, EthernetType: layers.EthernetTypeARP}
	arp := &layers.ARP{
		AddrType: layers.LinkTypeEthernet, Protocol: layers.EthernetTypeIPv4, HwAddressSize: 6, ProtAddressSize: 4,
		Operation: layers.ARPRequest, SourceHwAddress: w.ifi.HardwareAddr, SourceProtAddress: w.client.AsSlice(),
		DstHwAddress: make([]byte, 6), DstProtAddress: w.vip.AsSlice(),
	}
	buf := gopacket.NewSerializeBuffer()
	if err := gopacket.SerializeLayers(buf, gopacket.SerializeOptions{FixLengths: true}, eth, arp); err != nil {
		return err
	}
	_, err := w.conn.WriteTo(buf.Bytes(), &packet.Addr{HardwareAddr: layers.EthernetBroadcast})
	return err
}

// since returns the frames seen at or after t.
func (w *arpWatch) since(t time.Time) []arpFrame {
	w.mu.Lock()
	defer w.mu.Unlock()
	i, _ := slices.BinarySearchFunc(w.frames, t, func(f arpFrame, t time.Time) int { return f.at.Compare(t) })
	return slices.Clone(w.frames[i:])
}

// probe asks for the VIP every 20 ms until stop is closed, and counts
// the answers by MAC and the questions that two boxes answered: replies of
// two MACs closer together than the probe interval.
func (w *arpWatch) probe(t *testing.T, stop <-chan struct{}) (done func() (answered map[string]int, doubles []string)) {
	start := time.Now()
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		for {
			if err := w.ask(); err != nil {
				t.Errorf("ARP request: %v", err)
				return
			}
			select {
			case <-stop:
				return
			case <-time.After(20 * time.Millisecond):
			}
		}
	}()
	return func() (map[string]int, []string) {
		<-finished
		answered := map[string]int{}
		var doubles []string
		var last arpFrame
		for _, f := range w.since(start) {
			if f.gratuitous {
				continue
			}
			answered[f.mac]++
			if last.mac != "" && last.mac != f.mac && f.at.Sub(last.at) < 10*time.Millisecond {
				doubles = append(doubles, fmt.Sprintf("%s at %s and %s at %s", last.mac, last.at.Format("15:04:05.000"), f.mac, f.at.Format("15:04:05.000")))
			}
			last = f
		}
		return answered, doubles
	}
}

// clientNeighbour is the client's neighbour entry for vip on the link with
// index idx: its MAC, or "" without one. Safe off the test's goroutine.
func clientNeighbour(tp *topo.Topology, idx int, vip netip.Addr) string {
	neigh, err := tp.Client.NS.Netlink().NeighList(idx, netlink.FAMILY_V4)
	if err != nil {
		return "error: " + err.Error()
	}
	for _, n := range neigh {
		if n.IP.Equal(net.IP(vip.AsSlice())) && n.HardwareAddr != nil {
			return n.HardwareAddr.String()
		}
	}
	return ""
}

// l2Roles polls both boxes' admin APIs until exactly one is active and the
// other standby, and returns them in that order.
func l2Roles(t *testing.T, boxes []*topo.L4LBD, within time.Duration) (active, standby *topo.L4LBD) {
	t.Helper()
	var last []string
	for deadline := time.Now().Add(within); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		last = last[:0]
		active, standby = nil, nil
		for _, d := range boxes {
			f := l2Failover(t, d)
			role := "unreachable"
			if f != nil {
				role = f.Role
			}
			last = append(last, d.Host.Name+": "+role)
			switch role {
			case "active":
				if active == nil {
					active = d
				} else {
					active = nil
				}
			case "standby":
				standby = d
			}
		}
		if active != nil && standby != nil {
			return active, standby
		}
	}
	t.Fatalf("no settled active/standby pair within %s: %v", within, last)
	return nil, nil
}

func l2Failover(t *testing.T, d *topo.L4LBD) *api.L2Failover {
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	st, err := d.API().Status(ctx)
	if err != nil || st.L2 == nil {
		return nil
	}
	return st.L2.Failover
}

// TestL2Failover runs two l4lbd boxes with [l2.failover] on the clients'
// segment and fails the active one, trial after trial: l4lbd killed
// (SIGKILL), frozen (SIGSTOP), the box's switch port dropping every frame,
// and a clean stop (SIGTERM). Each time the client's neighbour entry for
// the VIP must move to the standby's MAC, a new connection must succeed,
// and the long DSR flows opened at the start must go on to their first
// backend (the shared seed); the failed box then comes back, and while it
// does no ARP request may get two answers. Durations are logged
// (MEASURE), never asserted.
func TestL2Failover(t *testing.T) {
	// Each trial restarts a box for each kind of failure: one under
	// `make test`, L4LB_FAILOVER_TRIALS (make failover) to measure.
	trials := 1
	if os.Getenv("L4LB_FAILOVER_TRIALS") != "" {
		trials = failoverTrials(t)
	}
	tp := topo.New(t, topo.Options{LBs: 2, Backends: 2})
	for _, be := range tp.Backends {
		be.HoldVIPs(l2VIP)
		be.StartCompanion(l4lbd(), l2VIP.String())
		be.Serve(netip.AddrPortFrom(l2VIP, 80))
	}
	watch := watchARP(t, tp.Client, l2VIP)
	clientIdx := tp.Client.NS.Link(t, tp.Client.Iface).Attrs().Index
	var boxes []*topo.L4LBD
	for _, h := range tp.LBs {
		boxes = append(boxes, h.StartL4LBD(l4lbd(), l2FailoverConfig(h.Name, l2VIP)))
	}
	active, standby := l2Roles(t, boxes, 10*time.Second)
	t.Logf("%s active, %s standby", active.Host.Name, standby.Host.Name)
	if !reachable(tp, netip.AddrPortFrom(l2VIP, 80)) {
		t.Fatalf("%s not reachable through the active box\n%s", l2VIP, active.Log())
	}
	if got := clientNeighbour(tp, clientIdx, l2VIP); got != active.Host.MAC.String() {
		t.Fatalf("client's neighbour entry for %s: %q, want the active box's %s", l2VIP, got, active.Host.MAC)
	}
	flows, stopFlows := startLongFlows(t, tp, netip.AddrPortFrom(l2VIP, 80), 8, 43000)
	defer func() {
		if stopFlows != nil {
			stopFlows()
		}
	}()

	type failure struct {
		name string
		// split: the failed box lives on, cut off, and stays active.
		split bool
		// fail returns when the failure began (after any preparation)
		// and how to undo it.
		fail func(d *topo.L4LBD) (restore func(), at time.Time)
	}
	failures := []failure{
		{"l4lbd killed (SIGKILL)", false, func(d *topo.L4LBD) (func(), time.Time) {
			at := time.Now()
			d.Kill()
			return d.Start, at
		}},
		{"l4lbd frozen (SIGSTOP)", false, func(d *topo.L4LBD) (func(), time.Time) {
			at := time.Now()
			if err := d.Signal(syscall.SIGSTOP); err != nil {
				t.Fatal(err)
			}
			return func() { _ = d.Signal(syscall.SIGCONT) }, at
		}},
		{"switch port dropping every frame", true, func(d *topo.L4LBD) (func(), time.Time) {
			return tp.BlackholeAt(d.Host)
		}},
		{"l4lbd stopped (SIGTERM)", false, func(d *topo.L4LBD) (func(), time.Time) {
			at := time.Now()
			if err := d.Stop(); err != nil {
				t.Fatalf("stop: %v", err)
			}
			return d.Start, at
		}},
	}
	var splitDoubles []int
	took := map[string][]time.Duration{}
	tookGARP := map[string][]time.Duration{}
	for i := range trials {
		for _, f := range failures {
			from, to := active, standby
			// The client's kernel: its entry for the VIP moves to the
			// standby's MAC when the standby's gratuitous ARP arrives.
			// Watched from before the failure: a clean stop hands
			// over before l4lbd has exited.
			movedC := make(chan time.Time, 1)
			go func() {
				for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(2 * time.Millisecond) {
					if clientNeighbour(tp, clientIdx, l2VIP) == to.Host.MAC.String() {
						movedC <- time.Now()
						return
					}
				}
				movedC <- time.Time{}
			}()
			restore, start := f.fail(from)
			moved := <-movedC
			if moved.IsZero() {
				restore()
				t.Fatalf("%s, trial %d: the client's entry for %s did not move to %s (%s) within 10s: %q\n%s", f.name, i, l2VIP, to.Host.Name, to.Host.MAC, clientNeighbour(tp, clientIdx, l2VIP), to.Log())
			}
			// The capture's reader may lag the client's kernel.
			var garp time.Time
			for deadline := time.Now().Add(2 * time.Second); garp.IsZero() && time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
				for _, fr := range watch.since(start) {
					if fr.gratuitous && fr.mac == to.Host.MAC.String() {
						garp = fr.at
						break
					}
				}
			}
			if garp.IsZero() {
				t.Errorf("%s, trial %d: no gratuitous ARP from %s (%s) after it took over:\n%s", f.name, i, to.Host.Name, to.Host.MAC, grepLines(to.Log(), "L2 failover"))
			}
			took[f.name] = append(took[f.name], moved.Sub(start))
			tookGARP[f.name] = append(tookGARP[f.name], garp.Sub(start))
			t.Logf("MEASURE L2 %s, trial %d (%s -> %s): failure -> gratuitous ARP %s, client's neighbour entry moved %s",
				f.name, i, from.Host.Name, to.Host.Name, garp.Sub(start).Round(time.Millisecond), moved.Sub(start).Round(time.Millisecond))
			if c, err := tp.Client.DialTCPTimeout(0, netip.AddrPortFrom(l2VIP, 80), 2*time.Second); err != nil {
				t.Errorf("%s, trial %d: new connection through %s after the takeover: %v", f.name, i, to.Host.Name, err)
			} else {
				if err := c.Echo("after takeover"); err != nil {
					t.Errorf("%s, trial %d: echo after the takeover: %v", f.name, i, err)
				}
				c.Abort()
			}

			// The failed box comes back; no ARP request may get two
			// answers meanwhile.
			stopProbe := make(chan struct{})
			probed := watch.probe(t, stopProbe)
			restore()
			active, standby = l2Roles(t, boxes, 15*time.Second)
			// One more detection time: a box that would still claim
			// does so now.
			time.Sleep(time.Second)
			if a, s := l2Roles(t, boxes, time.Second); a != active || s != standby {
				t.Errorf("%s, trial %d: roles changed after settling: %s active, then %s", f.name, i, active.Host.Name, a.Host.Name)
				active, standby = a, s
			}
			close(stopProbe)
			answered, doubles := probed()
			if f.split {
				// The cut-off box stayed active, alone; until the
				// first advert crosses the healed link both answer.
				// The lower ranked then steps down.
				splitDoubles = append(splitDoubles, len(doubles))
				t.Logf("%s, trial %d: back, %s active; ARP answers by MAC: %v; questions answered twice while the split healed: %d %v", f.name, i, active.Host.Name, answered, len(doubles), doubles)
				continue
			}
			if active != to {
				// Equal priorities: the box that took over keeps the
				// VIPs, so the clients do not move twice.
				t.Errorf("%s, trial %d: %s took the VIPs back from %s when it came back", f.name, i, active.Host.Name, to.Host.Name)
			}
			if len(doubles) > 0 || len(answered) != 1 || answered[active.Host.MAC.String()] == 0 {
				t.Errorf("%s, trial %d: ARP answers while %s came back, by MAC: %v, answered twice: %v; want only the active %s (%s)", f.name, i, from.Host.Name, answered, doubles, active.Host.Name, active.Host.MAC)
			}
			t.Logf("%s, trial %d: back, %s active; ARP answers by MAC while it came back: %v", f.name, i, active.Host.Name, answered)
		}
	}
	stopFlows()
	stopFlows = nil
	var maxGap time.Duration
	for _, f := range flows {
		if f.broken.Load() {
			t.Errorf("long flow from port %d to %s broke: %v", f.sport, f.c.Backend, f.err.Load())
		}
		maxGap = max(maxGap, time.Duration(f.maxGap.Load()))
	}
	for _, f := range failures {
		t.Logf("MEASURE L2 takeover, %s, failover 3x200ms: failure -> client's neighbour entry moved: %s; -> gratuitous ARP: %s", f.name, durations(took[f.name]), durations(tookGARP[f.name]))
	}
	t.Logf("MEASURE L2 failover: ARP questions answered by both boxes while a cut-off box came back, per trial: %v", splitDoubles)
	t.Logf("MEASURE L2 failover: %d long DSR flows through every takeover: longest pause %s", len(flows), maxGap.Round(time.Millisecond))
	for _, d := range boxes {
		if f := l2Failover(t, d); f != nil {
			t.Logf("%s: role %s, transitions %v, conflicts %d", d.Host.Name, f.Role, f.Transitions, f.Conflicts)
		}
	}
}
