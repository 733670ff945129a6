// SPDX-License-Identifier: Apache-2.0

package daemon

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/l4lb/l4lb/lb"
	"github.com/l4lb/l4lb/lb/api"
	"github.com/l4lb/l4lb/lb/plan"
)

// overrides are kept in a file next to the admin socket, named after it
// (/run/l4lb/l4lb.overrides.json by default; /run is kept across restarts
// of the service by RuntimeDirectoryPreserve): a restarted l4lbd keeps
// them, a reboot clears them, as befits a runtime override.
type overrides struct {
	path string
	m    plan.Overrides
}

// OverridesPath is the file holding the runtime backend overrides of the
// l4lbd whose admin socket is socket.
func OverridesPath(socket string) string { return runtimePath(socket, ".overrides.json") }

// loadOverrides reads the overrides; the caller holds the lock. Versions
// before the lock kept them as overrides.json next to the socket: such a
// file is taken over.
func loadOverrides(socket string) (*overrides, error) {
	o := &overrides{path: OverridesPath(socket), m: plan.Overrides{}}
	if _, err := os.Stat(o.path); errors.Is(err, os.ErrNotExist) {
		_ = os.Rename(filepath.Join(filepath.Dir(socket), "overrides.json"), o.path)
	}
	b, err := os.ReadFile(o.path)
	if errors.Is(err, os.ErrNotExist) {
		return o, nil
	}
	if err != nil {
		return o, fmt.Errorf("read backend overrides %s: %w", o.path, err)
	}
	var list []plan.Override
	if err := json.Unmarshal(b, &list); err != nil {
		return o, fmt.Errorf("backend overrides %s are corrupt (%v); starting without them", o.path, err)
	}
	for _, ov := range list {
		o.m[ov.Key] = ov
	}
	return o, nil
}

func (o *overrides) save() error {
	list := make([]plan.Override, 0, len(o.m))
	for _, ov := range o.m {
		list = append(list, ov)
	}
	slices.SortFunc(list, func(a, b plan.Override) int {
		if a.Service != b.Service {
			if a.Service < b.Service {
				return -1
			}
			return 1
		}
		return a.Backend.Compare(b.Backend)
	})
	b, err := json.MarshalIndent(list, "", "  ")
	if err != nil {
		return err
	}
	if err := writeAtomic(o.path, b); err != nil {
		return fmt.Errorf("save backend overrides: %w", err)
	}
	return nil
}

// Backend implements api.Provider: it runs on the control loop, so the
// override is programmed when the call returns.
func (d *Daemon) Backend(ctx context.Context, service string, backend netip.AddrPort, action api.BackendAction) error {
	return d.doFor(ctx, service, func() error {
		svc, ok := d.merger.Service(service)
		if !ok {
			return fmt.Errorf("no service %q: %w", service, api.ErrNotFound)
		}
		if !slices.ContainsFunc(svc.Backends, func(b lb.Backend) bool { return b.Addr == backend }) {
			return fmt.Errorf("service %q has no backend %s: %w", service, backend, api.ErrNotFound)
		}
		k := plan.Key{Service: service, Backend: backend}
		switch action {
		case api.ActionClear:
			delete(d.overrides.m, k)
		case api.ActionDrain:
			d.overrides.m[k] = plan.Override{Key: k, State: lb.Draining, Since: time.Now()}
		case api.ActionDisable:
			d.overrides.m[k] = plan.Override{Key: k, State: lb.Disabled, Since: time.Now()}
		case api.ActionEnable:
			d.overrides.m[k] = plan.Override{Key: k, State: lb.Active, Since: time.Now()}
		}
		d.log.Info("backend override", "service", service, "backend", backend, "action", action)
		return d.overrides.save()
	})
}

// doFor runs f on the control loop, then reconciles, and returns f's
// error. f can change only the service named service ("" for any), so the
// pass after it redoes that service alone when it can (applyService).
func (d *Daemon) doFor(ctx context.Context, service string, f func() error) error {
	done := make(chan error, 1)
	select {
	case d.requests <- request{f: f, done: done, service: service}:
	case <-ctx.Done():
		return ctx.Err()
	}
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// ping waits until the control loop is free: proof it is not wedged.
func (d *Daemon) ping(ctx context.Context) error {
	return d.query(ctx, func() error { return nil })
}

// query runs f on the control loop, which owns the merger and the
// configuration, without a reconcile after it: for reads.
func (d *Daemon) query(ctx context.Context, f func() error) error {
	done := make(chan error, 1)
	select {
	case d.requests <- request{f: f, done: done, ping: true}:
	case <-ctx.Done():
		return ctx.Err()
	}
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// request is work for the control loop.
type request struct {
	f    func() error
	done chan error
	// ping: run f only, no reconcile.
	ping bool
	// service, when set, is the only service f can change.
	service string
}
