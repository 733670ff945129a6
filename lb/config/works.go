// SPDX-License-Identifier: Apache-2.0

package config

import (
	"fmt"
	"net/netip"
	"slices"

	"github.com/l4lb/l4lb/lb"
	"github.com/l4lb/l4lb/lb/maglev"
)

// The rules of this file look past one field: at a service's backends
// together (weights that leave one without a Maglev slot), at the box (a
// backend that is one of its addresses) and at the whole set of services
// (a backend that is another service's VIP). A config that breaks one can
// never work, whatever the network does: the file is refused with
// file:line, and a service from Consul or Kubernetes that breaks one is
// refused by l4lbd with the same words (ServiceProblems,
// AcrossServices). A service without backends may be meant (its backends
// come later): that is a warning, in the file only.

// Problem is one rule a service breaks, found by ServiceProblems or
// AcrossServices.
type Problem struct {
	// Service is the position of the service in the slice checked.
	Service int
	// Backend is the position of the backend the problem is about in the
	// service's backends; -1 when it is about the VIP.
	Backend int
	// Other is the position of the other service of a problem across
	// services; -1 when there is none.
	Other int
	// Msg says what is wrong and what to do, naming the other service
	// as the caller's name function did.
	Msg string
}

// starved lists the positions of the backends of svc (defaults resolved:
// TableSize set) that have a weight but get no slot of the Maglev table,
// with the weight they need for one. Only active backends take part, as in
// the table (maglev.FromLB). Equal weights, or a smallest weight worth a
// slot by itself, cannot starve anything; only otherwise are the quotas
// computed, so the common case costs one pass over the backends.
func starved(svc lb.Service) (pos []int, need []uint64) {
	m := uint64(svc.TableSize)
	if m == 0 || len(svc.Backends) < 2 {
		return nil, nil
	}
	var total, least uint64
	for _, b := range svc.Backends {
		if b.State != lb.Active || b.Weight == 0 {
			continue
		}
		w := uint64(b.Weight)
		total += w
		if least == 0 || w < least {
			least = w
		}
	}
	if least == 0 || m*least >= total {
		return nil, nil
	}
	slots, err := maglev.Slots(svc.TableSize, maglev.FromLB(nil, svc.Backends))
	if err != nil {
		return nil, nil // the checks of the table size and the backends say why
	}
	for i, b := range svc.Backends {
		if b.State == lb.Active && b.Weight > 0 && slots[i] == 0 {
			// m·w ≥ (the others' total + w) is one slot by its
			// exact share, whatever the leftovers do.
			rest := total - uint64(b.Weight)
			pos = append(pos, i)
			need = append(need, (rest+m-2)/(m-1))
		}
	}
	return pos, need
}

// starvedMsg says why backend b of svc gets no slot.
func starvedMsg(svc lb.Service, b lb.Backend, need uint64) string {
	return fmt.Sprintf("weight %d gets none of the %d slots of the Maglev table next to the other backends' weights, so this backend would never get a new flow: give it a weight of at least %d (or lower the others), or a larger table_size; use weight = 0 if it is meant to get no new flows",
		b.Weight, svc.TableSize, need)
}

// boxAddress says which interface of the box holds a, if one does.
func boxAddress(a netip.Addr, box []HostAddr) (string, bool) {
	for _, h := range box {
		if h.Prefix.Addr().Unmap() == a {
			return h.Interface, true
		}
	}
	return "", false
}

// backendOnBoxMsg says why a backend at an address of the box cannot work.
func backendOnBoxMsg(a netip.Addr, ifc string) string {
	return fmt.Sprintf("address %s is an address of this box (%s): the datapath would send the client's packets back out to the box itself, and the connection times out; use the address of the server that runs the service", a, ifc)
}

// ServiceProblems lists why svc alone, defaults resolved, can never work
// on a box: a backend that is the service's own VIP or one of the box's
// addresses (onBox names the interface that holds an address; nil skips
// that rule), and weights that leave a backend without a Maglev slot. The
// file's services meet the same rules at parse time; l4lbd applies this
// to the services of every source and refuses those with a problem.
func ServiceProblems(svc lb.Service, onBox func(netip.Addr) (string, bool)) []Problem {
	var out []Problem
	for j, b := range svc.Backends {
		a := b.Addr.Addr()
		if a == svc.Frontend.Addr {
			out = append(out, Problem{Backend: j, Other: -1, Msg: fmt.Sprintf("address %s is the service's own VIP: packets would be sent back to the load balancer; use the backend's real address", a)})
		} else if ifc, ok := onBoxAt(onBox, a); ok {
			out = append(out, Problem{Backend: j, Other: -1, Msg: backendOnBoxMsg(a, ifc)})
		}
	}
	pos, need := starved(svc)
	for k, j := range pos {
		out = append(out, Problem{Backend: j, Other: -1, Msg: starvedMsg(svc, svc.Backends[j], need[k])})
	}
	return out
}

// VIPIndex is the VIP addresses of a set of services, by address, with
// the positions of the services that have each.
type VIPIndex struct {
	first map[netip.Addr]int
	// more are the further services of an address several services
	// share (on other ports or protocols), in order.
	more map[netip.Addr][]int
}

// IndexVIPs indexes the VIP addresses of svcs.
func IndexVIPs(svcs []lb.Service) VIPIndex {
	x := VIPIndex{first: make(map[netip.Addr]int, len(svcs))}
	for i, svc := range svcs {
		a := svc.Frontend.Addr
		if !a.IsValid() {
			continue
		}
		if _, ok := x.first[a]; !ok {
			x.first[a] = i
			continue
		}
		if x.more == nil {
			x.more = map[netip.Addr][]int{}
		}
		x.more[a] = append(x.more[a], i)
	}
	return x
}

// Has reports whether a is the VIP of one of the services.
func (x VIPIndex) Has(a netip.Addr) bool {
	_, ok := x.first[a]
	return ok
}

// At lists the positions, in the services indexed, of the services whose
// VIP is a, in order.
func (x VIPIndex) At(a netip.Addr) []int {
	i, ok := x.first[a]
	if !ok {
		return nil
	}
	return append([]int{i}, x.more[a]...)
}

func onBoxAt(onBox func(netip.Addr) (string, bool), a netip.Addr) (string, bool) {
	if onBox == nil {
		return "", false
	}
	return onBox(a)
}

// AcrossServices finds a backend of one service at the address of another
// service's VIP (x indexes the VIPs of svcs). l4lb answers for a VIP's
// address (and announces it), so packets sent to that backend come back
// to the load balancer instead of reaching a server: it can never work.
// Each such pair is reported once, on the later of the two services in
// svcs (as a duplicate name is, at its second use): on its backend when
// the earlier service has the VIP, on its VIP when the earlier one has the
// backend. name names a service by position in the messages
// ("service \"web\" (line 12)"). The problems come in the order of svcs.
func AcrossServices(svcs []lb.Service, x VIPIndex, name func(i int) string) []Problem {
	var out []Problem
	var vipDone map[int]bool // services whose VIP is reported already
	for i, svc := range svcs {
		for j, b := range svc.Backends {
			a := b.Addr.Addr()
			k, ok := x.first[a]
			if !ok || a == svc.Frontend.Addr {
				continue // the service's own VIP is ServiceProblems' to report
			}
			if k < i {
				out = append(out, Problem{Service: i, Backend: j, Other: k, Msg: fmt.Sprintf(
					"address %s is the VIP of %s: the load balancer answers for that address, so packets to this backend would come back to it instead of reaching a server; use the backend's real address",
					a, name(k))})
			}
			for _, k := range append([]int{k}, x.more[a]...) {
				if k < i || vipDone[k] {
					continue
				}
				if vipDone == nil {
					vipDone = map[int]bool{}
				}
				vipDone[k] = true
				out = append(out, Problem{Service: k, Backend: -1, Other: i, Msg: fmt.Sprintf(
					"vip %s is the address of backend %s of %s: the load balancer would answer for it, so that backend's traffic would never reach it; use an address that no backend has",
					a, b.Addr, name(i))})
			}
		}
	}
	slices.SortStableFunc(out, func(a, b Problem) int { return a.Service - b.Service })
	return out
}

// Describe renders p, found in svc, as one line: "backend ADDR: msg", or
// the message alone when it is about the VIP.
func (p Problem) Describe(svc lb.Service) string {
	if p.Backend >= 0 {
		return fmt.Sprintf("backend %s: %s", svc.Backends[p.Backend].Addr, p.Msg)
	}
	return p.Msg
}
