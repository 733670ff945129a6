// SPDX-License-Identifier: Apache-2.0

package config

import (
	"fmt"
	"math"
	"net"
	"strconv"
	"time"
)

// IPFIX holds the settings of flow export ([ipfix]): the connection
// table's flows sent as IPFIX records to collectors over UDP (lb/ipfix,
// docs/observability.md).
type IPFIX struct {
	// Collectors are the collectors' host:port UDP addresses.
	Collectors []string
	// ScanInterval is how often the connection table is read: the
	// records' timing is this coarse, and each scan walks the table.
	ScanInterval time.Duration
	// ActiveTimeout is how often a lasting flow is reported again.
	ActiveTimeout time.Duration
	// IdleTimeout ends a flow without a packet for that long.
	IdleTimeout time.Duration
	// TemplateRefresh is how often the templates are sent again.
	TemplateRefresh time.Duration
	// Sampling reports one flow in Sampling (by a hash of its 5-tuple).
	Sampling uint32
	// ObservationDomain is the messages' observation domain ID.
	ObservationDomain uint32
	// EnterpriseNumber is the private enterprise number of the l4lb
	// elements (service, mode, event).
	EnterpriseNumber uint32
	// MaxFlows bounds the flows followed between scans (memory).
	MaxFlows int
	// Counts puts each flow's packets and bytes into its records: the
	// datapath counts per flow (docs/observability.md says what that
	// costs). On unless counts = false.
	Counts bool
}

// [ipfix] defaults.
const (
	defaultIPFIXScan        = 10 * time.Second
	defaultIPFIXActive      = time.Minute
	defaultIPFIXIdle        = time.Minute
	defaultIPFIXTemplates   = time.Minute
	defaultIPFIXEnterprise  = 32473 // RFC 5612's documentation number
	defaultIPFIXMaxFlows    = 262144
	maxIPFIXScanInterval    = 10 * time.Minute
	maxIPFIXSampling        = 1 << 16
	maxIPFIXMaxFlows        = 16 << 20
	ipfixDurationHint       = "write it like \"10s\""
	ipfixCollectorsRequired = "ipfix.collectors lists no collector: name at least one host:port (UDP, e.g. \"192.0.2.50:4739\"), or remove [ipfix]"
)

func (c *checker) ipfix(r *rawIPFIX) *IPFIX {
	s := scope{c: c}.sub("ipfix")
	x := &IPFIX{
		ScanInterval: defaultIPFIXScan, ActiveTimeout: defaultIPFIXActive, IdleTimeout: defaultIPFIXIdle,
		TemplateRefresh: defaultIPFIXTemplates, Sampling: 1, EnterpriseNumber: defaultIPFIXEnterprise, MaxFlows: defaultIPFIXMaxFlows,
		Counts: true,
	}
	if r.Collectors == nil {
		s.errorf("", ipfixCollectorsRequired)
	} else if list, ok := s.strs("collectors", r.Collectors); ok {
		if len(list) == 0 {
			s.errorf("collectors", ipfixCollectorsRequired)
		}
		seen := map[string]bool{}
		for i, a := range list {
			key := indexPath("collectors", i)
			host, port, err := net.SplitHostPort(a)
			n, perr := strconv.Atoi(port)
			switch {
			case err != nil || host == "" || perr != nil || n < 1 || n > 65535:
				s.errorf(key, "%s = %q is not host:port: write it like \"192.0.2.50:4739\" or \"[2001:db8::50]:4739\"", s.name(key), a)
			case seen[a]:
				s.errorf(key, "%s: collector %q is listed twice: remove one", s.name(key), a)
			default:
				seen[a] = true
				x.Collectors = append(x.Collectors, a)
			}
		}
	}
	if d, ok := s.duration("scan_interval", r.ScanInterval); ok {
		if d < time.Second || d > maxIPFIXScanInterval {
			s.errorf("scan_interval", "ipfix.scan_interval = %q is out of range: use 1s..10m (each scan walks the whole connection table)", d)
		} else {
			x.ScanInterval = d
		}
	}
	for _, t := range []struct {
		key string
		v   any
		dst *time.Duration
	}{{"active_timeout", r.ActiveTimeout, &x.ActiveTimeout}, {"idle_timeout", r.IdleTimeout, &x.IdleTimeout}} {
		if d, ok := s.duration(t.key, t.v); ok {
			*t.dst = d
		}
	}
	for _, t := range []struct {
		key string
		d   time.Duration
	}{{"active_timeout", x.ActiveTimeout}, {"idle_timeout", x.IdleTimeout}} {
		if t.d < x.ScanInterval {
			s.errorf(t.key, "ipfix.%s = %q is shorter than ipfix.scan_interval (%s): flows are seen only once a scan; raise it or scan more often", t.key, t.d, x.ScanInterval)
		}
	}
	if d, ok := s.duration("template_refresh", r.TemplateRefresh); ok {
		x.TemplateRefresh = d
	}
	if n, ok := s.intIn("sampling", r.Sampling, 1, maxIPFIXSampling, fmt.Sprintf("report 1 flow in N, N in 1..%d (1: every flow)", maxIPFIXSampling)); ok {
		x.Sampling = uint32(n)
	}
	if n, ok := s.intIn("observation_domain", r.ObservationDomain, 0, math.MaxUint32, "use 0..4294967295"); ok {
		x.ObservationDomain = uint32(n)
	}
	if n, ok := s.intIn("enterprise_number", r.EnterpriseNumber, 1, math.MaxUint32, "use your IANA private enterprise number, or leave the default 32473 (RFC 5612's documentation number)"); ok {
		x.EnterpriseNumber = uint32(n)
	}
	if n, ok := s.intIn("max_flows", r.MaxFlows, 1, maxIPFIXMaxFlows, fmt.Sprintf("use 1..%d flows followed at once (about 200 bytes each)", maxIPFIXMaxFlows)); ok {
		x.MaxFlows = int(n)
	}
	if b, ok := s.boolean("counts", r.Counts); ok {
		x.Counts = b
	}
	return x
}
