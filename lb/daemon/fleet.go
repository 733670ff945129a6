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
	"github.com/l4lb/l4lb/lb"
	"github.com/l4lb/l4lb/lb/api"
	"github.com/l4lb/l4lb/lb/config"
	"github.com/l4lb/l4lb/lb/fleet"
	"github.com/l4lb/l4lb/lb/plan"
)

// fleetRun is the running fleet check (with [discovery.consul]).
type fleetRun struct {
	f *consul.Fleet
	// pub serializes publishFleet: the control loop and the self-check
	// (selfcheck.go) both publish.
	pub sync.Mutex
	// local is the record last handed to Publish, under pub; clean says
	// that no service in it carried a drift fingerprint.
	local fleet.Box
	clean bool
	// from is the view local was made from.
	from *plan.View
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
// After a pass over a few services (changed names them; prev is the view
// it replaced) only their entries are made again, when the last record was
// made from prev and no service is flagged by the self-check.
func (d *Daemon) publishFleet(v, prev *view, changed []string) {
	r := d.fleet
	if r == nil {
		return
	}
	r.pub.Lock()
	defer r.pub.Unlock()
	unverified := d.unverified()
	var b fleet.Box
	var same bool
	if changed != nil && prev != nil && r.from == prev.View && len(unverified) == 0 && r.clean {
		b, same = fleetPatch(r.local, v, changed)
	} else {
		b = fleet.Box{Name: r.f.Name(), Version: Version, SeedFingerprint: seedFingerprint(v.cfg.Maglev.Seed), Services: fleetServices(v, unverified)}
		prev := r.local
		prev.Updated = time.Time{}
		b.Updated = time.Time{}
		same = reflect.DeepEqual(prev, b)
	}
	r.clean, r.from = len(unverified) == 0, v.View
	if same {
		return
	}
	b.Updated = time.Now()
	r.local = b
	r.mu.Lock()
	r.cur = b
	r.mu.Unlock()
	r.f.Publish(b)
}

// fleetServices are the entries of every programmed service of v, sorted
// by frontend.
func fleetServices(v *view, unverified map[lb.Frontend]string) []fleet.Service {
	out := []fleet.Service{}
	for _, svc := range v.Services.All() {
		if fs, ok := fleetService(v, svc, unverified); ok {
			out = append(out, fs)
		}
	}
	slices.SortFunc(out, func(x, y fleet.Service) int { return strings.Compare(x.Frontend, y.Frontend) })
	return out
}

// fleetService is svc's entry in the fleet record, if it is programmed:
// its fingerprint, or a drift one when the self-check found its maps
// differ (unverified).
func fleetService(v *view, svc lb.Service, unverified map[lb.Frontend]string) (fleet.Service, bool) {
	ps := v.programmedOf(svc.Frontend)
	if ps.Fingerprint == "" {
		return fleet.Service{}, false
	}
	fp := ps.Fingerprint
	if found, ok := unverified[svc.Frontend]; ok {
		fp = driftFingerprint(fp, found)
	}
	return fleet.Service{Name: svc.Name, Frontend: svc.Frontend.String(), Fingerprint: fp}, true
}

// fleetPatch is last (sorted by frontend) with the entries of the services
// named made again from v, and whether nothing changed.
func fleetPatch(last fleet.Box, v *view, changed []string) (fleet.Box, bool) {
	b := last
	b.Services = slices.Clone(last.Services)
	same := true
	for _, name := range changed {
		i, ok := v.Pos[name]
		if !ok {
			continue
		}
		svc := v.Services.At(i)
		fe := svc.Frontend.String()
		at, found := slices.BinarySearchFunc(b.Services, fe, func(x fleet.Service, fe string) int { return strings.Compare(x.Frontend, fe) })
		fs, ok := fleetService(v, svc, nil)
		switch {
		case ok && found:
			if b.Services[at] != fs {
				b.Services[at], same = fs, false
			}
		case ok:
			b.Services, same = slices.Insert(b.Services, at, fs), false
		case found:
			b.Services, same = slices.Delete(b.Services, at, at+1), false
		}
	}
	return b, same
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
