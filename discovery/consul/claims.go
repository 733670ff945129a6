// SPDX-License-Identifier: Apache-2.0

package consul

import (
	"fmt"
	"slices"
	"strings"

	"github.com/l4lb/l4lb/lb"
)

// candidate is a service the source could publish, with the label of its
// origin (`consul service "web"` or `consul KV l4lb/services/web`).
type candidate struct {
	origin string
	svc    lb.Service
}

// claims decides which of the source's own services may be published: two
// Consul services (or a Consul service and a KV definition) with the same
// frontend or the same name would be one datapath entry, so the earlier
// claim keeps serving and both are told, as the merger does between
// sources. The merger never sees such a pair, because it only compares
// different sources.
type claims struct {
	frontends map[lb.Frontend]string // frontend -> origin
	names     map[string]string      // name -> origin
}

func newClaims() *claims {
	return &claims{frontends: map[lb.Frontend]string{}, names: map[string]string{}}
}

// resolve returns the services to publish, sorted by name, and a problem
// per origin involved in a conflict.
func (c *claims) resolve(cands []candidate) ([]lb.Service, map[string][]string) {
	// Release claims whose origin no longer makes them.
	live := map[string]lb.Service{}
	for _, cd := range cands {
		live[cd.origin] = cd.svc
	}
	for fe, o := range c.frontends {
		if s, ok := live[o]; !ok || s.Frontend != fe {
			delete(c.frontends, fe)
		}
	}
	for name, o := range c.names {
		if s, ok := live[o]; !ok || s.Name != name {
			delete(c.names, name)
		}
	}

	// New claims in a fixed order, so that a fresh start decides the same.
	slices.SortFunc(cands, func(a, b candidate) int { return strings.Compare(a.origin, b.origin) })
	problems := map[string][]string{}
	var out []lb.Service
	for _, cd := range cands {
		if o, ok := c.frontends[cd.svc.Frontend]; ok && o != cd.origin {
			problems[cd.origin] = append(problems[cd.origin], fmt.Sprintf("%s: service %q: frontend %s is already served by %s: left out; change its l4lb-vip, l4lb-port or l4lb-protocol",
				cd.origin, cd.svc.Name, cd.svc.Frontend, o))
			problems[o] = append(problems[o], fmt.Sprintf("%s: frontend %s is also claimed by %s, which is left out while this one serves it",
				o, cd.svc.Frontend, cd.origin))
			continue
		}
		if o, ok := c.names[cd.svc.Name]; ok && o != cd.origin {
			problems[cd.origin] = append(problems[cd.origin], fmt.Sprintf("%s: service name %q is already used by %s: left out; rename one of them",
				cd.origin, cd.svc.Name, o))
			problems[o] = append(problems[o], fmt.Sprintf("%s: service name %q is also used by %s, which is left out while this one serves",
				o, cd.svc.Name, cd.origin))
			continue
		}
		c.frontends[cd.svc.Frontend] = cd.origin
		c.names[cd.svc.Name] = cd.origin
		out = append(out, cd.svc)
	}
	slices.SortFunc(out, func(a, b lb.Service) int { return strings.Compare(a.Name, b.Name) })
	return out, problems
}
