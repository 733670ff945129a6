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
// l4lb, meta l4lb-vip / l4lb-port / l4lb-protocol; no checks, so
// passing), and the bench's client of its HTTP API.
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
	t.Cleanup(func() { os.RemoveAll(dir) })
	c := &consulAgent{dir: dir}
	c.proc = h.Start(bin, "agent", "-dev", "-node", "bench",
		"-bind", "127.0.0.1", "-client", "127.0.0.1",
		"-dns-port=-1", "-grpc-port=-1", "-grpc-tls-port=-1",
		"-data-dir", filepath.Join(dir, "data"),
		"-hcl", "disable_update_check = true",
		// l4lbd holds one blocking query, so one connection, per
		// service; the agent's default limit of 200 per client address
		// answers the rest with 429 (found by this bench at 1,000
		// services: l4lbd then never sees most of them).
		"-hcl", fmt.Sprintf("limits { http_max_conns_per_client = %d }", consulConns(n)),
		"-log-level", "warn")
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
	// The instances are catalog entries of one node of their own, as an
	// external service's are: the agent's anti-entropy leaves them
	// alone, and they go in 64 to a transaction (PUT /v1/txn), 4
	// transactions at a time. One agent registration each took 20 ms at
	// 32 at a time: 35 minutes for 100,000 instances.
	if _, err := c.api.Catalog().Register(&api.CatalogRegistration{Node: consulNode, Address: topo.Prefix4 + "100"}, nil); err != nil {
		t.Fatalf("consul: register node %s: %v", consulNode, err)
	}
	const perTxn = 64
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, 1)
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				k0 := int(next.Add(perTxn) - perTxn)
				if k0 >= n*b {
					return
				}
				var ops api.TxnOps
				for k := k0; k < min(k0+perTxn, n*b); k++ {
					ops = append(ops, &api.TxnOp{Service: &api.ServiceTxnOp{Verb: api.ServiceSet, Node: consulNode, Service: *consulInstance(k/b, k%b, b, -1)}})
				}
				ok, resp, _, err := c.api.Txn().Txn(ops, nil)
				if err == nil && !ok {
					err = fmt.Errorf("rolled back: %v", resp.Errors)
				}
				if err != nil {
					select {
					case errs <- fmt.Errorf("register instances %d..%d: %w", k0, k0+len(ops)-1, err):
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

// consulConns is the agent's http_max_conns_per_client for n services:
// a connection per service watch, and some for the catalog and KV watches
// and the bench's own client.
func consulConns(n int) int { return max(200, n+200) }

// consulNode is the catalog node holding every instance.
const consulNode = "bench-backends"

// consulInstance is instance j of service i; change ≥ 0 gives it the
// port that change's backend has (changedBackend).
func consulInstance(i, j, b, change int) *api.AgentService {
	a := backendAddr(i*b + j)
	if change >= 0 {
		a = changedBackend(a, change)
	}
	return &api.AgentService{
		ID:      fmt.Sprintf("s%d-%d", i, j),
		Service: fmt.Sprintf("s%d", i),
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

// register replaces instance j of service i (the same ID) through the
// catalog (PUT /v1/catalog/register).
func (c *consulAgent) register(svc *api.AgentService) error {
	_, err := c.api.Catalog().Register(&api.CatalogRegistration{Node: consulNode, Address: topo.Prefix4 + "100", Service: svc, SkipNodeUpdate: true}, nil)
	return err
}

// changedBackend is what backend a becomes with change i: the same
// address on a port no other backend has.
func changedBackend(a netip.AddrPort, i int) netip.AddrPort {
	return netip.AddrPortFrom(a.Addr(), 60000+uint16(i%5000))
}
