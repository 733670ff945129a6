// SPDX-License-Identifier: Apache-2.0

package config

import (
	"bytes"
	"fmt"
	"net/netip"
	"net/url"
	"reflect"
	"strconv"
	"strings"

	"github.com/l4lb/l4lb/lb"
	"github.com/l4lb/l4lb/lb/maglev"
)

// ParseService parses one service definition: the body of a [[service]]
// table as a document of its own (name, vip, ..., [health], [[backend]]),
// in TOML, or in JSON with the same keys when the first non-blank byte is
// '{'. It is how services stored one per key (Consul KV) are read, and it
// applies exactly the checks a service in the config file gets. where
// replaces the file name in errors (for example `consul KV
// l4lb/services/web`).
//
// defaults are the daemon's; they take part in the checks that depend on
// the effective mode, dispatch and table size, but are not applied to the
// result, which leaves Source empty for the caller to fill. Zero fields of
// defaults mean the documented global defaults.
func ParseService(where string, data []byte, defaults lb.Defaults) (lb.Service, error) {
	c := &checker{file: where}
	var raw rawService
	if isJSON(data) {
		if !c.decodeJSON(data, &raw) {
			return lb.Service{}, c.errs
		}
	} else {
		strict, ok := c.decodeTOML(data, &raw)
		if !ok {
			return lb.Service{}, c.errs
		}
		c.addStrict(strict, []rawService{raw}, reflect.TypeOf(raw), false)
	}
	svc, _ := c.service(scope{c: c}, &raw, 0, fillDefaults(defaults))
	if len(c.errs) > 0 {
		c.errs.sortByLine()
		return lb.Service{}, c.errs
	}
	return svc, nil
}

func isJSON(data []byte) bool {
	b := bytes.TrimLeft(data, " \t\r\n\ufeff")
	return len(b) > 0 && b[0] == '{'
}

func fillDefaults(d lb.Defaults) lb.Defaults {
	def := Default().Defaults()
	if d.Mode == lb.ModeDefault {
		d.Mode = def.Mode
	}
	if d.Dispatch == lb.DispatchDefault {
		d.Dispatch = def.Dispatch
	}
	if d.TableSize == 0 {
		d.TableSize = def.TableSize
	}
	return d
}

// serviceLabel names a service in errors before (or without) validating it.
func serviceLabel(r *rawService, i int) string {
	if name, ok := r.Name.(string); ok && name != "" {
		return name
	}
	return "#" + strconv.Itoa(i+1)
}

// backendLabel names a backend in errors: its address:port when the address
// is usable, else its 1-based position in the service.
func backendLabel(r *rawBackend, servicePort any, j int) string {
	text, _ := r.Address.(string)
	a, err := netip.ParseAddr(text)
	if err != nil {
		return "#" + strconv.Itoa(j+1)
	}
	if p, ok := rawPort(r.Port); ok {
		return netip.AddrPortFrom(a, p).String()
	}
	if r.Port == nil {
		if p, ok := rawPort(servicePort); ok {
			return netip.AddrPortFrom(a, p).String()
		}
	}
	return a.String()
}

// rawPort reads a port without reporting anything, for labels.
func rawPort(v any) (uint16, bool) {
	var n int64
	switch x := v.(type) {
	case int64:
		n = x
	case interface{ Int64() (int64, error) }:
		var err error
		if n, err = x.Int64(); err != nil {
			return 0, false
		}
	default:
		return 0, false
	}
	if n < 1 || n > 65535 {
		return 0, false
	}
	return uint16(n), true
}

// serviceFacts is what cross-service checks need to know about a service
// that validated far enough.
type serviceFacts struct {
	nameOK     bool
	frontendOK bool
	// rawBackend is, for each backend of the result, its position in
	// the table's [[service.backend]] array (invalid ones are left out
	// of the result), to locate problems found later.
	rawBackend []int
}

// services validates every [[service]] of a file and the rules that span
// services: unique names, unique frontends, and no backend at another
// service's VIP (AcrossServices). With the box's addresses (box, from
// Options.Host), a backend at one of them is refused too.
func (c *checker) services(raws []rawService, d lb.Defaults, source string, box []HostAddr) []lb.Service {
	var out []lb.Service
	names := make(map[string]int)
	fronts := make(map[lb.Frontend]int)
	rawBackends := make([][]int, len(raws))
	for i := range raws {
		sc := scope{c: c, path: indexPath("service", i), service: serviceLabel(&raws[i], i)}
		svc, facts := c.service(sc, &raws[i], i, d)
		svc.Source = source
		rawBackends[i] = facts.rawBackend
		for j, b := range svc.Backends {
			if ifc, ok := boxAddress(b.Addr.Addr(), box); ok {
				c.backendScope(sc, &raws[i], facts.rawBackend[j]).problem("address", backendOnBoxMsg(b.Addr.Addr(), ifc))
			}
		}
		if facts.nameOK {
			if first, dup := names[svc.Name]; dup {
				sc.errorf("name", "name %q is already used by the service at line %d: service names must be unique, rename one of them",
					svc.Name, c.line(indexPath("service", first)))
			} else {
				names[svc.Name] = i
			}
		}
		if facts.frontendOK {
			if first, dup := fronts[svc.Frontend]; dup {
				sc.errorf("vip", "frontend %s is already used by service %q (line %d): change the VIP, port or protocol of one of them",
					svc.Frontend, serviceLabel(&raws[first], first), c.line(indexPath("service", first)))
			} else {
				fronts[svc.Frontend] = i
			}
		}
		out = append(out, svc)
	}
	name := func(i int) string {
		return fmt.Sprintf("service %q (line %d)", serviceLabel(&raws[i], i), c.line(indexPath("service", i)))
	}
	for _, p := range AcrossServices(out, IndexVIPs(out), name) {
		sc := scope{c: c, path: indexPath("service", p.Service), service: serviceLabel(&raws[p.Service], p.Service)}
		if p.Backend < 0 {
			sc.problem("vip", p.Msg)
		} else {
			c.backendScope(sc, &raws[p.Service], rawBackends[p.Service][p.Backend]).problem("address", p.Msg)
		}
	}
	return out
}

// backendScope is the scope of backend j of the service r whose scope is s.
func (c *checker) backendScope(s scope, r *rawService, j int) scope {
	return scope{c: c, path: indexPath(joinPath(s.path, "backend"), j), service: s.service, backend: backendLabel(&r.Backend[j], r.Port, j)}
}

func validServiceName(name string) bool {
	if len(name) < 1 || len(name) > 63 {
		return false
	}
	for i := 0; i < len(name); i++ {
		ch := name[i]
		if !('a' <= ch && ch <= 'z' || 'A' <= ch && ch <= 'Z' || '0' <= ch && ch <= '9' || ch == '.' || ch == '_' || ch == '-') {
			return false
		}
	}
	return true
}

// service validates one service; s is the scope of its table. Unset
// overrides stay unset in the result, but the checks that depend on them
// (table capacity, DSR over IPIP or Geneve) use the effective values from d.
func (c *checker) service(s scope, r *rawService, i int, d lb.Defaults) (lb.Service, serviceFacts) {
	var svc lb.Service
	var facts serviceFacts
	s.service = serviceLabel(r, i)

	if r.Name == nil {
		s.errorf("name", "name is missing: every service needs a unique name")
	} else if name, ok := s.str("name", r.Name); ok {
		if validServiceName(name) {
			svc.Name = name
			facts.nameOK = true
		} else {
			s.errorf("name", "name %q is not valid: use 1 to 63 letters, digits, '.', '_' or '-'", name)
		}
	}

	vipOK, portOK, protoOK := false, false, false
	if r.VIP == nil {
		s.errorf("vip", "vip is missing: set the virtual IP address clients connect to")
	} else if text, ok := s.str("vip", r.VIP); ok {
		if a, err := unicast(text); err != nil {
			s.errorf("vip", "vip: %v", err)
		} else {
			svc.Frontend.Addr, vipOK = a, true
		}
	}
	if r.Port == nil {
		s.errorf("port", "port is missing: set the port clients connect to (1..65535)")
	} else if p, ok := s.port("port", r.Port); ok {
		svc.Frontend.Port, portOK = p, true
	}
	if r.Protocol == nil {
		s.errorf("protocol", "protocol is missing: set it to \"tcp\" or \"udp\"")
	} else if p, ok := enum(s, "protocol", r.Protocol, lb.ParseProtocol); ok {
		svc.Frontend.Proto, protoOK = p, true
	}
	facts.frontendOK = vipOK && portOK && protoOK

	if m, ok := enum(s, "mode", r.Mode, lb.ParseMode); ok {
		svc.Mode = m
	}
	if m, ok := enum(s, "dsr_dispatch", r.DSRDispatch, lb.ParseDispatch); ok {
		svc.Dispatch = m
	}
	if a, ok := enum(s, "algorithm", r.Algorithm, lb.ParseAlgorithm); ok {
		svc.Algorithm = a
	}
	tableOK := true
	if r.TableSize != nil {
		svc.TableSize, tableOK = s.tableSize("table_size", r.TableSize)
	}
	c.affinity(s, r, &svc)
	if r.DrainTimeout != nil {
		if t, ok := s.duration("drain_timeout", r.DrainTimeout); ok {
			svc.DrainTimeout = t
		}
	}
	if v, ok := s.boolean("announce", r.Announce); ok {
		svc.Announce.Off = !v
	}
	if n, ok := s.intIn("announce_min_healthy", r.AnnounceMin, 1, maxMinHealthy, fmt.Sprintf("use 1..%d healthy backends", maxMinHealthy)); ok {
		svc.Announce.MinHealthy = int(n)
		if svc.Announce.Off {
			s.errorf("announce_min_healthy", "announce_min_healthy has no effect with announce = false: remove one of them")
		}
	}
	if vipOK {
		svc.SourceRanges = c.sourceRanges(s, r.SourceRanges, svc.Frontend.Addr)
	} else if r.SourceRanges != nil {
		c.sourceRanges(s, r.SourceRanges, netip.Addr{})
	}
	svc.Health = c.health(s.sub("health"), r.Health, svc.Frontend.Addr)

	eff := svc.WithDefaults(d)
	// IPIP and Geneve carry the client's packet unchanged, destination
	// port included, so the backend can only answer on the VIP's port.
	// opt rewrites the destination, port included, so any port works.
	samePort := (eff.Dispatch == lb.DispatchIPIP || eff.Dispatch == lb.DispatchGeneve) &&
		eff.ModeFor(svc.Frontend.Proto) == lb.ModeDSR && protoOK
	seen := make(map[netip.AddrPort]int)
	eligible := 0
	for j := range r.Backend {
		rb := &r.Backend[j]
		bs := c.backendScope(s, r, j)
		b, ok := c.backend(bs, rb, svc.Frontend, vipOK, portOK)
		if !ok {
			continue
		}
		if first, dup := seen[b.Addr]; dup {
			bs.errorf("address", "duplicate backend: %s is already a backend of this service (line %d): remove one of them",
				b.Addr, c.line(indexPath(joinPath(s.path, "backend"), first)))
			continue
		}
		seen[b.Addr] = j
		if samePort && portOK && rb.Port != nil && b.Addr.Port() != svc.Frontend.Port {
			bs.errorf("port", "port %d differs from the service port %d, but with mode %q and dsr_dispatch %q the packet reaches the backend unchanged, so the backend must listen on port %d: drop the backend port (or set it to %d), or use mode = \"snat\", or dsr_dispatch = \"opt\" (which rewrites the destination port)",
				b.Addr.Port(), svc.Frontend.Port, eff.Mode, eff.Dispatch, svc.Frontend.Port, svc.Frontend.Port)
		}
		if b.Weight > 0 {
			eligible++
		}
		svc.Backends = append(svc.Backends, b)
		facts.rawBackend = append(facts.rawBackend, j)
	}
	if tableOK && eff.TableSize > 0 && eligible > int(eff.TableSize) {
		key := "table_size"
		if r.TableSize == nil {
			key = ""
		}
		s.errorf(key, "%d backends have weight > 0 but the Maglev table has only %d slots, so some would get none: set table_size to a larger prime (e.g. %d)",
			eligible, eff.TableSize, suggestSize(eligible))
	} else if tableOK {
		eff.Backends = svc.Backends
		pos, need := starved(eff)
		for k, j := range pos {
			c.backendScope(s, r, facts.rawBackend[j]).problem("weight", starvedMsg(eff, svc.Backends[j], need[k]))
		}
	}
	if len(r.Backend) == 0 {
		s.warnf("", noBackendsMsg)
	}
	return svc, facts
}

// noBackendsMsg warns of a service without backends: it may be meant
// (backends to come), so it is not an error.
const noBackendsMsg = "service has no backends: its VIP is served, but every connection to it is dropped (drop_no_backend) until one is added; add a [[service.backend]], or leave the service out until it has one"

// checkHTTPPath accepts what can follow GET in a request line: it starts
// with '/', and has no whitespace or control characters (CR and LF would
// end the line and break every probe) and no fragment.
func checkHTTPPath(p string) error {
	if len(p) == 0 || p[0] != '/' {
		return fmt.Errorf("must start with \"/\"")
	}
	for _, r := range p {
		if r <= ' ' || r == 0x7f {
			return fmt.Errorf("contains %q: write a URL path without spaces or control characters (percent-encode them)", r)
		}
	}
	if strings.ContainsRune(p, '#') {
		return fmt.Errorf("contains a fragment ('#'), which is never sent to the server: remove it")
	}
	if _, err := url.ParseRequestURI(p); err != nil {
		return fmt.Errorf("is not a valid URL path: %v", err)
	}
	return nil
}

// suggestSize proposes a table size for n backends: Maglev balances well
// when the table has about 100 slots per backend.
func suggestSize(n int) uint32 {
	for _, m := range maglev.Ladder {
		if int(m) >= 100*n {
			return m
		}
	}
	if n < maglev.MaxTableSize {
		return maglev.MaxTableSize
	}
	return maglev.Ladder[len(maglev.Ladder)-1]
}

func (c *checker) affinity(s scope, r *rawService, svc *lb.Service) {
	clientIP := false
	if v, ok := s.str("affinity", r.Affinity); ok {
		switch v {
		case "none":
		case "client-ip":
			clientIP = true
		default:
			s.errorf("affinity", "affinity = %q is unknown: use \"none\" or \"client-ip\"", v)
		}
	}
	timeout := defaultAffinityTimeout
	if r.AffinityTimeout != nil {
		if !clientIP {
			s.errorf("affinity_timeout", "affinity_timeout has no effect without affinity = \"client-ip\": remove it or turn affinity on")
		} else if t, ok := s.duration("affinity_timeout", r.AffinityTimeout); ok {
			timeout = t
		}
	}
	if clientIP {
		svc.Affinity = lb.Affinity{ClientIP: true, Timeout: timeout}
	}
}

// sourceRanges parses the client allow-list. A prefix of the other family
// than the VIP could never match, so it is a mistake rather than a no-op.
func (c *checker) sourceRanges(s scope, v any, vip netip.Addr) []netip.Prefix {
	list, _ := s.strs("source_ranges", v)
	var out []netip.Prefix
	seen := make(map[netip.Prefix]bool)
	for i, text := range list {
		key := indexPath("source_ranges", i)
		p, err := netip.ParsePrefix(text)
		switch {
		case err != nil:
			s.errorf(key, "%s = %q is not a prefix: write it like \"192.0.2.0/24\" or \"2001:db8::/32\"", key, text)
		case p.Addr().Zone() != "":
			s.errorf(key, "%s = %q has an IPv6 zone: remove it", key, text)
		case p.Masked() != p:
			s.errorf(key, "%s = %q has bits set after the prefix length: write %s", key, text, p.Masked())
		case vip.IsValid() && p.Addr().Is4() != vip.Is4():
			s.errorf(key, "%s = %q is %s but the VIP %s is %s: it could never match", key, text, family(p.Addr()), vip, family(vip))
		case seen[p]:
			s.errorf(key, "%s: %s is listed twice: remove one", key, p)
		default:
			seen[p] = true
			out = append(out, p)
		}
	}
	return out
}

// backend validates one backend. The second result is false when the
// backend cannot be identified (no usable address), so it takes no part in
// the duplicate and capacity checks.
func (c *checker) backend(s scope, r *rawBackend, fe lb.Frontend, vipOK, svcPortOK bool) (lb.Backend, bool) {
	b := lb.Backend{Weight: lb.DefaultWeight, State: lb.Active}
	var addr netip.Addr
	addrOK := false
	if r.Address == nil {
		s.errorf("address", "address is missing: set the backend's IP address")
	} else if text, ok := s.str("address", r.Address); ok {
		if a, err := unicast(text); err != nil {
			s.errorf("address", "address: %v", err)
		} else if vipOK && a.Is4() != fe.Addr.Is4() {
			s.errorf("address", "address family differs from VIP %s", fe.Addr)
		} else if vipOK && a == fe.Addr {
			s.errorf("address", "address %s is the service's own VIP: packets would be sent back to the load balancer; use the backend's real address", a)
		} else {
			addr, addrOK = a, true
		}
	}
	port, portOK := fe.Port, svcPortOK
	if r.Port != nil {
		port, portOK = s.port("port", r.Port)
	}
	if r.Weight != nil {
		if n, ok := s.integer("weight", r.Weight); ok {
			switch {
			case n < 0:
				s.errorf("weight", "weight = %d is negative: use 0 to give the backend no new flows, or a positive weight", n)
			case n > 1<<32-1:
				s.errorf("weight", "weight = %d is out of range: use at most %d", n, uint32(1<<32-1))
			default:
				b.Weight = uint32(n)
			}
		}
	}
	if st, ok := enum(s, "state", r.State, lb.ParseBackendState); ok {
		b.State = st
	}
	if !addrOK || !portOK {
		return b, false
	}
	b.Addr = netip.AddrPortFrom(addr, port)
	return b, true
}

// health validates [service.health]. Absent means no checks (HealthNone);
// present, it must say which kind, and every key must apply to that kind,
// because a key that is silently ignored hides a misunderstanding.
func (c *checker) health(s scope, r *rawHealth, vip netip.Addr) lb.HealthCheck {
	var h lb.HealthCheck
	if r == nil {
		return h
	}
	typ, typeOK := lb.HealthNone, false
	if r.Type == nil {
		s.errorf("type", "health.type is missing: set it to \"tcp\", \"http\", \"udp\" or \"none\"")
	} else {
		typ, typeOK = enum(s, "type", r.Type, lb.ParseHealthType)
	}
	if typeOK && typ == lb.HealthNone {
		for _, k := range []struct {
			key string
			v   any
		}{{"port", r.Port}, {"interval", r.Interval}, {"timeout", r.Timeout}, {"rise", r.Rise}, {"fall", r.Fall},
			{"path", r.Path}, {"expect_status", r.ExpectStatus}, {"send", r.Send}, {"expect", r.Expect}} {
			if k.v != nil {
				s.errorf(k.key, "%s has no effect with health.type = \"none\": remove it", s.name(k.key))
			}
		}
		return lb.HealthCheck{Type: lb.HealthNone}
	}
	h = lb.HealthCheck{
		Type:     typ,
		Interval: defaultHealthInterval,
		Timeout:  defaultHealthTimeout,
		Rise:     defaultHealthRise,
		Fall:     defaultHealthFall,
	}
	if r.Port != nil {
		if n, ok := s.intIn("port", r.Port, 0, 65535, "use 1..65535, or 0 for the backend's own port"); ok {
			h.Port = uint16(n)
		}
	}
	intervalOK, timeoutOK := true, true
	if r.Interval != nil {
		h.Interval, intervalOK = s.duration("interval", r.Interval)
	}
	if r.Timeout != nil {
		h.Timeout, timeoutOK = s.duration("timeout", r.Timeout)
	}
	if r.Timeout == nil && intervalOK {
		// The default timeout only exists to bound a probe; with a short
		// interval it shrinks rather than turning into an error about a
		// key the operator never wrote.
		h.Timeout = min(h.Timeout, h.Interval)
	}
	if intervalOK && timeoutOK && h.Timeout > h.Interval {
		s.errorf("timeout", "health.timeout (%s) is longer than health.interval (%s): a probe must finish before the next one starts, shorten the timeout or lengthen the interval", h.Timeout, h.Interval)
	}
	if r.Rise != nil {
		if n, ok := s.intIn("rise", r.Rise, 1, 1<<31-1, "use at least 1 (default 2)"); ok {
			h.Rise = int(n)
		}
	}
	if r.Fall != nil {
		if n, ok := s.intIn("fall", r.Fall, 1, 1<<31-1, "use at least 1 (default 3)"); ok {
			h.Fall = int(n)
		}
	}

	only := func(key string, v any, want lb.HealthType) bool {
		if v == nil {
			return false
		}
		if typeOK && typ != want {
			s.errorf(key, "%s only applies to health.type = %q, not %q: remove it", s.name(key), want, typ)
			return false
		}
		return true
	}
	if typ == lb.HealthHTTP {
		h.Path, h.ExpectStatus = defaultHealthPath, defaultHealthStatus
	}
	if only("path", r.Path, lb.HealthHTTP) {
		if p, ok := s.str("path", r.Path); ok {
			if err := checkHTTPPath(p); err != nil {
				s.errorf("path", "health.path = %q %v", p, err)
			} else {
				h.Path = p
			}
		}
	}
	if only("expect_status", r.ExpectStatus, lb.HealthHTTP) {
		if n, ok := s.intIn("expect_status", r.ExpectStatus, 100, 599, "use an HTTP status code in 100..599"); ok {
			h.ExpectStatus = int(n)
		}
	}
	if only("send", r.Send, lb.HealthUDP) {
		if p, ok := s.str("send", r.Send); ok {
			// The largest UDP payload one datagram carries: 65535
			// minus the IP (20, IPv4) and UDP (8) headers.
			limit := 65507
			if vip.Is6() {
				limit = 65527
			}
			if len(p) > limit {
				s.errorf("send", "health.send is %d bytes, more than the %d a UDP datagram to %s can carry: every probe would fail; shorten it", len(p), limit, family(vip))
			} else {
				h.Send = p
			}
		}
	}
	if only("expect", r.Expect, lb.HealthUDP) {
		h.Expect, _ = s.str("expect", r.Expect)
	}
	return h
}
