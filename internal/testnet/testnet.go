// SPDX-License-Identifier: Apache-2.0

// Package testnet builds network topologies for tests: named network
// namespaces, veth pairs, bridges, addresses and routes, each removed when the
// test ends, even when it fails. Packet tests use it for a namespace in which
// bpf_fib_lookup finds routes and neighbours; end-to-end tests build whole
// client / LB / backend topologies with it.
//
// Namespaces are named (bind-mounted under /run/netns) so that a daemon under
// test can be started with `nsenter --net=/run/netns/NAME`, which, unlike
// `ip netns exec`, keeps the host's /sys/fs/bpf visible. NewAnonNS makes
// one without a name, for processes that may be killed before their
// cleanups run: the kernel removes it when the process exits.
package testnet

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// TB is the part of testing.TB the package uses, so that non-test programs
// (the demo) can build topologies too.
type TB interface {
	Helper()
	Fatalf(format string, args ...any)
	Skipf(format string, args ...any)
	Cleanup(func())
}

// PrivilegedEnv is set (to 1) by `make test` and CI. With it, a test that
// needs root fails when it is not root instead of skipping.
const PrivilegedEnv = "L4LB_PRIVILEGED_TESTS"

// RequireRoot skips the test when not running as root, unless the
// privileged test suite was requested, in which case it fails.
func RequireRoot(t TB) {
	t.Helper()
	SkipShort(t, "needs root for BPF and network namespaces")
	if os.Geteuid() == 0 {
		return
	}
	if os.Getenv(PrivilegedEnv) != "" {
		t.Fatalf("this test needs root (BPF, network namespaces) and %s is set: run `make test` as root", PrivilegedEnv)
	}
	t.Skipf("skipping: needs root for BPF and network namespaces (run `make test` as root)")
}

// SkipShort skips the test under `go test -short` (`make check`, the fast
// inner loop), saying why: that loop runs as root in CI too, but runs no
// test that needs the kernel, a namespace or an external binary, so that a
// mistake in pure Go code fails in seconds. `make test` runs them all.
func SkipShort(t TB, why string) {
	t.Helper()
	if testing.Testing() && testing.Short() {
		t.Skipf("skipping in -short mode (make check): %s; make test runs it", why)
	}
}

// NS is a network namespace created for one test.
type NS struct {
	// Name is the namespace's name under /run/netns (for an anonymous
	// one, a description).
	Name   string
	handle netns.NsHandle
	nl     *netlink.Handle
	anon   bool
}

// NewNS creates a named namespace with loopback up. The name gets a random
// suffix so that test packages running in parallel never collide. The
// namespace is deleted when the test ends.
func NewNS(t TB, prefix string) *NS {
	t.Helper()
	RequireRoot(t)
	var b [3]byte
	_, _ = rand.Read(b[:])
	name := fmt.Sprintf("l4t-%s-%s", prefix, hex.EncodeToString(b[:]))

	ns, err := newNamed(name)
	if err != nil {
		t.Fatalf("create netns %s: %v", name, err)
	}
	t.Cleanup(func() { ns.Close() })
	lo, err := ns.nl.LinkByName("lo")
	if err != nil {
		t.Fatalf("netns %s: find lo: %v", name, err)
	}
	if err := ns.nl.LinkSetUp(lo); err != nil {
		t.Fatalf("netns %s: set lo up: %v", name, err)
	}
	return ns
}

// NewAnonNS creates a namespace with loopback up that has no name under
// /run/netns: only this process's handle holds it, so the kernel removes it
// and its links when the process exits, however it exits. It is for tests
// whose processes can be killed before their cleanups run (a fuzz worker the
// engine kills while it sets up). Path and Command reach it through the
// handle's /proc path, from this process only.
func NewAnonNS(t TB, prefix string) *NS {
	t.Helper()
	RequireRoot(t)
	ns, err := newAnon()
	if err != nil {
		t.Fatalf("create an anonymous netns: %v", err)
	}
	ns.Name = fmt.Sprintf("%s (anonymous, fd %d)", prefix, int(ns.handle))
	t.Cleanup(func() { ns.Close() })
	lo, err := ns.nl.LinkByName("lo")
	if err != nil {
		t.Fatalf("netns %s: find lo: %v", ns.Name, err)
	}
	if err := ns.nl.LinkSetUp(lo); err != nil {
		t.Fatalf("netns %s: set lo up: %v", ns.Name, err)
	}
	return ns
}

func newAnon() (*NS, error) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	orig, err := netns.Get()
	if err != nil {
		return nil, err
	}
	defer orig.Close()
	h, err := netns.New()
	if err != nil {
		return nil, err
	}
	// New switched this thread into the new namespace: switch back
	// before the thread is unlocked.
	if err := netns.Set(orig); err != nil {
		h.Close()
		return nil, fmt.Errorf("return to the original netns: %w", err)
	}
	nl, err := netlink.NewHandleAt(h)
	if err != nil {
		h.Close()
		return nil, err
	}
	return &NS{handle: h, nl: nl, anon: true}, nil
}

func newNamed(name string) (*NS, error) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	orig, err := netns.Get()
	if err != nil {
		return nil, err
	}
	defer orig.Close()
	h, err := netns.NewNamed(name)
	if err != nil {
		return nil, err
	}
	// NewNamed switched this thread into the new namespace: switch back
	// before the thread is unlocked.
	if err := netns.Set(orig); err != nil {
		h.Close()
		_ = netns.DeleteNamed(name)
		return nil, fmt.Errorf("return to the original netns: %w", err)
	}
	nl, err := netlink.NewHandleAt(h)
	if err != nil {
		h.Close()
		_ = netns.DeleteNamed(name)
		return nil, err
	}
	return &NS{Name: name, handle: h, nl: nl}, nil
}

// Close deletes the namespace; links inside it go with it.
func (ns *NS) Close() {
	if ns.nl != nil {
		ns.nl.Close()
		ns.nl = nil
	}
	ns.handle.Close()
	if !ns.anon {
		_ = netns.DeleteNamed(ns.Name)
	}
}

// Path is the namespace's bind mount, for nsenter --net=PATH (an anonymous
// one's handle under /proc).
func (ns *NS) Path() string {
	if ns.anon {
		return fmt.Sprintf("/proc/%d/fd/%d", os.Getpid(), int(ns.handle))
	}
	return filepath.Join("/run/netns", ns.Name)
}

// Handle returns the namespace's handle, for APIs that act inside it
// (netlink subscriptions, datapath.Config.Netns).
func (ns *NS) Handle() *netns.NsHandle { return &ns.handle }

// Netlink returns a netlink handle bound to the namespace.
func (ns *NS) Netlink() *netlink.Handle { return ns.nl }

// Do runs fn on an OS thread switched into the namespace, on the CPUs the
// calling thread may run on (a test that keeps itself on one CPU, for the
// datapath's per-CPU state, keeps fn there too). fn must not start
// goroutines that expect to stay in the namespace.
func (ns *NS) Do(fn func() error) error {
	var cpus unix.CPUSet
	if err := unix.SchedGetaffinity(0, &cpus); err != nil {
		return fmt.Errorf("read the calling thread's CPUs: %w", err)
	}
	errc := make(chan error, 1)
	go func() {
		// The thread is left locked on purpose: if switching back
		// fails, the runtime discards it rather than reusing a thread
		// that sits in the wrong namespace.
		runtime.LockOSThread()
		var own unix.CPUSet
		if err := unix.SchedGetaffinity(0, &own); err != nil {
			errc <- err
			return
		}
		if own != cpus {
			if err := unix.SchedSetaffinity(0, &cpus); err != nil {
				errc <- fmt.Errorf("move to the calling thread's CPUs: %w", err)
				return
			}
		}
		orig, err := netns.Get()
		if err != nil {
			errc <- err
			return
		}
		defer orig.Close()
		if err := netns.Set(ns.handle); err != nil {
			errc <- err
			return
		}
		err = fn()
		if serr := netns.Set(orig); serr != nil {
			errc <- fmt.Errorf("return to the original netns: %w", serr)
			return
		}
		if own != cpus {
			if serr := unix.SchedSetaffinity(0, &own); serr != nil {
				errc <- fmt.Errorf("return to the thread's own CPUs: %w", serr)
				return
			}
		}
		runtime.UnlockOSThread()
		errc <- err
	}()
	return <-errc
}

// Command returns a command that runs inside the namespace through nsenter,
// keeping the host's mount namespace (and so /sys/fs/bpf).
func (ns *NS) Command(name string, args ...string) *exec.Cmd {
	return exec.Command("nsenter", append([]string{"--net=" + ns.Path(), "--", name}, args...)...)
}

// Run runs a command in the namespace and fails the test when it fails.
func (ns *NS) Run(t TB, name string, args ...string) string {
	t.Helper()
	out, err := ns.Command(name, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("netns %s: %s %s: %v\n%s", ns.Name, name, strings.Join(args, " "), err, out)
	}
	return string(out)
}

// Sysctl writes a sysctl inside the namespace (key like "net.ipv4.ip_forward").
func (ns *NS) Sysctl(t TB, key, value string) {
	t.Helper()
	path := "/proc/sys/" + strings.ReplaceAll(key, ".", "/")
	err := ns.Do(func() error { return os.WriteFile(path, []byte(value), 0o644) })
	if err != nil {
		t.Fatalf("netns %s: sysctl %s=%s: %v", ns.Name, key, value, err)
	}
}

// Link returns the named link in the namespace.
func (ns *NS) Link(t TB, name string) netlink.Link {
	t.Helper()
	l, err := ns.nl.LinkByName(name)
	if err != nil {
		t.Fatalf("netns %s: link %s: %v", ns.Name, name, err)
	}
	return l
}

// AddAddr adds an address in CIDR form ("10.0.0.1/24") to a link; IPv6
// addresses skip duplicate address detection so they are usable at once.
func (ns *NS) AddAddr(t TB, link, cidr string) {
	t.Helper()
	addr, err := netlink.ParseAddr(cidr)
	if err != nil {
		t.Fatalf("parse %s: %v", cidr, err)
	}
	if addr.IP.To4() == nil {
		addr.Flags |= unix.IFA_F_NODAD
	}
	if err := ns.nl.AddrAdd(ns.Link(t, link), addr); err != nil {
		t.Fatalf("netns %s: add %s to %s: %v", ns.Name, cidr, link, err)
	}
}

// Up sets links up.
func (ns *NS) Up(t TB, links ...string) {
	t.Helper()
	for _, l := range links {
		if err := ns.nl.LinkSetUp(ns.Link(t, l)); err != nil {
			t.Fatalf("netns %s: set %s up: %v", ns.Name, l, err)
		}
	}
}

// AddRoute adds a route to dst ("10.0.0.10/32" or "default") via gw over link.
// gw may be empty for an on-link route.
func (ns *NS) AddRoute(t TB, dst, gw, link string) {
	t.Helper()
	r := netlink.Route{LinkIndex: ns.Link(t, link).Attrs().Index}
	if gw != "" {
		g := net.ParseIP(gw)
		if g == nil {
			t.Fatalf("bad gateway %q", gw)
		}
		r.Gw = g
	}
	if dst == "default" {
		if gw != "" && net.ParseIP(gw).To4() == nil {
			_, r.Dst, _ = net.ParseCIDR("::/0")
		} else {
			_, r.Dst, _ = net.ParseCIDR("0.0.0.0/0")
		}
	} else {
		_, d, err := net.ParseCIDR(dst)
		if err != nil {
			t.Fatalf("bad route destination %q: %v", dst, err)
		}
		r.Dst = d
	}
	if gw == "" {
		r.Scope = netlink.SCOPE_LINK
	}
	if err := ns.nl.RouteAdd(&r); err != nil {
		t.Fatalf("netns %s: route %s via %q dev %s: %v", ns.Name, dst, gw, link, err)
	}
}

// AddNeigh adds a permanent neighbour entry (so a test does not depend on
// ARP / ND timing).
func (ns *NS) AddNeigh(t TB, link, ip string, mac net.HardwareAddr) {
	t.Helper()
	a := netip.MustParseAddr(ip)
	fam := netlink.FAMILY_V4
	if a.Is6() {
		fam = netlink.FAMILY_V6
	}
	n := &netlink.Neigh{
		LinkIndex:    ns.Link(t, link).Attrs().Index,
		Family:       fam,
		State:        netlink.NUD_PERMANENT,
		IP:           net.IP(a.AsSlice()),
		HardwareAddr: mac,
	}
	if err := ns.nl.NeighSet(n); err != nil {
		t.Fatalf("netns %s: neighbour %s dev %s: %v", ns.Name, ip, link, err)
	}
}

// MAC returns a link's hardware address.
func (ns *NS) MAC(t TB, link string) net.HardwareAddr {
	t.Helper()
	return ns.Link(t, link).Attrs().HardwareAddr
}

// Veth creates a veth pair with one end (nameA) in a and the other (nameB)
// in b, both up. Deleting either namespace removes the pair.
func Veth(t TB, a *NS, nameA string, b *NS, nameB string) {
	t.Helper()
	// Create both ends in a, then move the peer: the creating netlink
	// socket lives in a.
	v := &netlink.Veth{
		LinkAttrs: netlink.LinkAttrs{Name: nameA},
		PeerName:  nameB,
	}
	if err := a.nl.LinkAdd(v); err != nil {
		t.Fatalf("veth %s/%s: %v", nameA, nameB, err)
	}
	peer, err := a.nl.LinkByName(nameB)
	if err != nil {
		t.Fatalf("veth peer %s: %v", nameB, err)
	}
	if err := a.nl.LinkSetNsFd(peer, int(b.handle)); err != nil {
		t.Fatalf("move %s to %s: %v", nameB, b.Name, err)
	}
	a.Up(t, nameA)
	b.Up(t, nameB)
}

// Bridge creates a bridge in ns and enslaves the given links to it.
func (ns *NS) Bridge(t TB, name string, ports ...string) {
	t.Helper()
	br := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: name}}
	if err := ns.nl.LinkAdd(br); err != nil {
		t.Fatalf("netns %s: bridge %s: %v", ns.Name, name, err)
	}
	for _, p := range ports {
		if err := ns.nl.LinkSetMaster(ns.Link(t, p), br); err != nil {
			t.Fatalf("netns %s: enslave %s to %s: %v", ns.Name, p, name, err)
		}
	}
	ns.Up(t, name)
}
