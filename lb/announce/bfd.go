// SPDX-License-Identifier: Apache-2.0

package announce

import (
	"context"
	"errors"
	"log/slog"
	"net/netip"
	"sync"
	"time"

	gapi "github.com/osrg/gobgp/v4/api"

	"github.com/l4lb/l4lb/lb/bfd"
	"github.com/l4lb/l4lb/lb/config"
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

// BFDStatus is the state of one peer's BFD session.
type BFDStatus struct {
	// State is up, down, init or admin_down.
	State string
	// Since is when State began; zero if it has not changed since the
	// session started.
	Since time.Time
	// Transitions counts the entries into each state since l4lbd started.
	Transitions map[string]uint64
	// PacketsSent and PacketsReceived count control packets since the
	// session started.
	PacketsSent, PacketsReceived uint64
	// The configured timers.
	DetectMultiplier             uint8
	MinRxInterval, MinTxInterval time.Duration
}

// bfdSessions runs the BFD sessions (lb/bfd) of the peers with
// [bgp.peer.bfd] and ties each to its BGP session: when BFD goes down, the
// BGP session is reset at once rather than after the hold time, as the
// router does on its side. The sessions live beside gobgp, not in it, so
// that a planned restart can hand them to the next l4lbd (Handoff, and
// SpeakerOptions.ResumeBFD) with the datapath answering in between.
type bfdSessions struct {
	srv *bfd.Server
	log *slog.Logger
	// reset resets the BGP session of a peer whose BFD went down.
	reset func(netip.Addr)

	mu sync.Mutex
	// cfg is the BFD configuration of each peer with a session.
	cfg map[netip.Addr]config.BFD
}

// newBFDSessions starts the BFD server (opts: the standard port and every
// address, except in tests).
func newBFDSessions(log *slog.Logger, opts bfd.Options, reset func(netip.Addr)) (*bfdSessions, error) {
	b := &bfdSessions{log: log, reset: reset, cfg: map[netip.Addr]config.BFD{}}
	opts.Logger = log
	srv, err := bfd.NewServer(opts, b.changed)
	if err != nil {
		return nil, err
	}
	b.srv = srv
	return b, nil
}

// changed is the server's report of a state change.
func (b *bfdSessions) changed(peer netip.Addr, from, to bfd.State) {
	// lb/bfd logs every change; what follows from one is said here.
	if from == bfd.Up {
		b.log.Warn("BFD session down: resetting the BGP session; the router withdraws this box's routes on its own BFD down", "peer", peer, "state", to.String())
		// Not from the server's goroutine: a reset waits for gobgp.
		go b.reset(peer)
	}
}

// sessionConfig is lb/bfd's configuration of peer a.
func sessionConfig(a netip.Addr, c config.BFD) bfd.Config {
	return bfd.Config{Peer: a, DetectMultiplier: c.DetectMultiplier, MinRx: c.MinRxInterval, MinTx: c.MinTxInterval}
}

// set makes the sessions those of peers: new peers with BFD get one
// (resumed from resume, when an earlier l4lbd handed it over), removed ones
// lose theirs, and a peer whose BFD settings changed starts afresh. It
// returns the peers whose session was resumed.
func (b *bfdSessions) set(peers []config.BGPPeer, resume map[netip.Addr]bfd.Saved) (resumed []netip.Addr, err error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	want := map[netip.Addr]config.BFD{}
	for _, p := range peers {
		if p.BFD.Enabled {
			want[p.Address] = p.BFD
		}
	}
	for a, c := range b.cfg {
		if w, ok := want[a]; !ok || w != c {
			b.srv.Remove(a)
			delete(b.cfg, a)
		}
	}
	var errs []error
	for a, c := range want {
		if _, ok := b.cfg[a]; ok {
			continue
		}
		var r *bfd.Saved
		if s, ok := resume[a]; ok {
			r = &s
		}
		err := b.srv.Add(sessionConfig(a, c), r)
		if err != nil && r != nil {
			b.log.Error("resume the BFD session handed over; starting afresh (the router sees it go down)", "peer", a, "error", err)
			r = nil
			err = b.srv.Add(sessionConfig(a, c), nil)
		}
		if err != nil {
			errs = append(errs, err)
			continue
		}
		b.cfg[a] = c
		if r != nil {
			resumed = append(resumed, a)
		}
	}
	return resumed, errors.Join(errs...)
}

// status returns the sessions' state, with their configured timers.
func (b *bfdSessions) status() map[netip.Addr]BFDStatus {
	b.mu.Lock()
	cfg := make(map[netip.Addr]config.BFD, len(b.cfg))
	for a, c := range b.cfg {
		cfg[a] = c
	}
	b.mu.Unlock()
	out := map[netip.Addr]BFDStatus{}
	for a, st := range b.srv.Status() {
		c := cfg[a]
		s := BFDStatus{State: st.State.String(), Since: st.Since, Transitions: map[string]uint64{},
			PacketsSent: st.PacketsSent, PacketsReceived: st.PacketsReceived,
			DetectMultiplier: c.DetectMultiplier, MinRxInterval: c.MinRxInterval, MinTxInterval: c.MinTxInterval}
		for _, name := range BFDStates {
			s.Transitions[name] = 0
		}
		for state, n := range st.Transitions {
			s.Transitions[state.String()] = n
		}
		out[a] = s
	}
	return out
}

// resetBGP resets the BGP session with a after its BFD session went down,
// if it is established: gobgp queues a reset of a session that is not and
// applies it to the next one, which it would kill as it comes up.
func (s *Speaker) resetBGP(a netip.Addr) {
	s.mu.Lock()
	stopped := s.stopped
	s.mu.Unlock()
	if stopped {
		return
	}
	up := false
	_ = s.srv.ListPeer(context.Background(), &gapi.ListPeerRequest{Address: a.String()}, func(p *gapi.Peer) {
		up = p.GetState().GetSessionState() == gapi.PeerState_SESSION_STATE_ESTABLISHED
	})
	if !up {
		return
	}
	if err := s.srv.ResetPeer(context.Background(), &gapi.ResetPeerRequest{Address: a.String(), Communication: "BFD session down"}); err != nil {
		s.log.Error("reset the BGP session after BFD went down", "peer", a, "error", err)
	}
}
