// SPDX-License-Identifier: Apache-2.0

package datapath_test

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/gopacket/gopacket/layers"

	"github.com/l4lb/l4lb/internal/pkttest"
	"github.com/l4lb/l4lb/internal/testnet"
	"github.com/l4lb/l4lb/lb"
	"github.com/l4lb/l4lb/lb/datapath"
	"github.com/l4lb/l4lb/lb/maglev"
	"github.com/l4lb/l4lb/lb/reconciler"
)

// testSeed is the hash seed of every packet test.
var testSeed = maglev.Seed{0x00, 0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77, 0x88, 0x99, 0xaa, 0xbb, 0xcc, 0xdd, 0xee, 0xff}

// testTableSize is the Maglev table size of every test service: small, so
// that tables are cheap, but large enough for weights to matter.
const testTableSize = 251

// Addresses of the packet-test topology: the LB's interface lb0 sits on
// 10.0.0.0/24 and fd00::/64 with the backends; VIPs and clients are routed.
var (
	lbAddr4   = netip.MustParseAddr("10.0.0.1")
	lbAddr6   = netip.MustParseAddr("fd00::1")
	vip4      = netip.MustParseAddr("192.0.2.10")
	vip6      = netip.MustParseAddr("2001:db8::10")
	client4   = netip.MustParseAddr("198.51.100.7")
	client6   = netip.MustParseAddr("2001:db8:1::7")
	backends4 = []netip.Addr{netip.MustParseAddr("10.0.0.11"), netip.MustParseAddr("10.0.0.12"), netip.MustParseAddr("10.0.0.13"), netip.MustParseAddr("10.0.0.14")}
	backends6 = []netip.Addr{netip.MustParseAddr("fd00::11"), netip.MustParseAddr("fd00::12"), netip.MustParseAddr("fd00::13"), netip.MustParseAddr("fd00::14")}
	// unrouted4 and unrouted6 are backend addresses the LB has no route for.
	unrouted4 = netip.MustParseAddr("203.0.113.99")
	unrouted6 = netip.MustParseAddr("2001:db8:ffff::99")
	// noNeigh4 and noNeigh6 are on lb0's subnets but have no neighbour entry.
	noNeigh4 = netip.MustParseAddr("10.0.0.50")
	noNeigh6 = netip.MustParseAddr("fd00::50")
)

// family bundles the addresses of one IP family, so tests run once per family.
type family struct {
	name     string
	lbAddr   netip.Addr
	vip      netip.Addr
	client   netip.Addr
	backends []netip.Addr
	unrouted netip.Addr
	noNeigh  netip.Addr
	icmp     layers.IPProtocol
}

var families = []family{
	{name: "ipv4", lbAddr: lbAddr4, vip: vip4, client: client4, backends: backends4, unrouted: unrouted4, noNeigh: noNeigh4, icmp: layers.IPProtocolICMPv4},
	{name: "ipv6", lbAddr: lbAddr6, vip: vip6, client: client6, backends: backends6, unrouted: unrouted6, noNeigh: noNeigh6, icmp: layers.IPProtocolICMPv6},
}

// familyOf returns the family of addr.
func familyOf(addr netip.Addr) family {
	if addr.Is4() {
		return families[0]
	}
	return families[1]
}

// backendMAC is the static neighbour MAC of a backend address.
func backendMAC(a netip.Addr) net.HardwareAddr {
	b := a.AsSlice()
	return net.HardwareAddr{0x02, 0xbe, 0, 0, b[len(b)-2], b[len(b)-1]}
}

// XDP verdicts (enum xdp_action).
const (
	xdpAborted uint32 = iota
	xdpDrop
	xdpPass
	xdpTX
	xdpRedirect
)

func verdictName(v uint32) string {
	switch v {
	case xdpAborted:
		return "XDP_ABORTED"
	case xdpDrop:
		return "XDP_DROP"
	case xdpPass:
		return "XDP_PASS"
	case xdpTX:
		return "XDP_TX"
	case xdpRedirect:
		return "XDP_REDIRECT"
	}
	return fmt.Sprintf("verdict %d", v)
}

// env is one LB datapath loaded (unpinned) and a namespace in which its
// bpf_fib_lookup finds routes and neighbours for the backends. Its maps are
// written only by a real reconciler, through the datapath's own binding.
type env struct {
	ns      *testnet.NS
	lb      *datapath.LB
	rec     *reconciler.Reconciler
	ifindex int
	lbMAC   net.HardwareAddr
}

// envOptions changes the datapath configuration of one env.
type envOptions struct {
	// conntrackMax is the connection table's size; 0 means 4096.
	conntrackMax uint32
	// snatAddrs are the SNAT addresses; nil means lb0's, lbAddr4 and
	// lbAddr6. The SNAT port range and timeouts keep the datapath's
	// defaults where zero.
	snatAddrs                []netip.Addr
	snatPortMin, snatPortMax uint16
	snatTimeouts             datapath.SNATTimeouts
	// maxBackends is the backend map's capacity; 0 means 256.
	maxBackends uint32
	// maxServices is the service map's capacity; 0 means 64.
	maxServices uint32
	// icmpRate is the ICMP answers' rate limit; 0 sends none.
	icmpRate uint32
	// insertRate is datapath.flow_insert_rate; 0 means no limit.
	insertRate uint32
	// snatMax is the SNAT tables' size; 0 takes conntrackMax.
	snatMax uint32
	// pinPath pins the maps there, for tests that load a second
	// datapath over the first one's state (env.reload).
	pinPath string
	// anonNS makes the namespaces anonymous: gone with the process even
	// when it is killed before its cleanups (the fuzzer's workers).
	anonNS bool
	// handshakeHold is datapath.Config.HandshakeHold; 0 takes the default.
	handshakeHold time.Duration
	// flowCounts is datapath.Config.FlowCounts.
	flowCounts bool
}

type xdpMD struct {
	Data, DataEnd, DataMeta, IngressIfindex, RxQueueIndex, EgressIfindex uint32
}

func newEnv(t *testing.T) *env { return newEnvWith(t, envOptions{}) }

// pinDir makes a bpffs directory of its own for the test's pins (a
// restarted datapath adopts them), removed with everything in it when the
// test ends.
func pinDir(t testing.TB, name string) string {
	t.Helper()
	testnet.RequireRoot(t)
	dir, err := os.MkdirTemp("/sys/fs/bpf", "l4lb-"+name+"-test-")
	if err != nil {
		t.Fatalf("bpffs directory: %v", err)
	}
	t.Cleanup(func() {
		datapath.Cleanup(dir)
		// The directory is the test's own: whatever the test pinned
		// there besides the datapath's own pins goes too.
		os.RemoveAll(dir)
	})
	return dir
}

func newEnvWith(t testing.TB, o envOptions) *env {
	t.Helper()
	testnet.RequireRoot(t)
	if o.conntrackMax == 0 {
		o.conntrackMax = 4096
	}
	if o.maxBackends == 0 {
		o.maxBackends = 256
	}
	newNS := testnet.NewNS
	if o.anonNS {
		newNS = testnet.NewAnonNS
	}
	ns := newNS(t, "pkt")
	peer := newNS(t, "peer")
	testnet.Veth(t, ns, "lb0", peer, "peer0")
	ns.AddAddr(t, "lb0", "10.0.0.1/24")
	ns.AddAddr(t, "lb0", "fd00::1/64")
	ns.Sysctl(t, "net.ipv4.conf.all.forwarding", "1")
	ns.Sysctl(t, "net.ipv6.conf.all.forwarding", "1")
	for _, b := range append(append([]netip.Addr{}, backends4...), backends6...) {
		ns.AddNeigh(t, "lb0", b.String(), backendMAC(b))
	}
	link := ns.Link(t, "lb0")
	e := &env{ns: ns, ifindex: link.Attrs().Index, lbMAC: link.Attrs().HardwareAddr}
	e.load(t, o, nil)
	return e
}

// config is the datapath configuration o describes, in e's namespace.
func (e *env) config(o envOptions) datapath.Config {
	if o.snatAddrs == nil {
		o.snatAddrs = []netip.Addr{lbAddr4, lbAddr6}
	}
	if o.conntrackMax == 0 {
		o.conntrackMax = 4096
	}
	if o.maxBackends == 0 {
		o.maxBackends = 256
	}
	if o.maxServices == 0 {
		o.maxServices = 64
	}
	return datapath.Config{
		PinPath:        o.pinPath,
		Seed:           testSeed,
		MaxServices:    o.maxServices,
		MaxBackends:    o.maxBackends,
		ConntrackMax:   o.conntrackMax,
		SNATAddresses:  o.snatAddrs,
		SNATPortMin:    o.snatPortMin,
		SNATPortMax:    o.snatPortMax,
		SNATTimeouts:   o.snatTimeouts,
		SNATMax:        o.snatMax,
		ICMPRateLimit:  o.icmpRate,
		FlowInsertRate: o.insertRate,
		HandshakeHold:  o.handshakeHold,
		FlowCounts:     o.flowCounts,
		Netns:          e.ns.Handle(),
		Log:            slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
	}
}

// load loads e's datapath with o (over the pins of a previous one when
// o.pinPath is set) and a reconciler that adopts what it holds, naming the
// adopted services as svcs do (the kernel does not keep names).
func (e *env) load(t testing.TB, o envOptions, svcs []lb.Service) {
	t.Helper()
	lbd, err := datapath.Load(e.config(o))
	if err != nil {
		t.Fatalf("load datapath: %v", err)
	}
	t.Cleanup(func() { lbd.Close() })
	// What attaching would learn: frames are forwarded only when
	// addressed to lb0's MAC, and its addresses are the box's.
	if err := lbd.LearnInterface("lb0"); err != nil {
		t.Fatalf("learn lb0: %v", err)
	}
	rcfg := reconciler.Config{Seed: testSeed, MaxServices: e.config(o).MaxServices, MaxBackends: e.config(o).MaxBackends}
	st, err := lbd.State()
	if err != nil {
		t.Fatalf("read datapath state: %v", err)
	}
	for i := range st.Services {
		for _, s := range svcs {
			if s.Frontend == st.Services[i].Service.Frontend {
				st.Services[i].Service.Name = s.Name
			}
		}
	}
	rec, err := reconciler.NewFromState(rcfg, lbd, nil, st)
	if err != nil {
		t.Fatalf("adopt datapath state: %v", err)
	}
	e.lb, e.rec = lbd, rec
}

// reload replaces e's datapath by one loaded with o over the same pins,
// as a restarted l4lbd with a changed configuration does; svcs are the
// services programmed. The old one is closed.
func (e *env) reload(t testing.TB, o envOptions, svcs ...lb.Service) {
	t.Helper()
	old := e.lb
	in := make([]lb.Service, len(svcs))
	for i, s := range svcs {
		in[i] = withDefaults(s)
	}
	e.load(t, o, in)
	old.Close()
}

// result is what one run of the XDP program returned.
type result struct {
	verdict uint32
	out     []byte
}

// hook selects the entry point a packet test runs: the XDP program or the
// tc (tcx ingress) one. Tests of a path loop over hooks.
type hook int

const (
	hookXDP hook = iota
	hookTC
)

var hooks = []hook{hookXDP, hookTC}

func (k hook) String() string {
	if k == hookTC {
		return "tc"
	}
	return "xdp"
}

// tc verdicts besides tcxNext (companion_test.go).
const (
	tcxDrop       = uint32(2)
	tcActRedirect = uint32(7)
)

// tx, pass and drop are the hook's verdicts for a packet sent back out of
// lb0, handed to the stack, or dropped.
func (k hook) tx() uint32 {
	if k == hookTC {
		return tcActRedirect
	}
	return xdpTX
}

func (k hook) pass() uint32 {
	if k == hookTC {
		return tcxNext
	}
	return xdpPass
}

func (k hook) drop() uint32 {
	if k == hookTC {
		return tcxDrop
	}
	return xdpDrop
}

func (k hook) verdictName(v uint32) string {
	if k == hookXDP {
		return verdictName(v)
	}
	switch v {
	case tcxNext:
		return "TCX_NEXT"
	case tcxDrop:
		return "TCX_DROP"
	case tcActRedirect:
		return "TC_ACT_REDIRECT"
	}
	return fmt.Sprintf("tc verdict %d", int32(v))
}

// skbContext is a struct __sk_buff (192 bytes) for a tc test run with only
// ifindex (byte offset 40) set: the interface bpf_fib_lookup routes from
// and the skb's device.
func skbContext(ifindex int) []byte {
	ctx := make([]byte, 192)
	binary.LittleEndian.PutUint32(ctx[40:], uint32(ifindex))
	return ctx
}

// runOn runs the program of hook k once on frame, as received on lb0.
func (e *env) runOn(t testing.TB, k hook, frame []byte) result {
	t.Helper()
	if k == hookXDP {
		return e.run(t, frame)
	}
	var res result
	err := e.ns.Do(func() error {
		opts := &ebpf.RunOptions{
			Data:    frame,
			DataOut: make([]byte, len(frame)+256),
			Context: skbContext(e.ifindex),
			Repeat:  1,
		}
		v, err := e.lb.ProgramTC().Run(opts)
		if err != nil {
			return fmt.Errorf("%d-byte frame: %w", len(frame), err)
		}
		res = result{verdict: v, out: opts.DataOut}
		return nil
	})
	if err != nil {
		t.Fatalf("run tc program: %v", err)
	}
	return res
}

// runXDPOn runs the XDP program once on frame, as received on the
// interface of e's namespace with index ifindex.
func (e *env) runXDPOn(t testing.TB, ifindex int, frame []byte) result {
	t.Helper()
	var res result
	err := e.ns.Do(func() error {
		opts := &ebpf.RunOptions{
			Data:    frame,
			DataOut: make([]byte, len(frame)+256),
			Context: xdpMD{DataEnd: uint32(len(frame)), IngressIfindex: uint32(ifindex)},
			Repeat:  1,
		}
		v, err := e.lb.Program().Run(opts)
		res = result{verdict: v, out: opts.DataOut}
		return err
	})
	if err != nil {
		t.Fatalf("run XDP program on ifindex %d: %v", ifindex, err)
	}
	return res
}

// run runs the XDP program once on frame, as received on lb0.
func (e *env) run(t testing.TB, frame []byte) result {
	t.Helper()
	return e.runAll(t, [][]byte{frame})[0]
}

// runAll runs the XDP program on each frame in turn, all from one thread
// switched into the namespace (bpf_fib_lookup resolves the ingress
// interface in the caller's namespace).
func (e *env) runAll(t testing.TB, frames [][]byte) []result {
	t.Helper()
	res := make([]result, len(frames))
	err := e.ns.Do(func() error {
		for i, f := range frames {
			opts := &ebpf.RunOptions{
				Data:    f,
				DataOut: make([]byte, len(f)+256),
				Context: xdpMD{DataEnd: uint32(len(f)), IngressIfindex: uint32(e.ifindex)},
				Repeat:  1,
			}
			v, err := e.lb.Program().Run(opts)
			if err != nil {
				return fmt.Errorf("frame %d (%d bytes): %w", i, len(f), err)
			}
			res[i] = result{verdict: v, out: opts.DataOut}
		}
		return nil
	})
	if err != nil {
		t.Fatalf("run XDP program: %v", err)
	}
	return res
}

// reconcile programs exactly svcs (DSR over IPIP unless they say otherwise).
func (e *env) reconcile(t testing.TB, svcs ...lb.Service) {
	t.Helper()
	in := make([]lb.Service, len(svcs))
	for i, s := range svcs {
		in[i] = withDefaults(s)
	}
	if err := e.rec.Reconcile(in); err != nil {
		t.Fatalf("reconcile: %v", err)
	}
}

func withDefaults(s lb.Service) lb.Service {
	return s.WithDefaults(lb.Defaults{Mode: lb.ModeDSR, Dispatch: lb.DispatchIPIP, TableSize: testTableSize})
}

func dsrService(name string, vip netip.Addr, port uint16, proto lb.Protocol, backends ...netip.Addr) lb.Service {
	s := lb.Service{Name: name, Frontend: lb.Frontend{Addr: vip, Port: port, Proto: proto}}
	for _, b := range backends {
		s.Backends = append(s.Backends, lb.Backend{Addr: netip.AddrPortFrom(b, port), Weight: 1})
	}
	return s
}

// state is the reconciler's record of what it programmed for fe.
func (e *env) state(t testing.TB, fe lb.Frontend) reconciler.ServiceState {
	t.Helper()
	for _, s := range e.rec.Programmed().Services {
		if s.HasEntry && s.Service.Frontend == fe {
			return s
		}
	}
	t.Fatalf("service %s is not programmed", fe)
	return reconciler.ServiceState{}
}

// reasons returns the reason counters' packet counts by name.
func (e *env) reasons(t testing.TB) map[string]uint64 {
	t.Helper()
	r, err := e.lb.Reasons()
	if err != nil {
		t.Fatalf("read reason counters: %v", err)
	}
	out := make(map[string]uint64, len(r))
	for name, c := range r {
		out[name] = c.Packets
	}
	return out
}

// expectReasons checks that, since before, exactly the reasons in want were
// counted, each want[name] times.
func (e *env) expectReasons(t testing.TB, before, want map[string]uint64) {
	t.Helper()
	after := e.reasons(t)
	for name := range want {
		if _, ok := after[name]; !ok {
			t.Errorf("%q is not a reason of the datapath (it has %v)", name, e.lb.ReasonNames())
		}
	}
	for name, n := range after {
		if got := n - before[name]; got != want[name] {
			t.Errorf("reason %s: counted %d packets, want %d", name, got, want[name])
		}
	}
}

// pick is the backend Go computes for a new flow of svc, with lb/maglev
// alone: table[FlowHash % M] of the table built over svc's backends. ok is
// false when the table is empty.
func pick(t testing.TB, svc lb.Service, f maglev.Flow) (addr netip.Addr, ok bool) {
	t.Helper()
	svc = withDefaults(svc)
	// Only active backends with a weight get slots: draining ones keep
	// their established flows through the connection table alone.
	in := make([]maglev.Backend, len(svc.Backends))
	for i, b := range svc.Backends {
		in[i] = maglev.Backend{Addr: b.Addr, Weight: b.Weight}
		if b.State != lb.Active {
			in[i].Weight = 0
		}
	}
	table, err := maglev.Build(testSeed, svc.TableSize, in)
	if err != nil {
		t.Fatalf("build Maglev table of %s: %v", svc.Name, err)
	}
	i := maglev.Lookup(testSeed, table, f)
	if i < 0 {
		return netip.Addr{}, false
	}
	return svc.Backends[i].Addr.Addr(), true
}

// mustPick is pick for a service that has eligible backends.
func mustPick(t testing.TB, svc lb.Service, f maglev.Flow) netip.Addr {
	t.Helper()
	a, ok := pick(t, svc, f)
	if !ok {
		t.Fatalf("service %s has no eligible backend", svc.Name)
	}
	return a
}

// packet returns a client packet of flow f with the given TCP flags.
func packet(f maglev.Flow, syn, ack bool, payload []byte) pkttest.Packet {
	return pkttest.Packet{
		Src:     netip.AddrPortFrom(f.Src, f.SrcPort),
		Dst:     netip.AddrPortFrom(f.Dst, f.DstPort),
		Proto:   layers.IPProtocol(f.Proto),
		SYN:     syn && f.Proto == uint8(lb.TCP),
		ACK:     ack && f.Proto == uint8(lb.TCP),
		Payload: payload,
	}
}

// frame builds p addressed to lb0.
func (e *env) frame(t testing.TB, p pkttest.Packet) []byte {
	t.Helper()
	if p.DstMAC == nil {
		p.DstMAC = e.lbMAC
	}
	return pkttest.Build(t, p)
}

// flowTo returns the flow of a client to fe from client:sport.
func flowTo(fe lb.Frontend, client netip.Addr, sport uint16) maglev.Flow {
	return maglev.Flow{Src: client, Dst: fe.Addr, SrcPort: sport, DstPort: fe.Port, Proto: uint8(fe.Proto)}
}

// martian reports a source the datapath refuses whatever its services
// (pkttest.Martian): 0/8, 127/8, 224/4 and above; ::, ::1, fe80::/10,
// ::ffff:0:0/96 and ff00::/8.
func martian(a netip.Addr) bool {
	if a.Is4() {
		return a.As4()[0] >= 224 || pkttest.Martian(a)
	}
	return pkttest.Martian(a)
}

// randomFlows returns n distinct flows to fe from random clients of fe's
// family, from a fixed seed so that a failure reproduces.
func randomFlows(fe lb.Frontend, n int, seed uint64) []maglev.Flow {
	rng := rand.New(rand.NewPCG(seed, uint64(fe.Port)))
	seen := map[maglev.Flow]bool{}
	var out []maglev.Flow
	for len(out) < n {
		var src netip.Addr
		if fe.Addr.Is4() {
			var a [4]byte
			binary.BigEndian.PutUint32(a[:], rng.Uint32())
			src = netip.AddrFrom4(a)
		} else {
			var a [16]byte
			binary.BigEndian.PutUint64(a[:8], rng.Uint64())
			binary.BigEndian.PutUint64(a[8:], rng.Uint64())
			src = netip.AddrFrom16(a)
			if src.Is4In6() {
				continue
			}
		}
		if martian(src) {
			continue // the datapath passes these, as hosts drop them
		}
		f := flowTo(fe, src, uint16(1+rng.IntN(65535)))
		if !seen[f] {
			seen[f] = true
			out = append(out, f)
		}
	}
	return out
}

// flowOf reads the client 5-tuple of a well-formed frame.
func flowOf(t testing.TB, frame []byte) maglev.Flow {
	t.Helper()
	d := pkttest.Decode(frame)
	var f maglev.Flow
	switch {
	case d.Outer4 != nil:
		f.Src, _ = netip.AddrFromSlice(d.Outer4.SrcIP.To4())
		f.Dst, _ = netip.AddrFromSlice(d.Outer4.DstIP.To4())
	case d.Outer6 != nil:
		f.Src, _ = netip.AddrFromSlice(d.Outer6.SrcIP)
		f.Dst, _ = netip.AddrFromSlice(d.Outer6.DstIP)
	default:
		t.Fatalf("frame has no IP header:\n%s", d.Dump())
	}
	switch {
	case d.TCP != nil:
		f.SrcPort, f.DstPort, f.Proto = uint16(d.TCP.SrcPort), uint16(d.TCP.DstPort), uint8(lb.TCP)
	case d.UDP != nil:
		f.SrcPort, f.DstPort, f.Proto = uint16(d.UDP.SrcPort), uint16(d.UDP.DstPort), uint8(lb.UDP)
	default:
		t.Fatalf("frame has no TCP or UDP header:\n%s", d.Dump())
	}
	return f
}

// checkTX checks that r is in sent back out of lb0 (XDP_TX), encapsulated
// to a backend whose neighbour MAC it carries, and returns that backend.
func (e *env) checkTX(t testing.TB, in []byte, r result) netip.Addr {
	t.Helper()
	if r.verdict != xdpTX {
		t.Fatalf("verdict %s, want XDP_TX; output:\n%s", verdictName(r.verdict), pkttest.Decode(r.out).Dump())
	}
	be := checkEncap(t, in, r.out)
	if got, want := net.HardwareAddr(r.out[0:6]), backendMAC(be); !bytes.Equal(got, want) {
		t.Errorf("Ethernet destination %s, want %s (the neighbour of backend %s)", got, want, be)
	}
	if got := net.HardwareAddr(r.out[6:12]); !bytes.Equal(got, e.lbMAC) {
		t.Errorf("Ethernet source %s, want lb0's %s", got, e.lbMAC)
	}
	return be
}

// checkEncap checks, field by field, that out carries the IP packet of in
// (without any Ethernet padding, byte for byte) behind the outer header the
// LB builds, and returns the outer destination: the backend. The outer
// source's host bits must be the flow hash's low bits, which proves that
// the program's hash equals lb/maglev's, not just the slot it leads to.
func checkEncap(t testing.TB, in, out []byte) netip.Addr {
	t.Helper()
	return checkEncapHash(t, in, out, maglev.FlowHash(testSeed, flowOf(t, in)))
}

// checkEncapHash is checkEncap for a packet that belongs to a flow with
// hash, such as an ICMP error about the flow.
func checkEncapHash(t testing.TB, in, out []byte, hash uint64) netip.Addr {
	t.Helper()
	inner := pkttest.IPPacket(t, in)
	v4 := in[pkttest.MustLayout(t, in).L3]>>4 == 4
	hdr, etype := 40, uint16(0x86dd)
	if v4 {
		hdr, etype = 20, 0x0800
	}
	if len(out) != 14+hdr+len(inner) {
		t.Fatalf("output frame is %d bytes, want 14 + %d + %d (Ethernet, outer header, inner packet without padding):\n%s",
			len(out), hdr, len(inner), pkttest.Decode(out).Dump())
	}
	if got := binary.BigEndian.Uint16(out[12:]); got != etype {
		t.Errorf("ethertype %#04x, want %#04x", got, etype)
	}
	o := out[14 : 14+hdr]
	var backend netip.Addr
	if v4 {
		fields := []struct {
			name      string
			got, want int
		}{
			{"version", int(o[0] >> 4), 4},
			{"IHL", int(o[0] & 0x0f), 5},
			{"TOS", int(o[1]), int(inner[1])},
			{"total length", int(binary.BigEndian.Uint16(o[2:])), len(inner) + 20},
			{"identification", int(binary.BigEndian.Uint16(o[4:])), int(binary.BigEndian.Uint16(inner[4:]))},
			{"flags and fragment offset (DF copied, nothing else)", int(binary.BigEndian.Uint16(o[6:])), int(binary.BigEndian.Uint16(inner[6:]) & 0x4000)},
			{"TTL", int(o[8]), 64},
			{"protocol", int(o[9]), 4},
		}
		for _, f := range fields {
			if f.got != f.want {
				t.Errorf("outer IPv4 %s = %#x, want %#x", f.name, f.got, f.want)
			}
		}
		if !pkttest.IPv4ChecksumValid(o) {
			t.Errorf("outer IPv4 header checksum %#04x, want %#04x", binary.BigEndian.Uint16(o[10:]), pkttest.IPv4Checksum(o))
		}
		src := netip.AddrFrom4([4]byte(o[12:16]))
		if !datapath.DefaultEncapSource4.Contains(src) {
			t.Errorf("outer source %s is outside %s", src, datapath.DefaultEncapSource4)
		}
		if got, want := binary.BigEndian.Uint16(o[14:16]), uint16(hash); got != want {
			t.Errorf("outer source %s: host bits %#04x, want the flow hash's low 16 bits %#04x", src, got, want)
		}
		backend = netip.AddrFrom4([4]byte(o[16:20]))
	} else {
		tc := o[0]<<4 | o[1]>>4
		label := uint32(o[1]&0x0f)<<16 | uint32(o[2])<<8 | uint32(o[3])
		innerTC := inner[0]<<4 | inner[1]>>4
		fields := []struct {
			name      string
			got, want int
		}{
			{"version", int(o[0] >> 4), 6},
			{"traffic class", int(tc), int(innerTC)},
			{"flow label", int(label), int(hash & 0xfffff)},
			{"payload length", int(binary.BigEndian.Uint16(o[4:])), len(inner)},
			{"next header", int(o[6]), 41},
			{"hop limit", int(o[7]), 64},
		}
		for _, f := range fields {
			if f.got != f.want {
				t.Errorf("outer IPv6 %s = %#x, want %#x", f.name, f.got, f.want)
			}
		}
		src := netip.AddrFrom16([16]byte(o[8:24]))
		if !datapath.DefaultEncapSource6.Contains(src) {
			t.Errorf("outer source %s is outside %s", src, datapath.DefaultEncapSource6)
		}
		if got, want := binary.BigEndian.Uint32(o[20:24]), uint32(hash); got != want {
			t.Errorf("outer source %s: low 32 bits %#08x, want the flow hash's %#08x", src, got, want)
		}
		backend = netip.AddrFrom16([16]byte(o[24:40]))
	}
	if got := out[14+hdr:]; !bytes.Equal(got, inner) {
		t.Errorf("inner packet differs from the client's:\n got %x\nwant %x", got, inner)
	}
	return backend
}

// mapEntries counts the entries of a hash map with keys K and values V.
func mapEntries[K, V any](t testing.TB, m *ebpf.Map) int {
	t.Helper()
	var (
		k K
		v V
		n int
	)
	it := m.Iterate()
	for it.Next(&k, &v) {
		n++
	}
	if err := it.Err(); err != nil {
		t.Fatalf("walk %s: %v", m, err)
	}
	return n
}

// sizeOfL3 is the IP length of a frame: what byte counters count.
func sizeOfL3(t testing.TB, frame []byte) uint64 {
	t.Helper()
	return uint64(len(pkttest.IPPacket(t, frame)))
}
