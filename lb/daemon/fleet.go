// SPDX-License-Identifier: Apache-2.0

package daemon

import (
	"context"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/l4lb/l4lb/discovery/consul"
	"github.com/l4lb/l4lb/lb/api"
	"github.com/l4lb/l4lb/lb/config"
	"github.com/l4lb/l4lb/lb/fleet"
)

// fleetRun is the running fleet check (with [discovery.consul]).
type fleetRun struct {
	f *consul.Fleet
	// pub serializes publishFleet: the control loop and the self-check
	// (selfcheck.go) both publish.
	pub sync.Mutex
	// local is the record last handed to Publish, under pub.
	local fleet.Box
	// cur is the same, for readers of the view.
	mu  sync.Mutex
	cur fleet.Box
}

// startFleet starts publishing and watching when cfg asks for it, until
// ctx ends (the record is then removed).
func (d *Daemon) startFleet(ctx context.Context, wg *sync.WaitGroup, cfg *config.Config) error {
	if cfg.Fleet == nil || cfg.Consul == nil {
		return nil
	}
	f, err := consul.NewFleet(cfg.Consul, cfg.Fleet, consul.FleetOptions{Log: d.log})
	if err != nil {
		return err
	}
	r := &fleetRun{f: f}
	wg.Add(1)
	go func() {
		defer wg.Done()
		f.Run(ctx)
	}()
	d.fleet = r
	d.log.Info("fleet check publishing this box", "box", f.Name(), "kv_prefix", cfg.Fleet.KVPrefix)
	return nil
}

// publishFleet hands the fleet check this view's record when it changed.
func (d *Daemon) publishFleet(v *view) {
	r := d.fleet
	if r == nil {
		return
	}
	r.pub.Lock()
	defer r.pub.Unlock()
	unverified := d.unverified()
	b := fleet.Box{Name: r.f.Name(), Version: Version, SeedFingerprint: seedFingerprint(v.cfg.Maglev.Seed), Services: []fleet.Service{}}
	for _, svc := range v.Services.All() {
		if ps := v.programmedOf(svc.Frontend); ps.Fingerprint != "" {
			fp := ps.Fingerprint
			if found, ok := unverified[svc.Frontend]; ok {
				fp = driftFingerprint(fp, found)
			}
			b.Services = append(b.Services, fleet.Service{Name: svc.Name, Frontend: svc.Frontend.String(), Fingerprint: fp})
		}
	}
	slices.SortFunc(b.Services, func(x, y fleet.Service) int { return strings.Compare(x.Frontend, y.Frontend) })
	prev := r.local
	prev.Updated = time.Time{}
	if reflect.DeepEqual(prev, b) {
		return
	}
	b.Updated = time.Now()
	r.local = b
	r.mu.Lock()
	r.cur = b
	r.mu.Unlock()
	r.f.Publish(b)
}

// fleetReport compares the boxes Consul holds, with this box's current
// record in place of the one Consul has, so a local change counts at once.
func (d *Daemon) fleetReport() (fleet.Report, consul.FleetStatus, bool) {
	r := d.fleet
	if r == nil {
		return fleet.Report{}, consul.FleetStatus{}, false
	}
	boxes, st := r.f.Boxes()
	r.mu.Lock()
	self := r.cur
	r.mu.Unlock()
	boxes = slices.DeleteFunc(boxes, func(b fleet.Box) bool { return b.Name == self.Name })
	if self.Name != "" {
		self.Seen = time.Now()
		boxes = append(boxes, self)
	}
	return fleet.Compare(boxes), st, true
}

// Fleet implements api.Provider.
func (d *Daemon) Fleet() (api.Fleet, error) {
	rep, st, ok := d.fleetReport()
	if !ok {
		return api.Fleet{}, fmt.Errorf("the fleet check is off: it publishes through [discovery.consul]; without Consul compare boxes with `l4lbctl fleet compare`: %w", api.ErrNotFound)
	}
	out := rep.API(d.fleet.f.Name())
	out.LastSync, out.Error = st.LastSync, st.Error
	for _, name := range slices.Sorted(maps.Keys(st.Gone)) {
		out.Gone = append(out.Gone, api.FleetGone{Name: name, LastSeen: st.Gone[name]})
	}
	return out, nil
}
