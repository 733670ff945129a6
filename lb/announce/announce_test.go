// SPDX-License-Identifier: Apache-2.0

package announce

import (
	"net/netip"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/l4lb/l4lb/lb"
)

func TestDecide(t *testing.T) {
	a := netip.MustParseAddr("192.0.2.10")
	b := netip.MustParseAddr("2001:db8::10")
	tests := []struct {
		name string
		svcs []Service
		min  int
		want []VIP
	}{
		{
			name: "programmed and healthy",
			svcs: []Service{{Name: "web", VIP: a, Programmed: true, Healthy: 1}},
			min:  1,
			want: []VIP{{Addr: a, Announced: true, Services: []string{"web"}}},
		},
		{
			name: "not programmed yet",
			svcs: []Service{{Name: "web", VIP: a, Healthy: 3}},
			min:  1,
			want: []VIP{{Addr: a, Services: []string{"web"}, Reason: `service "web" is not programmed`}},
		},
		{
			name: "too few healthy backends",
			svcs: []Service{{Name: "web", VIP: a, Programmed: true, Healthy: 1}},
			min:  2,
			want: []VIP{{Addr: a, Services: []string{"web"}, Reason: `service "web" has 1 healthy backends, needs 2`}},
		},
		{
			name: "backends not checked yet do not count",
			svcs: []Service{{Name: "web", VIP: a, Programmed: true, Healthy: 1, Unchecked: 2}},
			min:  2,
			want: []VIP{{Addr: a, Services: []string{"web"}, Reason: `service "web" has 1 healthy backends, needs 2 (2 not checked yet)`}},
		},
		{
			name: "per-service threshold wins over the announcer's",
			svcs: []Service{{Name: "web", VIP: a, Programmed: true, Healthy: 2, Announce: lb.Announce{MinHealthy: 3}}},
			min:  1,
			want: []VIP{{Addr: a, Services: []string{"web"}, Reason: `service "web" has 2 healthy backends, needs 3`}},
		},
		{
			name: "one ready service on a VIP is enough",
			svcs: []Service{
				{Name: "https", VIP: a, Programmed: true, Healthy: 0},
				{Name: "http", VIP: a, Programmed: true, Healthy: 2},
			},
			min:  1,
			want: []VIP{{Addr: a, Announced: true, Services: []string{"http", "https"}}},
		},
		{
			name: "an opted-out service does not announce its VIP",
			svcs: []Service{
				{Name: "admin", VIP: a, Programmed: true, Healthy: 2, Announce: lb.Announce{Off: true}},
				{Name: "web6", VIP: b, Programmed: true, Healthy: 2},
			},
			min:  1,
			want: []VIP{{Addr: b, Announced: true, Services: []string{"web6"}}},
		},
		{
			name: "an opted-out service next to a failing one",
			svcs: []Service{
				{Name: "admin", VIP: a, Programmed: true, Healthy: 2, Announce: lb.Announce{Off: true}},
				{Name: "web", VIP: a, Programmed: true, Healthy: 0},
			},
			min:  1,
			want: []VIP{{Addr: a, Services: []string{"web"}, Reason: `service "web" has 0 healthy backends, needs 1`}},
		},
		{
			name: "every reason is named",
			svcs: []Service{
				{Name: "b", VIP: a, Programmed: true, Healthy: 0},
				{Name: "a", VIP: a},
			},
			min:  1,
			want: []VIP{{Addr: a, Services: []string{"a", "b"}, Reason: `service "a" is not programmed; service "b" has 0 healthy backends, needs 1`}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := Decide(tt.svcs, tt.min)
			if diff := cmp.Diff(tt.want, got, cmp.Comparer(func(x, y netip.Addr) bool { return x == y })); diff != "" {
				t.Errorf("Decide (-want +got):\n%s", diff)
			}
		})
	}
}

func TestDiff(t *testing.T) {
	x, y, z := netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("10.0.0.2"), netip.MustParseAddr("10.0.0.3")
	add, del := diff(map[netip.Addr]bool{x: true, y: true}, []netip.Addr{z, y})
	if len(add) != 1 || add[0] != z || len(del) != 1 || del[0] != x {
		t.Errorf("diff = %v, %v; want [%v], [%v]", add, del, z, x)
	}
}
