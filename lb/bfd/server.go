// SPDX-License-Identifier: Apache-2.0

// Package bfd is l4lbd's single-hop BFD (RFC 5880, 5881): it watches the
// liveness of the BGP peers, the routers that carry the VIPs to clients.
// l4lbd resets a BGP session when its BFD session goes down, so a dead
// link or router is noticed in a fraction of a second instead of a hold
// time.
//
// Only the asynchronous mode is implemented: no authentication, no echo
// function, no demand mode. A Server holds the sessions of one process;
// its caller learns about state changes through the notify function.
//
// Sessions survive a planned restart: Handoff stops the old process's
// sessions without a word to the routers and returns their state as Saved
// values; the XDP datapath answers the routers while no process runs, and
// the new process's Add with that Saved resumes each session with the same
// discriminators, already Up, so the router never sees it go down.
package bfd

import (
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// slowTx is the least DesiredMinTxInterval while a session is not Up
// (RFC 5880 section 6.8.3): a session that is not Up costs the peer no
// more than a packet a second.
const slowTx = time.Second

// adminDownPackets is how many AdminDown packets Remove sends: more than
// one, so that a single lost packet does not leave the peer to find out
// by timeout.
const adminDownPackets = 3

// adminDownGap caps the spacing of those packets, so that Remove's tail is
// short even at the slow rate.
const adminDownGap = 100 * time.Millisecond

// Config is one BFD session as l4lbd configures it.
type Config struct {
	// Peer is the router's address; there is one session per peer.
	// An IPv6 zone is used to reach the peer but ignored when matching
	// received packets to the session.
	Peer netip.Addr
	// Local is the source address of transmitted packets; zero lets the
	// kernel pick one.
	Local netip.Addr
	// Interface, when set, binds the transmit socket to that device
	// (SO_BINDTODEVICE), for peers reachable over several links.
	Interface string
	// DetectMultiplier is how many of our RequiredMinRx intervals may
	// pass without a packet before the peer declares us down.
	DetectMultiplier uint8
	// MinRx and MinTx are the RequiredMinRxInterval and the
	// DesiredMinTxInterval once the session is Up; below Up this package
	// transmits no faster than once a second.
	MinRx, MinTx time.Duration
}

// Saved is what a session hands to the next process at a planned restart,
// and what the datapath needs to answer the peer meanwhile. It holds plain
// fields only, so it survives a JSON round trip.
type Saved struct {
	// Peer and Local are the session's addresses as configured.
	Peer, Local netip.Addr
	// LocalDiscr and RemoteDiscr identify the session on both ends.
	LocalDiscr, RemoteDiscr uint32
	// SrcPort is the transmit socket's source port.
	SrcPort uint16
	// DetectMultiplier, MinRx and MinTx are the local values the peer
	// knows (the ones last advertised).
	DetectMultiplier uint8
	MinRx, MinTx     time.Duration
	// The peer's values from its last packet.
	RemoteDetectMultiplier   uint8
	RemoteMinRx, RemoteMinTx time.Duration
}

// Status is the state of one session, for l4lbctl and the metrics.
type Status struct {
	// State is the session's state.
	State State
	// Since is when State began; zero if it has not changed since Add.
	Since time.Time
	// Diag is the local diagnostic code (RFC 5880 section 4.1) of the
	// last change to Down: 1 the peer went silent, 3 the peer said it
	// was down, 0 never down since Add.
	Diag uint8
	// LocalDiscr and RemoteDiscr identify the session on both ends;
	// RemoteDiscr is zero until the peer is heard, and again after a
	// detection timeout.
	LocalDiscr, RemoteDiscr uint32
	// PacketsSent and PacketsReceived count control packets of the
	// session; discarded packets are not counted.
	PacketsSent, PacketsReceived uint64
	// Transitions counts the entries into each state since Add; all four
	// states are present.
	Transitions map[State]uint64
}

// Options configures a Server.
type Options struct {
	// Port is the UDP port the server listens on and sends to; 0 means
	// 3784, the standard one. Other values are for tests.
	Port int
	// ListenAddr, when set, makes the server listen on that address
	// only, instead of the wildcard of each family, and refuse sessions
	// of the other family. It lets several servers share a port on
	// different addresses of one host: tests run two on loopback.
	ListenAddr netip.Addr
	// Logger receives state changes and socket errors; nil discards
	// them.
	Logger *slog.Logger
}

// Server runs the BFD sessions of one process.
type Server struct {
	port       int
	listenAddr netip.Addr
	log        *slog.Logger
	notify     func(peer netip.Addr, from, to State)
	done       chan struct{} // closed by Close and Handoff
	wg         sync.WaitGroup
	// wake tells the notifying goroutine that changes are queued.
	wake chan struct{}
	// discarded counts received packets dropped before reaching a
	// session; tests wait on it to know a bad packet was seen.
	discarded atomic.Uint64

	mu        sync.Mutex
	closed    bool
	listeners [2]*net.UDPConn // IPv4, IPv6
	byPeer    map[netip.Addr]*session
	byDiscr   map[uint32]*session
	changes   []change
}

// change is one state change waiting for the notify function.
type change struct {
	peer     netip.Addr
	from, to State
}

// NewServer returns a server with no sessions. notify, which may be nil,
// is called on every state change of every session, in order, from a
// goroutine of the server and never with the server's lock held; it must
// not call Close or Handoff. Sockets are opened by Add.
func NewServer(o Options, notify func(peer netip.Addr, from, to State)) (*Server, error) {
	if o.Port < 0 || o.Port > 65535 {
		return nil, fmt.Errorf("bfd: port %d is not a UDP port: use 0 for the standard 3784", o.Port)
	}
	s := &Server{
		port:       o.Port,
		listenAddr: o.ListenAddr.Unmap(),
		log:        o.Logger,
		notify:     notify,
		done:       make(chan struct{}),
		wake:       make(chan struct{}, 1),
		byPeer:     map[netip.Addr]*session{},
		byDiscr:    map[uint32]*session{},
	}
	if s.port == 0 {
		s.port = DefaultPort
	}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	s.wg.Add(1)
	go s.deliver()
	return s, nil
}

// peerKey is how sessions are indexed: a received packet's source has no
// zone name the configuration must match, and an IPv4 peer may be given
// mapped.
func peerKey(a netip.Addr) netip.Addr { return a.Unmap().WithZone("") }

// Add starts a session with cfg.Peer. With resume nil the session starts
// Down, as a new one. With resume from the previous process's Handoff for
// the same peer, it starts Up with the saved discriminators, source port
// (if free) and timers, transmits at once, and arms the detection timer,
// so that the peer sees no change; if the peer went down meanwhile, its
// next packet says so and the session follows.
func (s *Server) Add(cfg Config, resume *Saved) error {
	cfg.Peer, cfg.Local = cfg.Peer.Unmap(), cfg.Local.Unmap()
	if err := s.check(cfg, resume); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return fmt.Errorf("bfd: peer %s: the server is closed: start a new one", cfg.Peer)
	}
	key := peerKey(cfg.Peer)
	if s.byPeer[key] != nil {
		return fmt.Errorf("bfd: peer %s: a session exists already: remove it first", cfg.Peer)
	}
	if resume != nil && s.byDiscr[resume.LocalDiscr] != nil {
		return fmt.Errorf("bfd: peer %s: resuming: local discriminator %d is in use by peer %s: resume each session once", cfg.Peer, resume.LocalDiscr, s.byDiscr[resume.LocalDiscr].cfg.Peer)
	}
	fam := 0
	if cfg.Peer.Is6() {
		fam = 1
	}
	if s.listeners[fam] == nil {
		addr := s.listenAddr
		if !addr.IsValid() {
			addr = netip.IPv4Unspecified()
			if fam == 1 {
				addr = netip.IPv6Unspecified()
			}
		}
		l, err := listen(addr, s.port)
		if err != nil {
			return fmt.Errorf("bfd: peer %s: listening on %s port %d: %w (is another BFD daemon, such as gobgp's, running?)", cfg.Peer, addr, s.port, err)
		}
		s.listeners[fam] = l
		s.wg.Add(1)
		go s.read(l)
	}
	var want uint16
	if resume != nil {
		want = resume.SrcPort
	}
	conn, port, err := dial(cfg.Peer, cfg.Local, s.port, cfg.Interface, want)
	if err != nil {
		return fmt.Errorf("bfd: peer %s: binding source port: %w (check Local and Interface)", cfg.Peer, err)
	}
	ss := newSession(cfg, conn, port)
	if resume != nil {
		ss.resume(resume)
	} else {
		ss.localDiscr = s.newDiscr()
	}
	s.byPeer[key] = ss
	s.byDiscr[ss.localDiscr] = ss
	s.wg.Add(1)
	go s.run(ss)
	return nil
}

// check validates a session's configuration before anything is opened.
func (s *Server) check(cfg Config, resume *Saved) error {
	fail := func(format string, a ...any) error {
		return fmt.Errorf("bfd: peer %s: "+format, append([]any{cfg.Peer}, a...)...)
	}
	switch {
	case !cfg.Peer.IsValid():
		return errors.New("bfd: session without a peer address: set Config.Peer")
	case cfg.Local.IsValid() && cfg.Local.Is4() != cfg.Peer.Is4():
		return fail("local address %s is of the other family: use one of the peer's family or none", cfg.Local)
	case s.listenAddr.IsValid() && s.listenAddr.Is4() != cfg.Peer.Is4():
		return fail("the server listens on %s only: peers must be of its family", s.listenAddr)
	case cfg.DetectMultiplier == 0:
		return fail("detect multiplier is 0: set 1 or more (3 is usual)")
	case cfg.MinRx <= 0 || cfg.MinTx <= 0:
		return fail("intervals min_rx %v and min_tx %v must be positive", cfg.MinRx, cfg.MinTx)
	case cfg.MinRx.Microseconds() > 1<<32-1 || cfg.MinTx.Microseconds() > 1<<32-1:
		return fail("intervals min_rx %v and min_tx %v exceed the protocol's 71 minutes", cfg.MinRx, cfg.MinTx)
	case resume == nil:
		return nil
	case peerKey(resume.Peer) != peerKey(cfg.Peer):
		return fail("resuming the saved session of peer %s: pass the Saved of this peer, or nil", resume.Peer)
	case resume.LocalDiscr == 0 || resume.RemoteDiscr == 0 || resume.RemoteDetectMultiplier == 0:
		return fail("resuming: the saved session has no discriminators or remote detect multiplier: it was not Up; pass nil")
	}
	return nil
}

// newDiscr picks an unused nonzero local discriminator; random, so that a
// new session is never taken for one of the previous process.
func (s *Server) newDiscr() uint32 {
	for {
		d := rand.Uint32()
		if d != 0 && s.byDiscr[d] == nil {
			return d
		}
	}
}

// Remove ends the session with peer: it goes AdminDown (diagnostic 7),
// which is reported to notify, and tells the peer so in a few packets
// sent after Remove returns. Removing an unknown peer does nothing.
func (s *Server) Remove(peer netip.Addr) {
	s.mu.Lock()
	ss := s.byPeer[peerKey(peer)]
	if ss == nil || s.closed {
		s.mu.Unlock()
		return
	}
	delete(s.byPeer, peerKey(peer))
	delete(s.byDiscr, ss.localDiscr)
	s.setState(ss, AdminDown, diagAdminDown)
	ss.removing = adminDownPackets
	s.mu.Unlock()
	s.signal(ss)
}

// Status returns the state of every session, by peer address (unmapped,
// without zone).
func (s *Server) Status() map[netip.Addr]Status {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[netip.Addr]Status, len(s.byPeer))
	for k, ss := range s.byPeer {
		st := Status{
			State:           ss.state,
			Since:           ss.since,
			Diag:            ss.diag,
			LocalDiscr:      ss.localDiscr,
			RemoteDiscr:     ss.remoteDiscr,
			PacketsSent:     ss.sent.Load(),
			PacketsReceived: ss.received.Load(),
			Transitions:     make(map[State]uint64, len(ss.transitions)),
		}
		for i, n := range ss.transitions {
			st.Transitions[State(i)] = n
		}
		out[k] = st
	}
	return out
}

// Handoff stops every session without sending anything, so the peers keep
// them Up until their detection time runs out, and returns the state of
// those that are Up, for the next process's Add. Sessions in other states
// are left out: the next process starts them afresh. The server is closed
// afterwards.
func (s *Server) Handoff() []Saved {
	var out []Saved
	s.mu.Lock()
	if !s.closed {
		for _, ss := range s.byPeer {
			if ss.state == Up {
				out = append(out, ss.saved())
			}
		}
	}
	s.mu.Unlock()
	s.Close()
	return out
}

// Close stops every session without telling the peers, as a crash would,
// and releases the sockets; Status is empty and notify is not called after
// Close returns. Closing twice does nothing.
func (s *Server) Close() {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return
	}
	s.closed = true
	clear(s.byPeer)
	clear(s.byDiscr)
	close(s.done)
	for _, l := range s.listeners {
		if l != nil {
			l.Close()
		}
	}
	s.mu.Unlock()
	s.wg.Wait()
}

// read receives the control packets of one family until the listener is
// closed.
func (s *Server) read(l *net.UDPConn) {
	defer s.wg.Done()
	buf := make([]byte, 1500)
	oob := make([]byte, 128)
	for {
		n, oobn, flags, src, err := l.ReadMsgUDPAddrPort(buf, oob)
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			s.log.Warn("BFD: receiving", "error", err)
			continue
		}
		ttl, ok := hopLimit(oob[:oobn])
		switch {
		case flags&syscall.MSG_TRUNC != 0:
			s.drop(src, "truncated")
		case !ok:
			s.drop(src, "no TTL in control messages")
		case ttl != maxTTL:
			// Sent from more than one hop away, or forged (RFC 5881
			// section 5).
			s.drop(src, "TTL is not 255", "ttl", ttl)
		default:
			s.receive(buf[:n], src)
		}
	}
}

// drop counts and logs a discarded packet.
func (s *Server) drop(src netip.AddrPort, why string, args ...any) {
	s.discarded.Add(1)
	s.log.Debug("BFD: packet discarded", append([]any{"from", src, "reason", why}, args...)...)
}

// receive handles one packet that passed the TTL check.
func (s *Server) receive(b []byte, from netip.AddrPort) {
	p, err := parse(b)
	if err != nil {
		s.drop(from, err.Error())
		return
	}
	src := peerKey(from.Addr())
	s.mu.Lock()
	var ss *session
	if p.yourDiscr != 0 {
		ss = s.byDiscr[p.yourDiscr]
		if ss != nil && peerKey(ss.cfg.Peer) != src {
			ss = nil
		}
	} else if p.state == Down || p.state == AdminDown {
		// A peer that does not know our discriminator yet, or has
		// started a new session, is known by its address only.
		ss = s.byPeer[src]
	}
	if ss == nil {
		s.mu.Unlock()
		s.drop(from, "no session for the discriminators and source", "your_discr", p.yourDiscr, "state", p.state)
		return
	}
	ss.received.Add(1)
	kick := s.handle(ss, &p)
	s.mu.Unlock()
	if kick {
		s.signal(ss)
	}
}

// setState moves ss to state to, recording why, and queues the change for
// notify. Timers follow the state: fast ones are negotiated on the way Up
// (by a Poll sequence), the slow rate applies at once below Up, and the
// detection timer runs only in Init and Up.
func (s *Server) setState(ss *session, to State, diag uint8) {
	from := ss.state
	if from == to {
		return
	}
	ss.state, ss.since = to, time.Now()
	ss.transitions[to]++
	if to == Down || to == AdminDown {
		ss.diag = diag
	}
	switch {
	case to == Up:
		ss.setTimers(ss.cfg.MinTx, ss.cfg.MinRx)
	case from == Up:
		ss.slowDown()
	}
	if to != Init && to != Up {
		ss.detect.Stop()
		ss.detectAt = time.Time{}
	}
	s.changes = append(s.changes, change{ss.cfg.Peer, from, to})
	select {
	case s.wake <- struct{}{}:
	default:
	}
	args := []any{"peer", ss.cfg.Peer, "from", from, "to", to, "local_discr", ss.localDiscr, "remote_discr", ss.remoteDiscr}
	if to == Down || to == AdminDown {
		args = append(args, "diag", diag)
	}
	s.log.Info("BFD session state changed", args...)
}

// handle applies a received packet to ss, as RFC 5880 section 6.8.6
// says, and reports whether the session's goroutine should transmit now.
func (s *Server) handle(ss *session, p *packet) (kick bool) {
	before := ss.state
	ss.remoteDiscr = p.myDiscr
	ss.remoteState = p.state
	ss.remoteMult = p.detectMult
	ss.remoteMinTx = duration(p.minTx)
	if rx := duration(p.minRx); rx != ss.remoteMinRx {
		// The transmit interval changed: reschedule now rather
		// than at the old interval's end.
		ss.remoteMinRx = rx
		kick = true
	}
	if p.final && ss.polling {
		// The faster interval now in force starts at once.
		ss.pollDone()
		kick = true
	}
	if ss.state != AdminDown {
		switch {
		case p.state == AdminDown:
			if ss.state != Down {
				s.setState(ss, Down, diagNeighborDown)
			}
		case ss.state == Down:
			switch p.state {
			case Down:
				s.setState(ss, Init, diagNone)
			case Init:
				s.setState(ss, Up, diagNone)
			}
		case ss.state == Init:
			if p.state == Init || p.state == Up {
				s.setState(ss, Up, diagNone)
			}
		case ss.state == Up:
			if p.state == Down {
				s.setState(ss, Down, diagNeighborDown)
			}
		}
	}
	if ss.state == Init || ss.state == Up {
		ss.armDetect()
	}
	if p.poll {
		ss.final = true
	}
	// A state change is told to the peer at once, not at the next
	// interval: it is what the peer waits for to come Up.
	return kick || ss.final || ss.state != before
}

// signal wakes ss's goroutine to transmit now.
func (s *Server) signal(ss *session) {
	select {
	case ss.wake <- struct{}{}:
	default:
	}
}

// deliver calls notify with the queued state changes, in order, outside
// the lock, until the server is closed.
func (s *Server) deliver() {
	defer s.wg.Done()
	for {
		select {
		case <-s.done:
			return
		case <-s.wake:
		}
		s.mu.Lock()
		changes := s.changes
		s.changes = nil
		s.mu.Unlock()
		for _, c := range changes {
			if s.notify != nil {
				s.notify(c.peer, c.from, c.to)
			}
		}
	}
}

// run transmits ss's packets and watches its detection timer until the
// server is closed or, after Remove, the last AdminDown packet is sent.
func (s *Server) run(ss *session) {
	defer s.wg.Done()
	defer ss.conn.Close()
	defer ss.detect.Stop()
	tx := time.NewTimer(0) // a new or resumed session speaks at once
	defer tx.Stop()
	for {
		select {
		case <-s.done:
			return
		case <-ss.detect.C:
			s.expire(ss)
			continue
		case <-tx.C:
		case <-ss.wake:
		}
		if s.transmit(ss, tx) {
			return
		}
	}
}

// expire takes ss Down when its detection time has passed without a
// packet (RFC 5880 section 6.8.4).
func (s *Server) expire(ss *session) {
	s.mu.Lock()
	// The timer may have fired just before a packet reset it.
	if (ss.state != Init && ss.state != Up) || time.Now().Before(ss.detectAt) {
		s.mu.Unlock()
		return
	}
	s.setState(ss, Down, diagTimeExpired)
	// Section 6.8.1: the peer's discriminator is forgotten after a
	// detection time of silence; it will start a new session.
	ss.remoteDiscr = 0
	ss.remoteState = Down
	s.mu.Unlock()
	s.signal(ss)
}

// transmit sends one packet of ss and rearms tx for the next; it reports
// whether the session is finished (Remove's last AdminDown packet sent).
func (s *Server) transmit(ss *session, tx *time.Timer) (finished bool) {
	s.mu.Lock()
	p := ss.packet()
	// pollNext sends our own Poll right after a Final that displaced
	// it: the peer times us by the faster interval the Final packet
	// advertises, and only our Poll's answer lets us transmit at it.
	pollNext := false
	if ss.final {
		// The answer to a Poll carries Final and never Poll
		// (section 6.5).
		pollNext = p.poll
		p.poll, p.final, ss.final = false, true, false
	}
	next := ss.interval()
	// A peer asking for no packets (RequiredMinRx 0) gets only answers
	// to its Polls and our farewell.
	periodic := ss.remoteMinRx != 0
	send := periodic || p.final || ss.removing > 0
	if ss.removing > 0 {
		ss.removing--
		finished = ss.removing == 0
		next, periodic = min(next, adminDownGap), true
	}
	s.mu.Unlock()
	if send {
		s.write(ss, p)
	}
	switch {
	case pollNext:
		tx.Reset(0)
	case periodic:
		tx.Reset(next)
	default:
		tx.Stop()
	}
	return finished
}

// write sends p on ss's socket.
func (s *Server) write(ss *session, p packet) {
	b := p.appendTo(make([]byte, 0, packetLen))
	_, err := ss.conn.Write(b)
	if errors.Is(err, syscall.ECONNREFUSED) {
		// The error is an ICMP port unreachable answering an
		// earlier packet (the peer's BFD was not running), reported
		// on this write instead of sending: try once more.
		_, err = ss.conn.Write(b)
	}
	if err != nil {
		s.log.Debug("BFD: sending", "peer", ss.cfg.Peer, "error", err)
		return
	}
	ss.sent.Add(1)
}
