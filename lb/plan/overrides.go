// SPDX-License-Identifier: Apache-2.0

package plan

import (
	"net/netip"
	"time"

	"github.com/l4lb/l4lb/lb"
)

// Key names one backend of one service.
type Key struct {
	Service string         `json:"service"`
	Backend netip.AddrPort `json:"backend"`
}

// Override is a runtime state set through the API (`l4lbctl backend
// drain|enable|disable`). It wins over the source's state until cleared or
// until the backend leaves the service.
type Override struct {
	Key
	State lb.BackendState `json:"state"`
	Since time.Time       `json:"since"`
}

// Overrides are the runtime overrides by backend. The plan applies them
// and forgets those whose backend left its service; keeping them across
// restarts is the caller's (lb/daemon keeps them in a file).
type Overrides map[Key]Override

// apply returns svc with its overrides in force, and marks in seen the
// overrides that still apply.
func (o Overrides) apply(svc lb.Service, seen map[Key]bool) lb.Service {
	for i, b := range svc.Backends {
		k := Key{Service: svc.Name, Backend: b.Addr}
		if ov, ok := o[k]; ok {
			seen[k] = true
			svc.Backends[i].State = ov.State
		}
	}
	return svc
}

// prune forgets overrides of backends that left their service.
func (o Overrides) prune(seen map[Key]bool) bool {
	changed := false
	for k := range o {
		if !seen[k] {
			delete(o, k)
			changed = true
		}
	}
	return changed
}
