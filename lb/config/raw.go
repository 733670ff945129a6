// SPDX-License-Identifier: Apache-2.0

package config

// The raw* types mirror the document. They never leave this package: the
// decoders fill them, the validator turns them into model types.
//
// Leaves are `any` on purpose. A typed field makes the decoder stop at the
// first value of the wrong type, which would hide every other problem in the
// file; with `any` every value is decoded, and the validator reports each
// wrong type with its line next to the other errors. A nil leaf means the key
// is absent, which is how defaults are told apart from explicit values
// (weight = 0 is not the same as no weight). Tables stay typed so that the
// decoder can still reject unknown keys.

type rawFile struct {
	Version   any           `toml:"version"`
	Daemon    *rawDaemon    `toml:"daemon"`
	Datapath  *rawDatapath  `toml:"datapath"`
	Maglev    *rawMaglev    `toml:"maglev"`
	Service   []rawService  `toml:"service"`
	Discovery *rawDiscovery `toml:"discovery"`
	BGP       *rawBGP       `toml:"bgp"`
	L2        *rawL2        `toml:"l2"`
	Fleet     *rawFleet     `toml:"fleet"`
	IPFIX     *rawIPFIX     `toml:"ipfix"`
}

type rawDaemon struct {
	AdminSocket   any `toml:"admin_socket"`
	MetricsListen any `toml:"metrics_listen"`
	BPFFS         any `toml:"bpffs"`
	LogLevel      any `toml:"log_level"`
	MaxFlowMove   any `toml:"max_flow_move"`
	WatchConfig   any `toml:"watch_config"`
	SelfCheck     any `toml:"self_check_interval"`
}

type rawDatapath struct {
	Interfaces     any `toml:"interfaces"`
	Attach         any `toml:"attach"`
	XDPMode        any `toml:"xdp_mode"`
	Mode           any `toml:"mode"`
	DSRDispatch    any `toml:"dsr_dispatch"`
	SNATAddresses  any `toml:"snat_addresses"`
	SNATPortRange  any `toml:"snat_port_range"`
	ConntrackMax   any `toml:"conntrack_max"`
	MaxServices    any `toml:"max_services"`
	MaxBackends    any `toml:"max_backends"`
	SNATMax        any `toml:"snat_max"`
	DrainTimeout   any `toml:"drain_timeout"`
	ICMPRateLimit  any `toml:"icmp_rate_limit"`
	FlowInsertRate any `toml:"flow_insert_rate"`
	// SNATTimeouts is [datapath.snat_timeouts].
	SNATTimeouts *rawSNATTimeouts `toml:"snat_timeouts"`
}

type rawSNATTimeouts struct {
	TCP        any `toml:"tcp"`
	TCPClosing any `toml:"tcp_closing"`
	UDP        any `toml:"udp"`
}

type rawMaglev struct {
	HashSeed  any `toml:"hash_seed"`
	TableSize any `toml:"table_size"`
}

// rawService is one [[service]] of a config file, or a whole standalone
// service document (ParseService), hence the JSON tags.
type rawService struct {
	Name            any          `toml:"name" json:"name"`
	VIP             any          `toml:"vip" json:"vip"`
	Port            any          `toml:"port" json:"port"`
	Protocol        any          `toml:"protocol" json:"protocol"`
	Mode            any          `toml:"mode" json:"mode"`
	DSRDispatch     any          `toml:"dsr_dispatch" json:"dsr_dispatch"`
	Algorithm       any          `toml:"algorithm" json:"algorithm"`
	TableSize       any          `toml:"table_size" json:"table_size"`
	Affinity        any          `toml:"affinity" json:"affinity"`
	AffinityTimeout any          `toml:"affinity_timeout" json:"affinity_timeout"`
	SourceRanges    any          `toml:"source_ranges" json:"source_ranges"`
	DrainTimeout    any          `toml:"drain_timeout" json:"drain_timeout"`
	Announce        any          `toml:"announce" json:"announce"`
	AnnounceMin     any          `toml:"announce_min_healthy" json:"announce_min_healthy"`
	Health          *rawHealth   `toml:"health" json:"health"`
	Backend         []rawBackend `toml:"backend" json:"backend"`
}

type rawHealth struct {
	Type         any `toml:"type" json:"type"`
	Port         any `toml:"port" json:"port"`
	Interval     any `toml:"interval" json:"interval"`
	Timeout      any `toml:"timeout" json:"timeout"`
	Rise         any `toml:"rise" json:"rise"`
	Fall         any `toml:"fall" json:"fall"`
	Path         any `toml:"path" json:"path"`
	ExpectStatus any `toml:"expect_status" json:"expect_status"`
	Send         any `toml:"send" json:"send"`
	Expect       any `toml:"expect" json:"expect"`
}

type rawBackend struct {
	Address any `toml:"address" json:"address"`
	Port    any `toml:"port" json:"port"`
	Weight  any `toml:"weight" json:"weight"`
	State   any `toml:"state" json:"state"`
}

type rawDiscovery struct {
	Consul     *rawConsul     `toml:"consul"`
	Kubernetes *rawKubernetes `toml:"kubernetes"`
}

type rawConsul struct {
	Address       any `toml:"address"`
	Tag           any `toml:"tag"`
	KVPrefix      any `toml:"kv_prefix"`
	TokenFile     any `toml:"token_file"`
	Datacenter    any `toml:"datacenter"`
	Stale         any `toml:"stale"`
	TLSCAFile     any `toml:"tls_ca_file"`
	TLSCertFile   any `toml:"tls_cert_file"`
	TLSKeyFile    any `toml:"tls_key_file"`
	TLSServerName any `toml:"tls_server_name"`
	WarningState  any `toml:"warning_state"`
	RegisterSelf  any `toml:"register_self"`
	MaxWatches    any `toml:"max_watches"`
}

type rawKubernetes struct {
	Kubeconfig        any                  `toml:"kubeconfig"`
	LoadBalancerClass any                  `toml:"load_balancer_class"`
	IncludeClassless  any                  `toml:"include_classless"`
	NodeSelector      any                  `toml:"node_selector"`
	Pools             any                  `toml:"pools"`
	NamedPools        map[string]any       `toml:"named_pools"`
	Backends          any                  `toml:"backends"`
	QPS               any                  `toml:"qps"`
	Burst             any                  `toml:"burst"`
	LeaseNamespace    any                  `toml:"lease_namespace"`
	LeaseName         any                  `toml:"lease_name"`
	Health            *rawKubernetesHealth `toml:"health"`
}

type rawKubernetesHealth struct {
	Cluster       any `toml:"cluster"`
	KubeProxyPort any `toml:"kube_proxy_port"`
	Pod           any `toml:"pod"`
	Interval      any `toml:"interval"`
	Timeout       any `toml:"timeout"`
	Rise          any `toml:"rise"`
	Fall          any `toml:"fall"`
}

type rawBGP struct {
	ASN              any       `toml:"asn"`
	RouterID         any       `toml:"router_id"`
	ListenPort       any       `toml:"listen_port"`
	NextHopIPv4      any       `toml:"next_hop_ipv4"`
	NextHopIPv6      any       `toml:"next_hop_ipv6"`
	Communities      any       `toml:"communities"`
	LargeCommunities any       `toml:"large_communities"`
	MinHealthy       any       `toml:"announce_min_healthy"`
	GracefulRestart  any       `toml:"graceful_restart"`
	RestartTime      any       `toml:"restart_time"`
	OnStop           any       `toml:"on_stop"`
	DrainSeconds     any       `toml:"drain_seconds"`
	Peer             []rawPeer `toml:"peer"`
}

type rawPeer struct {
	Address      any `toml:"address"`
	ASN          any `toml:"asn"`
	Port         any `toml:"port"`
	Password     any `toml:"password"`
	HoldTime     any `toml:"hold_time"`
	Keepalive    any `toml:"keepalive"`
	ConnectRetry any `toml:"connect_retry"`
	Multihop     any `toml:"multihop"`
	Passive      any `toml:"passive"`
	Families     any `toml:"families"`
	// BFD is [bgp.peer.bfd].
	BFD *rawBFD `toml:"bfd"`
}

type rawBFD struct {
	Enabled          any `toml:"enabled"`
	DetectMultiplier any `toml:"detect_multiplier"`
	MinRxInterval    any `toml:"min_rx_interval"`
	MinTxInterval    any `toml:"min_tx_interval"`
}

type rawL2 struct {
	Interfaces any            `toml:"interfaces"`
	MinHealthy any            `toml:"announce_min_healthy"`
	Failover   *rawL2Failover `toml:"failover"`
}

type rawL2Failover struct {
	Enabled          any `toml:"enabled"`
	Name             any `toml:"name"`
	Group            any `toml:"group"`
	Priority         any `toml:"priority"`
	Interval         any `toml:"interval"`
	DetectMultiplier any `toml:"detect_multiplier"`
}

type rawFleet struct {
	Name       any `toml:"name"`
	KVPrefix   any `toml:"kv_prefix"`
	SessionTTL any `toml:"session_ttl"`
	Publish    any `toml:"publish"`
}

type rawIPFIX struct {
	Collectors        any `toml:"collectors"`
	ScanInterval      any `toml:"scan_interval"`
	ActiveTimeout     any `toml:"active_timeout"`
	IdleTimeout       any `toml:"idle_timeout"`
	TemplateRefresh   any `toml:"template_refresh"`
	Sampling          any `toml:"sampling"`
	ObservationDomain any `toml:"observation_domain"`
	EnterpriseNumber  any `toml:"enterprise_number"`
	MaxFlows          any `toml:"max_flows"`
	Counts            any `toml:"counts"`
}
