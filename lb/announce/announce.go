// SPDX-License-Identifier: Apache-2.0

// Package announce puts the VIPs on the network, the last step of the data
// flow toward clients: it tells routers (BGP, via an embedded gobgp
// speaker) or the clients' segment (ARP and NDP) that this box serves a
// VIP, and takes that back when it stops serving it.
//
// The daemon hands it, after every control-loop pass, one Service per
// served frontend: whether the datapath programmed it and how many of its
// backends are healthy. Decide turns that into the VIPs to announce, the
// same rule for every announcer: a VIP is announced while at least one
// service on it that takes part (lb.Announce.Off unset) is programmed with
// at least its threshold of healthy backends. A VIP serves several
// frontends (ports), so one failing service does not withdraw the others.
//
// The package knows nothing of the datapath or the health checker: the
// daemon converts their state into Service values, so the policy is a pure
// function and each announcer only turns a set of addresses into packets.
package announce

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/l4lb/l4lb/lb"
)

// Service is what the announcers need to know about one served frontend.
type Service struct {
	Name string
	VIP  netip.Addr
	// Programmed is true when the datapath holds the service and its
	// Maglev table, so traffic for it is forwarded.
	Programmed bool
	// Healthy counts the backends that take new flows and pass their
	// health checks (or have none).
	Healthy int
	// Unchecked counts the backends that take new flows but have not
	// passed a check yet (just started or added): they do not count as
	// healthy, and the reason says so.
	Unchecked int
	Announce  lb.Announce
}

// VIP is the decision about one address.
type VIP struct {
	Addr netip.Addr
	// Announced is true when the address is to be announced.
	Announced bool
	// Services are the services on the address that take part.
	Services []string
	// Reason says why the address is not announced, naming each service
	// that could have asked for it.
	Reason string
}

// Decide applies the announcement rule to every VIP of svcs; minHealthy is
// the announcer's threshold for services that set none. VIPs whose every
// service opts out are left out. The result is sorted by address.
func Decide(svcs []Service, minHealthy int) []VIP {
	byAddr := map[netip.Addr]*VIP{}
	var why = map[netip.Addr][]string{}
	for _, s := range svcs {
		if s.Announce.Off || !s.VIP.IsValid() {
			continue
		}
		v := byAddr[s.VIP]
		if v == nil {
			v = &VIP{Addr: s.VIP}
			byAddr[s.VIP] = v
		}
		v.Services = append(v.Services, s.Name)
		need := minHealthy
		if s.Announce.MinHealthy > 0 {
			need = s.Announce.MinHealthy
		}
		switch {
		case !s.Programmed:
			why[s.VIP] = append(why[s.VIP], fmt.Sprintf("service %q is not programmed", s.Name))
		case s.Healthy < need:
			r := fmt.Sprintf("service %q has %d healthy backends, needs %d", s.Name, s.Healthy, need)
			if s.Unchecked > 0 {
				r += fmt.Sprintf(" (%d not checked yet)", s.Unchecked)
			}
			why[s.VIP] = append(why[s.VIP], r)
		default:
			v.Announced = true
		}
	}
	out := make([]VIP, 0, len(byAddr))
	for _, v := range byAddr {
		slices.Sort(v.Services)
		if !v.Announced {
			r := why[v.Addr]
			slices.Sort(r)
			v.Reason = strings.Join(r, "; ")
		}
		out = append(out, *v)
	}
	slices.SortFunc(out, func(a, b VIP) int { return a.Addr.Compare(b.Addr) })
	return out
}

// Announced returns the addresses of vips that are announced.
func Announced(vips []VIP) []netip.Addr {
	var out []netip.Addr
	for _, v := range vips {
		if v.Announced {
			out = append(out, v.Addr)
		}
	}
	return out
}

// hostPrefix is the /32 or /128 of a VIP.
func hostPrefix(a netip.Addr) netip.Prefix {
	return netip.PrefixFrom(a, a.BitLen())
}

// diff returns what is in want but not in have, and what is in have but
// not in want, each sorted.
func diff(have map[netip.Addr]bool, want []netip.Addr) (add, del []netip.Addr) {
	w := map[netip.Addr]bool{}
	for _, a := range want {
		w[a] = true
		if !have[a] {
			add = append(add, a)
		}
	}
	for a := range have {
		if !w[a] {
			del = append(del, a)
		}
	}
	slices.SortFunc(add, netip.Addr.Compare)
	slices.SortFunc(del, netip.Addr.Compare)
	return add, del
}
