// SPDX-License-Identifier: Apache-2.0

package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/l4lb/l4lb/internal/testnet"
	"github.com/l4lb/l4lb/lb"
	"github.com/l4lb/l4lb/tests/topo"
)

// rig is the traffic scenarios' topology (tests/topo): a client, two boxes
// and two backends on one segment. Each system gets a box of its own, so
// neither leaves state (rules, connection entries, XDP) in the other's
// way: lb1 forwards with iptables, lb2 runs l4lbd. The client routes the
// service VIPs (198.18.0.0/15) to the box under test.
type rig struct {
	t        *testnet.Script
	o        options
	p        *progress
	tp       *topo.Topology
	ipt, l4  *topo.Host
	backends []*topo.Host
	servers  map[netip.AddrPort]*server
	d        *topo.L4LBD
}

const vipRange = "198.18.0.0/15"

func newRig(t *testnet.Script, o options, p *progress) *rig {
	p.step("building the topology: client, lb1 (iptables), lb2 (l4lbd), be1, be2 on 10.100.0.0/24")
	tp := topo.New(t, topo.Options{LBs: 2, Backends: 2})
	r := &rig{t: t, o: o, p: p, tp: tp, ipt: tp.LBs[0], l4: tp.LBs[1], backends: tp.Backends, servers: map[netip.AddrPort]*server{}}
	c := tp.Client.NS
	// Many short connections from one address: every port, and ports in
	// TIME_WAIT reused for new connections.
	c.Sysctl(t, "net.ipv4.ip_local_port_range", "1024 65535")
	c.Sysctl(t, "net.ipv4.tcp_tw_reuse", "1")
	box := r.ipt.NS
	box.Sysctl(t, "net.ipv4.ip_forward", "1")
	// The box forwards out of the interface packets came in on; without
	// this it would tell the client to go to the backends directly.
	box.Sysctl(t, "net.ipv4.conf.all.send_redirects", "0")
	box.Sysctl(t, "net.ipv4.conf.eth0.send_redirects", "0")
	for _, b := range r.backends {
		b.NS.Sysctl(t, "net.core.somaxconn", "8192")
	}
	t.Cleanup(r.stopAll)
	return r
}

// via routes the VIPs from the client to the box under test.
func (r *rig) via(h *topo.Host) {
	r.tp.Client.NS.Run(r.t, "ip", "route", "replace", vipRange, "via", h.Addr4.String(), "dev", "eth0")
}

// backendAddr is real backend number n (be1, be2 alternately) on port.
func (r *rig) backendAddr(n int, port uint16) netip.AddrPort {
	return netip.AddrPortFrom(r.backends[n%len(r.backends)].Addr4, port)
}

// fillerWorkload is n services of b endpoints each on the backends'
// addresses, at ports nothing listens on (they only make rule sets and maps
// big; no connection goes to them), with target as the last one: the
// worst place in kube-proxy's KUBE-SERVICES chain.
func (r *rig) fillerWorkload(n, b int, target []netip.AddrPort) *workload {
	w := &workload{svcs: make([]kpService, n)}
	for i := range n - 1 {
		s := kpService{ID: i, Name: fmt.Sprintf("bench/svc-%d:http", i), VIP: vipOf(i)}
		for j := range b {
			s.Endpoints = append(s.Endpoints, r.backendAddr(i+j, uint16(30000+j)))
		}
		w.svcs[i] = s
	}
	w.svcs[n-1] = kpService{ID: n - 1, Name: "bench/target:http", VIP: targetVIP, Endpoints: target}
	return w
}

// targetVIP is the VIP the scenarios send connections to.
var targetVIP = netip.MustParseAddrPort("198.19.255.1:80")

// iptLoad replaces lb1's tables with w's rules and clears its connection
// table, so every run starts alike.
func (r *rig) iptLoad(ctx context.Context, w *workload) {
	if _, err := kpRestore(ctx, r.ipt.NS, kpSync(kpWhole, w.svcs, nil, nil)); err != nil {
		r.t.Fatalf("lb1: load rules: %v", err)
	}
	r.conntrackFlush(r.ipt)
}

func (r *rig) conntrackFlush(h *topo.Host) {
	out, err := h.NS.Command("conntrack", "-F").CombinedOutput()
	if err != nil {
		r.t.Fatalf("%s: conntrack -F: %v\n%s", h.Name, err, out)
	}
}

// l4Config is the l4lbd config serving w on lb2, with capacities for
// every workload of the run. conntrack is conntrack_max and snat_max.
func (r *rig) l4Config(w *workload, conntrack uint32) topo.LBConfig {
	svcs := w.lbServices()
	return topo.LBConfig{
		Seed: fmt.Sprintf("%x", seed[:]), Mode: lb.ModeSNAT, LogLevel: "warn",
		MaxServices: uint32(r.maxServices()), MaxBackends: uint32(r.maxBackends()),
		ConntrackMax: conntrack, SNATMax: conntrack, Services: svcs,
	}
}

func (r *rig) maxServices() int {
	n := r.o.roServices
	for _, m := range r.o.latServices {
		n = max(n, m)
	}
	return n + 1
}

func (r *rig) maxBackends() int {
	n := r.o.roServices*r.o.roBackends + r.o.roBackends
	for _, m := range r.o.latServices {
		n = max(n, m+2)
	}
	return n + 16
}

// startL4LBD (re)starts l4lbd on lb2 with cfg. A running one is stopped
// and its pins removed first: capacities only apply at start.
func (r *rig) startL4LBD(cfg topo.LBConfig) {
	if r.d != nil {
		if err := r.d.Stop(); err != nil {
			r.t.Fatalf("lb2: stop l4lbd: %v\n%s", err, r.d.Log())
		}
		if out, err := r.l4.NS.Command(r.o.l4lbd, "--config", r.d.Config, "--cleanup").CombinedOutput(); err != nil {
			r.t.Fatalf("lb2: l4lbd --cleanup: %v\n%s", err, out)
		}
	}
	r.d = r.l4.StartL4LBD(r.o.l4lbd, cfg.TOML())
}

// l4Apply starts l4lbd on lb2 with cfg, or reloads the running one.
func (r *rig) l4Apply(cfg topo.LBConfig) {
	if r.d == nil {
		r.startL4LBD(cfg)
	} else {
		r.l4Reload(cfg)
	}
}

// serveOnly stops every backend instance and starts one on each backend
// at port, which it returns (be1's first).
func (r *rig) serveOnly(port uint16) []netip.AddrPort {
	eps := []netip.AddrPort{r.backendAddr(0, port), r.backendAddr(1, port)}
	r.stopAll()
	for _, a := range eps {
		r.serve(a)
	}
	return eps
}

// l4Reload applies cfg and waits until l4lbd reports the reload done
// (the state is then in the maps).
func (r *rig) l4Reload(cfg topo.LBConfig) {
	r.d.WriteConfig(cfg.TOML())
	if rl := r.d.Reload(); !rl.OK {
		r.t.Fatalf("lb2: reload rejected: %s", rl.Error)
	}
}

// l4lbctl runs the real l4lbctl against lb2's daemon.
func (r *rig) l4lbctl(args ...string) string {
	out, err := commandContext(context.Background(), r.o.l4lbctl, append([]string{"--socket", r.d.Socket}, args...)...).CombinedOutput()
	if err != nil {
		r.t.Fatalf("l4lbctl %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return strings.TrimSpace(string(out))
}

// l4Reasons reads l4lbd's datapath reason counters (packets).
func (r *rig) l4Reasons() map[string]uint64 {
	st, err := r.d.API().Status(context.Background())
	if err != nil {
		r.t.Fatalf("lb2: status: %v", err)
	}
	out := map[string]uint64{}
	for _, x := range st.Reasons {
		out[x.Name] = x.Packets
	}
	return out
}

// unusual is what moved between two readings of l4Reasons, except the
// packets l4lb is not for (ARP, traffic to the box itself): drops, and
// packets handed to the kernel that it would have forwarded.
func unusual(before, after map[string]uint64) map[string]uint64 {
	out := map[string]uint64{}
	for k, v := range after {
		if d := v - before[k]; d > 0 && k != "pass_not_ip" && k != "pass_not_service" {
			out[k] = d
		}
	}
	return out
}

// server is one backend instance (a pod, in Kubernetes terms): a TCP
// listener that greets every connection with its own address:port and
// holds it until the client closes.
type server struct {
	addr  netip.AddrPort
	l     net.Listener
	mu    sync.Mutex
	conns map[net.Conn]bool
	wg    sync.WaitGroup
	// accepted counts connections accepted so far.
	accepted atomic.Int64
}

// serve starts the backend instance at addr.
func (r *rig) serve(addr netip.AddrPort) *server {
	if s := r.servers[addr]; s != nil {
		return s
	}
	var h *topo.Host
	for _, b := range r.backends {
		if b.Addr4 == addr.Addr() {
			h = b
		}
	}
	if h == nil {
		r.t.Fatalf("no backend host has %s", addr.Addr())
	}
	s := &server{addr: addr, conns: map[net.Conn]bool{}}
	err := h.NS.Do(func() error {
		var err error
		s.l, err = net.Listen("tcp4", addr.String())
		return err
	})
	if err != nil {
		r.t.Fatalf("%s: listen on %s: %v", h.Name, addr, err)
	}
	s.wg.Add(1)
	go s.accept()
	r.servers[addr] = s
	return s
}

func (s *server) accept() {
	defer s.wg.Done()
	greeting := []byte(s.addr.String() + "\n")
	for {
		c, err := s.l.Accept()
		if err != nil {
			return
		}
		s.accepted.Add(1)
		s.mu.Lock()
		s.conns[c] = true
		s.mu.Unlock()
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			defer func() {
				s.mu.Lock()
				delete(s.conns, c)
				s.mu.Unlock()
				c.Close()
			}()
			_ = c.SetDeadline(time.Now().Add(10 * time.Second))
			if _, err := c.Write(greeting); err != nil {
				return
			}
			// Until the client closes.
			_, _ = bufio.NewReader(c).ReadString('\n')
		}()
	}
}

// active is how many connections the instance holds.
func (s *server) active() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.conns)
}

// stop ends the instance as a process exit does: the listener goes (new
// connections are refused) and open connections are closed.
func (r *rig) stop(addr netip.AddrPort) {
	s := r.servers[addr]
	if s == nil {
		return
	}
	delete(r.servers, addr)
	s.l.Close()
	s.mu.Lock()
	for c := range s.conns {
		c.Close()
	}
	s.mu.Unlock()
	s.wg.Wait()
}

// stopAll stops every backend instance.
func (r *rig) stopAll() {
	for a := range r.servers {
		r.stop(a)
	}
}

// ctStats sums `conntrack -S` over the CPUs of h's namespace.
func (r *rig) ctStats(h *topo.Host) map[string]uint64 {
	out, err := h.NS.Command("conntrack", "-S").CombinedOutput()
	if err != nil {
		r.t.Fatalf("%s: conntrack -S: %v\n%s", h.Name, err, out)
	}
	return parseCTStats(string(out))
}

// parseCTStats sums the key=value fields of `conntrack -S` lines.
func parseCTStats(s string) map[string]uint64 {
	sum := map[string]uint64{}
	for _, line := range strings.Split(s, "\n") {
		for _, f := range strings.Fields(line) {
			k, v, ok := strings.Cut(f, "=")
			if !ok || k == "cpu" {
				continue
			}
			if n, err := strconv.ParseUint(v, 10, 64); err == nil {
				sum[k] += n
			}
		}
	}
	return sum
}

// ctCount is nf_conntrack_count in h's namespace.
func (r *rig) ctCount(h *topo.Host) int {
	return r.readSysctlInt(h, "net/netfilter/nf_conntrack_count")
}

func (r *rig) readSysctlInt(h *topo.Host, key string) int {
	var n int
	err := h.NS.Do(func() error {
		b, err := os.ReadFile(filepath.Join("/proc/sys", key))
		if err != nil {
			return err
		}
		n, err = strconv.Atoi(string(bytes.TrimSpace(b)))
		return err
	})
	if err != nil {
		r.t.Fatalf("%s: read %s: %v", h.Name, key, err)
	}
	return n
}
