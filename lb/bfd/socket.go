// SPDX-License-Identifier: Apache-2.0

package bfd

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"syscall"

	"golang.org/x/sys/unix"
)

// DefaultPort is the UDP port of single-hop BFD control packets (RFC 5881).
const DefaultPort = 3784

// The source port range RFC 5881 section 4 requires.
const (
	srcPortMin = 49152
	srcPortMax = 65535
)

// maxTTL is the only TTL or hop limit a single-hop packet may arrive with
// (RFC 5881 section 5, GTSM): anything lower crossed a router.
const maxTTL = 255

// listen opens the receiving socket of one family on addr:port, asking the
// kernel for each packet's TTL or hop limit.
func listen(addr netip.Addr, port int) (*net.UDPConn, error) {
	network := "udp4"
	if addr.Is6() {
		network = "udp6"
	}
	lc := net.ListenConfig{Control: func(_, _ string, rc syscall.RawConn) error {
		return sockopts(rc, func(fd int) error {
			if addr.Is4() {
				return unix.SetsockoptInt(fd, unix.IPPROTO_IP, unix.IP_RECVTTL, 1)
			}
			// An IPv4 packet must never reach the IPv6 socket as a
			// mapped address: the IPv4 socket has it already.
			if err := unix.SetsockoptInt(fd, unix.IPPROTO_IPV6, unix.IPV6_V6ONLY, 1); err != nil {
				return err
			}
			return unix.SetsockoptInt(fd, unix.IPPROTO_IPV6, unix.IPV6_RECVHOPLIMIT, 1)
		})
	}}
	pc, err := lc.ListenPacket(context.Background(), network, netip.AddrPortFrom(addr, uint16(port)).String())
	if err != nil {
		return nil, err
	}
	return pc.(*net.UDPConn), nil
}

// hopLimit returns the TTL or hop limit in the control messages of a
// received packet; ok is false when there is none.
func hopLimit(oob []byte) (ttl int, ok bool) {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return 0, false
	}
	for _, m := range msgs {
		v4 := m.Header.Level == unix.IPPROTO_IP && m.Header.Type == unix.IP_TTL
		v6 := m.Header.Level == unix.IPPROTO_IPV6 && m.Header.Type == unix.IPV6_HOPLIMIT
		if (v4 || v6) && len(m.Data) >= 4 {
			return int(binary.NativeEndian.Uint32(m.Data)), true
		}
	}
	return 0, false
}

// dial opens a session's transmit socket: bound to local (or the
// wildcard) on a source port in 49152..65535, connected to peer:port,
// sending with TTL 255. It tries want first when it is nonzero (a resumed
// session keeps its port, which the peer may check), then random ports
// until one is free. The kernel's bind keeps the port unique among the
// host's sockets on local and on the wildcard, which covers every session
// of one source address.
func dial(peer, local netip.Addr, port int, iface string, want uint16) (*net.UDPConn, uint16, error) {
	if !local.IsValid() {
		local = netip.IPv4Unspecified()
		if peer.Is6() {
			local = netip.IPv6Unspecified()
		}
	}
	d := net.Dialer{Control: func(_, _ string, rc syscall.RawConn) error {
		return sockopts(rc, func(fd int) error {
			var err error
			if peer.Is4() {
				err = unix.SetsockoptInt(fd, unix.IPPROTO_IP, unix.IP_TTL, maxTTL)
			} else {
				err = unix.SetsockoptInt(fd, unix.IPPROTO_IPV6, unix.IPV6_UNICAST_HOPS, maxTTL)
			}
			if err != nil || iface == "" {
				return err
			}
			return unix.SetsockoptString(fd, unix.SOL_SOCKET, unix.SO_BINDTODEVICE, iface)
		})
	}}
	remote := net.UDPAddrFromAddrPort(netip.AddrPortFrom(peer, uint16(port)))
	// A host has 16,384 ports in the range; a few dozen tries find a free
	// one unless nearly all are taken, which is worth an error.
	const tries = 64
	for i := range tries {
		p := want
		if i > 0 || p < srcPortMin {
			p = uint16(srcPortMin + rand.IntN(srcPortMax-srcPortMin+1))
		}
		d.LocalAddr = net.UDPAddrFromAddrPort(netip.AddrPortFrom(local, p))
		c, err := d.Dial("udp", remote.String())
		if err == nil {
			return c.(*net.UDPConn), p, nil
		}
		if !errors.Is(err, syscall.EADDRINUSE) {
			return nil, 0, err
		}
	}
	return nil, 0, fmt.Errorf("no free source port in %d..%d after %d tries", srcPortMin, srcPortMax, tries)
}

// sockopts runs set on the socket's descriptor and returns either error.
func sockopts(rc syscall.RawConn, set func(fd int) error) error {
	var err error
	if cerr := rc.Control(func(fd uintptr) { err = set(int(fd)) }); cerr != nil {
		return cerr
	}
	return err
}
