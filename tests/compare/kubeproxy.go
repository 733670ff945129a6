// SPDX-License-Identifier: Apache-2.0

package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base32"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"sync"
	"time"

	"github.com/l4lb/l4lb/internal/testnet"
)

// kpService is one Kubernetes service port as kube-proxy's iptables mode
// sees it: a cluster IP and port, and the ready endpoints behind it.
type kpService struct {
	// ID numbers the service in its workload.
	ID int
	// Name is "namespace/name:port", kube-proxy's ServicePortName.
	Name      string
	VIP       netip.AddrPort
	Endpoints []netip.AddrPort
}

// kube-proxy's constants for the rules it writes.
const (
	kpMasqMark = "0x4000/0x4000"
	// kpClusterCIDR is the pod network: traffic from outside it to a
	// cluster IP is masqueraded, which is what makes replies from the
	// endpoints come back through the proxy (as l4lb's SNAT mode does).
	kpClusterCIDR = "10.244.0.0/16"
)

// kpChain returns a per-service or per-endpoint chain name the way
// kube-proxy makes them: a prefix and the first 16 characters of the
// base32 SHA-256 of the service port name and protocol (and the endpoint).
func kpChain(prefix string, parts ...string) string {
	sum := sha256.Sum256([]byte(strings.Join(parts, "")))
	return prefix + base32.StdEncoding.EncodeToString(sum[:])[:16]
}

func svcChain(s *kpService) string { return kpChain("KUBE-SVC-", s.Name, "tcp") }

func sepChain(s *kpService, ep netip.AddrPort) string {
	return kpChain("KUBE-SEP-", s.Name, "tcp", ep.String())
}

// kpMode is how a rule set is written and applied.
type kpMode int

const (
	// kpFull is kube-proxy's full sync: every chain it owns in the filter
	// and nat tables, applied with `iptables-restore --noflush` (declaring
	// a chain flushes it; chains not named are left alone). Every sync
	// before kube-proxy 1.28, and still at start and after failures.
	kpFull kpMode = iota
	// kpPartial is kube-proxy 1.28+'s partial sync: the top-level chains
	// and only the changed services' chains, with --noflush.
	kpPartial
	// kpWhole replaces the filter and nat tables as a whole, built-in
	// chains and their jumps included (iptables-restore without
	// --noflush): what a box that owns its tables can do, and the
	// fastest way to apply the same rules with iptables-nft.
	kpWhole
)

func (m kpMode) String() string {
	return [...]string{"kube-proxy full sync", "kube-proxy partial sync", "whole-table restore"}[m]
}

// kpRuleset is one input to iptables-restore.
type kpRuleset struct {
	mode  kpMode
	buf   bytes.Buffer
	lines int
}

func (r *kpRuleset) line(format string, a ...any) {
	fmt.Fprintf(&r.buf, format, a...)
	r.buf.WriteByte('\n')
	r.lines++
}

// kpSync renders one sync of svcs. In kpPartial mode only the services in
// changed get their chains written; gone lists endpoint chains that no
// longer exist and are deleted (kube-proxy does this in every mode).
func kpSync(mode kpMode, svcs []kpService, changed map[int]bool, gone []string) *kpRuleset {
	r := &kpRuleset{mode: mode}
	write := func(i int) bool { return mode != kpPartial || changed[i] }
	whole := mode == kpWhole

	r.line("*filter")
	if whole {
		for _, c := range []string{"INPUT", "FORWARD", "OUTPUT"} {
			r.line(":%s ACCEPT [0:0]", c)
		}
	}
	for _, c := range []string{"KUBE-SERVICES", "KUBE-EXTERNAL-SERVICES", "KUBE-FORWARD", "KUBE-NODEPORTS", "KUBE-PROXY-FIREWALL"} {
		r.line(":%s - [0:0]", c)
	}
	if whole {
		r.line(`-A FORWARD -m comment --comment "kubernetes forwarding rules" -j KUBE-FORWARD`)
	}
	r.line(`-A KUBE-FORWARD -m conntrack --ctstate INVALID -j DROP`)
	r.line(`-A KUBE-FORWARD -m comment --comment "kubernetes forwarding rules" -m mark --mark %s -j ACCEPT`, kpMasqMark)
	r.line(`-A KUBE-FORWARD -m comment --comment "kubernetes forwarding conntrack rule" -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT`)
	r.line("COMMIT")

	r.line("*nat")
	if whole {
		for _, c := range []string{"PREROUTING", "INPUT", "OUTPUT", "POSTROUTING"} {
			r.line(":%s ACCEPT [0:0]", c)
		}
	}
	for _, c := range []string{"KUBE-SERVICES", "KUBE-NODEPORTS", "KUBE-POSTROUTING", "KUBE-MARK-MASQ"} {
		r.line(":%s - [0:0]", c)
	}
	for i := range svcs {
		if !write(i) {
			continue
		}
		s := &svcs[i]
		r.line(":%s - [0:0]", svcChain(s))
		for _, ep := range s.Endpoints {
			r.line(":%s - [0:0]", sepChain(s, ep))
		}
	}
	// A chain is deleted as kube-proxy does it: declared (which flushes
	// it) and removed with -X at the end, once nothing jumps to it.
	if !whole {
		for _, c := range gone {
			r.line(":%s - [0:0]", c)
		}
	}
	if whole {
		r.line(`-A PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES`)
		r.line(`-A OUTPUT -m comment --comment "kubernetes service portals" -j KUBE-SERVICES`)
		r.line(`-A POSTROUTING -m comment --comment "kubernetes postrouting rules" -j KUBE-POSTROUTING`)
	}
	r.line(`-A KUBE-POSTROUTING -m mark ! --mark %s -j RETURN`, kpMasqMark)
	r.line(`-A KUBE-POSTROUTING -j MARK --xor-mark 0x4000`)
	r.line(`-A KUBE-POSTROUTING -m comment --comment "kubernetes service traffic requiring SNAT" -j MASQUERADE --random-fully`)
	r.line(`-A KUBE-MARK-MASQ -j MARK --or-mark 0x4000`)
	// The dispatch chain: one rule per service, walked in order by the
	// first packet of every new connection.
	for i := range svcs {
		s := &svcs[i]
		r.line(`-A KUBE-SERVICES -m comment --comment "%s cluster IP" -m tcp -p tcp -d %s --dport %d -j %s`,
			s.Name, s.VIP.Addr(), s.VIP.Port(), svcChain(s))
	}
	r.line(`-A KUBE-SERVICES -m comment --comment "kubernetes service nodeports; NOTE: this must be the last rule in this chain" -m addrtype --dst-type LOCAL -j KUBE-NODEPORTS`)
	for i := range svcs {
		if !write(i) {
			continue
		}
		s := &svcs[i]
		svc := svcChain(s)
		r.line(`-A %s -m comment --comment "%s cluster IP" -m tcp -p tcp -d %s --dport %d ! -s %s -j KUBE-MARK-MASQ`,
			svc, s.Name, s.VIP.Addr(), s.VIP.Port(), kpClusterCIDR)
		// Endpoint j of n is taken with probability 1/(n-j), the last
		// one unconditionally: a uniform choice from a linear walk.
		n := len(s.Endpoints)
		for j, ep := range s.Endpoints {
			if j < n-1 {
				r.line(`-A %s -m comment --comment "%s -> %s" -m statistic --mode random --probability %.10f -j %s`,
					svc, s.Name, ep, 1/float64(n-j), sepChain(s, ep))
			} else {
				r.line(`-A %s -m comment --comment "%s -> %s" -j %s`, svc, s.Name, ep, sepChain(s, ep))
			}
		}
		for _, ep := range s.Endpoints {
			sep := sepChain(s, ep)
			r.line(`-A %s -m comment --comment %s -s %s -j KUBE-MARK-MASQ`, sep, s.Name, ep.Addr())
			r.line(`-A %s -m comment --comment %s -m tcp -p tcp -j DNAT --to-destination %s`, sep, s.Name, ep)
		}
	}
	if !whole {
		for _, c := range gone {
			r.line("-X %s", c)
		}
	}
	r.line("COMMIT")
	return r
}

// errTimeout is what kpRestore returns when iptables-restore did not finish
// within its time budget; it was killed and changed nothing (the commit of
// an iptables-nft restore is one transaction).
var errTimeout = errors.New("iptables-restore did not finish in time")

// kpRestore applies a rule set with iptables-restore inside ns, the way
// its mode says (kube-proxy's syncs run `iptables-restore -w --noflush
// --counters`), and returns how long the command took. It kills the command
// when ctx ends and then returns errTimeout.
func kpRestore(ctx context.Context, ns *testnet.NS, r *kpRuleset) (time.Duration, error) {
	args := []string{"--net=" + ns.Path(), "--", "iptables-restore", "-w"}
	if r.mode != kpWhole {
		args = append(args, "--noflush", "--counters")
	}
	cmd := commandContext(ctx, "nsenter", args...)
	cmd.Stdin = bytes.NewReader(r.buf.Bytes())
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	start := time.Now()
	err := cmd.Run()
	took := time.Since(start)
	if ctx.Err() != nil {
		return took, errTimeout
	}
	if err != nil {
		return took, fmt.Errorf("iptables-restore (%s, %d lines) in %s: %v\n%s", r.mode, r.lines, ns.Name, err, firstLines(out.String(), 20))
	}
	return took, nil
}

func firstLines(s string, n int) string {
	ls := strings.SplitN(s, "\n", n+1)
	if len(ls) > n {
		ls = ls[:n]
	}
	return strings.Join(ls, "\n")
}

// kpProxy plays kube-proxy's sync loop on a box: changes are published to
// it at any time, and it syncs whenever the published state differs from
// what it last wrote, each sync covering every change published before it
// started (changes that arrive during a sync wait for the next one). It
// syncs as soon as it can: no --iptables-min-sync-period, which in
// kube-proxy (default 1 s) would only delay syncs further.
type kpProxy struct {
	ns   *testnet.NS
	mode kpMode // kpFull or kpPartial
	kick chan struct{}

	mu      sync.Mutex
	svcs    []kpService
	gen     int // generation of svcs
	changed map[int]bool
	gone    []string
	applied int // generation last written
	// published[g] is when generation g was published; appliedAt[g] when
	// a sync that covered it finished.
	published map[int]time.Time
	appliedAt map[int]time.Time
	syncs     []time.Duration
	err       error
}

func newKPProxy(ns *testnet.NS, mode kpMode, svcs []kpService) *kpProxy {
	return &kpProxy{
		ns: ns, mode: mode, kick: make(chan struct{}, 1), svcs: cloneKP(svcs),
		changed: map[int]bool{}, published: map[int]time.Time{}, appliedAt: map[int]time.Time{},
	}
}

func cloneKP(svcs []kpService) []kpService {
	out := make([]kpService, len(svcs))
	for i, s := range svcs {
		s.Endpoints = append([]netip.AddrPort(nil), s.Endpoints...)
		out[i] = s
	}
	return out
}

// publish sets service i's endpoints, as an EndpointSlice update reaching
// kube-proxy does, and returns the generation it made.
func (p *kpProxy) publish(i int, eps []netip.AddrPort) int {
	p.mu.Lock()
	s := &p.svcs[i]
	keep := map[netip.AddrPort]bool{}
	for _, ep := range eps {
		keep[ep] = true
	}
	for _, ep := range s.Endpoints {
		if !keep[ep] {
			p.gone = append(p.gone, sepChain(s, ep))
		}
	}
	s.Endpoints = append([]netip.AddrPort(nil), eps...)
	p.changed[i] = true
	p.gen++
	g := p.gen
	p.published[g] = time.Now()
	p.mu.Unlock()
	select {
	case p.kick <- struct{}{}:
	default:
	}
	return g
}

// run syncs until ctx ends; a sync in progress is killed then.
func (p *kpProxy) run(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-p.kick:
		}
		p.mu.Lock()
		if p.gen == p.applied {
			p.mu.Unlock()
			continue
		}
		gen := p.gen
		r := kpSync(p.mode, p.svcs, p.changed, p.gone)
		changed, gone := p.changed, p.gone
		p.changed, p.gone = map[int]bool{}, nil
		p.mu.Unlock()

		took, err := kpRestore(ctx, p.ns, r)
		p.mu.Lock()
		if err != nil {
			if ctx.Err() == nil && p.err == nil {
				p.err = err
			}
			// What the failed sync carried goes into the next one.
			for i := range changed {
				p.changed[i] = true
			}
			p.gone = append(gone, p.gone...)
			p.mu.Unlock()
			if ctx.Err() != nil {
				return
			}
			continue
		}
		now := time.Now()
		for g := p.applied + 1; g <= gen; g++ {
			p.appliedAt[g] = now
		}
		p.applied = gen
		p.syncs = append(p.syncs, took)
		pending := p.gen != p.applied
		p.mu.Unlock()
		if pending {
			select {
			case p.kick <- struct{}{}:
			default:
			}
		}
	}
}

// lags returns, for each published generation, how long it took to reach
// the kernel; generations still unapplied count until now and are flagged.
func (p *kpProxy) lags() (lags []time.Duration, unapplied int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for g := 1; g <= p.gen; g++ {
		at, ok := p.appliedAt[g]
		if !ok {
			at = time.Now()
			unapplied++
		}
		lags = append(lags, at.Sub(p.published[g]))
	}
	return lags, unapplied
}
