// SPDX-License-Identifier: Apache-2.0

package metrics

import (
	"errors"
	"net/netip"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"

	"github.com/l4lb/l4lb/lb"
)

// fakeSource hands out a fixed snapshot and counts the calls, so tests can
// check the collector reads live state on every scrape.
type fakeSource struct {
	snap  Snapshot
	calls int
}

func (f *fakeSource) Snapshot() Snapshot {
	f.calls++
	return f.snap
}

var syncTime = time.Date(2026, 1, 2, 3, 4, 5, 500_000_000, time.UTC) // 1767323045.5

// smallSnapshot exercises every field: a programmed DSR service with a
// healthy active backend and an unhealthy draining override, an IPv6 SNAT
// service not programmed yet (no counters), a programmed SNAT service
// without backends (reply counters), and one of each other entry.
func smallSnapshot() Snapshot {
	return Snapshot{
		Services: []Service{
			{
				Name:        "web",
				Frontend:    lb.Frontend{Addr: netip.MustParseAddr("10.0.0.10"), Port: 80, Proto: lb.TCP},
				Mode:        lb.ModeDSR,
				Dispatch:    lb.DispatchIPIP,
				Source:      "file:/etc/l4lb/l4lb.toml",
				Fingerprint: "3f2a9c01b7e4",
				Counters:    &Counters{Packets: 100, Bytes: 6400, NewFlows: 10},
				Backends: []Backend{
					{Addr: netip.MustParseAddrPort("10.1.0.11:30080"), Weight: 1, State: lb.Active, Health: HealthHealthy,
						Counters: &Counters{Packets: 60, Bytes: 3840, NewFlows: 6}, Connections: &Connections{Active: 5, Inactive: 1}},
					{Addr: netip.MustParseAddrPort("10.1.0.12:30080"), Weight: 2, State: lb.Draining, Override: true, Health: HealthUnhealthy,
						Counters: &Counters{Packets: 40, Bytes: 2560, NewFlows: 4}, Connections: &Connections{Active: 0, Inactive: 3}},
				},
			},
			{
				Name:     "dns",
				Frontend: lb.Frontend{Addr: netip.MustParseAddr("2001:db8::53"), Port: 53, Proto: lb.UDP},
				Mode:     lb.ModeSNAT,
				Source:   "consul",
				Backends: []Backend{{Addr: netip.MustParseAddrPort("[2001:db8::1]:53"), Weight: 1}},
			},
			{
				Name:     "api",
				Frontend: lb.Frontend{Addr: netip.MustParseAddr("10.0.0.11"), Port: 443, Proto: lb.TCP},
				Mode:     lb.ModeSNAT,
				Source:   "file:/etc/l4lb/l4lb.toml",
				Counters: &Counters{Packets: 50, Bytes: 3200, NewFlows: 5, ReplyPackets: 40, ReplyBytes: 48000},
			},
		},
		Reasons: []Reason{
			{Name: "drop_no_backend", Packets: 3, Bytes: 180},
			{Name: "pass_not_service", Packets: 7, Bytes: 420},
		},
		Conntrack: &Table{Entries: 12, Capacity: 1048576},
		SNAT:      &Table{Entries: 5, Capacity: 64512},
		Maps: []Map{
			{Name: "services", Entries: 2, Capacity: 4096},
			{Name: "conntrack", Entries: 12, Capacity: 1048576},
		},
		Discovery: []Discovery{
			{Name: "file:/etc/l4lb/l4lb.toml", LastSync: syncTime, Services: 1},
			{Name: "consul", Services: 2},
		},
		Conflicts:      []Conflict{{Service: "web", Source: "consul", Reason: "frontend"}},
		Refused:        []Refusal{{Service: "geneve-svc", Source: "consul", Reason: RefusedUnsupported}},
		PendingRestart: []string{"datapath.conntrack_max", "maglev.hash_seed"},
	}
}

const smallExposition = `
# HELP l4lb_backend_admin_override 1 when the administrative state is a runtime override set with l4lbctl backend, 0 when it is the source's.
# TYPE l4lb_backend_admin_override gauge
l4lb_backend_admin_override{backend="10.1.0.11:30080",service="web"} 0
l4lb_backend_admin_override{backend="10.1.0.12:30080",service="web"} 1
l4lb_backend_admin_override{backend="[2001:db8::1]:53",service="dns"} 0
# HELP l4lb_backend_admin_state 1 for the administrative state in force (active, draining, disabled), 0 for the others.
# TYPE l4lb_backend_admin_state gauge
l4lb_backend_admin_state{backend="10.1.0.11:30080",service="web",state="active"} 1
l4lb_backend_admin_state{backend="10.1.0.11:30080",service="web",state="disabled"} 0
l4lb_backend_admin_state{backend="10.1.0.11:30080",service="web",state="draining"} 0
l4lb_backend_admin_state{backend="10.1.0.12:30080",service="web",state="active"} 0
l4lb_backend_admin_state{backend="10.1.0.12:30080",service="web",state="disabled"} 0
l4lb_backend_admin_state{backend="10.1.0.12:30080",service="web",state="draining"} 1
l4lb_backend_admin_state{backend="[2001:db8::1]:53",service="dns",state="active"} 1
l4lb_backend_admin_state{backend="[2001:db8::1]:53",service="dns",state="disabled"} 0
l4lb_backend_admin_state{backend="[2001:db8::1]:53",service="dns",state="draining"} 0
# HELP l4lb_backend_bytes_total Bytes the datapath sent to the backend, counted at L3 as received.
# TYPE l4lb_backend_bytes_total counter
l4lb_backend_bytes_total{backend="10.1.0.11:30080",service="web"} 3840
l4lb_backend_bytes_total{backend="10.1.0.12:30080",service="web"} 2560
# HELP l4lb_backend_connections The backend's flows in the connection table, by state: active (TCP, established, seen within datapath.snat_timeouts.tcp) or inactive (UDP, TCP closing or reopening), each inactive one until its state's timeout runs out. Counted at most a few seconds ago.
# TYPE l4lb_backend_connections gauge
l4lb_backend_connections{backend="10.1.0.11:30080",service="web",state="active"} 5
l4lb_backend_connections{backend="10.1.0.11:30080",service="web",state="inactive"} 1
l4lb_backend_connections{backend="10.1.0.12:30080",service="web",state="active"} 0
l4lb_backend_connections{backend="10.1.0.12:30080",service="web",state="inactive"} 3
# HELP l4lb_backend_health_state 1 for the backend's health state (unchecked, unknown, healthy, unhealthy), 0 for the others.
# TYPE l4lb_backend_health_state gauge
l4lb_backend_health_state{backend="10.1.0.11:30080",service="web",state="healthy"} 1
l4lb_backend_health_state{backend="10.1.0.11:30080",service="web",state="unchecked"} 0
l4lb_backend_health_state{backend="10.1.0.11:30080",service="web",state="unhealthy"} 0
l4lb_backend_health_state{backend="10.1.0.11:30080",service="web",state="unknown"} 0
l4lb_backend_health_state{backend="10.1.0.12:30080",service="web",state="healthy"} 0
l4lb_backend_health_state{backend="10.1.0.12:30080",service="web",state="unchecked"} 0
l4lb_backend_health_state{backend="10.1.0.12:30080",service="web",state="unhealthy"} 1
l4lb_backend_health_state{backend="10.1.0.12:30080",service="web",state="unknown"} 0
l4lb_backend_health_state{backend="[2001:db8::1]:53",service="dns",state="healthy"} 0
l4lb_backend_health_state{backend="[2001:db8::1]:53",service="dns",state="unchecked"} 1
l4lb_backend_health_state{backend="[2001:db8::1]:53",service="dns",state="unhealthy"} 0
l4lb_backend_health_state{backend="[2001:db8::1]:53",service="dns",state="unknown"} 0
# HELP l4lb_backend_new_flows_total New flows the datapath assigned to the backend.
# TYPE l4lb_backend_new_flows_total counter
l4lb_backend_new_flows_total{backend="10.1.0.11:30080",service="web"} 6
l4lb_backend_new_flows_total{backend="10.1.0.12:30080",service="web"} 4
# HELP l4lb_backend_packets_total Packets the datapath sent to the backend.
# TYPE l4lb_backend_packets_total counter
l4lb_backend_packets_total{backend="10.1.0.11:30080",service="web"} 60
l4lb_backend_packets_total{backend="10.1.0.12:30080",service="web"} 40
# HELP l4lb_backend_weight Relative share of new flows the backend is configured for (0: none).
# TYPE l4lb_backend_weight gauge
l4lb_backend_weight{backend="10.1.0.11:30080",service="web"} 1
l4lb_backend_weight{backend="10.1.0.12:30080",service="web"} 2
l4lb_backend_weight{backend="[2001:db8::1]:53",service="dns"} 1
# HELP l4lb_config_pending_restart 1 per setting of the configuration file in force that differs from the running value and applies only when l4lbd restarts.
# TYPE l4lb_config_pending_restart gauge
l4lb_config_pending_restart{setting="datapath.conntrack_max"} 1
l4lb_config_pending_restart{setting="maglev.hash_seed"} 1
# HELP l4lb_conntrack_capacity Size of the connection table (datapath.conntrack_max); when full, the least recently used flows are evicted.
# TYPE l4lb_conntrack_capacity gauge
l4lb_conntrack_capacity 1.048576e+06
# HELP l4lb_conntrack_entries Flows in the connection table.
# TYPE l4lb_conntrack_entries gauge
l4lb_conntrack_entries 12
# HELP l4lb_datapath_bytes_total Bytes (L3 length; whole frame for non-IP) of the packets counted in l4lb_datapath_packets_total, by reason.
# TYPE l4lb_datapath_bytes_total counter
l4lb_datapath_bytes_total{reason="drop_no_backend"} 180
l4lb_datapath_bytes_total{reason="pass_not_service"} 420
# HELP l4lb_datapath_packets_total Packets the datapath did not forward to a backend, by what it did instead (pass_*: handed to the kernel stack, drop_*: dropped).
# TYPE l4lb_datapath_packets_total counter
l4lb_datapath_packets_total{reason="drop_no_backend"} 3
l4lb_datapath_packets_total{reason="pass_not_service"} 7
# HELP l4lb_discovery_last_sync_timestamp_seconds Unix time the discovery source last published its services; 0 if it never did.
# TYPE l4lb_discovery_last_sync_timestamp_seconds gauge
l4lb_discovery_last_sync_timestamp_seconds{source="consul"} 0
l4lb_discovery_last_sync_timestamp_seconds{source="file:/etc/l4lb/l4lb.toml"} 1.7673230455e+09
# HELP l4lb_discovery_services Services in the discovery source's last snapshot.
# TYPE l4lb_discovery_services gauge
l4lb_discovery_services{source="consul"} 2
l4lb_discovery_services{source="file:/etc/l4lb/l4lb.toml"} 1
# HELP l4lb_map_capacity Maximum entries of the BPF map.
# TYPE l4lb_map_capacity gauge
l4lb_map_capacity{map="conntrack"} 1.048576e+06
l4lb_map_capacity{map="services"} 4096
# HELP l4lb_map_entries Entries in use in the BPF map.
# TYPE l4lb_map_entries gauge
l4lb_map_entries{map="conntrack"} 12
l4lb_map_entries{map="services"} 2
# HELP l4lb_service_bytes_total Bytes the datapath forwarded for the service, counted at L3 as received.
# TYPE l4lb_service_bytes_total counter
l4lb_service_bytes_total{service="api"} 3200
l4lb_service_bytes_total{service="web"} 6400
# HELP l4lb_service_info Always 1 for each served service; labels carry its frontend, forwarding mode, DSR dispatch, the source that defined it and the fingerprint of its Maglev table inputs.
# TYPE l4lb_service_info gauge
l4lb_service_info{dispatch="ipip",fingerprint="3f2a9c01b7e4",frontend="10.0.0.10:80/tcp",mode="dsr",service="web",source="file:/etc/l4lb/l4lb.toml"} 1
l4lb_service_info{dispatch="",fingerprint="",frontend="[2001:db8::53]:53/udp",mode="snat",service="dns",source="consul"} 1
l4lb_service_info{dispatch="",fingerprint="",frontend="10.0.0.11:443/tcp",mode="snat",service="api",source="file:/etc/l4lb/l4lb.toml"} 1
# HELP l4lb_service_new_flows_total Flows of the service that got a backend from the Maglev table (not from the connection table).
# TYPE l4lb_service_new_flows_total counter
l4lb_service_new_flows_total{service="api"} 5
l4lb_service_new_flows_total{service="web"} 10
# HELP l4lb_service_packets_total Packets the datapath forwarded for the service.
# TYPE l4lb_service_packets_total counter
l4lb_service_packets_total{service="api"} 50
l4lb_service_packets_total{service="web"} 100
# HELP l4lb_service_reply_bytes_total Bytes of the SNAT service's replies sent back to clients, counted at L3 as received from the backend.
# TYPE l4lb_service_reply_bytes_total counter
l4lb_service_reply_bytes_total{service="api"} 48000
# HELP l4lb_service_reply_packets_total Replies of the SNAT service's backends that the datapath rewrote and sent back to clients.
# TYPE l4lb_service_reply_packets_total counter
l4lb_service_reply_packets_total{service="api"} 40
# HELP l4lb_services_conflicting Service definitions left out because another source claimed the same frontend or name first (reason: frontend, name).
# TYPE l4lb_services_conflicting gauge
l4lb_services_conflicting{reason="frontend",service="web",source="consul"} 1
# HELP l4lb_services_refused Services the datapath does not serve (reason: unsupported, map_full, local_vip, cannot_work).
# TYPE l4lb_services_refused gauge
l4lb_services_refused{reason="unsupported",service="geneve-svc",source="consul"} 1
# HELP l4lb_snat_capacity Source-NAT bindings available (addresses times ports).
# TYPE l4lb_snat_capacity gauge
l4lb_snat_capacity 64512
# HELP l4lb_snat_entries Source-NAT bindings (LB address and port) in use.
# TYPE l4lb_snat_entries gauge
l4lb_snat_entries 5
`

func TestCollectorExactValues(t *testing.T) {
	src := &fakeSource{snap: smallSnapshot()}
	if err := testutil.CollectAndCompare(NewCollector(src), strings.NewReader(smallExposition)); err != nil {
		t.Fatal(err)
	}
}

// TestCollectorReadsLiveState checks that nothing is cached between
// scrapes: a changed source shows at the next scrape.
func TestCollectorReadsLiveState(t *testing.T) {
	src := &fakeSource{snap: Snapshot{Conntrack: &Table{Entries: 1, Capacity: 10}}}
	c := NewCollector(src)
	for _, want := range []uint64{1, 7, 3} {
		src.snap.Conntrack.Entries = want
		exp := "# HELP l4lb_conntrack_entries Flows in the connection table.\n# TYPE l4lb_conntrack_entries gauge\n" +
			"l4lb_conntrack_entries " + strconv.FormatUint(want, 10) + "\n"
		if err := testutil.CollectAndCompare(c, strings.NewReader(exp), "l4lb_conntrack_entries"); err != nil {
			t.Fatalf("entries %d: %v", want, err)
		}
	}
	if src.calls != 3 {
		t.Errorf("Snapshot called %d times for 3 scrapes, want 3", src.calls)
	}
}

func TestLint(t *testing.T) {
	rec := NewRecorder()
	rec.ObserveReconcile(3*time.Millisecond, nil)
	rec.ObserveReconcile(time.Second, errors.New("map full"))
	rec.ConfigLoaded(syncTime)
	rec.ObserveReload(syncTime, errors.New("bad file"))
	rec.ServiceRefused(RefusedMapFull)
	for name, c := range map[string]prometheus.Collector{
		"collector":  NewCollector(&fakeSource{snap: smallSnapshot()}),
		"recorder":   rec,
		"build info": BuildInfo("v1.2.3"),
	} {
		problems, err := testutil.CollectAndLint(c)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		for _, p := range problems {
			t.Errorf("%s: %s: %s", name, p.Metric, p.Text)
		}
	}
}

// TestDescribeMatchesCollect registers everything in a pedantic registry,
// which fails a gather when a collected metric was not described or is
// inconsistent with its description.
func TestDescribeMatchesCollect(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(NewCollector(&fakeSource{snap: smallSnapshot()}), NewRecorder(), BuildInfo("v1"))
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if !strings.HasPrefix(mf.GetName(), "l4lb_") {
			t.Errorf("metric %s lacks the l4lb_ prefix", mf.GetName())
		}
	}
}

func TestCollectorLeavesOutWhatIsUnknown(t *testing.T) {
	tests := []struct {
		name string
		snap Snapshot
		want int
	}{
		{"empty snapshot", Snapshot{}, 0},
		// info, weight, override, 3 admin states, 4 health states; no
		// counters because none were read.
		{"service without counters", Snapshot{Services: []Service{{
			Name: "a", Frontend: lb.Frontend{Addr: netip.MustParseAddr("10.0.0.1"), Port: 1, Proto: lb.TCP},
			Backends: []Backend{{Addr: netip.MustParseAddrPort("10.1.0.1:1")}},
		}}}, 1 + 1 + 1 + 3 + 4},
		{"no SNAT, no conntrack", Snapshot{Maps: []Map{{Name: "services", Entries: 1, Capacity: 2}}}, 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := testutil.CollectAndCount(NewCollector(SourceFunc(func() Snapshot { return tt.snap })))
			if got != tt.want {
				t.Errorf("got %d series, want %d", got, tt.want)
			}
		})
	}
}

func TestCollectorSkipsRepeats(t *testing.T) {
	snap := smallSnapshot()
	snap.Services = append(snap.Services, snap.Services[0])
	snap.Services[1].Backends = append(snap.Services[1].Backends, snap.Services[1].Backends[0])
	snap.Reasons = append(snap.Reasons, snap.Reasons[0])
	snap.Maps = append(snap.Maps, snap.Maps[0])
	snap.Discovery = append(snap.Discovery, snap.Discovery[0])
	snap.Conflicts = append(snap.Conflicts, snap.Conflicts[0])
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(NewCollector(SourceFunc(func() Snapshot { return snap })))
	if _, err := reg.Gather(); err != nil {
		t.Fatalf("repeated entries broke the scrape: %v", err)
	}
	want := `
# HELP l4lb_services_conflicting Service definitions left out because another source claimed the same frontend or name first (reason: frontend, name).
# TYPE l4lb_services_conflicting gauge
l4lb_services_conflicting{reason="frontend",service="web",source="consul"} 2
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "l4lb_services_conflicting"); err != nil {
		t.Error(err)
	}
}

// TestCollectorPartialFailure checks that a read error and a bad label
// value each fail only their own part: the gather reports them, and every
// other series is still there.
func TestCollectorPartialFailure(t *testing.T) {
	snap := smallSnapshot()
	snap.Errors = []error{errors.New("read counters svc_stats[3]: operation not permitted")}
	snap.Services = append(snap.Services, Service{Name: "bad\xffname", Frontend: lb.Frontend{Addr: netip.MustParseAddr("10.0.0.2"), Port: 2, Proto: lb.TCP}})
	reg := prometheus.NewRegistry()
	reg.MustRegister(NewCollector(SourceFunc(func() Snapshot { return snap })))
	mfs, err := reg.Gather()
	if err == nil {
		t.Fatal("gather reported no error")
	}
	for _, want := range []string{"svc_stats[3]", "UTF-8"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("gather error %q does not mention %q", err, want)
		}
	}
	got := map[string]*dto.MetricFamily{}
	for _, mf := range mfs {
		got[mf.GetName()] = mf
	}
	if mf := got["l4lb_service_info"]; mf == nil || len(mf.GetMetric()) != len(snap.Services)-1 {
		t.Errorf("l4lb_service_info: want the %d good services, got %v", len(snap.Services)-1, mf)
	}
	if got["l4lb_conntrack_entries"] == nil {
		t.Error("l4lb_conntrack_entries missing after a partial failure")
	}
}

func TestHealthString(t *testing.T) {
	for h, want := range map[Health]string{
		HealthUnchecked: "unchecked", HealthUnknown: "unknown", HealthHealthy: "healthy", HealthUnhealthy: "unhealthy", Health(9): "health-9",
	} {
		if got := h.String(); got != want {
			t.Errorf("Health(%d).String() = %q, want %q", h, got, want)
		}
	}
}

func announceSnapshot() Snapshot {
	return Snapshot{
		SeedFingerprint: "a1b2c3d4e5f6",
		BGP: &BGP{Announced: 2, Peers: []BGPPeer{
			{Address: "10.0.0.1", Up: true, Advertised: 2, UpdatesSent: 5, UpdatesReceived: 1,
				BFD: &BFD{Up: true, Transitions: map[string]uint64{"up": 2, "down": 1, "init": 2, "admin_down": 0}}},
			{Address: "2001:db8::1", Up: false},
		}},
		L2: &L2{Announced: 1, Interfaces: []L2Interface{{Name: "eth0", ARPReplies: 7, NDReplies: 3, Gratuitous: 4}},
			Failover: &L2Failover{Role: "standby", Transitions: map[string]uint64{"listening": 2, "active": 1, "standby": 2}, Peers: 1, Conflicts: 1}},
		Fleet: &Fleet{Boxes: 2, Mismatch: map[string]bool{"web": true, "dns": false}},
	}
}

const announceExposition = `
# HELP l4lb_bgp_announced_prefixes VIPs (as /32 or /128) in the BGP speaker's table, announced to every peer of their family.
# TYPE l4lb_bgp_announced_prefixes gauge
l4lb_bgp_announced_prefixes 2
# HELP l4lb_bgp_peer_advertised_prefixes Prefixes advertised to the peer on the current session.
# TYPE l4lb_bgp_peer_advertised_prefixes gauge
l4lb_bgp_peer_advertised_prefixes{peer="10.0.0.1"} 2
l4lb_bgp_peer_advertised_prefixes{peer="2001:db8::1"} 0
# HELP l4lb_bgp_peer_bfd_transitions_total Times the BFD session with the peer entered the state (up, down, init, admin_down) since l4lbd started; a rising down count is a box or link failing, or a flap.
# TYPE l4lb_bgp_peer_bfd_transitions_total counter
l4lb_bgp_peer_bfd_transitions_total{peer="10.0.0.1",state="admin_down"} 0
l4lb_bgp_peer_bfd_transitions_total{peer="10.0.0.1",state="down"} 1
l4lb_bgp_peer_bfd_transitions_total{peer="10.0.0.1",state="init"} 2
l4lb_bgp_peer_bfd_transitions_total{peer="10.0.0.1",state="up"} 2
# HELP l4lb_bgp_peer_bfd_up 1 while the BFD session with the peer is up, 0 otherwise; absent for peers without BFD.
# TYPE l4lb_bgp_peer_bfd_up gauge
l4lb_bgp_peer_bfd_up{peer="10.0.0.1"} 1
# HELP l4lb_bgp_peer_up 1 while the BGP session with the peer is established, 0 otherwise.
# TYPE l4lb_bgp_peer_up gauge
l4lb_bgp_peer_up{peer="10.0.0.1"} 1
l4lb_bgp_peer_up{peer="2001:db8::1"} 0
# HELP l4lb_bgp_updates_received_total BGP UPDATE messages received from the peer since its session came up.
# TYPE l4lb_bgp_updates_received_total counter
l4lb_bgp_updates_received_total{peer="10.0.0.1"} 1
l4lb_bgp_updates_received_total{peer="2001:db8::1"} 0
# HELP l4lb_bgp_updates_sent_total BGP UPDATE messages sent to the peer (announcements and withdrawals) since its session came up.
# TYPE l4lb_bgp_updates_sent_total counter
l4lb_bgp_updates_sent_total{peer="10.0.0.1"} 5
l4lb_bgp_updates_sent_total{peer="2001:db8::1"} 0
# HELP l4lb_fleet_boxes LB boxes whose fleet records this box sees in Consul, itself included.
# TYPE l4lb_fleet_boxes gauge
l4lb_fleet_boxes 2
# HELP l4lb_fleet_mismatch 1 when another LB box has a different fingerprint (seed, table size, eligible backends) for the service's frontend: the boxes send one flow to different backends.
# TYPE l4lb_fleet_mismatch gauge
l4lb_fleet_mismatch{service="dns"} 0
l4lb_fleet_mismatch{service="web"} 1
# HELP l4lb_l2_announced_vips VIPs whose ARP requests and neighbour solicitations this box answers.
# TYPE l4lb_l2_announced_vips gauge
l4lb_l2_announced_vips 1
# HELP l4lb_l2_failover_active 1 while this box is the active one of its L2 failover group and answers for the VIPs, 0 otherwise; absent without [l2.failover].
# TYPE l4lb_l2_failover_active gauge
l4lb_l2_failover_active 0
# HELP l4lb_l2_failover_conflicts_total Adverts of another active box received while this one was active (a split segment that healed, or two boxes with one name).
# TYPE l4lb_l2_failover_conflicts_total counter
l4lb_l2_failover_conflicts_total 1
# HELP l4lb_l2_failover_peers Other boxes of the L2 failover group heard within the detection time.
# TYPE l4lb_l2_failover_peers gauge
l4lb_l2_failover_peers 1
# HELP l4lb_l2_failover_role 1 for this box's current L2 failover role (active, standby, listening), 0 for the others.
# TYPE l4lb_l2_failover_role gauge
l4lb_l2_failover_role{role="active"} 0
l4lb_l2_failover_role{role="listening"} 0
l4lb_l2_failover_role{role="standby"} 1
# HELP l4lb_l2_failover_transitions_total Times this box entered the L2 failover role since l4lbd started; a rising active count on several boxes is a flapping group.
# TYPE l4lb_l2_failover_transitions_total counter
l4lb_l2_failover_transitions_total{role="active"} 1
l4lb_l2_failover_transitions_total{role="listening"} 2
l4lb_l2_failover_transitions_total{role="standby"} 2
# HELP l4lb_l2_gratuitous_sent_total Gratuitous ARPs and unsolicited neighbour advertisements sent for VIPs that appeared.
# TYPE l4lb_l2_gratuitous_sent_total counter
l4lb_l2_gratuitous_sent_total{interface="eth0"} 4
# HELP l4lb_l2_replies_sent_total ARP replies (kind=arp) and neighbour advertisements (kind=nd) sent for VIPs.
# TYPE l4lb_l2_replies_sent_total counter
l4lb_l2_replies_sent_total{interface="eth0",kind="arp"} 7
l4lb_l2_replies_sent_total{interface="eth0",kind="nd"} 3
# HELP l4lb_maglev_seed_info Always 1; the fingerprint label identifies the Maglev hash seed without revealing it. Boxes of one fleet must show the same.
# TYPE l4lb_maglev_seed_info gauge
l4lb_maglev_seed_info{fingerprint="a1b2c3d4e5f6"} 1
`

// TestAnnounceSeries checks the announcer, seed and fleet series, and
// that they pass the linter.
func TestAnnounceSeries(t *testing.T) {
	c := NewCollector(&fakeSource{snap: announceSnapshot()})
	if err := testutil.CollectAndCompare(c, strings.NewReader(announceExposition)); err != nil {
		t.Fatal(err)
	}
	problems, err := testutil.CollectAndLint(c)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("%s: %s", p.Metric, p.Text)
	}
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(c)
	if _, err := reg.Gather(); err != nil {
		t.Fatalf("pedantic gather: %v", err)
	}
}

// TestIPFIXSeries checks the flow export's series: one sent and one
// dropped counter per collector, records by every event (zero included),
// and lints them.
func TestIPFIXSeries(t *testing.T) {
	c := NewCollector(SourceFunc(func() Snapshot {
		return Snapshot{IPFIX: &IPFIX{
			Collectors:  []IPFIXCollector{{Address: "192.0.2.50:4739", Sent: 12, Dropped: 3}, {Address: "192.0.2.50:4739", Sent: 99}},
			Records:     map[string]uint64{"created": 9, "ended": 6},
			Tracked:     3,
			Untracked:   1,
			ScanSeconds: 0.25,
		}}
	}))
	want := `# HELP l4lb_ipfix_flows_tracked Flows the IPFIX exporter follows from scan to scan.
# TYPE l4lb_ipfix_flows_tracked gauge
l4lb_ipfix_flows_tracked 3
# HELP l4lb_ipfix_flows_untracked_total New flows the IPFIX exporter could not follow (ipfix.max_flows reached): never reported.
# TYPE l4lb_ipfix_flows_untracked_total counter
l4lb_ipfix_flows_untracked_total 1
# HELP l4lb_ipfix_records_dropped_total IPFIX flow records for the collector that the kernel refused to send (the collector unreachable, a full socket buffer).
# TYPE l4lb_ipfix_records_dropped_total counter
l4lb_ipfix_records_dropped_total{collector="192.0.2.50:4739"} 3
# HELP l4lb_ipfix_records_sent_total IPFIX flow records sent to the collector.
# TYPE l4lb_ipfix_records_sent_total counter
l4lb_ipfix_records_sent_total{collector="192.0.2.50:4739"} 12
# HELP l4lb_ipfix_records_total IPFIX flow records made, by event: created, active (active timeout), ended.
# TYPE l4lb_ipfix_records_total counter
l4lb_ipfix_records_total{event="active"} 0
l4lb_ipfix_records_total{event="created"} 9
l4lb_ipfix_records_total{event="ended"} 6
# HELP l4lb_ipfix_scan_duration_seconds How long the latest scan of the connection table for IPFIX took.
# TYPE l4lb_ipfix_scan_duration_seconds gauge
l4lb_ipfix_scan_duration_seconds 0.25
`
	if err := testutil.CollectAndCompare(c, strings.NewReader(want)); err != nil {
		t.Error(err)
	}
	problems, err := testutil.CollectAndLint(c)
	if err != nil || len(problems) > 0 {
		t.Errorf("lint: %v %+v", err, problems)
	}
}
