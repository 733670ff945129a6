// SPDX-License-Identifier: Apache-2.0

package main

import (
	"bytes"
	"fmt"
	"testing"
	"time"

	"github.com/l4lb/l4lb/lb/api"
)

// TestServiceRates checks the rates between two listings: per second over
// the interval, a reset counter read as 0, services and backends present
// in one listing only left out, and the table.
func TestServiceRates(t *testing.T) {
	svc := func(name string, pkts uint64, be ...api.Backend) api.Service {
		return api.Service{Name: name, Frontend: "10.0.0.10:80/tcp", Counters: api.Counters{Packets: pkts, Bytes: pkts * 100, NewFlows: pkts / 10}, Backends: be}
	}
	be := func(addr string, pkts uint64) api.Backend {
		return api.Backend{Address: addr, Counters: api.Counters{Packets: pkts, Bytes: pkts * 100, NewFlows: pkts / 10}}
	}
	snat := func(s api.Service, replies uint64) api.Service {
		s.Mode = "snat"
		s.Counters.ReplyPackets, s.Counters.ReplyBytes = replies, replies*1000
		return s
	}
	before := []api.Service{svc("web", 1000, be("10.1.0.11:80", 600), be("10.1.0.12:80", 400)), svc("gone", 5), svc("reset", 900), snat(svc("api", 100), 200)}
	after := []api.Service{svc("web", 3000, be("10.1.0.11:80", 2100), be("10.1.0.12:80", 900), be("10.1.0.13:80", 0)), svc("new", 7), svc("reset", 10), snat(svc("api", 300), 600)}
	rates := serviceRates(before, after, 2*time.Second)
	want := []ServiceRates{
		{Name: "web", Frontend: "10.0.0.10:80/tcp", Rates: Rates{100, 1000, 100000, 0, 0}, Backends: map[string]Rates{
			"10.1.0.11:80": {75, 750, 75000, 0, 0}, "10.1.0.12:80": {25, 250, 25000, 0, 0}}},
		{Name: "reset", Frontend: "10.0.0.10:80/tcp", Rates: Rates{}, Backends: map[string]Rates{}},
		{Name: "api", Frontend: "10.0.0.10:80/tcp", Rates: Rates{10, 100, 10000, 200, 200000}, Backends: map[string]Rates{}},
	}
	if fmt.Sprint(rates) != fmt.Sprint(want) {
		t.Errorf("rates\n got %+v\nwant %+v", rates, want)
	}
	var out bytes.Buffer
	if err := printServiceRates(&out, after, rates); err != nil {
		t.Fatal(err)
	}
	wantTable := `SERVICE / BACKEND  FRONTEND          CONNS/S  PKTS/S  BYTES/S  REPLY PKTS/S  REPLY BYTES/S
web                10.0.0.10:80/tcp  100.0    1000.0  100000   -             -
  -> 10.1.0.11:80                    75.0     750.0   75000    -             -
  -> 10.1.0.12:80                    25.0     250.0   25000    -             -
reset              10.0.0.10:80/tcp  0.0      0.0     0        -             -
api                10.0.0.10:80/tcp  10.0     100.0   10000    200.0         200000
`
	if out.String() != wantTable {
		t.Errorf("table:\n%s\nwant:\n%s", out.String(), wantTable)
	}
}
