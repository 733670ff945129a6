// SPDX-License-Identifier: Apache-2.0

package plan

import (
	"errors"

	"github.com/l4lb/l4lb/lb"
	"github.com/l4lb/l4lb/lb/metrics"
	"github.com/l4lb/l4lb/lb/reconciler"
)

// mapFull lists the services a reconcile refused because a map is full.
func mapFull(err error, desired []lb.Service) []metrics.Refusal {
	if err == nil {
		return nil
	}
	sources := map[string]string{}
	for _, s := range desired {
		sources[s.Name] = s.Source
	}
	errs := []error{err}
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		errs = j.Unwrap()
	}
	var out []metrics.Refusal
	for _, e := range errs {
		var full *reconciler.MapFullError
		if errors.As(e, &full) {
			out = append(out, metrics.Refusal{Service: full.Service, Source: sources[full.Service], Reason: metrics.RefusedMapFull})
		}
	}
	return out
}
