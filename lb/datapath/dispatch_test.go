// SPDX-License-Identifier: Apache-2.0

package datapath_test

import (
	"bytes"
	"encoding/binary"
	"net"
	"net/netip"
	"testing"

	"github.com/l4lb/l4lb/internal/pkttest"
	"github.com/l4lb/l4lb/lb"
	"github.com/l4lb/l4lb/lb/maglev"
)

// Shared by the tests of the DSR dispatches geneve and opt, on both hooks.

// pktKind is one kind of client packet in the dispatch test matrix
// {hook} x {family} x {pktKind}: a TCP SYN (opt carries its option), a TCP
// segment of an established flow (opt does not), and a UDP datagram.
type pktKind struct {
	name     string
	proto    lb.Protocol
	syn, ack bool
}

var pktKinds = []pktKind{
	{name: "tcp-syn", proto: lb.TCP, syn: true},
	{name: "tcp-ack", proto: lb.TCP, ack: true},
	{name: "udp", proto: lb.UDP},
}

// Frontend ports of the dispatch tests' services.
const (
	dispatchTCPPort = 80
	dispatchUDPPort = 53
)

// dispatchServices returns a TCP and a UDP DSR service per family, with
// dispatch d and three backends each, listening on tcpPort / udpPort (0:
// the service's own port).
func dispatchServices(d lb.Dispatch, tcpPort, udpPort uint16) []lb.Service {
	var svcs []lb.Service
	for _, fam := range families {
		for _, s := range []struct {
			name       string
			port, bePt uint16
			proto      lb.Protocol
		}{
			{"web-" + fam.name, dispatchTCPPort, tcpPort, lb.TCP},
			{"dns-" + fam.name, dispatchUDPPort, udpPort, lb.UDP},
		} {
			svc := dsrService(s.name, fam.vip, s.port, s.proto, fam.backends[:3]...)
			svc.Mode, svc.Dispatch = lb.ModeDSR, d
			if s.bePt != 0 {
				for i := range svc.Backends {
					svc.Backends[i].Addr = netip.AddrPortFrom(svc.Backends[i].Addr.Addr(), s.bePt)
				}
			}
			svcs = append(svcs, svc)
		}
	}
	return svcs
}

// serviceOf returns the service of svcs on fam's VIP for proto.
func serviceOf(t testing.TB, svcs []lb.Service, fam family, proto lb.Protocol) lb.Service {
	t.Helper()
	for _, s := range svcs {
		if s.Frontend.Addr == fam.vip && s.Frontend.Proto == proto {
			return s
		}
	}
	t.Fatalf("no %s service on %s", proto, fam.vip)
	return lb.Service{}
}

// backendPort is the port svc's backend at addr listens on.
func backendPort(t testing.TB, svc lb.Service, addr netip.Addr) uint16 {
	t.Helper()
	for _, b := range svc.Backends {
		if b.Addr.Addr() == addr {
			return b.Addr.Port()
		}
	}
	t.Fatalf("%s is not a backend of %s", addr, svc.Name)
	return 0
}

// kindPacket is a client packet of kind on flow f, with header fields set
// that the dispatches must carry (DSCP/ECN, DF, identification, TTL, flow
// label) or leave alone.
func kindPacket(f maglev.Flow, kind pktKind) pkttest.Packet {
	p := packet(f, kind.syn, kind.ack, []byte("payload for the backend"))
	p.TOS, p.DF, p.ID, p.TTL, p.FlowLabel = 0xb9, true, 0x4242, 17, 0xabcde
	return p
}

// checkMACs checks that out leaves lb0 for the neighbour of backend.
func (e *env) checkMACs(t testing.TB, out []byte, backend netip.Addr) {
	t.Helper()
	if got, want := net.HardwareAddr(out[0:6]), backendMAC(backend); !bytes.Equal(got, want) {
		t.Errorf("Ethernet destination %s, want %s (the neighbour of backend %s)", got, want, backend)
	}
	if got := net.HardwareAddr(out[6:12]); !bytes.Equal(got, e.lbMAC) {
		t.Errorf("Ethernet source %s, want lb0's %s", got, e.lbMAC)
	}
}

// fieldCheck is one header field's value and the one it must have.
type fieldCheck struct {
	name      string
	got, want int
}

func checkFields(t testing.TB, what string, fields []fieldCheck) {
	t.Helper()
	for _, f := range fields {
		if f.got != f.want {
			t.Errorf("%s %s = %#x, want %#x", what, f.name, f.got, f.want)
		}
	}
}

// netOrder returns the value a __be16 field holds for port, as the
// generated Go types read it (host order on a little-endian host).
func netOrder(port uint16) uint16 {
	var b [2]byte
	binary.BigEndian.PutUint16(b[:], port)
	return binary.NativeEndian.Uint16(b[:])
}

// fromNetOrder is the inverse of netOrder.
func fromNetOrder(v uint16) uint16 { return netOrder(v) }
