// SPDX-License-Identifier: Apache-2.0

package metrics

import (
	"maps"
	"net/netip"
	"slices"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/l4lb/l4lb/lb"
)

// Label names shared by the state metrics.
const (
	labelService  = "service"
	labelFrontend = "frontend"
	labelBackend  = "backend"
	labelReason   = "reason"
	labelEvent    = "event"
	labelMap      = "map"
	labelSource   = "source"
	labelState    = "state"
	labelMode     = "mode"
	labelDispatch = "dispatch"
	labelResult   = "result"
	labelSetting  = "setting"
	// labelFingerprint lets an alert compare boxes: the same service with
	// two fingerprints means two boxes send one flow to different backends.
	labelFingerprint = "fingerprint"
	labelPeer        = "peer"
	labelInterface   = "interface"
	labelKind        = "kind"
	labelCollector   = "collector"
)

var (
	svcLabels     = []string{labelService}
	backendLabels = []string{labelService, labelBackend}

	descServiceInfo = prometheus.NewDesc("l4lb_service_info",
		"Always 1 for each served service; labels carry its frontend, forwarding mode, DSR dispatch, the source that defined it and the fingerprint of its Maglev table inputs.",
		[]string{labelService, labelFrontend, labelMode, labelDispatch, labelSource, labelFingerprint}, nil)
	descServicePackets = prometheus.NewDesc("l4lb_service_packets_total",
		"Packets the datapath forwarded for the service.", svcLabels, nil)
	descServiceBytes = prometheus.NewDesc("l4lb_service_bytes_total",
		"Bytes the datapath forwarded for the service, counted at L3 as received.", svcLabels, nil)
	descServiceNewFlows = prometheus.NewDesc("l4lb_service_new_flows_total",
		"Flows of the service that got a backend from the Maglev table (not from the connection table).", svcLabels, nil)

	descServiceReplyPackets = prometheus.NewDesc("l4lb_service_reply_packets_total",
		"Replies of the SNAT service's backends that the datapath rewrote and sent back to clients.", svcLabels, nil)
	descServiceReplyBytes = prometheus.NewDesc("l4lb_service_reply_bytes_total",
		"Bytes of the SNAT service's replies sent back to clients, counted at L3 as received from the backend.", svcLabels, nil)

	descBackendPackets = prometheus.NewDesc("l4lb_backend_packets_total",
		"Packets the datapath sent to the backend.", backendLabels, nil)
	descBackendBytes = prometheus.NewDesc("l4lb_backend_bytes_total",
		"Bytes the datapath sent to the backend, counted at L3 as received.", backendLabels, nil)
	descBackendNewFlows = prometheus.NewDesc("l4lb_backend_new_flows_total",
		"New flows the datapath assigned to the backend.", backendLabels, nil)
	descBackendWeight = prometheus.NewDesc("l4lb_backend_weight",
		"Relative share of new flows the backend is configured for (0: none).", backendLabels, nil)
	descBackendAdminState = prometheus.NewDesc("l4lb_backend_admin_state",
		"1 for the administrative state in force (active, draining, disabled), 0 for the others.",
		[]string{labelService, labelBackend, labelState}, nil)
	descBackendOverride = prometheus.NewDesc("l4lb_backend_admin_override",
		"1 when the administrative state is a runtime override set with l4lbctl backend, 0 when it is the source's.",
		backendLabels, nil)
	descBackendHealth = prometheus.NewDesc("l4lb_backend_health_state",
		"1 for the backend's health state (unchecked, unknown, healthy, unhealthy), 0 for the others.",
		[]string{labelService, labelBackend, labelState}, nil)

	descBackendConnections = prometheus.NewDesc("l4lb_backend_connections",
		"The backend's flows in the connection table, by state: active (TCP, established, seen within datapath.snat_timeouts.tcp) or inactive (UDP, TCP closing or reopening), each inactive one until its state's timeout runs out. Counted at most a few seconds ago.",
		[]string{labelService, labelBackend, labelState}, nil)

	descReasonPackets = prometheus.NewDesc("l4lb_datapath_packets_total",
		"Packets the datapath did not forward to a backend, by what it did instead (pass_*: handed to the kernel stack, drop_*: dropped).",
		[]string{labelReason}, nil)
	descEvents = prometheus.NewDesc("l4lb_datapath_events_total",
		"Things the datapath did besides a packet's verdict: next hops asked of bpf_fib_lookup (fib_fallback), new flows left unrecorded over datapath.flow_insert_rate (ct_insert_limited), SNAT bindings made in or promoted from the overflow tables.",
		[]string{labelEvent}, nil)
	descReasonBytes = prometheus.NewDesc("l4lb_datapath_bytes_total",
		"Bytes (L3 length; whole frame for non-IP) of the packets counted in l4lb_datapath_packets_total, by reason.",
		[]string{labelReason}, nil)

	descConntrackEntries = prometheus.NewDesc("l4lb_conntrack_entries",
		"Flows in the connection table.", nil, nil)
	descConntrackCapacity = prometheus.NewDesc("l4lb_conntrack_capacity",
		"Size of the connection table (datapath.conntrack_max); when full, the least recently used flows are evicted.", nil, nil)
	descSNATEntries = prometheus.NewDesc("l4lb_snat_entries",
		"Source-NAT bindings (LB address and port) in use.", nil, nil)
	descSNATCapacity = prometheus.NewDesc("l4lb_snat_capacity",
		"Source-NAT bindings available (addresses times ports).", nil, nil)
	descMapEntries = prometheus.NewDesc("l4lb_map_entries",
		"Entries in use in the BPF map.", []string{labelMap}, nil)
	descMapCapacity = prometheus.NewDesc("l4lb_map_capacity",
		"Maximum entries of the BPF map.", []string{labelMap}, nil)

	descDiscoverySync = prometheus.NewDesc("l4lb_discovery_last_sync_timestamp_seconds",
		"Unix time the discovery source last published its services; 0 if it never did.",
		[]string{labelSource}, nil)
	descDiscoveryServices = prometheus.NewDesc("l4lb_discovery_services",
		"Services in the discovery source's last snapshot.", []string{labelSource}, nil)
	descConflicting = prometheus.NewDesc("l4lb_services_conflicting",
		"Service definitions left out because another source claimed the same frontend or name first (reason: frontend, name).",
		[]string{labelService, labelSource, labelReason}, nil)
	descRefused = prometheus.NewDesc("l4lb_services_refused",
		"Services the datapath does not serve (reason: unsupported, map_full, local_vip, cannot_work).",
		[]string{labelService, labelSource, labelReason}, nil)

	descPendingRestart = prometheus.NewDesc("l4lb_config_pending_restart",
		"1 per setting of the configuration file in force that differs from the running value and applies only when l4lbd restarts.",
		[]string{labelSetting}, nil)
	descSeedInfo = prometheus.NewDesc("l4lb_maglev_seed_info",
		"Always 1; the fingerprint label identifies the Maglev hash seed without revealing it. Boxes of one fleet must show the same.",
		[]string{labelFingerprint}, nil)

	descBGPAnnounced = prometheus.NewDesc("l4lb_bgp_announced_prefixes",
		"VIPs (as /32 or /128) in the BGP speaker's table, announced to every peer of their family.", nil, nil)
	descBGPPeerUp = prometheus.NewDesc("l4lb_bgp_peer_up",
		"1 while the BGP session with the peer is established, 0 otherwise.", []string{labelPeer}, nil)
	descBGPPeerAdvertised = prometheus.NewDesc("l4lb_bgp_peer_advertised_prefixes",
		"Prefixes advertised to the peer on the current session.", []string{labelPeer}, nil)
	descBGPUpdatesSent = prometheus.NewDesc("l4lb_bgp_updates_sent_total",
		"BGP UPDATE messages sent to the peer (announcements and withdrawals) since its session came up.", []string{labelPeer}, nil)
	descBGPUpdatesReceived = prometheus.NewDesc("l4lb_bgp_updates_received_total",
		"BGP UPDATE messages received from the peer since its session came up.", []string{labelPeer}, nil)
	descBFDUp = prometheus.NewDesc("l4lb_bgp_peer_bfd_up",
		"1 while the BFD session with the peer is up, 0 otherwise; absent for peers without BFD.", []string{labelPeer}, nil)
	descBFDTransitions = prometheus.NewDesc("l4lb_bgp_peer_bfd_transitions_total",
		"Times the BFD session with the peer entered the state (up, down, init, admin_down) since l4lbd started; a rising down count is a box or link failing, or a flap.", []string{labelPeer, "state"}, nil)

	descL2Announced = prometheus.NewDesc("l4lb_l2_announced_vips",
		"VIPs whose ARP requests and neighbour solicitations this box answers.", nil, nil)
	descL2Replies = prometheus.NewDesc("l4lb_l2_replies_sent_total",
		"ARP replies (kind=arp) and neighbour advertisements (kind=nd) sent for VIPs.", []string{labelInterface, labelKind}, nil)
	descL2Gratuitous = prometheus.NewDesc("l4lb_l2_gratuitous_sent_total",
		"Gratuitous ARPs and unsolicited neighbour advertisements sent for VIPs that appeared.", []string{labelInterface}, nil)
	descL2Active = prometheus.NewDesc("l4lb_l2_failover_active",
		"1 while this box is the active one of its L2 failover group and answers for the VIPs, 0 otherwise; absent without [l2.failover].", nil, nil)
	descL2Role = prometheus.NewDesc("l4lb_l2_failover_role",
		"1 for this box's current L2 failover role (active, standby, listening), 0 for the others.", []string{"role"}, nil)
	descL2Transitions = prometheus.NewDesc("l4lb_l2_failover_transitions_total",
		"Times this box entered the L2 failover role since l4lbd started; a rising active count on several boxes is a flapping group.", []string{"role"}, nil)
	descL2Peers = prometheus.NewDesc("l4lb_l2_failover_peers",
		"Other boxes of the L2 failover group heard within the detection time.", nil, nil)
	descL2Conflicts = prometheus.NewDesc("l4lb_l2_failover_conflicts_total",
		"Adverts of another active box received while this one was active (a split segment that healed, or two boxes with one name).", nil, nil)

	descFleetBoxes = prometheus.NewDesc("l4lb_fleet_boxes",
		"LB boxes whose fleet records this box sees in Consul, itself included.", nil, nil)
	descFleetMismatch = prometheus.NewDesc("l4lb_fleet_mismatch",
		"1 when another LB box has a different fingerprint (seed, table size, eligible backends) for the service's frontend: the boxes send one flow to different backends.",
		svcLabels, nil)

	descIPFIXSent = prometheus.NewDesc("l4lb_ipfix_records_sent_total",
		"IPFIX flow records sent to the collector.", []string{labelCollector}, nil)
	descIPFIXDropped = prometheus.NewDesc("l4lb_ipfix_records_dropped_total",
		"IPFIX flow records for the collector that the kernel refused to send (the collector unreachable, a full socket buffer).", []string{labelCollector}, nil)
	descIPFIXRecords = prometheus.NewDesc("l4lb_ipfix_records_total",
		"IPFIX flow records made, by event: created, active (active timeout), ended.", []string{labelEvent}, nil)
	descIPFIXTracked = prometheus.NewDesc("l4lb_ipfix_flows_tracked",
		"Flows the IPFIX exporter follows from scan to scan.", nil, nil)
	descIPFIXUntracked = prometheus.NewDesc("l4lb_ipfix_flows_untracked_total",
		"New flows the IPFIX exporter could not follow (ipfix.max_flows reached): never reported.", nil, nil)
	descIPFIXScan = prometheus.NewDesc("l4lb_ipfix_scan_duration_seconds",
		"How long the latest scan of the connection table for IPFIX took.", nil, nil)

	descScrapeError = prometheus.NewDesc("l4lb_snapshot_error",
		"Never exposed: carries errors met while reading the live state.", nil, nil)
)

var allDescs = []*prometheus.Desc{
	descServiceInfo, descServicePackets, descServiceBytes, descServiceNewFlows,
	descServiceReplyPackets, descServiceReplyBytes,
	descBackendPackets, descBackendBytes, descBackendNewFlows, descBackendWeight,
	descBackendAdminState, descBackendOverride, descBackendHealth, descBackendConnections,
	descReasonPackets, descReasonBytes, descEvents,
	descConntrackEntries, descConntrackCapacity, descSNATEntries, descSNATCapacity,
	descMapEntries, descMapCapacity,
	descDiscoverySync, descDiscoveryServices, descConflicting, descRefused,
	descPendingRestart, descSeedInfo, descBGPAnnounced, descBGPPeerUp, descBGPPeerAdvertised, descBGPUpdatesSent, descBGPUpdatesReceived, descBFDUp, descBFDTransitions,
	descL2Announced, descL2Replies, descL2Gratuitous, descL2Active, descL2Role, descL2Transitions, descL2Peers, descL2Conflicts, descFleetBoxes, descFleetMismatch,
	descIPFIXSent, descIPFIXDropped, descIPFIXRecords, descIPFIXTracked, descIPFIXUntracked, descIPFIXScan,
	descScrapeError,
}

// adminStates and healthStates are every value of the state labels: all
// are exported (0 or 1) so that a change of state moves a value instead of
// making one series vanish and another appear.
var (
	adminStates  = []lb.BackendState{lb.Active, lb.Draining, lb.Disabled}
	healthStates = []Health{HealthUnchecked, HealthUnknown, HealthHealthy, HealthUnhealthy}
)

// Collector turns a Source's snapshot into metrics at scrape time. It keeps
// no state of its own.
type Collector struct {
	src Source
}

// NewCollector returns a collector reading src on every scrape.
func NewCollector(src Source) *Collector {
	return &Collector{src: src}
}

// Describe implements prometheus.Collector.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range allDescs {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	s := c.src.Snapshot()
	e := emitter{ch: ch}

	seenSvc := make(map[string]bool, len(s.Services))
	for _, svc := range s.Services {
		// A repeated series would fail the whole scrape; the daemon never
		// sends one, so the first wins without ceremony.
		if seenSvc[svc.Name] {
			continue
		}
		seenSvc[svc.Name] = true
		e.service(svc)
	}

	seenReason := make(map[string]bool, len(s.Reasons))
	for _, r := range s.Reasons {
		if seenReason[r.Name] {
			continue
		}
		seenReason[r.Name] = true
		e.counter(descReasonPackets, r.Packets, r.Name)
		e.counter(descReasonBytes, r.Bytes, r.Name)
	}

	seenEvent := make(map[string]bool, len(s.Events))
	for _, ev := range s.Events {
		if seenEvent[ev.Name] {
			continue
		}
		seenEvent[ev.Name] = true
		e.counter(descEvents, ev.Count, ev.Name)
	}

	if t := s.Conntrack; t != nil {
		e.gauge(descConntrackEntries, float64(t.Entries))
		e.gauge(descConntrackCapacity, float64(t.Capacity))
	}
	if t := s.SNAT; t != nil {
		e.gauge(descSNATEntries, float64(t.Entries))
		e.gauge(descSNATCapacity, float64(t.Capacity))
	}
	seenMap := make(map[string]bool, len(s.Maps))
	for _, m := range s.Maps {
		if seenMap[m.Name] {
			continue
		}
		seenMap[m.Name] = true
		e.gauge(descMapEntries, float64(m.Entries), m.Name)
		e.gauge(descMapCapacity, float64(m.Capacity), m.Name)
	}

	seenSrc := make(map[string]bool, len(s.Discovery))
	for _, d := range s.Discovery {
		if seenSrc[d.Name] {
			continue
		}
		seenSrc[d.Name] = true
		var ts float64
		if !d.LastSync.IsZero() {
			ts = unixSeconds(d.LastSync)
		}
		e.gauge(descDiscoverySync, ts, d.Name)
		e.gauge(descDiscoveryServices, float64(d.Services), d.Name)
	}

	// Normally one entry per (service, source); counting keeps a repeated
	// entry from failing the scrape.
	conflicts := map[[3]string]int{}
	for _, c := range s.Conflicts {
		conflicts[[3]string{c.Service, c.Source, c.Reason}]++
	}
	for k, n := range conflicts {
		e.gauge(descConflicting, float64(n), k[0], k[1], k[2])
	}
	refused := map[[3]string]int{}
	for _, r := range s.Refused {
		refused[[3]string{r.Service, r.Source, string(r.Reason)}]++
	}
	for k, n := range refused {
		e.gauge(descRefused, float64(n), k[0], k[1], k[2])
	}

	for _, name := range s.PendingRestart {
		e.gauge(descPendingRestart, 1, name)
	}
	e.announce(s)

	for _, err := range s.Errors {
		if err != nil {
			ch <- prometheus.NewInvalidMetric(descScrapeError, err)
		}
	}
}

// emitter sends const metrics, turning bad label values (invalid UTF-8 in a
// name from Consul, say) into an error for that one series instead of a
// panic that would lose the whole scrape.
type emitter struct {
	ch chan<- prometheus.Metric
}

func (e emitter) send(d *prometheus.Desc, t prometheus.ValueType, v float64, labels ...string) {
	m, err := prometheus.NewConstMetric(d, t, v, labels...)
	if err != nil {
		m = prometheus.NewInvalidMetric(d, err)
	}
	e.ch <- m
}

func (e emitter) gauge(d *prometheus.Desc, v float64, labels ...string) {
	e.send(d, prometheus.GaugeValue, v, labels...)
}

func (e emitter) counter(d *prometheus.Desc, v uint64, labels ...string) {
	e.send(d, prometheus.CounterValue, float64(v), labels...)
}

func (e emitter) service(svc Service) {
	e.gauge(descServiceInfo, 1, svc.Name, svc.Frontend.String(), svc.Mode.String(), svc.Dispatch.String(), svc.Source, svc.Fingerprint)
	if c := svc.Counters; c != nil {
		e.counter(descServicePackets, c.Packets, svc.Name)
		e.counter(descServiceBytes, c.Bytes, svc.Name)
		e.counter(descServiceNewFlows, c.NewFlows, svc.Name)
		// Only SNAT replies come back through the box.
		if svc.Mode == lb.ModeSNAT {
			e.counter(descServiceReplyPackets, c.ReplyPackets, svc.Name)
			e.counter(descServiceReplyBytes, c.ReplyBytes, svc.Name)
		}
	}
	seen := make(map[netip.AddrPort]bool, len(svc.Backends))
	for _, b := range svc.Backends {
		if seen[b.Addr] {
			continue
		}
		seen[b.Addr] = true
		addr := b.Addr.String()
		if c := b.Counters; c != nil {
			e.counter(descBackendPackets, c.Packets, svc.Name, addr)
			e.counter(descBackendBytes, c.Bytes, svc.Name, addr)
			e.counter(descBackendNewFlows, c.NewFlows, svc.Name, addr)
		}
		if c := b.Connections; c != nil {
			e.gauge(descBackendConnections, float64(c.Active), svc.Name, addr, "active")
			e.gauge(descBackendConnections, float64(c.Inactive), svc.Name, addr, "inactive")
		}
		e.gauge(descBackendWeight, float64(b.Weight), svc.Name, addr)
		for _, st := range adminStates {
			e.gauge(descBackendAdminState, boolValue(b.State == st), svc.Name, addr, st.String())
		}
		e.gauge(descBackendOverride, boolValue(b.Override), svc.Name, addr)
		for _, h := range healthStates {
			e.gauge(descBackendHealth, boolValue(b.Health == h), svc.Name, addr, h.String())
		}
	}
}

func boolValue(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// announce emits the seed, announcer and fleet series.
func (e emitter) announce(s Snapshot) {
	if s.SeedFingerprint != "" {
		e.gauge(descSeedInfo, 1, s.SeedFingerprint)
	}
	if b := s.BGP; b != nil {
		e.gauge(descBGPAnnounced, float64(b.Announced))
		seen := map[string]bool{}
		for _, p := range b.Peers {
			if seen[p.Address] {
				continue
			}
			seen[p.Address] = true
			e.gauge(descBGPPeerUp, boolValue(p.Up), p.Address)
			e.gauge(descBGPPeerAdvertised, float64(p.Advertised), p.Address)
			e.counter(descBGPUpdatesSent, p.UpdatesSent, p.Address)
			e.counter(descBGPUpdatesReceived, p.UpdatesReceived, p.Address)
			if b := p.BFD; b != nil {
				e.gauge(descBFDUp, boolValue(b.Up), p.Address)
				for _, st := range slices.Sorted(maps.Keys(b.Transitions)) {
					e.counter(descBFDTransitions, b.Transitions[st], p.Address, st)
				}
			}
		}
	}
	if l := s.L2; l != nil {
		e.gauge(descL2Announced, float64(l.Announced))
		seen := map[string]bool{}
		for _, i := range l.Interfaces {
			if seen[i.Name] {
				continue
			}
			seen[i.Name] = true
			e.counter(descL2Replies, i.ARPReplies, i.Name, "arp")
			e.counter(descL2Replies, i.NDReplies, i.Name, "nd")
			e.counter(descL2Gratuitous, i.Gratuitous, i.Name)
		}
		if f := l.Failover; f != nil {
			active := 0.0
			if f.Role == "active" {
				active = 1
			}
			e.gauge(descL2Active, active)
			for _, r := range []string{"active", "standby", "listening"} {
				on := 0.0
				if f.Role == r {
					on = 1
				}
				e.gauge(descL2Role, on, r)
				e.counter(descL2Transitions, f.Transitions[r], r)
			}
			e.gauge(descL2Peers, float64(f.Peers))
			e.counter(descL2Conflicts, f.Conflicts)
		}
	}
	if f := s.Fleet; f != nil {
		e.gauge(descFleetBoxes, float64(f.Boxes))
		for svc, m := range f.Mismatch {
			e.gauge(descFleetMismatch, boolValue(m), svc)
		}
	}
	if x := s.IPFIX; x != nil {
		seen := map[string]bool{}
		for _, c := range x.Collectors {
			if seen[c.Address] {
				continue
			}
			seen[c.Address] = true
			e.counter(descIPFIXSent, c.Sent, c.Address)
			e.counter(descIPFIXDropped, c.Dropped, c.Address)
		}
		for _, ev := range []string{"created", "active", "ended"} {
			e.counter(descIPFIXRecords, x.Records[ev], ev)
		}
		e.gauge(descIPFIXTracked, float64(x.Tracked))
		e.counter(descIPFIXUntracked, x.Untracked)
		e.gauge(descIPFIXScan, x.ScanSeconds)
	}
}
