// SPDX-License-Identifier: Apache-2.0

package health

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"syscall"

	"github.com/l4lb/l4lb/lb"
)

// Target says where a probe connects and how its socket is set up before it
// does.
type Target struct {
	// Addr is the address and port the probe dials.
	Addr netip.AddrPort
	// Mark, when not zero, is set as SO_MARK on the probe socket before it
	// connects, so that a tc program or a routing rule can steer the probe
	// (for DSR, to one backend behind the VIP). Needs CAP_NET_ADMIN.
	Mark uint32
	// Local, when valid, is the source address the probe binds to; the
	// kernel picks the port. It must be of the family of Addr.
	Local netip.Addr
	// Host is the HTTP Host header; empty means Addr. The Manager fills it
	// with the service's VIP:port when the targets function leaves it empty.
	Host string
}

// String formats the target for logs and status, for example
// "10.0.0.10:80 mark 0x4c420007 from 10.0.0.2".
func (t Target) String() string {
	var b strings.Builder
	b.WriteString(t.Addr.String())
	if t.Mark != 0 {
		fmt.Fprintf(&b, " mark %#x", t.Mark)
	}
	if t.Local.IsValid() {
		b.WriteString(" from ")
		b.WriteString(t.Local.String())
	}
	return b.String()
}

// Direct is the target of a backend probed at its own address: what SNAT
// services use, since the LB reaches their backends that way too. The port
// is the check's port override, or else the backend's port.
func Direct(svc lb.Service, b lb.Backend) Target {
	port := b.Addr.Port()
	if svc.Health.Port != 0 {
		port = svc.Health.Port
	}
	return Target{Addr: netip.AddrPortFrom(b.Addr.Addr(), port), Host: frontendHost(svc)}
}

// ThroughVIP is the target of a backend probed along the path clients use:
// the service's VIP and port (or the check's port override), with mark
// telling the tc egress program which backend to dispatch the probe to. The
// daemon picks the mark (a prefix the program recognises and the backend's
// id) and, if needed, sets Local to an address the backends' replies route
// back to.
func ThroughVIP(svc lb.Service, mark uint32) Target {
	port := svc.Frontend.Port
	if svc.Health.Port != 0 {
		port = svc.Health.Port
	}
	return Target{Addr: netip.AddrPortFrom(svc.Frontend.Addr, port), Mark: mark, Host: frontendHost(svc)}
}

// frontendHost is the Host header of a service's HTTP probes: the name its
// clients reach it by, so that a backend serving several sites answers for
// the right one.
func frontendHost(svc lb.Service) string {
	if !svc.Frontend.Addr.IsValid() {
		return ""
	}
	return netip.AddrPortFrom(svc.Frontend.Addr, svc.Frontend.Port).String()
}

// probeConn, when set by a test, sees every connection a checker dials, so
// the test can read its socket options back.
var probeConn func(network string, c net.Conn)

// dial connects a probe socket of network ("tcp" or "udp") to t, with t's
// mark and source address applied before the connect.
func dial(ctx context.Context, network string, t Target) (net.Conn, error) {
	if !t.Addr.IsValid() {
		return nil, fmt.Errorf("%s probe has no address to dial: the daemon's targets function returned an empty Target", network)
	}
	var d net.Dialer
	if t.Local.IsValid() {
		if t.Local.Unmap().Is4() != t.Addr.Addr().Unmap().Is4() {
			return nil, fmt.Errorf("%s probe of %s: source address %s is of another address family; give a local address of the target's family", network, t.Addr, t.Local)
		}
		ip := net.IP(t.Local.AsSlice())
		switch network {
		case "udp":
			d.LocalAddr = &net.UDPAddr{IP: ip, Zone: t.Local.Zone()}
		default:
			d.LocalAddr = &net.TCPAddr{IP: ip, Zone: t.Local.Zone()}
		}
	}
	if t.Mark != 0 {
		mark := t.Mark
		d.Control = func(_, _ string, c syscall.RawConn) error { return setMark(c, mark) }
	}
	c, err := d.DialContext(ctx, network, t.Addr.String())
	if err != nil {
		return nil, err
	}
	if probeConn != nil {
		probeConn(network, c)
	}
	return c, nil
}
