// SPDX-License-Identifier: Apache-2.0

package e2e

import (
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"strings"
	"testing"

	"github.com/gopacket/gopacket/layers"
	"golang.org/x/sys/unix"

	"github.com/l4lb/l4lb/internal/pkttest"
	"github.com/l4lb/l4lb/tests/topo"
)

// floodConfig is an l4lbd with small tables (2048 entries) and the given
// insert rate (0: none), a DSR and a SNAT service per protocol, to the
// given backends.
func floodConfig(rate int, backends ...int) string {
	var b strings.Builder
	fmt.Fprintf(&b, `
[daemon]
admin_socket   = "{{socket}}"
metrics_listen = []
bpffs          = "{{bpffs}}"

[datapath]
interfaces       = ["eth0"]
attach           = "xdp"
xdp_mode         = "generic"
dsr_dispatch     = "ipip"
conntrack_max    = 2048
snat_max         = 2048
flow_insert_rate = %d
max_services     = 16
max_backends     = 64

[maglev]
hash_seed  = %q
table_size = 1021
`, rate, e2eSeed)
	for _, svc := range []struct {
		name, mode, proto string
		port, bePort      int
	}{
		{"dsr-tcp", "dsr", "tcp", 80, 80},
		{"dsr-udp", "dsr", "udp", 53, 53},
		{"nat-tcp", "snat", "tcp", 8080, 9080},
		{"nat-udp", "snat", "udp", 8053, 9053},
	} {
		fmt.Fprintf(&b, "\n[[service]]\nname = %q\nvip = %q\nport = %d\nprotocol = %q\nmode = %q\n", svc.name, vip4, svc.port, svc.proto, svc.mode)
		for _, n := range backends {
			fmt.Fprintf(&b, "[[service.backend]]\naddress = \"%s%d\"\nport = %d\n", topo.Prefix4, n, svc.bePort)
		}
	}
	return b.String()
}

// rawSender writes Ethernet frames out of a host's segment interface.
type rawSender struct {
	fd      int
	ifindex int
}

func newRawSender(t *testing.T, h *topo.Host) *rawSender {
	t.Helper()
	s := &rawSender{}
	err := h.NS.Do(func() error {
		ifc, err := net.InterfaceByName(h.Iface)
		if err != nil {
			return err
		}
		s.ifindex = ifc.Index
		s.fd, err = unix.Socket(unix.AF_PACKET, unix.SOCK_RAW, 0)
		return err
	})
	if err != nil {
		t.Fatalf("raw socket on %s: %v", h.Name, err)
	}
	t.Cleanup(func() { unix.Close(s.fd) })
	return s
}

func (s *rawSender) send(frame []byte) error {
	var dst [8]byte
	return unix.Sendto(s.fd, frame, 0, &unix.SockaddrLinklayer{Ifindex: s.ifindex, Halen: 6, Addr: dst})
}

// TestFloodsKeepEstablishedFlows runs long TCP connections through a DSR
// and a SNAT service of a real l4lbd whose tables hold 2048 entries, then
// floods every service from the client's segment with spoofed SYNs, ACKs
// and UDP datagrams, ten times the tables' capacity each. Every connection
// keeps working, also after a fourth backend joins (which Maglev alone
// would give some of the DSR flows): their entries survived the floods.
func TestFloodsKeepEstablishedFlows(t *testing.T) {
	tp := topo.New(t, topo.Options{LBs: 1, Backends: 4})
	for _, be := range tp.Backends {
		be.HoldVIPs(vip4)
		be.StartCompanion(l4lbd(), vip4.String())
		be.Serve(netip.AddrPortFrom(vip4, 80), netip.AddrPortFrom(vip4, 53),
			netip.AddrPortFrom(be.Addr4, 9080), netip.AddrPortFrom(be.Addr4, 9053))
	}
	lb := tp.LBs[0]
	// The connections open without a limit, so every one is recorded;
	// the limit the flood meets comes with a restart, which keeps the
	// pinned tables.
	d := lb.StartL4LBD(l4lbd(), floodConfig(0, 21, 22, 23))
	tp.RouteVIPs(lb, vip4)

	const long = 20
	type conn struct {
		c       *topo.Conn
		backend string
	}
	var conns []conn
	for _, port := range []uint16{80, 8080} {
		for i := range long {
			c, err := tp.Client.DialTCP(uint16(30000+int(port)%1000*50+i), netip.AddrPortFrom(vip4, port))
			if err != nil {
				t.Fatalf("connection %d to port %d: %v\n%s", i, port, err, d.Log())
			}
			t.Cleanup(func() { c.Close() })
			conns = append(conns, conn{c, c.Backend})
		}
	}
	echoAll := func(when string) (broken int) {
		for i, c := range conns {
			if err := c.c.Echo(fmt.Sprintf("%s %d", when, i)); err != nil {
				broken++
				t.Errorf("%s: connection %d (to %s on %s) broke: %v", when, i, c.c.RemoteAddr(), c.backend, err)
			} else if c.c.Backend != c.backend {
				t.Errorf("%s: connection %d moved from %s to %s", when, i, c.backend, c.c.Backend)
			}
		}
		return broken
	}
	echoAll("before the floods")
	d.WriteConfig(floodConfig(20, 21, 22, 23))
	d.Restart()
	echoAll("after a restart with flow_insert_rate = 20")

	// The floods: spoofed sources in 11.0.0.0/8, frames straight onto
	// the segment to the LB box's MAC.
	raw := newRawSender(t, tp.Client)
	rng := rand.New(rand.NewPCG(1, 2))
	const perFlood = 10 * 2048
	sent := 0
	for _, kind := range []struct {
		name  string
		proto layers.IPProtocol
		syn   bool
		ports []uint16
	}{
		{"SYN", layers.IPProtocolTCP, true, []uint16{80, 8080}},
		{"ACK", layers.IPProtocolTCP, false, []uint16{80, 8080}},
		{"UDP", layers.IPProtocolUDP, false, []uint16{53, 8053}},
	} {
		for _, port := range kind.ports {
			base := pkttest.Build(t, pkttest.Packet{
				SrcMAC: tp.Client.MAC, DstMAC: lb.MAC, Proto: kind.proto,
				Src: netip.AddrPortFrom(netip.MustParseAddr("11.0.0.1"), 1), Dst: netip.AddrPortFrom(vip4, port),
				SYN: kind.syn && kind.proto == layers.IPProtocolTCP, ACK: !kind.syn && kind.proto == layers.IPProtocolTCP,
				Payload: []byte("flood"),
			})
			l := pkttest.MustLayout(t, base)
			for range perFlood {
				binary.BigEndian.PutUint32(base[l.L3+12:], 0x0b000000|rng.Uint32()&0x00ffffff)
				binary.BigEndian.PutUint16(base[l.L4:], uint16(1024+rng.IntN(60000)))
				pkttest.FixIPv4Checksum(base, l)
				if err := raw.send(base); err != nil {
					t.Fatalf("send flood frame: %v", err)
				}
				sent++
			}
		}
	}
	t.Logf("sent %d spoofed frames (%d per flood, 10x the 2048-entry tables)", sent, perFlood)
	if n := echoAll("after the floods"); n > 0 {
		t.Fatalf("%d of %d established connections broke during the floods", n, len(conns))
	}

	// A fourth backend joins every service.
	d.WriteConfig(floodConfig(20, 21, 22, 23, 24))
	if r := d.Reload(); !r.OK {
		t.Fatalf("reload adding be4: %+v", r)
	}
	if n := echoAll("after be4 joined"); n > 0 {
		t.Fatalf("%d of %d established connections broke when a backend joined after the floods", n, len(conns))
	}
}
