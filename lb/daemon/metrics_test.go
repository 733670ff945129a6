// SPDX-License-Identifier: Apache-2.0

package daemon

import (
	"errors"
	"testing"

	"github.com/l4lb/l4lb/lb"
	"github.com/l4lb/l4lb/lb/metrics"
)

func TestMapFullRefusals(t *testing.T) {
	err := errors.Join(
		errors.New(`service "c": backend map full (max_backends = 4); raise datapath.max_backends`),
		errors.New(`service "d": SetTable 3: operation not permitted; the next reconcile retries`),
		errors.New(`service "e": service map full (max_services = 2); raise datapath.max_services`),
	)
	desired := []lb.Service{{Name: "c", Source: "file:x"}, {Name: "e", Source: "consul"}}
	got := mapFull(err, desired)
	want := []metrics.Refusal{
		{Service: "c", Source: "file:x", Reason: metrics.RefusedMapFull},
		{Service: "e", Source: "consul", Reason: metrics.RefusedMapFull},
	}
	if len(got) != len(want) || got[0] != want[0] || got[1] != want[1] {
		t.Fatalf("got %+v, want %+v", got, want)
	}
	if mapFull(nil, desired) != nil {
		t.Fatal("no error, no refusal")
	}
}
