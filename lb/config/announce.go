// SPDX-License-Identifier: Apache-2.0

package config

import (
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Defaults of [bgp], [l2] and [fleet]; etc/l4lb.toml repeats them.
const (
	defaultBGPPort         = 179
	defaultHoldTime        = 90 * time.Second
	defaultConnectRetry    = 5 * time.Second
	defaultRestartTime     = 120 * time.Second
	defaultDrainSeconds    = 5
	defaultMinHealthy      = 1
	defaultFleetKVPrefix   = "l4lb/fleet/"
	defaultFleetSessionTTL = 15 * time.Second
	// BFD: a peer that stops answering is down after 3 × 300 ms.
	defaultBFDMultiplier = 3
	defaultBFDInterval   = 300 * time.Millisecond
	// BFD intervals outside these bounds are typos: below 10 ms a busy
	// host misses packets and flaps, above a minute the hold timer is as
	// fast. The wire carries microseconds.
	minBFDInterval = 10 * time.Millisecond
	maxBFDInterval = time.Minute
	// maxMinHealthy bounds announce_min_healthy: more than a service can
	// have backends is a typo.
	maxMinHealthy = 65536
	// maxRestartTime is what the 12-bit field of the graceful restart
	// capability holds (RFC 4724).
	maxRestartTime = 4095
	// L2 failover: a box that misses 3 adverts sent every 200 ms is gone.
	defaultL2Priority   = 100
	defaultL2Group      = 1
	defaultL2Interval   = 200 * time.Millisecond
	defaultL2Multiplier = 3
	minL2Interval       = 10 * time.Millisecond
	maxL2Interval       = 10 * time.Second
	// Consul refuses session TTLs outside 10s..24h.
	minSessionTTL = 10 * time.Second
	maxSessionTTL = 24 * time.Hour
)

// StopAction is what l4lbd does with its BGP routes when it stops.
type StopAction uint8

// Stop actions.
const (
	// StopKeep closes the sessions without a NOTIFICATION, so routers that
	// negotiated graceful restart keep the routes while l4lbd restarts
	// (the pinned datapath forwards meanwhile).
	StopKeep StopAction = iota
	// StopDrain withdraws every route, waits DrainTime for routers to move
	// the traffic elsewhere, then closes the sessions.
	StopDrain
)

// String returns the config name of the action.
func (a StopAction) String() string {
	if a == StopDrain {
		return "drain"
	}
	return "keep"
}

// Community is a BGP community (RFC 1997): ASN in the high 16 bits, value
// in the low ones.
type Community uint32

// String formats the community as "asn:value", or by its RFC 1997 name.
func (c Community) String() string {
	for name, wk := range wellKnown {
		if wk == c {
			return name
		}
	}
	return fmt.Sprintf("%d:%d", uint32(c)>>16, uint32(c)&0xffff)
}

// LargeCommunity is a BGP large community (RFC 8092).
type LargeCommunity struct {
	Global, Local1, Local2 uint32
}

// String formats the community as "global:local1:local2".
func (c LargeCommunity) String() string { return fmt.Sprintf("%d:%d:%d", c.Global, c.Local1, c.Local2) }

// BGP holds the settings of the embedded BGP speaker ([bgp]), which
// announces each VIP the datapath serves as a /32 or /128 to routers that
// spread flows over the LB boxes by ECMP.
type BGP struct {
	ASN      uint32
	RouterID netip.Addr
	// ListenPort accepts sessions the routers open; 0 only connects out.
	ListenPort uint16
	// NextHop4 and NextHop6 are the next hops of announced IPv4 and IPv6
	// VIPs; invalid means the local address of each session, which is
	// right when the peer shares the VIP's family.
	NextHop4, NextHop6 netip.Addr
	Communities        []Community
	LargeCommunities   []LargeCommunity
	// MinHealthy is the default number of healthy backends a service
	// needs to get its VIP announced.
	MinHealthy int
	// GracefulRestart advertises RFC 4724 graceful restart with
	// RestartTime, so that a restart of l4lbd does not pull traffic.
	GracefulRestart bool
	RestartTime     time.Duration
	OnStop          StopAction
	// DrainTime is how long StopDrain waits after withdrawing.
	DrainTime time.Duration
	Peers     []BGPPeer
}

// BGPPeer is one router l4lbd peers with ([[bgp.peer]]).
type BGPPeer struct {
	Address netip.Addr
	ASN     uint32
	Port    uint16
	// Password is the TCP-MD5 key (RFC 2385); empty: none.
	Password string
	// Keepalive defaults to a third of HoldTime.
	HoldTime     time.Duration
	Keepalive    time.Duration
	ConnectRetry time.Duration
	// Multihop is the TTL of an eBGP session to a router that is not
	// directly connected; 0 means directly connected.
	Multihop uint8
	// Passive waits for the router to connect.
	Passive bool
	// IPv4 and IPv6 are the unicast families announced on the session.
	IPv4, IPv6 bool
	// BFD is the liveness check of the session ([bgp.peer.bfd]).
	BFD BFD
}

// BFD holds the settings of single-hop asynchronous BFD (RFC 5880, 5881)
// with one peer: the router learns within DetectMultiplier × MinRxInterval
// that this box stopped answering, and drops its routes, instead of
// waiting for the hold time. The router must run BFD for this address too.
type BFD struct {
	Enabled bool
	// DetectMultiplier is how many intervals without a packet take the
	// session down.
	DetectMultiplier uint8
	// MinRxInterval is the shortest interval at which this box accepts
	// the peer's packets, MinTxInterval the one at which it wants to send
	// its own; each side's detection time uses the slower of the two.
	MinRxInterval, MinTxInterval time.Duration
}

// DetectionTime is how long the peer may stay silent before this side
// takes the session down (the peer's detection time uses its own
// multiplier and the slower of our transmit and its receive interval).
func (b BFD) DetectionTime() time.Duration {
	return time.Duration(b.DetectMultiplier) * b.MinRxInterval
}

// L2 holds the settings of L2 announcement ([l2]): answering ARP and
// neighbour solicitations for the VIPs on the clients' segment.
type L2 struct {
	Interfaces []string
	MinHealthy int
	// Failover is nil when [l2.failover] is absent or disabled: this box
	// answers alone.
	Failover *L2Failover
}

// L2Failover holds the settings of active/standby failover between the
// boxes of one segment ([l2.failover]): the live box with the best
// (priority, name) answers, the others stay silent until it is gone.
type L2Failover struct {
	// Name identifies the box in its adverts; empty means its host name.
	Name string
	// Group separates independent sets of boxes on one segment: a box
	// hears only the adverts of its own group.
	Group uint8
	// Priority ranks the boxes (higher wins); equal priorities keep the
	// box that is active, so a box coming back does not take over.
	Priority uint8
	// Interval is how often a box sends its advert.
	Interval time.Duration
	// DetectMultiplier adverts missed in a row take a box for gone.
	DetectMultiplier uint8
}

// DetectionTime is how long a box may stay silent before the others take
// it for gone.
func (f L2Failover) DetectionTime() time.Duration {
	return time.Duration(f.DetectMultiplier) * f.Interval
}

// Fleet holds the settings of the fleet check ([fleet]): this box's
// fingerprints published in Consul's KV store next to the other boxes'.
type Fleet struct {
	// Name identifies the box; empty means its host name.
	Name       string
	KVPrefix   string
	SessionTTL time.Duration
}

func (c *checker) bgp(r *rawBGP) *BGP {
	s := scope{c: c}.sub("bgp")
	b := &BGP{
		MinHealthy:      defaultMinHealthy,
		GracefulRestart: true,
		RestartTime:     defaultRestartTime,
		DrainTime:       defaultDrainSeconds * time.Second,
	}
	if r.ASN == nil {
		s.errorf("asn", "bgp.asn is missing: set this box's AS number, e.g. asn = 65001")
	} else if n, ok := s.asn("asn", r.ASN); ok {
		b.ASN = n
	}
	if r.RouterID == nil {
		s.errorf("router_id", "bgp.router_id is missing: set an IPv4 address unique among the routers' peers, usually this box's own address")
	} else if v, ok := s.str("router_id", r.RouterID); ok {
		if a, err := netip.ParseAddr(v); err != nil || !a.Is4() || a.IsUnspecified() {
			s.errorf("router_id", "bgp.router_id = %q is not an IPv4 address: the BGP identifier is written as one (also on IPv6-only boxes), e.g. \"192.0.2.2\"", v)
		} else {
			b.RouterID = a
		}
	}
	if r.ListenPort != nil {
		if n, ok := s.intIn("listen_port", r.ListenPort, 0, 65535, "use 0 (do not listen; connect out only) or a port, usually 179"); ok {
			b.ListenPort = uint16(n)
		}
	}
	b.NextHop4 = nextHop(s, "next_hop_ipv4", r.NextHopIPv4, true)
	b.NextHop6 = nextHop(s, "next_hop_ipv6", r.NextHopIPv6, false)
	if list, ok := s.strs("communities", r.Communities); ok {
		for i, text := range list {
			key := indexPath("communities", i)
			if cm, err := parseCommunity(text); err != nil {
				s.errorf(key, "%s = %q: %v", s.name(key), text, err)
			} else if slices.Contains(b.Communities, cm) {
				s.errorf(key, "%s: %s is listed twice: remove one", s.name(key), cm)
			} else {
				b.Communities = append(b.Communities, cm)
			}
		}
	}
	if list, ok := s.strs("large_communities", r.LargeCommunities); ok {
		for i, text := range list {
			key := indexPath("large_communities", i)
			if cm, err := parseLargeCommunity(text); err != nil {
				s.errorf(key, "%s = %q: %v", s.name(key), text, err)
			} else if slices.Contains(b.LargeCommunities, cm) {
				s.errorf(key, "%s: %s is listed twice: remove one", s.name(key), cm)
			} else {
				b.LargeCommunities = append(b.LargeCommunities, cm)
			}
		}
	}
	if n, ok := s.intIn("announce_min_healthy", r.MinHealthy, 1, maxMinHealthy, fmt.Sprintf("use 1..%d healthy backends (default %d)", maxMinHealthy, defaultMinHealthy)); ok {
		b.MinHealthy = int(n)
	}
	if v, ok := s.boolean("graceful_restart", r.GracefulRestart); ok {
		b.GracefulRestart = v
	}
	if n, ok := s.intIn("restart_time", r.RestartTime, 1, maxRestartTime, fmt.Sprintf("use 1..%d seconds (default %d)", maxRestartTime, int(defaultRestartTime.Seconds()))); ok {
		b.RestartTime = time.Duration(n) * time.Second
		if !b.GracefulRestart {
			s.errorf("restart_time", "bgp.restart_time has no effect with graceful_restart = false: remove it or turn graceful restart on")
		}
	}
	b.OnStop = StopKeep
	if !b.GracefulRestart {
		b.OnStop = StopDrain
	}
	if a, ok := enum(s, "on_stop", r.OnStop, parseStopAction); ok {
		b.OnStop = a
		if a == StopKeep && !b.GracefulRestart {
			s.errorf("on_stop", "bgp.on_stop = \"keep\" needs graceful_restart = true: without it routers drop the routes as soon as the session closes; use on_stop = \"drain\" or turn graceful restart on")
		}
	}
	if n, ok := s.intIn("drain_seconds", r.DrainSeconds, 0, 3600, fmt.Sprintf("use 0..3600 seconds (default %d)", defaultDrainSeconds)); ok {
		b.DrainTime = time.Duration(n) * time.Second
		if b.OnStop != StopDrain {
			s.errorf("drain_seconds", "bgp.drain_seconds has no effect with on_stop = \"keep\": remove it or set on_stop = \"drain\"")
		}
	}
	if len(r.Peer) == 0 {
		s.errorf("", "[bgp] has no [[bgp.peer]]: add at least one router to announce the VIPs to")
	}
	seen := map[netip.Addr]int{}
	for i := range r.Peer {
		ps := s.sub(indexPath("peer", i))
		p, ok := c.peer(ps, &r.Peer[i], b)
		if !ok {
			continue
		}
		if first, dup := seen[p.Address]; dup {
			ps.errorf("address", "%s: %s is already the peer at line %d: remove one", ps.name("address"), p.Address, c.line(indexPath("bgp.peer", first)))
			continue
		}
		seen[p.Address] = i
		b.Peers = append(b.Peers, p)
	}
	return b
}

// nextHop parses a next hop of one family; an absent or empty key means
// the session's local address.
func nextHop(s scope, key string, v any, v4 bool) netip.Addr {
	text, ok := s.str(key, v)
	if !ok || text == "" {
		return netip.Addr{}
	}
	a, err := unicast(text)
	if err != nil {
		s.errorf(key, "%s: %v", s.name(key), err)
		return netip.Addr{}
	}
	if a.Is4() != v4 {
		s.errorf(key, "%s = %q is %s: write an %s address", s.name(key), text, family(a), map[bool]string{true: "IPv4", false: "IPv6"}[v4])
		return netip.Addr{}
	}
	return a
}

func (c *checker) peer(s scope, r *rawPeer, b *BGP) (BGPPeer, bool) {
	p := BGPPeer{Port: defaultBGPPort, HoldTime: defaultHoldTime, ConnectRetry: defaultConnectRetry}
	ok := true
	if r.Address == nil {
		s.errorf("address", "%s is missing: set the router's address", s.name("address"))
		ok = false
	} else if text, good := s.str("address", r.Address); good {
		a, err := unicast(text)
		if err != nil {
			s.errorf("address", "%s: %v", s.name("address"), err)
			ok = false
		} else {
			p.Address = a
		}
	} else {
		ok = false
	}
	if r.ASN == nil {
		s.errorf("asn", "%s is missing: set the router's AS number", s.name("asn"))
	} else if n, good := s.asn("asn", r.ASN); good {
		p.ASN = n
	}
	if r.Port != nil {
		if n, good := s.port("port", r.Port); good {
			p.Port = n
		}
	}
	if v, good := s.str("password", r.Password); good {
		p.Password = v
	}
	holdOK := true
	if r.HoldTime != nil {
		n, good := s.intIn("hold_time", r.HoldTime, 3, 65535, "use 3..65535 seconds (default 90)")
		holdOK = good
		if good {
			p.HoldTime = time.Duration(n) * time.Second
		}
	}
	p.Keepalive = p.HoldTime / 3
	if r.Keepalive != nil {
		if n, good := s.intIn("keepalive", r.Keepalive, 1, 21845, "use 1..21845 seconds (default a third of hold_time)"); good {
			p.Keepalive = time.Duration(n) * time.Second
			if holdOK && p.Keepalive >= p.HoldTime {
				s.errorf("keepalive", "%s (%ds) must be shorter than hold_time (%ds), usually a third of it", s.name("keepalive"), n, int(p.HoldTime.Seconds()))
			}
		}
	}
	if r.ConnectRetry != nil {
		if n, good := s.intIn("connect_retry", r.ConnectRetry, 1, 65535, "use 1..65535 seconds (default 5)"); good {
			p.ConnectRetry = time.Duration(n) * time.Second
		}
	}
	if r.Multihop != nil {
		if n, good := s.intIn("multihop", r.Multihop, 0, 255, "use 0 (directly connected) or the TTL to the router, 2..255"); good {
			p.Multihop = uint8(n)
		}
	}
	if v, good := s.boolean("passive", r.Passive); good {
		p.Passive = v
		if v && b.ListenPort == 0 {
			s.errorf("passive", "%s = true waits for the router to connect, but bgp.listen_port is 0 (not listening): set listen_port = 179", s.name("passive"))
		}
	}
	if r.Families == nil {
		p.IPv4, p.IPv6 = p.Address.Is4(), p.Address.Is6()
	} else if list, good := s.strs("families", r.Families); good {
		if len(list) == 0 {
			s.errorf("families", "%s is empty: list \"ipv4\", \"ipv6\" or both, or remove it for the family of the peer's address", s.name("families"))
		}
		for i, f := range list {
			key := indexPath("families", i)
			switch f {
			case "ipv4":
				p.IPv4 = true
			case "ipv6":
				p.IPv6 = true
			default:
				s.errorf(key, "%s = %q: want \"ipv4\" or \"ipv6\"", s.name(key), f)
			}
		}
	}
	// A VIP of the other family than the session needs a next hop of its
	// own family, which the session's local address is not.
	if ok && p.Address.Is4() && p.IPv6 && !b.NextHop6.IsValid() {
		s.errorf("families", "%s announces IPv6 VIPs over an IPv4 session: set bgp.next_hop_ipv6 to this box's IPv6 address, or peer over IPv6", s.name("families"))
	}
	if ok && p.Address.Is6() && p.IPv4 && !b.NextHop4.IsValid() {
		s.errorf("families", "%s announces IPv4 VIPs over an IPv6 session: set bgp.next_hop_ipv4 to this box's IPv4 address, or peer over IPv4", s.name("families"))
	}
	p.BFD = bfd(s.sub("bfd"), r.BFD, p.Multihop)
	return p, ok
}

// bfd validates [bgp.peer.bfd]. Absent means off; present means on unless
// enabled = false, so that a table of timers alone turns BFD on.
func bfd(s scope, r *rawBFD, multihop uint8) BFD {
	if r == nil {
		return BFD{}
	}
	f := BFD{Enabled: true, DetectMultiplier: defaultBFDMultiplier, MinRxInterval: defaultBFDInterval, MinTxInterval: defaultBFDInterval}
	if v, ok := s.boolean("enabled", r.Enabled); ok {
		f.Enabled = v
	}
	if n, ok := s.intIn("detect_multiplier", r.DetectMultiplier, 1, 255, fmt.Sprintf("use 1..255 (default %d)", defaultBFDMultiplier)); ok {
		f.DetectMultiplier = uint8(n)
	}
	interval := func(key string, v any, into *time.Duration) {
		d, ok := s.duration(key, v)
		if !ok {
			return
		}
		if d < minBFDInterval || d > maxBFDInterval || d%time.Microsecond != 0 {
			s.errorf(key, "%s = %q is out of range: use %s..%s in whole microseconds (default %s)", s.name(key), v, minBFDInterval, maxBFDInterval, defaultBFDInterval)
			return
		}
		*into = d
	}
	interval("min_rx_interval", r.MinRxInterval, &f.MinRxInterval)
	interval("min_tx_interval", r.MinTxInterval, &f.MinTxInterval)
	if f.Enabled && multihop > 0 {
		s.errorf("enabled", "%s: BFD runs single-hop only (RFC 5881), but this peer is multihop = %d: remove [bgp.peer.bfd] or peer with a directly connected router", s.name("enabled"), multihop)
	}
	return f
}

// asn converts an AS number: 1..4294967294; 0 and 4294967295 are reserved
// and 23456 only stands in for a 4-byte ASN on old sessions.
func (s scope) asn(key string, v any) (uint32, bool) {
	n, ok := s.intIn(key, v, 1, 4294967294, "use an AS number in 1..4294967294 (private: 64512..65534, 4200000000..4294967294)")
	if !ok {
		return 0, false
	}
	if n == 23456 {
		s.errorf(key, "%s = 23456 is AS_TRANS, which only stands in for 4-byte AS numbers: use the real AS number", s.name(key))
		return 0, false
	}
	return uint32(n), true
}

func parseStopAction(s string) (StopAction, error) {
	switch s {
	case "keep":
		return StopKeep, nil
	case "drain":
		return StopDrain, nil
	}
	return 0, fmt.Errorf("unknown action %q (want \"keep\": routes stay for a restart, or \"drain\": withdraw, wait drain_seconds, stop)", s)
}

// wellKnown are the RFC 1997 communities that have names.
var wellKnown = map[string]Community{
	"no-export":           0xFFFFFF01,
	"no-advertise":        0xFFFFFF02,
	"no-export-subconfed": 0xFFFFFF03,
}

func parseCommunity(text string) (Community, error) {
	if c, ok := wellKnown[text]; ok {
		return c, nil
	}
	a, v, ok := strings.Cut(text, ":")
	hi, err1 := strconv.ParseUint(a, 10, 16)
	lo, err2 := strconv.ParseUint(v, 10, 16)
	if !ok || err1 != nil || err2 != nil {
		return 0, fmt.Errorf("not a community: write it as \"asn:value\" with both in 0..65535, e.g. \"65001:100\", or no-export, no-advertise, no-export-subconfed")
	}
	return Community(uint32(hi)<<16 | uint32(lo)), nil
}

func parseLargeCommunity(text string) (LargeCommunity, error) {
	parts := strings.Split(text, ":")
	var n [3]uint32
	bad := len(parts) != 3
	for i := 0; !bad && i < 3; i++ {
		v, err := strconv.ParseUint(parts[i], 10, 32)
		bad = err != nil
		n[i] = uint32(v)
	}
	if bad {
		return LargeCommunity{}, fmt.Errorf("not a large community: write it as \"global:local1:local2\" with each in 0..4294967295, e.g. \"65001:1:100\"")
	}
	return LargeCommunity{n[0], n[1], n[2]}, nil
}

func (c *checker) l2(r *rawL2, dp *Datapath) *L2 {
	s := scope{c: c}.sub("l2")
	l := &L2{MinHealthy: defaultMinHealthy}
	if r.Interfaces == nil {
		l.Interfaces = slices.Clone(dp.Interfaces)
	} else if list, ok := s.strs("interfaces", r.Interfaces); ok {
		if len(list) == 0 {
			s.errorf("interfaces", "l2.interfaces is empty: list the interfaces on the clients' segment, or remove the key for datapath.interfaces")
		}
		for i, name := range list {
			key := indexPath("interfaces", i)
			switch {
			case checkIfName(name) != nil:
				s.errorf(key, "%s: %v", s.name(key), checkIfName(name))
			case slices.Contains(l.Interfaces, name):
				s.errorf(key, "%s: interface %q is listed twice: remove one", s.name(key), name)
			case len(dp.Interfaces) > 0 && !slices.Contains(dp.Interfaces, name):
				s.errorf(key, "%s: %q is not in datapath.interfaces: the traffic the box attracts there would not reach the datapath; add it there or remove it here", s.name(key), name)
			default:
				l.Interfaces = append(l.Interfaces, name)
			}
		}
	}
	if n, ok := s.intIn("announce_min_healthy", r.MinHealthy, 1, maxMinHealthy, fmt.Sprintf("use 1..%d healthy backends (default %d)", maxMinHealthy, defaultMinHealthy)); ok {
		l.MinHealthy = int(n)
	}
	l.Failover = l2Failover(s.sub("failover"), r.Failover)
	return l
}

// l2Failover validates [l2.failover]. Absent means off; present means on
// unless enabled = false, as for [bgp.peer.bfd].
func l2Failover(s scope, r *rawL2Failover) *L2Failover {
	if r == nil {
		return nil
	}
	f := &L2Failover{Group: defaultL2Group, Priority: defaultL2Priority, Interval: defaultL2Interval, DetectMultiplier: defaultL2Multiplier}
	enabled := true
	if v, ok := s.boolean("enabled", r.Enabled); ok {
		enabled = v
	}
	if v, ok := s.str("name", r.Name); ok {
		// The name travels in every advert, one length byte before it.
		if v == "" || len(v) > 64 || strings.ContainsFunc(v, func(c rune) bool { return c <= ' ' || c > '~' }) {
			s.errorf("name", "%s = %q: use 1..64 printable ASCII characters without spaces, unique among the boxes of the group (default: the host name)", s.name("name"), v)
		} else {
			f.Name = v
		}
	}
	if n, ok := s.intIn("group", r.Group, 1, 255, fmt.Sprintf("use 1..255 (default %d); boxes that back each other up share one", defaultL2Group)); ok {
		f.Group = uint8(n)
	}
	if n, ok := s.intIn("priority", r.Priority, 1, 255, fmt.Sprintf("use 1..255, higher wins (default %d)", defaultL2Priority)); ok {
		f.Priority = uint8(n)
	}
	// One missed advert must not move the VIPs: at least two.
	if n, ok := s.intIn("detect_multiplier", r.DetectMultiplier, 2, 255, fmt.Sprintf("use 2..255 (default %d)", defaultL2Multiplier)); ok {
		f.DetectMultiplier = uint8(n)
	}
	if d, ok := s.duration("interval", r.Interval); ok {
		if d < minL2Interval || d > maxL2Interval || d%time.Millisecond != 0 {
			s.errorf("interval", "%s = %q is out of range: use %s..%s in whole milliseconds (default %s)", s.name("interval"), r.Interval, minL2Interval, maxL2Interval, defaultL2Interval)
		} else {
			f.Interval = d
		}
	}
	if !enabled {
		return nil
	}
	return f
}

// fleet validates [fleet]; it returns nil when the check is off. Without
// [discovery.consul] there is nowhere to publish: `l4lbctl fleet compare`
// does the check on demand instead.
func (c *checker) fleet(r *rawFleet, consul *Consul) *Fleet {
	s := scope{c: c}.sub("fleet")
	f := &Fleet{KVPrefix: defaultFleetKVPrefix, SessionTTL: defaultFleetSessionTTL}
	publish := consul != nil
	if r == nil {
		if !publish {
			return nil
		}
		return f
	}
	if v, ok := s.boolean("publish", r.Publish); ok {
		if v && consul == nil {
			s.errorf("publish", "fleet.publish = true needs [discovery.consul]: the fingerprints are published in Consul's KV store; configure Consul, or compare boxes with `l4lbctl fleet compare`")
		}
		publish = v && consul != nil
	} else if consul == nil && r.Publish == nil {
		s.errorf("", "[fleet] has no effect without [discovery.consul]: the fingerprints are published in Consul's KV store; configure Consul, or remove [fleet] and compare boxes with `l4lbctl fleet compare`")
	}
	if v, ok := s.str("name", r.Name); ok {
		if !validServiceName(v) {
			s.errorf("name", "fleet.name = %q is not valid: use 1 to 63 letters, digits, '.', '_' or '-' (it becomes a KV key)", v)
		} else {
			f.Name = v
		}
	}
	if v, ok := s.str("kv_prefix", r.KVPrefix); ok {
		switch {
		case strings.HasPrefix(v, "/"):
			s.errorf("kv_prefix", "fleet.kv_prefix = %q: Consul KV keys do not start with '/': remove it", v)
		case v == "" || !strings.HasSuffix(v, "/"):
			s.errorf("kv_prefix", "fleet.kv_prefix = %q must end with '/': each box writes one key below it", v)
		default:
			f.KVPrefix = v
		}
	}
	if r.SessionTTL != nil {
		if d, ok := s.duration("session_ttl", r.SessionTTL); ok {
			if d < minSessionTTL || d > maxSessionTTL {
				s.errorf("session_ttl", "fleet.session_ttl = %q is out of range: Consul accepts %s..%s (default %s)", r.SessionTTL, minSessionTTL, maxSessionTTL, defaultFleetSessionTTL)
			} else {
				f.SessionTTL = d
			}
		}
	}
	if !publish {
		return nil
	}
	return f
}

// fleetOverlap refuses a fleet prefix inside (or around) the prefix the
// Consul source reads service definitions from: each box's record would be
// read as a broken service.
func (c *checker) fleetOverlap(f *Fleet, consul *Consul, fleetSet bool) {
	if f == nil || consul == nil {
		return
	}
	if !strings.HasPrefix(f.KVPrefix, consul.KVPrefix) && !strings.HasPrefix(consul.KVPrefix, f.KVPrefix) {
		return
	}
	s := scope{c: c}.sub("discovery").sub("consul")
	if fleetSet {
		s = scope{c: c}.sub("fleet")
	}
	s.errorf("kv_prefix", "fleet.kv_prefix %q and discovery.consul.kv_prefix %q overlap, so the boxes' fleet records would be read as service definitions: give each a prefix of its own", f.KVPrefix, consul.KVPrefix)
}
