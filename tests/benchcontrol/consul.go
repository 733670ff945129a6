// SPDX-License-Identifier: Apache-2.0

package main

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/l4lb/l4lb/discovery/consul"
	"github.com/l4lb/l4lb/internal/testnet"
	"github.com/l4lb/l4lb/tests/topo"
)

// consulAddr is where the agent listens, in the LB box's namespace, so
// that l4lbd reaches it on its own loopback.
const consulAddr = "127.0.0.1:8500"

// consulAgent is a dev-mode Consul agent holding n services of b
// instances, registered the way l4lbd's Consul source reads them (tag
// l4lb, meta l4lb-vip / l4lb-port / l4lb-protocol), and the bench's
// client of its HTTP API.
type consulAgent struct {
	proc  *topo.Proc
	api   *api.Client
	dir   string
	setup time.Duration // from the agent's start to every instance registered
	// changes counts the changes made so far, over every binary: each
	// gives the changed instance a port it did not have before.
	changes int
}

// startConsul runs bin/consul (`make bin/consul`) as a dev agent in h's
// namespace and registers n services of b instances. The instances are
// the file's backends (backendAddr), so each service has the same
// backends by either path.
func startConsul(t testnet.TB, h *topo.Host, bin string, n, b int) *consulAgent {
	t0 := time.Now()
	dir, err := os.MkdirTemp("", "l4lb-bench-consul-")
	if err != nil {
		t.Fatalf("consul: %v", err)
	}
	c := &consulAgent{dir: dir}
	c.proc = h.Start(bin, "agent", "-dev", "-node", "bench",
		"-bind", "127.0.0.1", "-client", "127.0.0.1",
		"-dns-port=-1", "-grpc-port=-1", "-grpc-tls-port=-1",
		"-data-dir", filepath.Join(dir, "data"),
		"-hcl", "disable_update_check = true", "-log-level", "warn")
	tr := &http.Transport{
		MaxIdleConnsPerHost: 64,
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			var conn net.Conn
			err := h.NS.Do(func() error {
				var err error
				conn, err = (&net.Dialer{Timeout: 3 * time.Second}).DialContext(ctx, network, addr)
				return err
			})
			return conn, err
		},
	}
	if c.api, err = api.NewClient(&api.Config{Address: consulAddr, Transport: tr}); err != nil {
		t.Fatalf("consul client: %v", err)
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		leader, err := c.api.Status().Leader()
		if err == nil && leader != "" {
			break
		}
		if c.proc.Exited() || time.Now().After(deadline) {
			t.Fatalf("consul agent did not come up: %v\n%s", err, c.proc.Log())
		}
		time.Sleep(100 * time.Millisecond)
	}
	// Registered concurrently: one request per instance.
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, 1)
	for range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				k := int(next.Add(1) - 1)
				if k >= n*b {
					return
				}
				if err := c.api.Agent().ServiceRegister(consulInstance(k/b, k%b, b, -1)); err != nil {
					select {
					case errs <- fmt.Errorf("register instance %d of s%d: %w", k%b, k/b, err):
					default:
					}
					return
				}
			}
		}()
	}
	wg.Wait()
	select {
	case err := <-errs:
		t.Fatalf("consul: %v", err)
	default:
	}
	c.setup = time.Since(t0)
	return c
}

func (c *consulAgent) stop() {
	_ = c.proc.Stop()
	os.RemoveAll(c.dir)
}

// consulInstance is instance j of service i; change ≥ 0 gives it the
// port that change's backend has (changedBackend).
func consulInstance(i, j, b, change int) *api.AgentServiceRegistration {
	a := backendAddr(i*b + j)
	if change >= 0 {
		a = changedBackend(a, change)
	}
	return &api.AgentServiceRegistration{
		ID:      fmt.Sprintf("s%d-%d", i, j),
		Name:    fmt.Sprintf("s%d", i),
		Tags:    []string{"l4lb"},
		Address: a.Addr().String(),
		Port:    int(a.Port()),
		Meta: map[string]string{
			consul.MetaVIP:      serviceVIP(i).String(),
			consul.MetaPort:     strconv.Itoa(servicePort),
			consul.MetaProtocol: "tcp",
		},
	}
}

// changedBackend is what backend a becomes with change i: the same
// address on a port no other backend has.
func changedBackend(a netip.AddrPort, i int) netip.AddrPort {
	return netip.AddrPortFrom(a.Addr(), 60000+uint16(i%5000))
}
