// SPDX-License-Identifier: Apache-2.0

// Package reset empties the maps that a control-plane pass fills and
// forgets again (the reconciler's per-pass sets, a source's dirty set).
// Its one job is the cost of emptying: a Go map keeps the room it once
// grew to, and walking or clearing it costs that room, not its entries.
// After a pass over 100,000 services, every later pass over one service
// would otherwise pay for 100,000.
package reset

// Map returns m without entries: m itself cleared, or a new map when m
// grew large, so that its room goes with it.
func Map[M ~map[K]V, K comparable, V any](m M) M {
	if len(m) > 1024 {
		return make(M)
	}
	clear(m)
	return m
}
