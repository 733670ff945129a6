// SPDX-License-Identifier: Apache-2.0

package consul_test

import (
	"bytes"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"
)

// privilegedEnv is set by `make test` (and so CI): there a missing consul
// binary is a failure, not a reason to skip.
const privilegedEnv = "L4LB_PRIVILEGED_TESTS"

// consulBinary finds the Consul v1.14.11 agent built by `make bin/consul`.
func consulBinary(t *testing.T) string {
	t.Helper()
	if testing.Short() {
		t.Skip("skipping in -short mode (make check): runs a Consul agent; make test runs it")
	}
	if p := os.Getenv("L4LB_CONSUL_BIN"); p != "" {
		if _, err := os.Stat(p); err != nil {
			t.Fatalf("L4LB_CONSUL_BIN=%s: %v", p, err)
		}
		return p
	}
	p, err := filepath.Abs(filepath.Join("..", "..", "bin", "consul"))
	if err == nil {
		if _, err = os.Stat(p); err == nil {
			return p
		}
	}
	msg := "no consul binary at bin/consul: build it with `make bin/consul` (Consul v1.14.11 from tests/tools), or point L4LB_CONSUL_BIN at one"
	if os.Getenv(privilegedEnv) != "" {
		t.Fatalf("%s (%s is set, so this is a failure)", msg, privilegedEnv)
	}
	t.Skip(msg)
	return ""
}

// agent is one `consul agent -dev` bound to 127.0.0.1: a single in-memory
// server, its state gone when it stops.
type agent struct {
	t        *testing.T
	bin      string
	HTTPPort int
	Addr     string // host:port of the HTTP API
	API      *api.Client
	cmd      *exec.Cmd
	logPath  string
	done     chan struct{}
}

// freePort asks the kernel for a port that is free on 127.0.0.1 for both
// TCP and UDP (Serf uses both).
func freePort(t *testing.T) int {
	t.Helper()
	for range 20 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatalf("find a free port: %v", err)
		}
		port := l.Addr().(*net.TCPAddr).Port
		u, err := net.ListenPacket("udp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
		l.Close()
		if err != nil {
			continue
		}
		u.Close()
		return port
	}
	t.Fatalf("no port free for both TCP and UDP on 127.0.0.1")
	return 0
}

// startAgent starts a dev agent whose HTTP API listens on httpPort (0: a
// free one) and waits until it has a leader and has synced its node. hcl
// adds agent settings.
func startAgent(t *testing.T, httpPort int, hcl ...string) *agent {
	t.Helper()
	bin := consulBinary(t)
	if httpPort == 0 {
		httpPort = freePort(t)
	}
	dir := t.TempDir()
	a := &agent{t: t, bin: bin, HTTPPort: httpPort, Addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(httpPort)),
		logPath: filepath.Join(dir, "consul.log"), done: make(chan struct{})}
	logf, err := os.Create(a.logPath)
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	args := []string{"agent", "-dev",
		"-node", "l4lb-test",
		"-bind", "127.0.0.1", "-client", "127.0.0.1", "-advertise", "127.0.0.1",
		"-http-port", strconv.Itoa(httpPort),
		"-dns-port=-1", "-grpc-port=-1", "-grpc-tls-port=-1",
		"-serf-lan-port", strconv.Itoa(freePort(t)),
		"-serf-wan-port", strconv.Itoa(freePort(t)),
		"-server-port", strconv.Itoa(freePort(t)),
		"-data-dir", filepath.Join(dir, "data"),
		// No update check: the agent must not talk to anything but
		// loopback.
		"-hcl", "disable_update_check = true",
		"-log-level", "info",
	}
	for _, h := range hcl {
		args = append(args, "-hcl", h)
	}
	a.cmd = exec.Command(bin, args...)
	a.cmd.Env = append(os.Environ(), "CHECKPOINT_DISABLE=1")
	a.cmd.Stdout, a.cmd.Stderr = logf, logf
	if err := a.cmd.Start(); err != nil {
		t.Fatalf("start consul agent: %v", err)
	}
	go func() {
		_ = a.cmd.Wait()
		close(a.done)
	}()
	t.Cleanup(a.Kill)

	a.API, err = api.NewClient(&api.Config{Address: a.Addr, Scheme: "http"})
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		leader, lerr := a.API.Status().Leader()
		if lerr == nil && leader != "" {
			node, _, nerr := a.API.Catalog().Node("l4lb-test", nil)
			if nerr == nil && node != nil {
				break
			}
		}
		select {
		case <-a.done:
			t.Fatalf("consul agent exited during start-up:\n%s", a.logTail())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("consul agent at %s not ready after 60s:\n%s", a.Addr, a.logTail())
		}
		time.Sleep(50 * time.Millisecond)
	}
	return a
}

// Kill stops the agent at once (no leave): to its clients it is an outage.
func (a *agent) Kill() {
	select {
	case <-a.done:
		return
	default:
	}
	_ = a.cmd.Process.Kill()
	<-a.done
}

func (a *agent) logTail() string {
	data, _ := os.ReadFile(a.logPath)
	if len(data) > 4000 {
		data = data[len(data)-4000:]
	}
	return string(bytes.TrimSpace(data))
}

// Instances registered straight into the catalog live on nodes of their
// own, so that the agent's anti-entropy leaves them alone and a test can set
// each instance's node address and check status directly.
type inst struct {
	node, nodeAddr string
	id, service    string
	addr           string // service address; "" falls back to the node's
	port           int
	tags           []string
	meta           map[string]string
	weight         int
	status         string // check status; "" for no check (passing)
}

func (a *agent) register(t *testing.T, in inst) {
	t.Helper()
	if in.nodeAddr == "" {
		in.nodeAddr = "192.0.2.250"
	}
	reg := &api.CatalogRegistration{
		Node:    in.node,
		Address: in.nodeAddr,
		Service: &api.AgentService{
			ID: in.id, Service: in.service, Address: in.addr, Port: in.port,
			Tags: in.tags, Meta: in.meta,
		},
	}
	if in.weight > 0 {
		reg.Service.Weights = api.AgentWeights{Passing: in.weight, Warning: 1}
	}
	if in.status != "" {
		reg.Check = &api.AgentCheck{Node: in.node, CheckID: "check-" + in.id, Name: "check of " + in.id,
			Status: in.status, ServiceID: in.id}
	}
	if _, err := a.API.Catalog().Register(reg, nil); err != nil {
		t.Fatalf("register %s/%s: %v", in.node, in.id, err)
	}
}

func (a *agent) deregister(t *testing.T, node, id string) {
	t.Helper()
	if _, err := a.API.Catalog().Deregister(&api.CatalogDeregistration{Node: node, ServiceID: id}, nil); err != nil {
		t.Fatalf("deregister %s/%s: %v", node, id, err)
	}
}

func (a *agent) put(t *testing.T, key, value string) {
	t.Helper()
	if _, err := a.API.KV().Put(&api.KVPair{Key: key, Value: []byte(value)}, nil); err != nil {
		t.Fatalf("KV put %s: %v", key, err)
	}
}

func (a *agent) del(t *testing.T, key string) {
	t.Helper()
	if _, err := a.API.KV().Delete(key, nil); err != nil {
		t.Fatalf("KV delete %s: %v", key, err)
	}
}

// index is the agent's current catalog index.
func (a *agent) index(t *testing.T) uint64 {
	t.Helper()
	_, meta, err := a.API.Catalog().Services(nil)
	if err != nil {
		t.Fatalf("read catalog: %v", err)
	}
	return meta.LastIndex
}

func (a *agent) String() string { return fmt.Sprintf("consul agent %s", a.Addr) }
