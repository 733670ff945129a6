// SPDX-License-Identifier: Apache-2.0

package daemon

import (
	"strings"
	"testing"
)

// A service whose maps could not be written back publishes a fingerprint
// no box computes from its configuration, stable while the maps stay as
// they are, so the fleet check names it on every pass until it is fixed.
func TestDriftFingerprint(t *testing.T) {
	fp := "3f2a9c01d4e5"
	a := driftFingerprint(fp, "maglev: 14 slots changed")
	if a == fp || !strings.HasPrefix(a, "drift-") {
		t.Errorf("drift fingerprint %q: want one that differs from %q and says drift", a, fp)
	}
	if again := driftFingerprint(fp, "maglev: 14 slots changed"); again != a {
		t.Errorf("not stable: %q then %q", a, again)
	}
	if other := driftFingerprint(fp, "services: no entry"); other == a {
		t.Errorf("two different drifts share fingerprint %q", a)
	}
}
