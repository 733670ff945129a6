// SPDX-License-Identifier: Apache-2.0

package announce

import (
	"context"
	"log/slog"
	"maps"
	"net/netip"
	"slices"
	"sync"
	"time"

	gapi "github.com/osrg/gobgp/v4/api"
	"github.com/osrg/gobgp/v4/pkg/server"
)

// BFD session states, as l4lbctl and the metrics name them.
const (
	bfdUp        = "up"
	bfdDown      = "down"
	bfdInit      = "init"
	bfdAdminDown = "admin_down"
)

// BFDStates lists the BFD session states in the order status output and
// metrics use.
var BFDStates = []string{bfdUp, bfdDown, bfdInit, bfdAdminDown}

// bfdPoll is how often the watcher reads gobgp's BFD sessions. gobgp keeps
// no history and emits no event for a BFD transition; a session that went
// down stays down for at least the router's slow-start transmit interval
// (one second, RFC 5880 6.8.3), so polling well below that sees every
// transition.
const bfdPoll = 50 * time.Millisecond

// BFDStatus is the state of one peer's BFD session.
type BFDStatus struct {
	// State is up, down, init or admin_down.
	State string
	// Since is when the watcher saw State begin; zero if it has not
	// changed since l4lbd started.
	Since time.Time
	// Transitions counts the entries into each state since l4lbd started.
	Transitions map[string]uint64
	// PacketsSent and PacketsReceived count control packets of the
	// current BFD session (gobgp restarts them with the session).
	PacketsSent, PacketsReceived uint64
	// The configured timers.
	DetectMultiplier             uint8
	MinRxInterval, MinTxInterval time.Duration
}

// bfdWatch follows gobgp's BFD sessions, logs every state change and
// counts them: what an operator needs to tell a flapping link from a dead
// box after the fact.
type bfdWatch struct {
	srv *server.BgpServer
	log *slog.Logger
	// restart configures a peer afresh, if it has BFD, and says whether
	// it did (see poll).
	restart func(netip.Addr) bool
	done    chan struct{}
	wg      sync.WaitGroup
	// bgp is the BGP session of each peer at the last poll; only the
	// watcher's goroutine uses it.
	bgp map[netip.Addr]bgpSession

	mu       sync.Mutex
	sessions map[netip.Addr]*BFDStatus
}

// bgpSession is what the watcher remembers of a BGP session: whether it
// was established, and how many NOTIFICATIONs it had sent and received.
type bgpSession struct {
	up    bool
	notes uint64
}

func watchBFD(srv *server.BgpServer, log *slog.Logger, restart func(netip.Addr) bool) *bfdWatch {
	w := &bfdWatch{srv: srv, log: log, restart: restart, done: make(chan struct{}), bgp: map[netip.Addr]bgpSession{}, sessions: map[netip.Addr]*BFDStatus{}}
	w.wg.Add(1)
	go func() {
		defer w.wg.Done()
		t := time.NewTicker(bfdPoll)
		defer t.Stop()
		for {
			select {
			case <-w.done:
				return
			case now := <-t.C:
				w.poll(now)
			}
		}
	}()
	return w
}

// poll reads the BFD and BGP sessions. A peer whose BGP session went down,
// or whose BFD session went down while the BGP session was down, is
// configured afresh, to work around two behaviours that together keep a
// recovered peer flapping forever: a router (BIRD) makes a new BFD
// session, with a new discriminator, for each BGP session, and gobgp keeps
// the old one bound and drops the new one's packets until its detection
// time runs out; gobgp then resets the BGP session, and a reset while the
// session is down is queued and kills the next session as soon as it is
// established. A fresh gobgp peer has a fresh BFD session, which accepts
// the router's new one at once, and no queued reset.
func (w *bfdWatch) poll(now time.Time) {
	// Without BFD there is nothing to follow: skip reading the BGP
	// sessions, which costs a round trip through gobgp's main loop.
	n := 0
	w.srv.ListBfdPeer(context.Background(), func(string, *gapi.BfdPeerState) { n++ })
	w.mu.Lock()
	idle := n == 0 && len(w.sessions) == 0
	w.mu.Unlock()
	if idle {
		return
	}
	var restart []netip.Addr
	_ = w.srv.ListPeer(context.Background(), &gapi.ListPeerRequest{}, func(p *gapi.Peer) {
		a, err := netip.ParseAddr(p.GetConf().GetNeighborAddress())
		if err != nil {
			return
		}
		a = a.Unmap()
		msgs := p.GetState().GetMessages()
		now := bgpSession{
			up:    p.GetState().GetSessionState() == gapi.PeerState_SESSION_STATE_ESTABLISHED,
			notes: msgs.GetSent().GetNotification() + msgs.GetReceived().GetNotification(),
		}
		// A session can come up and be torn down between two polls;
		// its NOTIFICATION still shows in the counters.
		if was, ok := w.bgp[a]; ok && (was.up && !now.up || now.notes != was.notes) {
			restart = append(restart, a)
		}
		w.bgp[a] = now
	})
	restart = append(restart, w.pollBFD(now)...)
	for _, a := range slices.Compact(restart) {
		if !w.restart(a) {
			continue
		}
		// The fresh session starts down: not a transition to count.
		w.mu.Lock()
		if s, ok := w.sessions[a]; ok {
			s.State = bfdDown
		}
		w.mu.Unlock()
	}
}

// pollBFD reads gobgp's BFD sessions and returns the peers whose session
// went down while their BGP session was not established: gobgp's reset is
// then queued for the next BGP session.
func (w *bfdWatch) pollBFD(now time.Time) (restart []netip.Addr) {
	type live struct {
		state      string
		sent, recv uint64
	}
	seen := map[netip.Addr]live{}
	w.srv.ListBfdPeer(context.Background(), func(addr string, st *gapi.BfdPeerState) {
		a, err := netip.ParseAddr(addr)
		if err != nil {
			return
		}
		seen[a.Unmap()] = live{bfdState(st.GetSessionState()), st.GetBfdAsync().GetTransmittedPackets(), st.GetBfdAsync().GetReceivedPackets()}
	})
	w.mu.Lock()
	defer w.mu.Unlock()
	for a, l := range seen {
		s, ok := w.sessions[a]
		if !ok {
			// gobgp starts every session down. Every state has a
			// count, zero included, so that metrics show the series
			// before the first failure.
			s = &BFDStatus{State: bfdDown, Transitions: map[string]uint64{}}
			for _, st := range BFDStates {
				s.Transitions[st] = 0
			}
			w.sessions[a] = s
		}
		s.PacketsSent, s.PacketsReceived = l.sent, l.recv
		if l.state == s.State {
			continue
		}
		switch {
		case s.State == bfdUp:
			// gobgp has reset the BGP session by now: the router
			// withdraws this box's routes on its own BFD down.
			w.log.Warn("BFD session down: the BGP session is reset", "peer", a, "state", l.state)
		case l.state == bfdUp:
			w.log.Info("BFD session up", "peer", a)
		}
		if l.state == bfdDown && !w.bgp[a].up {
			restart = append(restart, a)
		}
		s.State, s.Since = l.state, now
		s.Transitions[l.state]++
	}
	for a, s := range w.sessions {
		if _, ok := seen[a]; !ok && s.State != bfdDown {
			// Removed from the configuration (or BFD turned off).
			s.State, s.Since = bfdDown, now
			s.Transitions[bfdDown]++
		}
	}
	return restart
}

// status copies the sessions' state.
func (w *bfdWatch) status() map[netip.Addr]BFDStatus {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := make(map[netip.Addr]BFDStatus, len(w.sessions))
	for a, s := range w.sessions {
		c := *s
		c.Transitions = maps.Clone(s.Transitions)
		out[a] = c
	}
	return out
}

func (w *bfdWatch) stop() {
	select {
	case <-w.done:
	default:
		close(w.done)
	}
	w.wg.Wait()
}

func bfdState(s gapi.BfdSessionState) string {
	switch s {
	case gapi.BfdSessionState_BFD_SESSION_STATE_UP:
		return bfdUp
	case gapi.BfdSessionState_BFD_SESSION_STATE_INIT:
		return bfdInit
	case gapi.BfdSessionState_BFD_SESSION_STATE_ADMIN_DOWN:
		return bfdAdminDown
	}
	return bfdDown
}
