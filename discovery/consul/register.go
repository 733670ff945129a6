// SPDX-License-Identifier: Apache-2.0

package consul

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/hashicorp/consul/api"
)

// SelfService is the Consul service name under which l4lb boxes register
// themselves (discovery.consul.register_self).
const SelfService = "l4lb"

// SelfID is the Consul service id of the box named host; its TTL check has
// the id SelfID(host) + ":health".
func SelfID(host string) string { return SelfService + "-" + host }

// registerSelf keeps this box registered with the local agent and its TTL
// check fed from Options.Healthy until ctx ends, then deregisters it. An
// agent that restarts forgets local registrations, so a failed TTL update
// leads to registering again rather than to giving up.
func (s *Source) registerSelf(ctx context.Context) {
	host := s.opts.Hostname
	if host == "" {
		h, err := os.Hostname()
		if err != nil || h == "" {
			s.log.Error("cannot register this box in Consul: no host name (set one, or turn register_self off)", "error", err)
			return
		}
		host = h
	}
	id := SelfID(host)
	checkID := id + ":health"
	ttl := 3 * s.opts.SelfInterval
	reg := &api.AgentServiceRegistration{
		ID:   id,
		Name: SelfService,
		Meta: map[string]string{"l4lb-host": host},
		Check: &api.AgentServiceCheck{
			CheckID: checkID,
			Name:    "l4lbd health",
			TTL:     ttl.String(),
			// A box that died without deregistering disappears after a
			// while instead of staying critical forever.
			DeregisterCriticalServiceAfter: (10 * ttl).String(),
		},
	}
	log := s.log.With("service_id", id)

	registered, lastOK := false, true
	tick := time.NewTicker(s.opts.SelfInterval)
	defer tick.Stop()
	for {
		if !registered {
			err := s.client.Agent().ServiceRegisterOpts(reg, api.ServiceRegisterOpts{}.WithContext(ctx))
			if err != nil && ctx.Err() != nil {
				// Stopped while asking: the agent may have registered
				// the box all the same, so the stop deregisters it.
				registered = true
			} else if err != nil {
				if lastOK {
					log.Warn("cannot register this box in Consul; retrying", "error", err)
				}
				lastOK = false
			} else {
				registered = true
				log.Info("registered this box in Consul", "ttl", ttl)
			}
		}
		if registered {
			status, output := api.HealthPassing, "l4lbd is healthy"
			if s.opts.Healthy != nil {
				if err := s.opts.Healthy(); err != nil {
					status, output = api.HealthCritical, err.Error()
				}
			}
			q := (&api.QueryOptions{}).WithContext(ctx)
			if err := s.client.Agent().UpdateTTLOpts(checkID, output, status, q); err != nil {
				// Stopped while asking says nothing about the
				// registration, which the stop below removes.
				if ctx.Err() == nil {
					if lastOK {
						log.Warn("cannot update this box's health check in Consul; registering again", "error", err)
					}
					registered, lastOK = false, false
				}
			} else if !lastOK {
				log.Info("this box's health check in Consul is updated again")
				lastOK = true
			}
		}
		select {
		case <-ctx.Done():
			if registered {
				s.deregisterSelf(ctx, id)
			}
			return
		case <-tick.C:
		}
	}
}

// deregisterSelf removes the registration on a clean stop, so operators see
// the box leave rather than turn critical.
func (s *Source) deregisterSelf(ctx context.Context, id string) {
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if err := s.client.Agent().ServiceDeregisterOpts(id, (&api.QueryOptions{}).WithContext(dctx)); err != nil {
		s.log.Warn("cannot deregister this box from Consul; it will turn critical and be removed after its check expires", "service_id", id, "error", fmt.Sprint(err))
		return
	}
	s.log.Info("deregistered this box from Consul", "service_id", id)
}
