// SPDX-License-Identifier: Apache-2.0

package consul

// WriteStats is what f has written to Consul so far: transactions, keys
// written or deleted, and bytes of values (before base64).
func (f *Fleet) WriteStats() (txns, keys, bytes int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.wrote.txns, f.wrote.keys, f.wrote.bytes
}
