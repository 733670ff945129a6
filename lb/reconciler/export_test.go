// SPDX-License-Identifier: Apache-2.0

package reconciler

// SetChunkLimits lowers the limits of one chunk of additions and changes,
// so tests can cross them with a handful of small services.
func (r *Reconciler) SetChunkLimits(tables, slots, services int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.maxTables, r.maxSlots, r.maxServices = tables, slots, services
}
