// SPDX-License-Identifier: Apache-2.0

package announce

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"sync"
	"time"

	"github.com/google/uuid"
	gapi "github.com/osrg/gobgp/v4/api"
	"github.com/osrg/gobgp/v4/pkg/apiutil"
	"github.com/osrg/gobgp/v4/pkg/packet/bgp"
	"github.com/osrg/gobgp/v4/pkg/server"

	"github.com/l4lb/l4lb/lb/bfd"
	"github.com/l4lb/l4lb/lb/config"
)

// deferralTime bounds how long a restarted speaker waits for the routers'
// End-of-RIB before it sends its routes (RFC 4724 selection deferral). l4lb
// takes no routes from routers, so there is nothing to wait for but the
// marker itself; a router that stays down must not hold the others' updates
// back for gobgp's default of six minutes.
const deferralTime = 5

// SpeakerOptions configure a Speaker.
type SpeakerOptions struct {
	Log *slog.Logger
	// Restarting sets the Restart State bit of graceful restart: this
	// l4lbd took over a datapath that kept forwarding (pinned state), so
	// routers that kept its routes stale keep them until it has announced
	// again.
	Restarting bool
	// ResumeBFD are the BFD sessions the previous l4lbd handed over as it
	// stopped (Stop), read back from the datapath that answered for them
	// meanwhile. A configured peer's session is resumed, Up, so that the
	// router never sees it go down.
	ResumeBFD []bfd.Saved
	// ReleaseBFD stops the datapath answering for a handed-over session,
	// once this l4lbd's own session has taken it over (or the peer no
	// longer has BFD), and returns how many packets it answered.
	ReleaseBFD func(peer netip.Addr) (answered uint64, err error)
}

// Speaker announces VIPs over BGP with an embedded gobgp server: one /32
// or /128 per VIP to every configured peer of the VIP's family. Its methods
// are safe for concurrent use.
type Speaker struct {
	log        *slog.Logger
	srv        *server.BgpServer
	restarting bool

	mu      sync.Mutex
	cfg     config.BGP
	paths   map[netip.Addr]uuid.UUID // announced VIPs
	peered  bool                     // peers added (after the first Set)
	stopped bool

	bfd *bfdSessions
}

// NewSpeaker starts the BGP server for cfg. No session is opened before the
// first Set: the routers' first view is then the complete one.
func NewSpeaker(cfg *config.BGP, opts SpeakerOptions) (*Speaker, error) {
	log := opts.Log
	if log == nil {
		log = slog.Default()
	}
	log = log.With("component", "bgp")
	// gobgp logs every FSM step at debug; its info level says what an
	// operator wants to know (sessions up and down).
	lvl := &slog.LevelVar{}
	lvl.Set(max(slog.LevelInfo, minLevel(log)))
	srv := server.NewBgpServer(server.LoggerOption(log, lvl))
	go srv.Serve()
	port := int32(cfg.ListenPort)
	if port == 0 {
		port = -1 // gobgp: do not listen
	}
	err := srv.StartBgp(context.Background(), &gapi.StartBgpRequest{Global: &gapi.Global{
		Asn:        cfg.ASN,
		RouterId:   cfg.RouterID.String(),
		ListenPort: port,
	}})
	if err != nil {
		srv.Stop()
		return nil, fmt.Errorf("bgp: start the speaker (asn %d, router id %s, listen port %d): %w", cfg.ASN, cfg.RouterID, cfg.ListenPort, err)
	}
	// Routes the routers send are never used: reject them on arrival
	// rather than keep a copy of a full table. The global import policy
	// also sees this box's own routes, which it must let through.
	localOnly := &gapi.Policy{Name: "l4lb-local-only", Statements: []*gapi.Statement{{
		Name:       "l4lb-accept-local",
		Conditions: &gapi.Conditions{RouteType: gapi.Conditions_ROUTE_TYPE_LOCAL},
		Actions:    &gapi.Actions{RouteAction: gapi.RouteAction_ROUTE_ACTION_ACCEPT},
	}}}
	err = srv.AddPolicy(context.Background(), &gapi.AddPolicyRequest{Policy: localOnly})
	if err == nil {
		err = srv.SetPolicyAssignment(context.Background(), &gapi.SetPolicyAssignmentRequest{Assignment: &gapi.PolicyAssignment{
			Name:          "global",
			Direction:     gapi.PolicyDirection_POLICY_DIRECTION_IMPORT,
			Policies:      []*gapi.Policy{{Name: localOnly.Name}},
			DefaultAction: gapi.RouteAction_ROUTE_ACTION_REJECT,
		}})
	}
	if err != nil {
		srv.Stop()
		return nil, fmt.Errorf("bgp: set the import policy: %w", err)
	}
	sp := &Speaker{log: log, srv: srv, restarting: opts.Restarting, cfg: *cfg, paths: map[netip.Addr]uuid.UUID{}}
	if sp.bfd, err = newBFDSessions(log, bfd.Options{}, sp.resetBGP); err != nil {
		srv.Stop()
		return nil, fmt.Errorf("bgp: start BFD: %w", err)
	}
	if err := sp.startBFD(opts); err != nil {
		sp.bfd.srv.Close()
		srv.Stop()
		return nil, err
	}
	return sp, nil
}

// startBFD starts the peers' BFD sessions, before any BGP session: a
// session handed over by the previous l4lbd is resumed at once, and the
// datapath stops answering for it.
func (s *Speaker) startBFD(opts SpeakerOptions) error {
	resume := map[netip.Addr]bfd.Saved{}
	for _, r := range opts.ResumeBFD {
		resume[r.Peer.Unmap()] = r
	}
	resumed, err := s.bfd.set(s.cfg.Peers, resume)
	if err != nil {
		return fmt.Errorf("bgp: start BFD: %w", err)
	}
	for a := range resume {
		var answered uint64
		if opts.ReleaseBFD != nil {
			n, err := opts.ReleaseBFD(a)
			if err != nil {
				s.log.Error("stop the datapath answering BFD", "peer", a, "error", err)
			}
			answered = n
		}
		if slices.Contains(resumed, a) {
			s.log.Info("BFD session resumed", "peer", a, "answered_by_datapath", answered)
		} else {
			s.log.Info("BFD session of the previous l4lbd dropped: the peer has no BFD now", "peer", a, "answered_by_datapath", answered)
		}
	}
	return nil
}

// minLevel is the lowest level log lets through.
func minLevel(log *slog.Logger) slog.Level {
	for _, l := range []slog.Level{slog.LevelDebug, slog.LevelInfo, slog.LevelWarn} {
		if log.Enabled(context.Background(), l) {
			return l
		}
	}
	return slog.LevelError
}

// Set makes the announced VIPs exactly vips: new ones are announced, the
// others withdrawn. The first call also opens the sessions.
func (s *Speaker) Set(vips []netip.Addr) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopped {
		return nil
	}
	have := make(map[netip.Addr]bool, len(s.paths))
	for a := range s.paths {
		have[a] = true
	}
	add, del := diff(have, vips)
	var errs []error
	for _, a := range add {
		if err := s.announceLocked(a); err != nil {
			errs = append(errs, err)
			continue
		}
		s.log.Info("announcing VIP", "vip", a)
	}
	for _, a := range del {
		if err := s.withdrawLocked(a); err != nil {
			errs = append(errs, err)
			continue
		}
		s.log.Info("withdrew VIP", "vip", a)
	}
	if !s.peered {
		s.peered = true
		for _, p := range s.cfg.Peers {
			if err := s.addPeerLocked(p); err != nil {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}

// path builds the route of a VIP with this box's attributes.
func (s *Speaker) path(a netip.Addr) (*apiutil.Path, error) {
	nlri, err := bgp.NewIPAddrPrefix(hostPrefix(a))
	if err != nil {
		return nil, err
	}
	attrs := []bgp.PathAttributeInterface{bgp.NewPathAttributeOrigin(bgp.BGP_ORIGIN_ATTR_TYPE_IGP)}
	family := bgp.RF_IPv4_UC
	if a.Is4() {
		// Unspecified: gobgp puts each session's local address.
		nh := netip.IPv4Unspecified()
		if s.cfg.NextHop4.IsValid() {
			nh = s.cfg.NextHop4
		}
		attr, err := bgp.NewPathAttributeNextHop(nh)
		if err != nil {
			return nil, err
		}
		attrs = append(attrs, attr)
	} else {
		family = bgp.RF_IPv6_UC
		nh := netip.IPv6Unspecified()
		if s.cfg.NextHop6.IsValid() {
			nh = s.cfg.NextHop6
		}
		attr, err := bgp.NewPathAttributeMpReachNLRI(family, []bgp.PathNLRI{{NLRI: nlri}}, nh)
		if err != nil {
			return nil, err
		}
		attrs = append(attrs, attr)
	}
	if len(s.cfg.Communities) > 0 {
		cs := make([]uint32, len(s.cfg.Communities))
		for i, c := range s.cfg.Communities {
			cs[i] = uint32(c)
		}
		attrs = append(attrs, bgp.NewPathAttributeCommunities(cs))
	}
	if len(s.cfg.LargeCommunities) > 0 {
		var ls []*bgp.LargeCommunity
		for _, c := range s.cfg.LargeCommunities {
			ls = append(ls, bgp.NewLargeCommunity(c.Global, c.Local1, c.Local2))
		}
		attrs = append(attrs, bgp.NewPathAttributeLargeCommunities(ls))
	}
	return &apiutil.Path{Family: family, Nlri: nlri, Attrs: attrs}, nil
}

func (s *Speaker) announceLocked(a netip.Addr) error {
	p, err := s.path(a)
	if err != nil {
		return fmt.Errorf("bgp: route for %s: %w", a, err)
	}
	resp, err := s.srv.AddPath(apiutil.AddPathRequest{Paths: []*apiutil.Path{p}})
	if err != nil {
		return fmt.Errorf("bgp: announce %s: %w", a, err)
	}
	s.paths[a] = resp[0].UUID
	return nil
}

func (s *Speaker) withdrawLocked(a netip.Addr) error {
	id, ok := s.paths[a]
	if !ok {
		return nil
	}
	if err := s.srv.DeletePath(apiutil.DeletePathRequest{UUIDs: []uuid.UUID{id}}); err != nil {
		return fmt.Errorf("bgp: withdraw %s: %w", a, err)
	}
	delete(s.paths, a)
	return nil
}

// peerOf turns a configured peer into gobgp's.
func (s *Speaker) peerOf(p config.BGPPeer) *gapi.Peer {
	secs := func(d time.Duration) uint64 { return uint64(d / time.Second) }
	gp := &gapi.Peer{
		Conf: &gapi.PeerConf{
			NeighborAddress: p.Address.String(),
			PeerAsn:         p.ASN,
			AuthPassword:    p.Password,
			Description:     "l4lb",
		},
		Timers: &gapi.Timers{Config: &gapi.TimersConfig{
			HoldTime:          secs(p.HoldTime),
			KeepaliveInterval: secs(p.Keepalive),
			ConnectRetry:      secs(p.ConnectRetry),
			// After a session reset gobgp idles for this long (30 s by
			// default) before connecting again.
			IdleHoldTimeAfterReset: secs(p.ConnectRetry),
		}},
		Transport: &gapi.Transport{PassiveMode: p.Passive, RemotePort: uint32(p.Port)},
	}
	if p.Multihop > 0 {
		gp.EbgpMultihop = &gapi.EbgpMultihop{Enabled: true, MultihopTtl: uint32(p.Multihop)}
	}
	gr := s.cfg.GracefulRestart
	if gr {
		gp.GracefulRestart = &gapi.GracefulRestart{
			Enabled:         true,
			RestartTime:     uint32(s.cfg.RestartTime / time.Second),
			DeferralTime:    deferralTime,
			LocalRestarting: s.restarting,
		}
	}
	family := func(afi gapi.Family_Afi) *gapi.AfiSafi {
		return &gapi.AfiSafi{
			Config:            &gapi.AfiSafiConfig{Family: &gapi.Family{Afi: afi, Safi: gapi.Family_SAFI_UNICAST}, Enabled: true},
			MpGracefulRestart: &gapi.MpGracefulRestart{Config: &gapi.MpGracefulRestartConfig{Enabled: gr}},
		}
	}
	if p.IPv4 {
		gp.AfiSafis = append(gp.AfiSafis, family(gapi.Family_AFI_IP))
	}
	if p.IPv6 {
		gp.AfiSafis = append(gp.AfiSafis, family(gapi.Family_AFI_IP6))
	}
	return gp
}

func (s *Speaker) addPeerLocked(p config.BGPPeer) error {
	if err := s.srv.AddPeer(context.Background(), &gapi.AddPeerRequest{Peer: s.peerOf(p)}); err != nil {
		return fmt.Errorf("bgp: add peer %s (AS %d): %w", p.Address, p.ASN, err)
	}
	s.log.Info("BGP peer configured", "peer", p.Address, "peer_asn", p.ASN)
	return nil
}

func (s *Speaker) deletePeerLocked(a netip.Addr) error {
	if err := s.srv.DeletePeer(context.Background(), &gapi.DeletePeerRequest{Address: a.String()}); err != nil {
		return fmt.Errorf("bgp: remove peer %s: %w", a, err)
	}
	return nil
}

// Reconfigure applies a reloaded [bgp]: peers added, removed or changed
// (a changed peer's session is reset), and new path attributes announced.
// The identity of the speaker (asn, router_id, listen_port, graceful
// restart) changes only with a restart of l4lbd; those settings are
// returned and keep their running values.
func (s *Speaker) Reconfigure(cfg *config.BGP) (restartOnly []string, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopped {
		return nil, nil
	}
	old := s.cfg
	if old.ASN != cfg.ASN || old.RouterID != cfg.RouterID || old.ListenPort != cfg.ListenPort {
		restartOnly = append(restartOnly, "bgp.asn / router_id / listen_port")
	}
	if old.GracefulRestart != cfg.GracefulRestart || old.RestartTime != cfg.RestartTime {
		restartOnly = append(restartOnly, "bgp.graceful_restart / restart_time")
	}
	next := *cfg
	next.ASN, next.RouterID, next.ListenPort = old.ASN, old.RouterID, old.ListenPort
	next.GracefulRestart, next.RestartTime = old.GracefulRestart, old.RestartTime
	s.cfg = next

	var errs []error
	if s.peered {
		oldPeers := map[netip.Addr]config.BGPPeer{}
		for _, p := range old.Peers {
			oldPeers[p.Address] = p
		}
		for _, p := range next.Peers {
			was, ok := oldPeers[p.Address]
			delete(oldPeers, p.Address)
			switch {
			case !ok:
				errs = append(errs, s.addPeerLocked(p))
			case was != p:
				s.log.Info("BGP peer settings changed; resetting its session", "peer", p.Address)
				errs = append(errs, s.deletePeerLocked(p.Address), s.addPeerLocked(p))
			}
		}
		for a := range oldPeers {
			s.log.Info("BGP peer removed from the configuration", "peer", a)
			errs = append(errs, s.deletePeerLocked(a))
		}
	}
	if _, err := s.bfd.set(next.Peers, nil); err != nil {
		errs = append(errs, err)
	}
	if !slices.Equal(old.Communities, next.Communities) || !slices.Equal(old.LargeCommunities, next.LargeCommunities) ||
		old.NextHop4 != next.NextHop4 || old.NextHop6 != next.NextHop6 {
		// Announcing a prefix again replaces its attributes.
		for a := range s.paths {
			errs = append(errs, s.announceLocked(a))
		}
	}
	return restartOnly, errors.Join(errs...)
}

// MinHealthy is the threshold of the configuration in force.
func (s *Speaker) MinHealthy() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cfg.MinHealthy
}

// Stop ends the speaker. With config.StopDrain it withdraws every VIP,
// waits drain (the datapath keeps forwarding meanwhile, so flows that the
// routers have not moved yet still work), then closes the sessions with a
// NOTIFICATION. With config.StopKeep it closes them without one, so that
// routers that negotiated graceful restart keep the routes until the next
// l4lbd has announced again; then it also hands over the BFD sessions that
// are up, stopping them without a word to the router, and returns them
// for the datapath to answer until the next l4lbd resumes them (they keep
// the router's BGP session alive only with graceful restart).
func (s *Speaker) Stop(action config.StopAction, drain time.Duration) (handoff []bfd.Saved) {
	s.mu.Lock()
	if s.stopped {
		s.mu.Unlock()
		return nil
	}
	s.stopped = true
	if action == config.StopDrain && len(s.paths) > 0 {
		n := len(s.paths)
		for a := range s.paths {
			if err := s.withdrawLocked(a); err != nil {
				s.log.Error("withdraw at stop", "vip", a, "error", err)
			}
		}
		s.mu.Unlock()
		s.log.Info("withdrew every VIP; waiting for the routers to move the traffic", "vips", n, "wait", drain)
		time.Sleep(drain)
	} else {
		s.mu.Unlock()
	}
	keep := action == config.StopKeep
	if keep {
		s.log.Info("stopping BGP without a NOTIFICATION: routers with graceful restart keep the routes for the restart", "restart_time", s.cfg.RestartTime)
	}
	if err := s.srv.StopBgp(context.Background(), &gapi.StopBgpRequest{AllowGracefulRestart: keep}); err != nil {
		s.log.Error("stop BGP", "error", err)
	}
	s.srv.Stop()
	if keep && s.cfg.GracefulRestart {
		return s.bfd.srv.Handoff()
	}
	s.bfd.srv.Close()
	return nil
}

// PeerStatus is the state of one BGP session.
type PeerStatus struct {
	Address netip.Addr
	ASN     uint32
	// State is the session's FSM state: idle, connect, active, opensent,
	// openconfirm or established.
	State string
	Up    bool
	// Since is when the session came up (Up) or last went down; zero if
	// it never did.
	Since time.Time
	// UpdatesSent and UpdatesReceived count UPDATE messages.
	UpdatesSent, UpdatesReceived uint64
	// Advertised counts the prefixes sent on the session.
	Advertised uint64
	// GracefulRestart is true when both sides advertised it.
	GracefulRestart bool
	// LastError says why the session last went down.
	LastError string
	// BFD is the state of the peer's BFD session; nil when BFD is off.
	BFD *BFDStatus
}

// SpeakerStatus is what the speaker announces and to whom.
type SpeakerStatus struct {
	ASN       uint32
	RouterID  netip.Addr
	Announced []netip.Addr
	Peers     []PeerStatus
}

// Status reads the sessions' live state.
func (s *Speaker) Status() SpeakerStatus {
	s.mu.Lock()
	st := SpeakerStatus{ASN: s.cfg.ASN, RouterID: s.cfg.RouterID}
	for a := range s.paths {
		st.Announced = append(st.Announced, a)
	}
	peers := slices.Clone(s.cfg.Peers)
	stopped := s.stopped
	s.mu.Unlock()
	slices.SortFunc(st.Announced, netip.Addr.Compare)
	live := map[string]*gapi.Peer{}
	if !stopped {
		_ = s.srv.ListPeer(context.Background(), &gapi.ListPeerRequest{EnableAdvertised: true}, func(p *gapi.Peer) {
			live[p.GetConf().GetNeighborAddress()] = p
		})
	}
	bfd := s.bfd.status()
	for _, p := range peers {
		ps := PeerStatus{Address: p.Address, ASN: p.ASN, State: "idle"}
		if gp, ok := live[p.Address.String()]; ok {
			fillPeer(&ps, gp)
		}
		if p.BFD.Enabled {
			b := bfd[p.Address]
			if b.State == "" {
				// No session (stopped, or its socket failed).
				b.State = bfdDown
			}
			b.DetectMultiplier, b.MinRxInterval, b.MinTxInterval = p.BFD.DetectMultiplier, p.BFD.MinRxInterval, p.BFD.MinTxInterval
			ps.BFD = &b
		}
		st.Peers = append(st.Peers, ps)
	}
	return st
}

func fillPeer(ps *PeerStatus, gp *gapi.Peer) {
	state := gp.GetState()
	switch state.GetSessionState() {
	case gapi.PeerState_SESSION_STATE_CONNECT:
		ps.State = "connect"
	case gapi.PeerState_SESSION_STATE_ACTIVE:
		ps.State = "active"
	case gapi.PeerState_SESSION_STATE_OPENSENT:
		ps.State = "opensent"
	case gapi.PeerState_SESSION_STATE_OPENCONFIRM:
		ps.State = "openconfirm"
	case gapi.PeerState_SESSION_STATE_ESTABLISHED:
		ps.State = "established"
		ps.Up = true
	}
	ts := gp.GetTimers().GetState()
	if ps.Up && ts.GetUptime() != nil {
		ps.Since = ts.GetUptime().AsTime()
	} else if ts.GetDowntime() != nil && ts.GetDowntime().AsTime().Unix() > 0 {
		ps.Since = ts.GetDowntime().AsTime()
	}
	ps.UpdatesSent = state.GetMessages().GetSent().GetUpdate()
	ps.UpdatesReceived = state.GetMessages().GetReceived().GetUpdate()
	for _, af := range gp.GetAfiSafis() {
		ps.Advertised += af.GetState().GetAdvertised()
	}
	var local, remote bool
	for _, c := range state.GetLocalCap() {
		local = local || c.GetGracefulRestart() != nil
	}
	for _, c := range state.GetRemoteCap() {
		remote = remote || c.GetGracefulRestart() != nil
	}
	ps.GracefulRestart = local && remote
	ps.LastError = state.GetDisconnectMessage()
}
