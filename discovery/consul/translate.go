// SPDX-License-Identifier: Apache-2.0

package consul

import (
	"cmp"
	"encoding/json"
	"fmt"
	"path"
	"slices"
	"strconv"
	"strings"

	"github.com/hashicorp/consul/api"

	"github.com/l4lb/l4lb/lb"
	"github.com/l4lb/l4lb/lb/config"
)

// Meta keys of a Consul service instance that make its service a frontend.
// The first three are required; the others override daemon defaults.
const (
	MetaVIP       = "l4lb-vip"
	MetaPort      = "l4lb-port"
	MetaProtocol  = "l4lb-protocol"
	MetaMode      = "l4lb-mode"
	MetaDispatch  = "l4lb-dispatch"
	MetaTableSize = "l4lb-table-size"
	MetaHealth    = "l4lb-health"
)

// definition is a frontend as one instance's meta declares it, one value
// per meta key ("" when absent). It is comparable, so instances can be
// grouped by what they declare.
type definition struct {
	vip, port, protocol, mode, dispatch, tableSize, health string
}

func definitionOf(meta map[string]string) definition {
	return definition{
		vip:       strings.TrimSpace(meta[MetaVIP]),
		port:      strings.TrimSpace(meta[MetaPort]),
		protocol:  strings.TrimSpace(meta[MetaProtocol]),
		mode:      strings.TrimSpace(meta[MetaMode]),
		dispatch:  strings.TrimSpace(meta[MetaDispatch]),
		tableSize: strings.TrimSpace(meta[MetaTableSize]),
		health:    strings.TrimSpace(meta[MetaHealth]),
	}
}

// String shows the declared frontend, for errors about instances that
// disagree with each other.
func (d definition) String() string {
	s := fmt.Sprintf("%s=%q %s=%q %s=%q", MetaVIP, d.vip, MetaPort, d.port, MetaProtocol, d.protocol)
	for _, kv := range []struct{ k, v string }{{MetaMode, d.mode}, {MetaDispatch, d.dispatch}, {MetaTableSize, d.tableSize}, {MetaHealth, d.health}} {
		if kv.v != "" {
			s += fmt.Sprintf(" %s=%q", kv.k, kv.v)
		}
	}
	return s
}

// docBackend and docHealth are the parts of a service document that the
// Consul source fills; keys as in the file's [[service.backend]].
type docBackend struct {
	Address string `json:"address"`
	Port    int    `json:"port"`
	Weight  int    `json:"weight"`
	State   string `json:"state"`
}

type docHealth struct {
	Type string `json:"type"`
}

type document struct {
	Name      string       `json:"name"`
	VIP       string       `json:"vip"`
	Port      int64        `json:"port"`
	Protocol  string       `json:"protocol"`
	Mode      string       `json:"mode,omitempty"`
	Dispatch  string       `json:"dsr_dispatch,omitempty"`
	TableSize int64        `json:"table_size,omitempty"`
	Health    *docHealth   `json:"health,omitempty"`
	Backend   []docBackend `json:"backend,omitempty"`
}

// document turns the meta into the JSON form of a service definition, so
// that it is validated by config.ParseService exactly like a service of
// the file. Problems the document cannot even express (a missing key, a
// port that is not a number) are reported here, by meta key.
func (d definition) document(name string) (document, []string) {
	doc := document{Name: name, VIP: d.vip, Protocol: d.protocol, Mode: d.mode, Dispatch: d.dispatch}
	var problems []string
	for _, req := range []struct{ key, val, want string }{
		{MetaVIP, d.vip, "the VIP clients connect to"},
		{MetaPort, d.port, "the frontend port (1..65535)"},
		{MetaProtocol, d.protocol, `"tcp" or "udp"`},
	} {
		if req.val == "" {
			problems = append(problems, fmt.Sprintf("meta %s is missing: set it to %s", req.key, req.want))
		}
	}
	if d.port != "" {
		n, err := strconv.ParseInt(d.port, 10, 64)
		if err != nil {
			problems = append(problems, fmt.Sprintf("meta %s = %q is not a number: set it to the frontend port (1..65535)", MetaPort, d.port))
		}
		doc.Port = n
	}
	if d.tableSize != "" {
		n, err := strconv.ParseInt(d.tableSize, 10, 64)
		if err != nil || n <= 0 {
			problems = append(problems, fmt.Sprintf("meta %s = %q is not a positive number: set it to a prime Maglev table size, or remove it for the default", MetaTableSize, d.tableSize))
		}
		doc.TableSize = n
	}
	if d.health != "" {
		doc.Health = &docHealth{Type: d.health}
	}
	return doc, problems
}

// parse validates doc with the file's rules; where names the origin in
// errors. Each returned problem is one line of config.ErrorList.
func parse(where string, doc document, defaults lb.Defaults) (lb.Service, []string) {
	data, err := json.Marshal(doc)
	if err != nil {
		return lb.Service{}, []string{fmt.Sprintf("%s: cannot encode the definition: %v", where, err)}
	}
	svc, err := config.ParseService(where, data, defaults)
	if err != nil {
		lines := strings.Split(err.Error(), "\n")
		for i, l := range lines {
			lines[i] = dropLine(where, l)
		}
		return lb.Service{}, lines
	}
	return svc, nil
}

// dropLine removes the line number config.ParseService puts after where:
// the document was made from meta, which has no lines.
func dropLine(where, msg string) string {
	rest, ok := strings.CutPrefix(msg, where+":")
	if !ok {
		return msg
	}
	digits := len(rest) - len(strings.TrimLeft(rest, "0123456789"))
	if digits == 0 || !strings.HasPrefix(rest[digits:], ": ") {
		return msg
	}
	return where + rest[digits:]
}

// instance is one Consul service instance reduced to what l4lb uses.
type instance struct {
	node, id string
	def      definition
	addr     string
	port     int
	weight   int
	status   string // Consul's aggregated check status
}

func (in instance) label() string {
	return fmt.Sprintf("instance %q on node %q", in.id, in.node)
}

func instancesOf(entries []*api.ServiceEntry) []instance {
	out := make([]instance, 0, len(entries))
	for _, e := range entries {
		if e == nil || e.Service == nil {
			continue
		}
		in := instance{
			id:     e.Service.ID,
			def:    definitionOf(e.Service.Meta),
			addr:   e.Service.Address,
			port:   e.Service.Port,
			weight: e.Service.Weights.Passing,
			status: e.Checks.AggregatedStatus(),
		}
		if e.Node != nil {
			in.node = e.Node.Node
			if in.addr == "" {
				// Consul's own rule: an instance without a service
				// address is reached at its node's address.
				in.addr = e.Node.Address
			}
		}
		if in.weight <= 0 {
			// Consul never stores a passing weight below 1; zero only
			// means "not set", which Consul itself treats as 1.
			in.weight = lb.DefaultWeight
		}
		out = append(out, in)
	}
	slices.SortFunc(out, func(a, b instance) int {
		return cmp.Or(strings.Compare(a.node, b.node), strings.Compare(a.id, b.id))
	})
	return out
}

// translation is one Consul service or KV definition turned into a
// service: ok is false when it cannot be served at all. problems are
// reported in Status whether or not the service is served.
type translation struct {
	svc      lb.Service
	ok       bool
	problems []string
}

// fromCatalog turns the tagged instances of the Consul service name into
// one lb.Service. Every instance declares the frontend in its meta; the
// declaration shared by most instances that validate wins (on a tie, the
// one of the first instance by node and id), so a rolling change of meta
// or one badly registered instance never takes the whole service down.
// Instances that declare something else, or that cannot be a backend, are
// left out and reported. Only instances whose checks pass (or warn, then
// with state warning) become backends.
func fromCatalog(name string, entries []*api.ServiceEntry, warning lb.BackendState, defaults lb.Defaults) translation {
	where := fmt.Sprintf("consul service %q", name)
	insts := instancesOf(entries)
	if len(insts) == 0 {
		return translation{}
	}

	type group struct {
		def     definition
		members []int
		first   int
	}
	var groups []*group
	byDef := map[definition]*group{}
	for i, in := range insts {
		g, ok := byDef[in.def]
		if !ok {
			g = &group{def: in.def, first: i}
			byDef[in.def] = g
			groups = append(groups, g)
		}
		g.members = append(g.members, i)
	}

	var (
		problems []string
		chosen   *group
		base     document
	)
	for _, g := range groups {
		doc, bad := g.def.document(name)
		metaWhere := fmt.Sprintf("%s meta of %s", where, insts[g.first].label())
		if len(g.members) > 1 {
			metaWhere += fmt.Sprintf(" (and %d more)", len(g.members)-1)
		}
		if len(bad) == 0 {
			_, bad = parse(metaWhere, doc, defaults)
		} else {
			for i := range bad {
				bad[i] = metaWhere + ": " + bad[i]
			}
		}
		if len(bad) > 0 {
			problems = append(problems, bad...)
			continue
		}
		if chosen == nil || len(g.members) > len(chosen.members) {
			chosen, base = g, doc
		}
	}
	if chosen == nil {
		return translation{problems: problems}
	}
	for _, g := range groups {
		if g == chosen {
			continue
		}
		for _, i := range g.members {
			problems = append(problems, fmt.Sprintf("%s: %s declares %s but the other instances declare %s: left out; give every instance of the service the same l4lb-* meta",
				where, insts[i].label(), g.def, chosen.def))
		}
	}

	seen := map[string]instance{}
	for _, i := range chosen.members {
		in := insts[i]
		var state lb.BackendState
		switch in.status {
		case api.HealthPassing:
			state = lb.Active
		case api.HealthWarning:
			state = warning
		default:
			// Critical and maintenance instances are not backends.
			continue
		}
		b := docBackend{Address: in.addr, Port: in.port, Weight: in.weight, State: state.String()}
		key := fmt.Sprintf("%s|%d", b.Address, b.Port)
		if prev, dup := seen[key]; dup {
			problems = append(problems, fmt.Sprintf("%s: %s has the same address and port (%s:%d) as %s: left out; each instance needs its own address or port",
				where, in.label(), in.addr, in.port, prev.label()))
			continue
		}
		one := base
		one.Backend = []docBackend{b}
		if _, bad := parse(where+" "+in.label(), one, defaults); len(bad) > 0 {
			problems = append(problems, bad...)
			continue
		}
		seen[key] = in
		base.Backend = append(base.Backend, b)
	}
	// The whole service once more, for the checks that span backends (the
	// Maglev table must have room for all of them).
	svc, bad := parse(where, base, defaults)
	if len(bad) > 0 {
		return translation{problems: append(problems, bad...)}
	}
	svc.Source = SourceName
	return translation{svc: svc, ok: true, problems: problems}
}

// fromKV parses one KV definition. The service's name is the `name` inside
// the definition, as in the file; it must equal the key's last path
// element, so that one key is one service and two keys can never define
// the same service.
func fromKV(key string, value []byte, defaults lb.Defaults) translation {
	where := "consul KV " + key
	svc, err := config.ParseService(where, value, defaults)
	if err != nil {
		return translation{problems: strings.Split(err.Error(), "\n")}
	}
	if base := path.Base(key); svc.Name != base {
		return translation{problems: []string{fmt.Sprintf("%s: service %q: the name differs from the key's last element %q: rename the key to %s or set name = %q",
			where, svc.Name, base, path.Join(path.Dir(key), svc.Name), base)}}
	}
	svc.Source = SourceName
	return translation{svc: svc, ok: true}
}
