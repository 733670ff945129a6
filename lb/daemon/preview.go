// SPDX-License-Identifier: Apache-2.0

package daemon

import (
	"context"
	"fmt"
	"net/netip"
	"strings"

	"github.com/l4lb/l4lb/discovery"
	"github.com/l4lb/l4lb/lb/api"
	"github.com/l4lb/l4lb/lb/change"
	"github.com/l4lb/l4lb/lb/config"
	"github.com/l4lb/l4lb/lb/maglev"
	"github.com/l4lb/l4lb/lb/plan"
	"github.com/l4lb/l4lb/lb/reconciler"
)

// preview says what programming cfg's services would do to what is
// programmed now, without changing anything: the file's snapshot replaces
// the current one in a copy of the merger, and the result goes through the
// same defaults, overrides and health as apply gives it. The old side is
// the tables the datapath holds; the new side is built with the running
// seed (a new seed waits for a restart). Control loop only.
func (d *Daemon) preview(cfg *config.Config) []change.Service {
	m := d.merger.Clone()
	m.Update(discovery.Snapshot{Source: d.file.Name(), Services: cfg.Services})
	merged, _ := m.Desired()
	r := d.plan.Resolve(merged, cfg.Defaults())
	v := d.view.Load()
	programmed := d.plan.Programmed(r.Desired)
	seed := d.cfg.Maglev.Seed

	old := map[string]change.Side{}
	for _, svc := range v.Services.All() {
		old[svc.Name] = change.Side{Service: svc, Table: liveOwners(seed, v.programmedOf(svc.Frontend).ServiceState)}
	}
	cur := map[string]change.Side{}
	for i, svc := range r.Desired {
		t, err := change.Build(seed, programmed[i])
		if err != nil {
			// The reconciler refuses it too; it would serve nothing.
			t = change.Table{Seed: seed}
		}
		cur[svc.Name] = change.Side{Service: svc, Table: t}
	}
	return change.Compare(old, cur)
}

// liveOwners is the programmed table of st as slot owners.
func liveOwners(seed maglev.Seed, st reconciler.ServiceState) change.Table {
	addrs := map[reconciler.BackendID]netip.AddrPort{}
	for _, b := range st.Backends {
		addrs[b.ID] = b.Addr
	}
	t := change.Table{Seed: seed, Owners: make([]netip.AddrPort, len(st.Table))}
	for i, id := range st.Table {
		t.Owners[i] = addrs[id]
	}
	return t
}

// OverGuard names the services of a preview that move more than max of
// their flows; max 0 is no guard.
func OverGuard(changes []change.Service, max float64) []string {
	if max <= 0 {
		return nil
	}
	var out []string
	for _, c := range changes {
		if c.Moved > max {
			out = append(out, fmt.Sprintf("service %q would move %s of its flows", c.Name, change.Percent(c.Moved)))
		}
	}
	return out
}

// guardError is a reload refused by daemon.max_flow_move.
func guardError(over []string, max float64) error {
	return fmt.Errorf("%s, more than daemon.max_flow_move = %g allows: the configuration is not applied; "+
		"review it with `l4lbctl config diff FILE`, and raise max_flow_move in the same edit to apply it deliberately",
		strings.Join(over, "; "), max)
}

// ConfigDiff implements api.Provider: the preview of a file's content,
// validated as a reload would validate it, on the control loop.
func (d *Daemon) ConfigDiff(ctx context.Context, req api.ConfigDiffRequest) (api.ConfigDiff, error) {
	opts := d.opts.Config
	if opts.Host != nil {
		opts.Host = HostFacts()
	}
	cfg, err := config.Parse(req.Name, []byte(req.Content), opts)
	if err != nil {
		return api.ConfigDiff{}, fmt.Errorf("%w: %w", err, api.ErrInvalid)
	}
	var out api.ConfigDiff
	err = d.query(ctx, func() error {
		out.PendingRestart = keepRunning(d.cfg, cfg)
		changes := d.preview(cfg)
		out.MaxFlowMove = cfg.Daemon.MaxFlowMove
		out.Refused = OverGuard(changes, cfg.Daemon.MaxFlowMove)
		out.Services = APIChanges(changes)
		return nil
	})
	out.Old, out.New = "running", req.Name
	return out, err
}

// APIChanges converts a change list to its wire form.
func APIChanges(changes []change.Service) []api.ServiceChange {
	out := make([]api.ServiceChange, 0, len(changes))
	for _, c := range changes {
		sc := api.ServiceChange{Name: c.Name, Status: c.Status, Other: c.Other, MovedFlows: c.Moved}
		for _, a := range c.Added {
			sc.Added = append(sc.Added, a.String())
		}
		for _, a := range c.Removed {
			sc.Removed = append(sc.Removed, a.String())
		}
		for _, r := range c.Reweighted {
			sc.Reweighted = append(sc.Reweighted, api.BackendChange{Backend: r.Backend.String(), Old: fmt.Sprint(r.Old), New: fmt.Sprint(r.New)})
		}
		for _, r := range c.Restated {
			sc.Restated = append(sc.Restated, api.BackendChange{Backend: r.Backend.String(), Old: r.Old.String(), New: r.New.String()})
		}
		out = append(out, sc)
	}
	return out
}

// OfflineChanges compares two configuration files as l4lbd would program
// them on a box with no other source, override or failed health check:
// `l4lbctl config diff OLD NEW`. Each side uses its own seed.
func OfflineChanges(old, cur *config.Config) ([]change.Service, error) {
	side := func(cfg *config.Config) (map[string]change.Side, error) {
		out := map[string]change.Side{}
		for _, svc := range cfg.Services {
			svc = plan.Normalize(svc.WithDefaults(cfg.Defaults()))
			t, err := change.Build(cfg.Maglev.Seed, svc)
			if err != nil {
				return nil, err
			}
			out[svc.Name] = change.Side{Service: svc, Table: t}
		}
		return out, nil
	}
	o, err := side(old)
	if err != nil {
		return nil, err
	}
	c, err := side(cur)
	if err != nil {
		return nil, err
	}
	return change.Compare(o, c), nil
}
