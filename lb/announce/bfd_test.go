// SPDX-License-Identifier: Apache-2.0

package announce

import (
	"net/netip"
	"testing"
	"time"

	"github.com/l4lb/l4lb/lb/config"
)

// TestPeerOfBFD checks what gobgp gets for [bgp.peer.bfd]: intervals in
// microseconds, and no BFD at all for a peer without the table.
func TestPeerOfBFD(t *testing.T) {
	s := &Speaker{}
	p := config.BGPPeer{Address: netip.MustParseAddr("192.0.2.1"), ASN: 65000, IPv4: true,
		BFD: config.BFD{Enabled: true, DetectMultiplier: 4, MinRxInterval: 250 * time.Millisecond, MinTxInterval: 1500 * time.Microsecond}}
	b := s.peerOf(p).GetBfd()
	if !b.GetEnabled() || b.GetDetectionMultiplier() != 4 || b.GetRequiredMinimumReceive() != 250000 || b.GetDesiredMinimumTxInterval() != 1500 || b.GetPort() != 0 {
		t.Errorf("BFD of the gobgp peer: %+v, want enabled, 4 x 250000 µs rx, 1500 µs tx, default port", b)
	}
	p.BFD = config.BFD{}
	if b := s.peerOf(p).GetBfd(); b != nil {
		t.Errorf("peer without [bgp.peer.bfd] has BFD %+v", b)
	}
}
