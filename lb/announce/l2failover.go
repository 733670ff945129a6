// SPDX-License-Identifier: Apache-2.0

package announce

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/mdlayher/packet"
	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"

	"github.com/l4lb/l4lb/lb/config"
)

// Active/standby failover between the L2 boxes of one segment. Every box
// sends a small advert on its L2 interfaces every interval; the live box
// with the best rank answers ARP and neighbour solicitations, the others
// stay silent and take over when it misses detect_multiplier adverts.
//
// Why raw Ethernet frames and not UDP multicast or VRRP: the responder
// already holds packet sockets on exactly these interfaces (CAP_NET_RAW),
// the frames need no IP address, route or firewall rule, and they cannot
// leave the segment whose neighbour caches they are about. VRRP would
// want a virtual MAC per group and owns the addresses it moves; here the
// VIPs stay unconfigured and each box answers with its own MAC, which the
// datapath's XDP program already receives.

const (
	// advertEtherType is IEEE 802's local experimental EtherType 1.
	advertEtherType = 0x88b5
	advertVersion   = 1
	// advertHeader is the advert's fixed part, before the name.
	advertHeader = 11
	// minEthPayload is what a frame carries at least; shorter adverts are
	// padded with zeros.
	minEthPayload = 46
)

// advertMAC is the group address adverts go to: bit 0 of the first octet
// marks a group, bit 1 a locally administered address, so it can clash
// with no vendor's.
var advertMAC = net.HardwareAddr{0x03, 'L', '4', 'L', 'B', '2'}

var advertMagic = [4]byte{'L', '4', 'L', '2'}

// Flags of an advert.
const (
	advActive  = 1 << 0
	advReady   = 1 << 1
	advLeaving = 1 << 2
)

// advert is one box's claim, as it travels after the Ethernet header:
// magic (4), version (1), group (1), priority (1), flags (1), interval in
// milliseconds (2, big endian), name length (1), name.
type advert struct {
	group, priority        uint8
	active, ready, leaving bool
	interval               time.Duration
	name                   string
}

func (a advert) marshal() []byte {
	b := make([]byte, max(advertHeader+len(a.name), minEthPayload))
	copy(b, advertMagic[:])
	b[4], b[5], b[6] = advertVersion, a.group, a.priority
	if a.active {
		b[7] |= advActive
	}
	if a.ready {
		b[7] |= advReady
	}
	if a.leaving {
		b[7] |= advLeaving
	}
	binary.BigEndian.PutUint16(b[8:], uint16(a.interval/time.Millisecond))
	b[10] = uint8(len(a.name))
	copy(b[advertHeader:], a.name)
	return b
}

var errNotAdvert = errors.New("not an l4lb L2 advert")

func parseAdvert(b []byte) (advert, error) {
	if len(b) < advertHeader || !bytes.Equal(b[:4], advertMagic[:]) {
		return advert{}, errNotAdvert
	}
	if b[4] != advertVersion {
		return advert{}, fmt.Errorf("advert version %d, this l4lbd speaks %d", b[4], advertVersion)
	}
	n := int(b[10])
	if n == 0 || len(b) < advertHeader+n {
		return advert{}, fmt.Errorf("advert name of %d bytes in %d", n, len(b)-advertHeader)
	}
	a := advert{
		group: b[5], priority: b[6],
		active: b[7]&advActive != 0, ready: b[7]&advReady != 0, leaving: b[7]&advLeaving != 0,
		interval: time.Duration(binary.BigEndian.Uint16(b[8:])) * time.Millisecond,
		name:     string(b[advertHeader : advertHeader+n]),
	}
	if a.interval <= 0 {
		return advert{}, fmt.Errorf("advert from %s with interval 0", a.name)
	}
	return a, nil
}

// Role is a box's part in L2 failover.
type Role int

// The roles, in the order a starting box goes through them.
const (
	// RoleListening: just started (for one detection time), or back
	// from a stall past its lease (for a quarter interval); the box
	// hears the others before it may claim the VIPs.
	RoleListening Role = iota
	// RoleStandby: another box ranks higher; this one stays silent.
	RoleStandby
	// RoleActive: this box answers for the VIPs.
	RoleActive
)

// Roles lists every role, for reports that want each one.
var Roles = []Role{RoleListening, RoleStandby, RoleActive}

func (r Role) String() string {
	switch r {
	case RoleListening:
		return "listening"
	case RoleStandby:
		return "standby"
	case RoleActive:
		return "active"
	}
	return fmt.Sprintf("role(%d)", int(r))
}

// candidate is what the election compares of a box.
type candidate struct {
	ready    bool
	priority uint8
	active   bool
	name     string
	mac      net.HardwareAddr
}

// beats ranks boxes: one that has checked its backends before one that
// has not (it would answer for VIPs it cannot yet vouch for), then the
// higher priority, then the box already active (a box coming back does
// not pull the clients over again), then the lower name and MAC.
func (a candidate) beats(b candidate) bool {
	switch {
	case a.ready != b.ready:
		return a.ready
	case a.priority != b.priority:
		return a.priority > b.priority
	case a.active != b.active:
		return a.active
	case a.name != b.name:
		return a.name < b.name
	}
	return bytes.Compare(a.mac, b.mac) < 0
}

// peer is another box of the group, as its last advert described it.
type peer struct {
	adv      advert
	mac      net.HardwareAddr
	iface    string
	lastSeen time.Time
}

func (p *peer) candidate() candidate {
	return candidate{ready: p.adv.ready, priority: p.adv.priority, active: p.adv.active, name: p.adv.name, mac: p.mac}
}

// elector runs this box's side of the election.
type elector struct {
	cfg    config.L2Failover
	name   string
	mac    net.HardwareAddr // of the first interface: the tie-break of last resort
	log    *slog.Logger
	ifaces []*l2Iface
	// onActive is called, outside the lock, when this box takes the VIPs.
	onActive func()
	// out sends an advert on every interface: send, or a recorder in
	// the election's unit tests.
	out func(advert)

	// lease is the time (Unix ns) until which this box may answer: set
	// when it becomes active and at each advert it sends, zero when it
	// is not active. A box that stalls (SIGSTOP, a starved process)
	// lets it lapse before the others can take over, so even the
	// readers' queued requests get no answer from a box that may no
	// longer be the active one.
	lease atomic.Int64

	mu        sync.Mutex
	role      Role
	since     time.Time
	holdUntil time.Time
	// resuming: back from a stall past the lease, reading what the
	// others sent meanwhile before deciding.
	resuming    bool
	ready       bool
	peers       map[string]*peer
	transitions map[Role]uint64
	lastSent    time.Time
	// conflicts counts adverts of another active box while this one was
	// active.
	conflicts uint64
}

func newElector(cfg config.L2Failover, ifaces []*l2Iface, log *slog.Logger) (*elector, error) {
	e := &elector{cfg: cfg, name: cfg.Name, ifaces: ifaces, peers: map[string]*peer{}, transitions: map[Role]uint64{}}
	// Until run starts the clock again, nothing may be claimed.
	e.holdUntil = time.Now().Add(cfg.DetectionTime())
	if e.name == "" {
		h, err := os.Hostname()
		if err != nil || h == "" || len(h) > 64 {
			return nil, fmt.Errorf("l2: the host name (%q, %v) cannot name this box in failover adverts: set l2.failover.name", h, err)
		}
		e.name = h
	}
	e.log = log.With("box", e.name, "group", cfg.Group)
	e.mac = ifaces[0].ifi.HardwareAddr
	e.out = e.send
	return e, nil
}

// advertFilter keeps the advert socket to others' frames.
var advertFilter = []bpf.Instruction{
	bpf.LoadExtension{Num: bpf.ExtType},
	bpf.JumpIf{Cond: bpf.JumpEqual, Val: unix.PACKET_OUTGOING, SkipTrue: 1},
	bpf.RetConstant{Val: 0xffff},
	bpf.RetConstant{Val: 0},
}

// openAdverts opens an interface's advert socket and joins the adverts'
// group address, which a NIC would otherwise filter.
func (li *l2Iface) openAdverts() error {
	raw, err := bpf.Assemble(advertFilter)
	if err != nil {
		return err
	}
	if li.adv, err = packet.Listen(li.ifi, packet.Raw, advertEtherType, &packet.Config{Filter: raw}); err != nil {
		return fmt.Errorf("l2: failover advert socket on %s: %w (needs CAP_NET_RAW)", li.ifi.Name, err)
	}
	if err := li.adv.JoinGroup(advertMAC); err != nil {
		return fmt.Errorf("l2: join the failover adverts' group %s on %s: %w", advertMAC, li.ifi.Name, err)
	}
	return nil
}

func (e *elector) detection() time.Duration { return e.cfg.DetectionTime() }

// leaseFor is how long an advert lets this box answer: half an interval
// less than the others wait before they take over.
func (e *elector) leaseFor() time.Duration { return e.detection() - e.cfg.Interval/2 }

// holds reports whether this box is active with a lease that runs.
func (e *elector) holds(now time.Time) bool { return now.UnixNano() < e.lease.Load() }

// run sends adverts and watches the lease until ctx ends, then tells the
// others this box leaves, so that they take over at once.
func (e *elector) run(ctx context.Context, wg *sync.WaitGroup) {
	for _, li := range e.ifaces {
		wg.Add(1)
		go func() { defer wg.Done(); e.read(li) }()
	}
	now := time.Now()
	e.mu.Lock()
	e.setRole(RoleListening, now)
	e.holdUntil = now.Add(e.detection())
	e.mu.Unlock()
	e.log.Info("L2 failover: listening for the other boxes before claiming the VIPs", "priority", e.cfg.Priority, "interval", e.cfg.Interval, "detect_multiplier", e.cfg.DetectMultiplier)
	// Expiry is checked four times an interval, so that a takeover
	// comes at most a quarter interval after the detection time.
	tick := time.NewTicker(e.cfg.Interval / 4)
	defer tick.Stop()
	e.tick(now)
	for {
		select {
		case <-ctx.Done():
			e.mu.Lock()
			e.lease.Store(0)
			adv := e.advertLocked()
			e.mu.Unlock()
			adv.leaving = true
			e.out(adv)
			return
		case <-tick.C:
			// Not the tick's own time: that is when it was due,
			// which after a stall (SIGSTOP) is before the stall,
			// inside the lease that has since lapsed.
			e.tick(time.Now())
		}
	}
}

func (e *elector) tick(now time.Time) {
	e.mu.Lock()
	became := e.decideLocked(now)
	var adv *advert
	// Back from a stall, the box stays silent until it has decided:
	// an advert now would say standby to a box that should wait, or
	// active to one that took over.
	if !e.resuming && (became || now.Sub(e.lastSent) >= e.cfg.Interval-e.cfg.Interval/8) {
		a := e.sentLocked(now)
		adv = &a
	}
	e.mu.Unlock()
	if adv != nil {
		e.out(*adv)
	}
	if became {
		e.onActive()
	}
}

// sentLocked records an advert as sent now, renewing the lease of an
// active box, and returns it.
func (e *elector) sentLocked(now time.Time) advert {
	e.lastSent = now
	if e.role == RoleActive {
		e.lease.Store(now.Add(e.leaseFor()).UnixNano())
	}
	return e.advertLocked()
}

func (e *elector) advertLocked() advert {
	return advert{
		group: e.cfg.Group, priority: e.cfg.Priority, interval: e.cfg.Interval, name: e.name,
		active: e.role == RoleActive, ready: e.ready,
	}
}

// self is this box for the election. Back from a stall it still counts
// as the active one against boxes that did not claim meanwhile, so that
// a stall shorter than the detection time moves nothing.
func (e *elector) self() candidate {
	return candidate{ready: e.ready, priority: e.cfg.Priority, active: e.role == RoleActive || e.resuming, name: e.name, mac: e.mac}
}

// decideLocked forgets the peers that went silent and takes or gives up
// the VIPs; it reports whether this box just became active.
func (e *elector) decideLocked(now time.Time) (became bool) {
	if e.role == RoleActive && !e.holds(now) {
		// Stalled past the lease: another box may have taken over
		// meanwhile, and its adverts wait in the sockets. Stop
		// answering and read them before deciding: a box that took
		// over keeps the VIPs; if none did, this one goes on. Checked
		// first on every path: after a stall, the adverts queued
		// meanwhile may be read before the next tick.
		e.log.Warn("L2 failover: this box stalled past its lease; not answering until it has heard the others",
			"stalled", now.Sub(e.lastSent).Round(time.Millisecond))
		e.setRole(RoleListening, now)
		e.resuming = true
		e.holdUntil = now.Add(e.cfg.Interval / 4)
	}
	for k, p := range e.peers {
		if now.Sub(p.lastSeen) > time.Duration(e.cfg.DetectMultiplier)*p.adv.interval {
			e.log.Warn("L2 failover: box gone (no advert within the detection time)", "peer", p.adv.name, "mac", p.mac, "was", roleOf(p.adv), "last_seen", now.Sub(p.lastSeen).Round(time.Millisecond))
			delete(e.peers, k)
		}
	}
	if now.Before(e.holdUntil) {
		return false
	}
	self, best := e.self(), true
	var winner *peer
	for _, p := range e.peers {
		// Back from a stall, a box that claimed meanwhile wins: it
		// has moved the clients.
		if p.candidate().beats(self) || e.resuming && p.adv.active {
			best, winner = false, p
			break
		}
	}
	e.resuming = false
	switch {
	case best && e.role != RoleActive:
		e.setRole(RoleActive, now)
		e.log.Info("L2 failover: this box is active; answering for the VIPs", "peers", len(e.peers))
		return true
	case !best && e.role != RoleStandby:
		if e.role == RoleActive {
			e.log.Info("L2 failover: stepping down; another box ranks higher", "peer", winner.adv.name, "priority", winner.adv.priority)
		}
		e.setRole(RoleStandby, now)
	}
	return false
}

func roleOf(a advert) Role {
	if a.active {
		return RoleActive
	}
	return RoleStandby
}

func (e *elector) setRole(r Role, now time.Time) {
	if r != RoleActive {
		e.lease.Store(0)
	}
	if r == e.role && !e.since.IsZero() {
		return
	}
	e.role, e.since = r, now
	e.transitions[r]++
	if r == RoleActive {
		e.lease.Store(now.Add(e.leaseFor()).UnixNano())
	}
}

// setReady marks this box as having had every checked backend probed; it
// only ever turns on, so that a backend added later does not demote the
// active box.
func (e *elector) setReady(now time.Time) {
	e.mu.Lock()
	if e.ready {
		e.mu.Unlock()
		return
	}
	e.ready = true
	became := e.decideLocked(now)
	adv := e.sentLocked(now)
	e.mu.Unlock()
	e.out(adv)
	if became {
		e.onActive()
	}
}

// heard takes in another box's advert.
func (e *elector) heard(li *l2Iface, mac net.HardwareAddr, a advert, now time.Time) {
	e.mu.Lock()
	key := a.name + "/" + mac.String()
	p, known := e.peers[key]
	var conflict bool
	switch {
	case a.leaving:
		if known {
			e.log.Info("L2 failover: box leaves the group", "peer", a.name, "mac", mac)
			delete(e.peers, key)
		}
	default:
		if !known {
			p = &peer{mac: slices.Clone(mac), iface: li.ifi.Name}
			e.peers[key] = p
			e.log.Info("L2 failover: box joins the group", "peer", a.name, "mac", mac, "priority", a.priority, "interface", li.ifi.Name)
			if a.name == e.name {
				e.log.Error("L2 failover: another box uses this box's name; give each box its own l2.failover.name", "peer_mac", mac)
			}
		}
		conflict = a.active && e.role == RoleActive && (!known || !p.adv.active)
		p.adv, p.lastSeen = a, now
	}
	became := e.decideLocked(now)
	// Another box claimed the VIPs while this one held them (a segment
	// that split and healed): if this box keeps them, tell the clients
	// again, since the other one may have moved them.
	reclaim := conflict && e.role == RoleActive
	if conflict {
		e.conflicts++
		e.log.Warn("L2 failover: two active boxes; the lower ranked one steps down", "peer", a.name, "keeping", e.role == RoleActive)
	}
	var adv *advert
	// A box new to this one gets this one's advert at once rather than
	// at the next interval: a box starting up learns who is active,
	// and a healed split ends sooner.
	if !e.resuming && (became || reclaim || (!known && !a.leaving)) {
		sent := e.sentLocked(now)
		adv = &sent
	}
	e.mu.Unlock()
	if adv != nil {
		e.out(*adv)
	}
	if became || reclaim {
		e.onActive()
	}
}

func (e *elector) send(a advert) {
	payload := a.marshal()
	for _, li := range e.ifaces {
		frame := make([]byte, 0, 14+len(payload))
		frame = append(frame, advertMAC...)
		frame = append(frame, li.ifi.HardwareAddr...)
		frame = binary.BigEndian.AppendUint16(frame, advertEtherType)
		frame = append(frame, payload...)
		if _, err := li.adv.WriteTo(frame, &packet.Addr{HardwareAddr: advertMAC}); err != nil && !errors.Is(err, net.ErrClosed) {
			e.log.Warn("L2 failover: advert not sent", "interface", li.ifi.Name, "error", err)
		}
	}
}

func (e *elector) read(li *l2Iface) {
	buf := make([]byte, 1514)
	for {
		n, _, err := li.adv.ReadFrom(buf)
		if err != nil {
			if !errors.Is(err, net.ErrClosed) {
				e.log.Error("L2 failover advert socket failed; no longer hearing the other boxes on this interface", "interface", li.ifi.Name, "error", err)
			}
			return
		}
		if n < 14 {
			continue
		}
		src := net.HardwareAddr(buf[6:12])
		if slices.ContainsFunc(e.ifaces, func(o *l2Iface) bool { return bytes.Equal(o.ifi.HardwareAddr, src) }) {
			continue
		}
		a, err := parseAdvert(buf[14:n])
		if err != nil {
			if !errors.Is(err, errNotAdvert) {
				e.log.Warn("L2 failover: advert not understood", "interface", li.ifi.Name, "from", src, "error", err)
			}
			continue
		}
		if a.group != e.cfg.Group {
			continue
		}
		e.heard(li, src, a, time.Now())
	}
}

// BoxStatus is another box of the failover group.
type BoxStatus struct {
	Name      string
	MAC       net.HardwareAddr
	Interface string
	Priority  uint8
	Role      Role
	Ready     bool
	LastSeen  time.Time
}

// FailoverStatus is this box's part in L2 failover.
type FailoverStatus struct {
	Name     string
	Group    uint8
	Priority uint8
	Role     Role
	Since    time.Time
	Ready    bool
	// Transitions counts the entries into each role since l4lbd
	// started.
	Transitions map[Role]uint64
	// Conflicts counts adverts of another active box while this one was
	// active.
	Conflicts uint64
	Interval  time.Duration
	// DetectMultiplier adverts missed take a box for gone.
	DetectMultiplier uint8
	Peers            []BoxStatus
}

func (e *elector) status() *FailoverStatus {
	e.mu.Lock()
	defer e.mu.Unlock()
	st := &FailoverStatus{
		Name: e.name, Group: e.cfg.Group, Priority: e.cfg.Priority, Role: e.role, Since: e.since, Ready: e.ready,
		Transitions: map[Role]uint64{}, Conflicts: e.conflicts, Interval: e.cfg.Interval, DetectMultiplier: e.cfg.DetectMultiplier,
	}
	for r, n := range e.transitions {
		st.Transitions[r] = n
	}
	for _, p := range e.peers {
		st.Peers = append(st.Peers, BoxStatus{
			Name: p.adv.name, MAC: p.mac, Interface: p.iface, Priority: p.adv.priority,
			Role: roleOf(p.adv), Ready: p.adv.ready, LastSeen: p.lastSeen,
		})
	}
	slices.SortFunc(st.Peers, func(a, b BoxStatus) int {
		if c := bytes.Compare([]byte(a.Name), []byte(b.Name)); c != 0 {
			return c
		}
		return bytes.Compare(a.MAC, b.MAC)
	})
	return st
}
