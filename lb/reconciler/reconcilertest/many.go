// SPDX-License-Identifier: Apache-2.0

package reconcilertest

import (
	"fmt"
	"net/netip"

	"github.com/l4lb/l4lb/lb"
)

// Many is n services named s000000… of m backends each (weight 1), on
// distinct VIPs in 10/8 and backends in 11/8: the shape the control-plane
// benchmarks use at 1,000 to 100,000 services.
func Many(n, m int) []lb.Service {
	svcs := make([]lb.Service, n)
	for i := range svcs {
		s := lb.Service{Name: fmt.Sprintf("s%06d", i), Frontend: lb.Frontend{Addr: netip.AddrFrom4([4]byte{10, byte(i >> 16), byte(i >> 8), byte(i)}), Port: 80, Proto: lb.TCP}}
		for j := range m {
			s.Backends = append(s.Backends, lb.Backend{Addr: netip.AddrPortFrom(netip.AddrFrom4([4]byte{11, byte(i >> 16), byte(i >> 8), byte(i)}), uint16(8000+j)), Weight: 1})
		}
		svcs[i] = s
	}
	return svcs
}
