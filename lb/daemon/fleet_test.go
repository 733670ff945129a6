// SPDX-License-Identifier: Apache-2.0

package daemon

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"reflect"
	"testing"

	"github.com/l4lb/l4lb/lb"
	"github.com/l4lb/l4lb/lb/fleet"
	"github.com/l4lb/l4lb/lb/plan"
)

// TestFleetPatchEqualsFull: the fleet record patched for the services of a
// pass over a few services equals the record made from every service,
// over random services that lose and regain their table and change their
// fingerprint.
func TestFleetPatchEqualsFull(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	const n = 50
	svcs := make([]lb.Service, n)
	programmed := map[lb.Frontend]*plan.Programmed{}
	randomize := func(i int) {
		s := lb.Service{Name: fmt.Sprintf("s%d", i), Frontend: lb.Frontend{Addr: netip.AddrFrom4([4]byte{192, 0, 2, byte(i)}), Port: 80, Proto: lb.TCP}}
		svcs[i] = s
		ps := &plan.Programmed{}
		if rng.IntN(4) != 0 {
			ps.Fingerprint = fmt.Sprintf("fp%d", rng.IntN(3))
		}
		programmed[s.Frontend] = ps
	}
	viewOf := func() *view { return testView(svcs, programmed, nil) }
	var last fleet.Box
	randomSteps(rng, n, randomize, func(i int) string { return svcs[i].Name }, func(step int, changed []string) {
		v := viewOf()
		if changed == nil {
			last = fleet.Box{Name: "box", Services: fleetServices(v, nil)}
			return
		}
		got, same := fleetPatch(last, v, changed)
		want := fleetServices(v, nil)
		if !reflect.DeepEqual(got.Services, want) {
			t.Fatalf("step %d, %v changed:\ngot  %v\nwant %v", step, changed, got.Services, want)
		}
		if same != reflect.DeepEqual(last.Services, want) {
			t.Fatalf("step %d: same = %v, but the records are %v and %v", step, same, last.Services, want)
		}
		last = got
	})
}
