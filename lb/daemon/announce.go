// SPDX-License-Identifier: Apache-2.0

package daemon

import (
	"context"
	"fmt"
	"net/netip"
	"reflect"
	"slices"
	"sync"
	"time"

	"github.com/l4lb/l4lb/internal/cow"
	"github.com/l4lb/l4lb/lb"
	"github.com/l4lb/l4lb/lb/announce"
	"github.com/l4lb/l4lb/lb/api"
	"github.com/l4lb/l4lb/lb/bfd"
	"github.com/l4lb/l4lb/lb/config"
	"github.com/l4lb/l4lb/lb/datapath"
	"github.com/l4lb/l4lb/lb/health"
	"github.com/l4lb/l4lb/lb/plan"
)

// recheckEvery is how often the announcement is decided again while a
// backend waits for its first passed check: the checker reports changes of
// state, and a backend that starts up and passes does not change.
const recheckEvery = 100 * time.Millisecond

// announcers are the running VIP announcers; nil fields are off. Control
// loop only.
type announcers struct {
	bgp *announce.Speaker
	l2  *announce.Responder
	// l2cfg is what the responder was started with; it changes only with
	// a restart.
	l2cfg *config.L2
	// opened is true once the speaker got its first set (which opens the
	// sessions).
	opened bool
	// complete is true once a decision over every service found every
	// backend probed: from then on a pass over a few services decides
	// for their VIPs alone (announceSome).
	complete bool
	// recheck fires while some backend waits for its first passed check.
	recheck *time.Timer
}

// startAnnouncers starts what [bgp] and [l2] ask for. restarting says that
// this l4lbd adopted a datapath that kept forwarding, which graceful
// restart tells the routers. Nothing is announced until the first
// announce call, which opens the BGP sessions with the complete set.
func (d *Daemon) startAnnouncers(ctx context.Context, wg *sync.WaitGroup, cfg *config.Config, restarting bool) error {
	a := &announcers{recheck: time.NewTimer(time.Hour)}
	a.recheck.Stop()
	if cfg.BGP != nil {
		held, err := d.dp.HeldBFD()
		if err != nil {
			d.log.Error("read the BFD sessions the previous l4lbd handed over; they start afresh", "error", err)
		}
		s, err := announce.NewSpeaker(cfg.BGP, announce.SpeakerOptions{Log: d.log, Restarting: restarting && cfg.BGP.GracefulRestart,
			ResumeBFD: savedBFD(held), ReleaseBFD: d.dp.ReleaseBFD})
		if err != nil {
			return err
		}
		a.bgp = s
	} else if held, err := d.dp.HeldBFD(); err == nil {
		for _, h := range held {
			if _, err := d.dp.ReleaseBFD(h.Peer); err != nil {
				d.log.Error("stop the datapath answering BFD", "peer", h.Peer, "error", err)
			}
		}
	}
	if cfg.L2 != nil {
		r, err := announce.NewResponder(cfg.L2, d.log)
		if err != nil {
			if a.bgp != nil {
				a.bgp.Stop(config.StopDrain, 0)
			}
			return err
		}
		a.l2, a.l2cfg = r, cfg.L2
		wg.Add(1)
		go func() {
			defer wg.Done()
			r.Run(ctx)
		}()
	}
	d.ann = a
	return nil
}

// stopAnnouncers ends the BGP speaker as [bgp] on_stop says: a drain
// withdraws and waits while the datapath still forwards; a keep leaves the
// routes to the routers' graceful restart. The L2 responder answers until
// Run's context ends, after this.
func (d *Daemon) stopAnnouncers() {
	a := d.ann
	if a == nil || a.bgp == nil {
		return
	}
	b := d.cfg.BGP
	handoff := a.bgp.Stop(b.OnStop, b.DrainTime)
	if len(handoff) == 0 {
		return
	}
	// The routers keep this box's routes for restart_time (graceful
	// restart); its BFD sessions must stay up as long, or a router that
	// ties BGP to BFD withdraws them at once.
	peers := make([]netip.Addr, 0, len(handoff))
	for _, h := range handoff {
		peers = append(peers, h.Peer)
	}
	if d.cfg.Datapath.Attach == config.AttachTC {
		d.log.Warn("the datapath runs at tc, which cannot answer BFD: routers that tie BGP to BFD withdraw this box until the next l4lbd is up; attach at XDP to keep the sessions up", "peers", peers)
		return
	}
	if err := d.dp.HoldBFD(handoff, b.RestartTime); err != nil {
		d.log.Error("hand the BFD sessions to the datapath; routers that tie BGP to BFD withdraw this box until the next l4lbd is up", "error", err)
		return
	}
	d.log.Info("the datapath answers BFD for this box until the next l4lbd resumes the sessions", "peers", peers, "for", b.RestartTime)
}

// savedBFD are the sessions the datapath held, as lb/bfd resumes them.
func savedBFD(held []datapath.BFDHold) []bfd.Saved {
	out := make([]bfd.Saved, 0, len(held))
	for _, h := range held {
		out = append(out, h.Saved)
	}
	return out
}

// announceInputs is what the announcers need of every served service,
// from what the view programmed and the health states given. A checked
// backend counts as healthy once a probe of it passed and it is up: the
// checker starts backends up, so that the datapath serves at once after a
// restart, but an announcement draws traffic to the box and waits for the
// evidence. waiting says that some backend has not passed yet, unprobed
// that some has not even had a probe end.
func announceInputs(svcs cow.Slice[lb.Service], idx plan.Index, states func(health.Key) (health.Status, bool)) (out []announce.Service, waiting, unprobed bool) {
	out = make([]announce.Service, 0, svcs.Len())
	for _, svc := range svcs.All() {
		ps, ok := idx.Get(svc.Frontend)
		in := announce.Service{
			Name:       svc.Name,
			VIP:        svc.Frontend.Addr,
			Programmed: ok && ps.HasEntry && ps.HasTable,
			Announce:   svc.Announce,
		}
		for _, b := range svc.Backends {
			if b.State != lb.Active || b.Weight == 0 {
				continue
			}
			if svc.Health.Type != lb.HealthNone {
				st, ok := states(health.Key{Service: svc.Name, Backend: b.Addr})
				if !ok || st.State != health.Up {
					continue
				}
				if !st.Passed {
					in.Unchecked++
					waiting = true
					unprobed = unprobed || st.LastCheck.IsZero()
					continue
				}
			}
			in.Healthy++
		}
		out = append(out, in)
	}
	return out, waiting, unprobed
}

// announce applies the rule to the view's services and hands each
// announcer its set. It runs on the control loop after every pass, with
// the states the pass programmed. After a pass over a few services
// (changed names them; prev is the last view) only their VIPs are decided
// again. It decides only: the caller publishes v and then calls the
// returned apply, which hands the announcers their sets, so that the API
// never shows a VIP announced after a router has seen it withdrawn.
func (d *Daemon) announce(v, prev *view, changed []string) (apply func()) {
	if a := d.ann; changed != nil && prev != nil && a != nil && a.complete {
		return d.announceSome(v, prev, changed)
	}
	return d.announceWith(v, v.Health.Get)
}

// announceSome is announceWith for the VIPs of the services named, whose
// part of v alone differs from prev: the decision for every other VIP is
// prev's. Every service on those VIPs is looked at (a VIP is announced when
// any of its services may be), none else.
func (d *Daemon) announceSome(v, prev *view, changed []string) (apply func()) {
	a := d.ann
	in, addrs, waiting := someInputs(v, changed)
	if waiting {
		a.recheck.Reset(recheckEvery)
	}
	if a.bgp != nil {
		v.bgpVIPs = spliceVIPs(prev.bgpVIPs, announce.Decide(in, a.bgp.MinHealthy()), addrs)
	}
	if a.l2 != nil {
		v.l2VIPs = spliceVIPs(prev.l2VIPs, announce.Decide(in, a.l2.MinHealthy()), addrs)
	}
	return func() { d.setAnnounced(v, true, false) }
}

// setAnnounced hands each announcer the set v decided; bgp false holds the
// BGP set back (sessions not opened yet) and ready tells the L2 failover
// that this box's set is complete.
func (d *Daemon) setAnnounced(v *view, bgp, ready bool) {
	a := d.ann
	if a.bgp != nil && bgp {
		if err := a.bgp.Set(announce.Announced(v.bgpVIPs)); err != nil {
			d.log.Error("BGP announcement", "error", err)
		}
	}
	if a.l2 != nil {
		a.l2.Set(announce.Announced(v.l2VIPs))
		if ready {
			// Failover: a box whose set is complete outranks one
			// still probing.
			a.l2.Ready()
		}
	}
}

// someInputs are announceInputs for every service on the VIPs of the
// services named, and those VIP addresses.
func someInputs(v *view, changed []string) (in []announce.Service, addrs []netip.Addr, waiting bool) {
	var on []lb.Service
	for _, name := range changed {
		i, ok := v.Pos[name]
		if !ok {
			continue
		}
		addr := v.Services.At(i).Frontend.Addr
		if slices.Contains(addrs, addr) {
			continue
		}
		addrs = append(addrs, addr)
		for _, j := range v.VIPs.At(addr) {
			on = append(on, v.Services.At(j))
		}
	}
	in, waiting, _ = announceInputs(cow.SliceOf(on), v.Index, v.Health.Get)
	return in, addrs, waiting
}

// spliceVIPs is prev (sorted by address) with its decisions for addrs
// replaced by fresh's, which holds decisions for those addresses only
// (none for an address whose every service opts out).
func spliceVIPs(prev, fresh []announce.VIP, addrs []netip.Addr) []announce.VIP {
	out := slices.DeleteFunc(slices.Clone(prev), func(v announce.VIP) bool { return slices.Contains(addrs, v.Addr) })
	for _, v := range fresh {
		i, _ := slices.BinarySearchFunc(out, v.Addr, func(x announce.VIP, a netip.Addr) int { return x.Addr.Compare(a) })
		out = slices.Insert(out, i, v)
	}
	return out
}

// reannounce decides again on the current view with the checks' current
// states, while a backend waits for its first passed check.
func (d *Daemon) reannounce() {
	v := *d.view.Load()
	apply := d.announceWith(&v, plan.MapLookup(d.health.States()))
	d.view.Store(&v)
	apply()
}

// recheckC fires when reannounce is due; nil (never) without announcers.
func (d *Daemon) recheckC() <-chan time.Time {
	if d.ann == nil {
		return nil
	}
	return d.ann.recheck.C
}

func (d *Daemon) announceWith(v *view, states func(health.Key) (health.Status, bool)) (apply func()) {
	a := d.ann
	if a == nil || (a.bgp == nil && a.l2 == nil) {
		return func() {}
	}
	in, waiting, unprobed := announceInputs(v.Services, v.Index, states)
	if waiting {
		a.recheck.Reset(recheckEvery)
	}
	a.complete = !unprobed
	if a.bgp != nil {
		v.bgpVIPs = announce.Decide(in, a.bgp.MinHealthy())
	}
	if a.l2 != nil {
		v.l2VIPs = announce.Decide(in, a.l2.MinHealthy())
	}
	// The first BGP set opens the sessions, and after a restart the
	// routers drop the routes it lacks: wait until every backend has had
	// a probe end, so that it is the complete set.
	bgp := a.opened || !unprobed
	a.opened = bgp
	return func() { d.setAnnounced(v, bgp, !unprobed) }
}

// reloadAnnouncers applies a reloaded [bgp] to the running speaker. Turning
// BGP or L2 on or off, and L2 settings, take a restart; the warnings say
// which.
func (d *Daemon) reloadAnnouncers(cfg *config.Config) (restartOnly []string) {
	a := d.ann
	old := d.cfg
	switch {
	case (old.BGP == nil) != (cfg.BGP == nil):
		restartOnly = append(restartOnly, "[bgp] added or removed")
		cfg.BGP = old.BGP
	case a != nil && a.bgp != nil:
		ro, err := a.bgp.Reconfigure(cfg.BGP)
		if err != nil {
			d.log.Error("BGP reconfiguration", "error", err)
		}
		restartOnly = append(restartOnly, ro...)
	}
	if (old.L2 == nil) != (cfg.L2 == nil) || old.L2 != nil && !reflect.DeepEqual(*old.L2, *cfg.L2) {
		restartOnly = append(restartOnly, "[l2]")
		cfg.L2 = old.L2
	}
	return restartOnly
}

// BGP implements api.Provider.
func (d *Daemon) BGP() (api.BGPStatus, error) {
	if b := d.bgpStatus(d.view.Load()); b != nil {
		return *b, nil
	}
	return api.BGPStatus{}, fmt.Errorf("BGP is off: add [bgp] to the configuration (docs/scale-out.md): %w", api.ErrNotFound)
}

func (d *Daemon) bgpStatus(v *view) *api.BGPStatus {
	a := d.ann
	if a == nil || a.bgp == nil {
		return nil
	}
	st := a.bgp.Status()
	out := &api.BGPStatus{
		ASN: st.ASN, RouterID: st.RouterID.String(), Peers: []api.BGPPeer{}, VIPs: apiVIPs(v.bgpVIPs),
		GracefulRestart: v.cfg.BGP.GracefulRestart, OnStop: v.cfg.BGP.OnStop.String(),
	}
	for _, p := range st.Peers {
		ap := api.BGPPeer{
			Address: p.Address.String(), ASN: p.ASN, State: p.State, Up: p.Up, Since: p.Since,
			UpdatesSent: p.UpdatesSent, UpdatesReceived: p.UpdatesReceived, Advertised: p.Advertised,
			GracefulRestart: p.GracefulRestart, LastError: p.LastError,
		}
		if b := p.BFD; b != nil {
			ap.BFD = &api.BFDSession{
				State: b.State, Since: b.Since, Transitions: b.Transitions,
				PacketsSent: b.PacketsSent, PacketsReceived: b.PacketsReceived,
				DetectMultiplier: b.DetectMultiplier, MinRxInterval: b.MinRxInterval.String(), MinTxInterval: b.MinTxInterval.String(),
			}
		}
		out.Peers = append(out.Peers, ap)
	}
	return out
}

func (d *Daemon) l2Status(v *view) *api.L2Status {
	a := d.ann
	if a == nil || a.l2 == nil {
		return nil
	}
	st := a.l2.Status()
	out := &api.L2Status{VIPs: apiVIPs(v.l2VIPs), Interfaces: []api.L2Interface{}}
	for _, i := range st.Interfaces {
		out.Interfaces = append(out.Interfaces, api.L2Interface{Name: i.Name, ARPReplies: i.ARPReplies, NDReplies: i.NDReplies, GratuitousSent: i.GratuitousSent})
	}
	out.Failover = apiFailover(st.Failover)
	return out
}

func apiFailover(f *announce.FailoverStatus) *api.L2Failover {
	if f == nil {
		return nil
	}
	out := &api.L2Failover{
		Name: f.Name, Group: f.Group, Priority: f.Priority, Role: f.Role.String(), Since: f.Since, Ready: f.Ready,
		Transitions: map[string]uint64{}, Conflicts: f.Conflicts, Interval: f.Interval.String(), DetectMultiplier: f.DetectMultiplier, Peers: []api.L2Peer{},
	}
	for r, n := range f.Transitions {
		out.Transitions[r.String()] = n
	}
	for _, p := range f.Peers {
		out.Peers = append(out.Peers, api.L2Peer{Name: p.Name, MAC: p.MAC.String(), Interface: p.Interface, Priority: p.Priority, Role: p.Role.String(), Ready: p.Ready, LastSeen: p.LastSeen})
	}
	return out
}

func apiVIPs(vips []announce.VIP) []api.AnnouncedVIP {
	out := []api.AnnouncedVIP{}
	for _, v := range vips {
		out = append(out, api.AnnouncedVIP{VIP: v.Addr.String(), Announced: v.Announced, Services: v.Services, Reason: v.Reason})
	}
	return out
}
