// SPDX-License-Identifier: Apache-2.0

// Package datapath is the only part of l4lb that touches kernel objects. It
// loads the BPF programs of package bpf, pins their maps under the daemon's
// bpffs directory, attaches the load balancer to interfaces (XDP), writes the
// maps on behalf of the reconciler (it implements reconciler.Datapath), keeps
// the neighbours of backends resolved, and reads the per-CPU counters for
// status and metrics. It also runs the backend companion (`l4lbd backend`).
//
// Everything above this package works on the lb model and is tested against
// reconcilertest.Fake; the tests here run the real programs with
// BPF_PROG_TEST_RUN on packets built in Go.
package datapath

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math/bits"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/btf"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/l4lb/l4lb/bpf"
	"github.com/l4lb/l4lb/lb/maglev"
	"github.com/l4lb/l4lb/lb/reconciler"
)

// Config is what the load balancer's datapath is built from.
type Config struct {
	// PinPath is the bpffs directory for pinned maps and links
	// (daemon.bpffs). Empty means nothing is pinned: tests and benchmarks.
	PinPath string
	// Seed is the shared Maglev hash seed; the flow hash is keyed with it.
	Seed maglev.Seed
	// EncapSource4 and EncapSource6 are the prefixes outer source addresses
	// of encapsulated packets are drawn from: the host bits come from the
	// flow hash, so one backend's traffic spreads over its receive queues.
	// A /32 (/128) gives every packet the same source. Zero values take
	// DefaultEncapSource4 / DefaultEncapSource6.
	EncapSource4 netip.Prefix
	EncapSource6 netip.Prefix
	// Capacities of the service, backend and connection maps.
	MaxServices  uint32
	MaxBackends  uint32
	ConntrackMax uint32
	// KeepNeighbours makes the datapath keep a managed neighbour entry for
	// every backend's next hop, so traffic never waits for ARP / ND and
	// the MACs the next-hop cache hands the datapath stay confirmed.
	KeepNeighbours bool
	// Netns is the network namespace whose routes, neighbours and links
	// the next-hop cache follows: the one the datapath's interfaces are
	// in. nil means the calling process's own (l4lbd).
	Netns *netns.NsHandle
	// SNATAddresses are the source addresses of SNAT-ed packets, at most
	// MaxSNATAddresses per family; each flow gets one of its family, picked
	// by the flow hash. When empty, Load takes the primary address of each
	// family of SNATInterfaces (InterfaceAddresses). A family without any
	// cannot serve SNAT services: (*LB).Supported refuses them.
	SNATAddresses  []netip.Addr
	SNATInterfaces []string
	// SNATPortMin and SNATPortMax bound the SNAT source ports, inclusive;
	// both zero take DefaultSNATPortMin / DefaultSNATPortMax.
	SNATPortMin, SNATPortMax uint16
	// SNATMax is the capacity of each SNAT table; 0 takes ConntrackMax.
	SNATMax uint32
	// SNATTimeouts are the idle timeouts of SNAT bindings; zero fields take
	// DefaultSNATTimeouts.
	SNATTimeouts SNATTimeouts
	// ICMPRateLimit is how many ICMP fragmentation-needed / packet-too-big
	// answers each CPU may send per second, in bursts of up to as many.
	// 0 sends none: a packet too big for the path is dropped and counted
	// only. l4lbd passes datapath.icmp_rate_limit (default 100).
	ICMPRateLimit uint32
	// AffinityMax is the capacity of the client-IP affinity table, one
	// entry per client of each service with affinity; 0 takes
	// DefaultAffinityMax(ConntrackMax).
	AffinityMax uint32
	// MaxSourceRanges is how many source_ranges prefixes all services hold
	// together; 0 takes DefaultMaxSourceRanges.
	MaxSourceRanges uint32
	// FlowInsertRate is how many new connection-table entries each CPU
	// may make per second (in bursts of up to a second's worth); above
	// it a new flow is forwarded by Maglev alone, unrecorded, so that a
	// flood of packets of unknown flows cannot evict established ones.
	// 0 means no limit. l4lbd passes datapath.flow_insert_rate.
	FlowInsertRate uint32
	// HandshakeHold is how long after a service's Maglev table is
	// replaced a TCP packet without a connection entry still follows the
	// backend its SYN went to (swaps.go); 0 takes DefaultHandshakeHold.
	// Not a configuration key: tests shorten it.
	HandshakeHold time.Duration
	// FlowCounts makes the datapath count each flow's forwarded client
	// packets and bytes (bpf/include/flowcounts.h) for Flows to report:
	// l4lbd sets it when IPFIX export is configured with counts. Off,
	// the programs do none of that work. It is a load-time constant: a
	// restart is what turns it on or off.
	FlowCounts bool
	// Object, when set, is a compiled LB object (an ELF file's bytes) to
	// load instead of the embedded one. It is for measuring a build of
	// bpf/lb.c against another (`make bench-ab`); it must declare the maps
	// and programs this package's bindings know, with the same layouts.
	Object []byte
	Log    *slog.Logger
}

// Default encapsulation source prefixes. 172.16.0.0/16 and 100::/64 (the
// RFC 6666 discard prefix) are never a client's address in practice, so a
// backend's ICMP about an outer header cannot reach a real host; operators
// whose network filters sources pick their own prefix.
var (
	DefaultEncapSource4 = netip.MustParsePrefix("172.16.0.0/16")
	DefaultEncapSource6 = netip.MustParsePrefix("100::/64")
)

// LB is the loaded load-balancer datapath.
type LB struct {
	cfg    Config
	log    *slog.Logger
	coll   *ebpf.Collection
	prog   *ebpf.Program
	progTC *ebpf.Program
	progHC *ebpf.Program

	services  *ebpf.Map
	backends  *ebpf.Map
	maglev    *ebpf.Map
	conntrack *ebpf.Map
	snatFwd   *ebpf.Map
	snatRev   *ebpf.Map
	affinity  *ebpf.Map
	srcRanges *ebpf.Map
	svcGen    *ebpf.Map
	cache     *cacheGen // flow_cache_gen (flowcache.go)
	// box is what the datapath knows of the box's MACs and addresses
	// (local.go).
	box          *boxAddrs
	events       *ebpf.Map
	svcStats     *ebpf.Map
	backendStats *ebpf.Map
	// svcReplies counts SNAT replies per service; nil with an object
	// from before it (Config.Object).
	svcReplies *ebpf.Map
	// flowCountMap holds the per-flow counts (flowcounts.go); nil with
	// an object from before it (Config.Object).
	flowCountMap *ebpf.Map
	// bfdHold holds BFD sessions across a restart (bfdhold.go); nil
	// with an object from before it (Config.Object).
	bfdHold *ebpf.Map
	reasons *ebpf.Map
	txPorts *txPortSet
	inner   *ebpf.MapSpec

	// offline are the maps OpenPinned opened read-only: set only on an
	// LB that reads the pins of a stopped l4lbd.
	offline []*ebpf.Map
	// snatRevOvf is the SNAT reverse overflow table of a datapath opened
	// read-only (OpenPinned), which has no collection.
	snatRevOvf *ebpf.Map

	reasonNames []string
	eventNames  []string
	cpus        int
	// words hands out svc_gen words, filter keeps vip_filter (filter.go).
	words  *svcWords
	filter *vipFilter
	counts entryCounts
	// flowCounts caches FlowCounts.
	flowCounts struct {
		mu sync.Mutex
		m  map[FlowOwner]FlowCount
		at time.Time
	}
	// ranges is what src_ranges holds, by service id (ranges.go).
	ranges *rangeCache

	mu    sync.Mutex
	links map[string]link.Link
	// nh is the next-hop cache (nexthop.go).
	nh *nextHops
	// ctf is the connection table's presence filter (ctfilter.go).
	ctf *ctFilter
	// swaps records when each service's Maglev table was replaced
	// (swaps.go).
	swaps *tableSwaps
	// legacy are maps an earlier l4lbd pinned under old names, until
	// Retire (migrate.go).
	legacy []legacyMap
	// tombs are the empty tables DeleteTables left, handles the
	// self-check's open tables (readback.go).
	tombs   tombstones
	handles tableHandles
	beWalk  backendWalk
	// digest hashes Maglev tables in the kernel for the self-check
	// (digest.go).
	digest tableDigester
	// trace is the running trace, if any (trace.go).
	trace traceState
}

// closeLegacy releases the old-named maps without unpinning them.
func (d *LB) closeLegacy() {
	for _, l := range d.legacy {
		l.m.Close()
	}
	d.legacy = nil
}

const linkDir = "links"

// Load loads the LB program and its maps. With a PinPath, maps already
// pinned there are adopted (their contents survive a restart) and new ones
// are pinned; a pinned map whose layout or size no longer matches is an
// error naming the map, never silently replaced.
func Load(cfg Config) (*LB, error) {
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if !cfg.EncapSource4.IsValid() {
		cfg.EncapSource4 = DefaultEncapSource4
	}
	if !cfg.EncapSource6.IsValid() {
		cfg.EncapSource6 = DefaultEncapSource6
	}
	if cfg.MaxServices == 0 || cfg.MaxBackends == 0 || cfg.ConntrackMax == 0 {
		return nil, fmt.Errorf("datapath: max_services, max_backends and conntrack_max must be positive")
	}
	if cfg.MaxBackends >= ^HealthMarkMask {
		return nil, fmt.Errorf("datapath: max_backends %d does not fit the health-probe mark (at most %d)", cfg.MaxBackends, ^HealthMarkMask-1)
	}
	cfg = withPolicyDefaults(resolveSNATAddresses(withSNATDefaults(cfg)))
	spec, cpus, err := sizedSpec(cfg)
	if err != nil {
		return nil, err
	}
	names, err := enumNames(spec.Types, "l4lb_reason", "L4LB_R_")
	if err != nil {
		return nil, err
	}
	events, err := enumNames(spec.Types, "l4lb_event", "L4LB_E_")
	if err != nil {
		return nil, err
	}

	markPinned, ovfPinned := ovfPinsBefore(cfg.PinPath)
	restart := tablesPinnedBefore(cfg.PinPath)
	coll, err := newCollection("LB", spec, cfg.PinPath, linkDir)
	if err != nil {
		return nil, err
	}
	d := &LB{
		cfg:          cfg,
		log:          cfg.Log,
		coll:         coll,
		prog:         coll.Programs[bpf.LbProgL4lbXdp],
		progTC:       coll.Programs[bpf.LbProgL4lbTc],
		progHC:       coll.Programs[bpf.LbProgL4lbHc],
		services:     coll.Maps[bpf.LbMapServices],
		backends:     coll.Maps[bpf.LbMapBackends],
		maglev:       coll.Maps[bpf.LbMapMaglev],
		conntrack:    coll.Maps[bpf.LbMapConntrack],
		snatFwd:      coll.Maps[bpf.LbMapSnatFwd],
		snatRev:      coll.Maps[bpf.LbMapSnatRev],
		affinity:     coll.Maps[bpf.LbMapAffinity],
		srcRanges:    coll.Maps[bpf.LbMapSrcRanges],
		svcGen:       coll.Maps[bpf.LbMapSvcGen],
		events:       coll.Maps[bpf.LbMapEvents],
		svcStats:     coll.Maps[bpf.LbMapSvcStats],
		backendStats: coll.Maps[bpf.LbMapBackendStats],
		svcReplies:   coll.Maps[bpf.LbMapSvcReplyStats],
		flowCountMap: coll.Maps[bpf.LbMapFlowCounts],
		bfdHold:      coll.Maps[bpf.LbMapBfdHold],
		reasons:      coll.Maps[bpf.LbMapReasons],
		txPorts:      &txPortSet{m: coll.Maps[bpf.LbMapTxPorts]},
		inner:        spec.Maps[bpf.LbMapMaglev].InnerMap.Copy(),
		reasonNames:  names,
		eventNames:   events,
		cpus:         cpus,
		links:        map[string]link.Link{},
	}
	if d.cache, err = newCacheGen(coll.Maps[bpf.LbMapFlowCacheGen]); err != nil {
		coll.Close()
		return nil, err
	}
	d.box = newBoxAddrs(coll.Maps[bpf.LbMapIngressMacs], coll.Maps[bpf.LbMapLocalAddrs], d.cache)
	if d.swaps, err = newTableSwaps(coll.Maps[bpf.LbMapMaglevSwapped], restart); err != nil {
		coll.Close()
		return nil, err
	}
	if d.ranges, err = readRanges(d.srcRanges); err != nil {
		coll.Close()
		return nil, err
	}
	if err := d.adoptServices(); err != nil {
		coll.Close()
		return nil, err
	}
	if err := d.migrate(); err != nil {
		d.closeLegacy()
		coll.Close()
		return nil, err
	}
	if err := d.guardOverflowMark(markPinned, ovfPinned); err != nil {
		d.closeLegacy()
		coll.Close()
		return nil, err
	}
	if d.nh, err = newNextHops(cfg.Log, cfg.Netns, cfg.KeepNeighbours, d.cache, coll.Maps[bpf.LbMapBackendRoutes],
		coll.Maps[bpf.LbMapNexthops], cfg.MaxBackends, d.box.macChanged, d.box.addrChanged); err != nil {
		coll.Close()
		return nil, err
	}
	if err := d.adoptBackends(); err != nil {
		d.nh.close()
		coll.Close()
		return nil, err
	}
	// A table this datapath created (nothing pinned) holds no entry
	// without its bit: the filter can go in now. A pinned one may be
	// written by an earlier l4lb's programs until Retire.
	d.ctf = newCTFilter(cfg.Log, coll, spec)
	install := d.ctf.clear
	if cfg.PinPath == "" {
		install = d.ctf.install
	}
	if err := install(); err != nil {
		d.ctf.close()
		d.nh.close()
		coll.Close()
		return nil, err
	}
	return d, nil
}

// sizedSpec is the LB object with cfg's load-time constants and map sizes
// set, exactly as Load creates it, and the number of possible CPUs.
func sizedSpec(cfg Config) (*ebpf.CollectionSpec, int, error) {
	spec, err := lbSpec(cfg.Object)
	if err != nil {
		return nil, 0, err
	}
	cpus, err := ebpf.PossibleCPU()
	if err != nil {
		return nil, 0, fmt.Errorf("datapath: count CPUs: %w", err)
	}
	if err := configure(spec, cfg); err != nil {
		return nil, 0, err
	}
	for name, n := range map[string]uint32{bpf.LbMapSnatFwd: cfg.SNATMax, bpf.LbMapSnatRev: cfg.SNATMax,
		bpf.LbMapSnatFwdOvf: snatOverflowMax(cfg.SNATMax), bpf.LbMapSnatRevOvf: snatOverflowMax(cfg.SNATMax)} {
		spec.Maps[name].MaxEntries = n
	}
	// An LRU with per-CPU lists (affinity) is rounded up by the kernel to
	// a multiple of the CPU count; ask for that size, or a restarted
	// daemon would find its own pinned map "incompatible".
	spec.Maps[bpf.LbMapAffinity].MaxEntries = perCPURound(cfg.AffinityMax, cpus)
	pinRenamed(spec)
	return spec, cpus, nil
}

// embeddedSpec parses the embedded object once: every reload's memory
// estimate (config host checks) asks for it, and parsing the ELF costs
// milliseconds.
var embeddedSpec = sync.OnceValues(bpf.LoadLb)

// lbSpec is the LB object to load: obj when given, else the embedded one.
func lbSpec(obj []byte) (*ebpf.CollectionSpec, error) {
	if obj == nil {
		spec, err := embeddedSpec()
		if err != nil {
			return nil, fmt.Errorf("datapath: read embedded LB object: %w", err)
		}
		// Callers size and rewrite the spec: each gets its own copy.
		return spec.Copy(), nil
	}
	spec, err := ebpf.LoadCollectionSpecFromReader(bytes.NewReader(obj))
	if err != nil {
		return nil, fmt.Errorf("datapath: read the LB object given in Config.Object: %w", err)
	}
	return spec, nil
}

// handshakeBuckets is the size of the handshakes map (the backends of DSR
// SYNs awaiting their first ACK, two per bucket, bpf/include/maps.h): room
// for a sixteenth of the connection table's capacity, as a power of two,
// at least 512 buckets. A handshake lasts a round trip and is forgotten
// only when two more SYNs fall in its bucket meanwhile: with the default
// 32768 buckets, 10,000 new connections a second of 100 ms round trips
// lose one handshake in about 2,000 to a collision, and only a handshake
// that is also caught by a backend change ever notices.
func handshakeBuckets(conntrackMax uint32) uint32 {
	n := max(conntrackMax/32, 512)
	return uint32(1) << bits.Len32(n-1)
}

// newCollection loads spec, pinning its maps under pinPath (creating it and
// its sub directory) or, with no pinPath, pinning nothing.
func newCollection(what string, spec *ebpf.CollectionSpec, pinPath, subdir string) (*ebpf.Collection, error) {
	opts := ebpf.CollectionOptions{}
	if pinPath != "" {
		if err := os.MkdirAll(filepath.Join(pinPath, subdir), 0o700); err != nil {
			return nil, fmt.Errorf("%s: create pin directory %s: %w", what, pinPath, err)
		}
		if err := checkBPFFS(pinPath); err != nil {
			return nil, fmt.Errorf("%s: %w", what, err)
		}
		opts.Maps.PinPath = pinPath
	} else {
		for _, m := range spec.Maps {
			m.Pinning = ebpf.PinNone
		}
	}
	coll, err := ebpf.NewCollectionWithOptions(spec, opts)
	if err == nil {
		return coll, nil
	}
	var ve *ebpf.VerifierError
	if errors.As(err, &ve) {
		return nil, fmt.Errorf("%s: the kernel's verifier rejected the program: %+v", what, ve)
	}
	if errors.Is(err, ebpf.ErrMapIncompatible) {
		return nil, fmt.Errorf("%s: a map pinned under %s does not match this configuration or version: %w; "+
			"restore the previous capacities, or run `l4lbd --cleanup` (this drops connection state)", what, pinPath, err)
	}
	return nil, fmt.Errorf("%s: load: %w", what, err)
}

// checkBPFFS makes sure dir is on a bpffs mount: pinning elsewhere fails
// with an error that does not say why.
func checkBPFFS(dir string) error {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return fmt.Errorf("statfs %s: %w", dir, err)
	}
	if uint32(st.Type) != unix.BPF_FS_MAGIC {
		return fmt.Errorf("%s is not on a bpffs mount; mount one with `mount -t bpf bpf /sys/fs/bpf` (systemd does this at boot). "+
			"Under `ip netns exec`, which mounts a /sys of its own and so hides the host's bpffs, start l4lbd with `nsenter --net=/run/netns/NAME` instead", dir)
	}
	return nil
}

// configure sets load-time constants and map capacities on the spec.
func configure(spec *ebpf.CollectionSpec, cfg Config) error {
	k0, k1 := seedKeys(cfg.Seed)
	src4, mask4, err := encapSource4(cfg.EncapSource4)
	if err != nil {
		return err
	}
	src6, mask6, err := encapSource6(cfg.EncapSource6)
	if err != nil {
		return err
	}
	vars := map[string]any{
		bpf.LbVarCfgSeedK0:            k0,
		bpf.LbVarCfgSeedK1:            k1,
		bpf.LbVarCfgEncapSrc4:         src4,
		bpf.LbVarCfgEncapSrc4HostMask: mask4,
		bpf.LbVarCfgEncapSrc6:         src6,
		bpf.LbVarCfgEncapSrc6HostMask: mask6,
		bpf.LbVarCfgHcMark:            HealthMark,
		bpf.LbVarCfgHcMarkMask:        HealthMarkMask,
	}
	snat, err := snatVars(cfg)
	if err != nil {
		return err
	}
	maps.Copy(vars, snat)
	icmp, err := icmpVars(cfg.ICMPRateLimit)
	if err != nil {
		return err
	}
	maps.Copy(vars, icmp)
	maps.Copy(vars, insertVars(cfg.FlowInsertRate))
	counts, err := flowCountVars(spec, cfg.FlowCounts)
	if err != nil {
		return err
	}
	maps.Copy(vars, counts)
	vars[bpf.LbVarCfgVipFilterMask] = filterWords(cfg.MaxServices) - 1
	vars[bpf.LbVarCfgHandshakeMask] = handshakeBuckets(cfg.ConntrackMax) - 1
	vars[bpf.LbVarCfgCtFilterMask] = ctFilterWords(cfg.ConntrackMax) - 1
	hold := cfg.HandshakeHold
	if hold <= 0 {
		hold = DefaultHandshakeHold
	}
	vars[bpf.LbVarCfgHandshakeHoldNs] = uint64(hold)
	for name, v := range vars {
		vs, ok := spec.Variables[name]
		if !ok {
			return fmt.Errorf("datapath: LB object lacks variable %s (stale bpf objects? run make generate)", name)
		}
		if err := vs.Set(v); err != nil {
			return fmt.Errorf("datapath: set %s: %w", name, err)
		}
	}
	sizes := map[string]uint32{
		bpf.LbMapServices:      cfg.MaxServices,
		bpf.LbMapMaglev:        cfg.MaxServices + 1,
		bpf.LbMapSvcStats:      cfg.MaxServices + 1,
		bpf.LbMapSvcReplyStats: cfg.MaxServices + 1,
		bpf.LbMapSvcGen:        cfg.MaxServices + 1,
		bpf.LbMapMaglevSwapped: cfg.MaxServices + 1,
		bpf.LbMapVipFilter:     filterWords(cfg.MaxServices),
		bpf.LbMapBackends:      cfg.MaxBackends + 1,
		bpf.LbMapBackendStats:  cfg.MaxBackends + 1,
		bpf.LbMapBackendRoutes: cfg.MaxBackends + 1,
		bpf.LbMapNexthops:      cfg.MaxBackends + 1,
		bpf.LbMapConntrack:     cfg.ConntrackMax,
		bpf.LbMapFlowCounts:    flowCountsSize(cfg),
		bpf.LbMapHandshakes:    handshakeBuckets(cfg.ConntrackMax),
		bpf.LbMapSrcRanges:     cfg.MaxSourceRanges,
		// VIPs (at most one per service) and interface addresses.
		bpf.LbMapLocalAddrs: cfg.MaxServices + 1024,
	}
	for name, n := range sizes {
		// An object from before a map (Config.Object) lacks it.
		if m, ok := spec.Maps[name]; ok {
			m.MaxEntries = n
		}
	}
	spec.Maps[bpf.LbMapCtFilter].InnerMap.MaxEntries = ctFilterWords(cfg.ConntrackMax)
	return nil
}

// enumNames maps a C enum's values (0..MAX-1) to lower-case names without
// the prefix, read from the object's BTF, so that names cannot drift from C.
func enumNames(types *btf.Spec, enum, prefix string) ([]string, error) {
	var e *btf.Enum
	if err := types.TypeByName(enum, &e); err != nil {
		return nil, fmt.Errorf("datapath: BTF of the object lacks enum %s: %w", enum, err)
	}
	var names []string
	for _, v := range e.Values {
		name := strings.TrimPrefix(v.Name, prefix)
		if name == "MAX" {
			continue
		}
		for uint64(len(names)) <= v.Value {
			names = append(names, "")
		}
		names[v.Value] = strings.ToLower(name)
	}
	for i, n := range names {
		if n == "" {
			return nil, fmt.Errorf("datapath: enum %s has no name for value %d", enum, i)
		}
	}
	return names, nil
}

// Program is the XDP program, for packet tests and benchmarks.
func (d *LB) Program() *ebpf.Program { return d.prog }

// ProgramTC is the tc (tcx ingress) program, for packet tests.
func (d *LB) ProgramTC() *ebpf.Program { return d.progTC }

// ProgramHC is the health-probe program (tcx egress), for packet tests.
func (d *LB) ProgramHC() *ebpf.Program { return d.progHC }

// Health probes through the VIP path carry this socket mark with the
// backend id in the low bits (bpf/include/config.h, l4lb_hc).
const (
	HealthMark     uint32 = 0x4c000000
	HealthMarkMask uint32 = 0xff000000
)

// HealthMarkFor is the socket mark of a probe of backend id.
func HealthMarkFor(id reconciler.BackendID) uint32 { return HealthMark | uint32(id)&^HealthMarkMask }

// ReasonNames are the names of the reason counters, by index.
func (d *LB) ReasonNames() []string { return append([]string(nil), d.reasonNames...) }

// Close releases the process's handles. Pinned maps and links stay, and so
// does the attached program: traffic keeps flowing while l4lbd restarts.
func (d *LB) Close() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	var errs []error
	if d.offline != nil {
		for _, m := range d.offline {
			errs = append(errs, m.Close())
		}
		d.offline = nil
		return errors.Join(errs...)
	}
	for name, l := range d.links {
		if err := l.Close(); err != nil {
			errs = append(errs, fmt.Errorf("close link on %s: %w", name, err))
		}
	}
	d.links = map[string]link.Link{}
	d.ctf.close()
	d.nh.close()
	d.closeLegacy()
	d.handles.closeAll()
	d.digest.close()
	d.coll.Close()
	return errors.Join(errs...)
}
