// SPDX-License-Identifier: Apache-2.0

package maglev

import (
	"encoding/hex"
	"net/netip"
	"strings"
	"testing"
)

// TestFlowKeyLayout pins the 40-byte layout byte by byte, written out by
// hand from the package documentation rather than from the code.
func TestFlowKeyLayout(t *testing.T) {
	tests := []struct {
		name string
		f    Flow
		want string // hex, spaces for readability
	}{{
		name: "IPv4 TCP",
		f:    Flow{Src: netip.MustParseAddr("192.0.2.10"), Dst: netip.MustParseAddr("198.51.100.1"), SrcPort: 40000, DstPort: 443, Proto: 6},
		want: "00000000000000000000ffff c000020a" + // src ::ffff:192.0.2.10
			"00000000000000000000ffff c6336401" + // dst ::ffff:198.51.100.1
			"9c40 01bb 06 000000", // ports 40000 and 443 big endian, proto, pad
	}, {
		name: "IPv6 UDP",
		f:    Flow{Src: netip.MustParseAddr("2001:db8::1"), Dst: netip.MustParseAddr("2001:db8:1::abcd"), SrcPort: 53, DstPort: 5353, Proto: 17},
		want: "20010db8000000000000000000000001" +
			"20010db8000100000000000000 00abcd" +
			"0035 14e9 11 000000",
	}, {
		name: "zone ignored, ICMP without ports",
		f:    Flow{Src: netip.MustParseAddr("fe80::1%eth0"), Dst: netip.MustParseAddr("fe80::2"), Proto: 58},
		want: "fe800000000000000000000000000001" +
			"fe800000000000000000000000000002" +
			"0000 0000 3a 000000",
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			k := FlowKey(tt.f)
			want := strings.ReplaceAll(tt.want, " ", "")
			if got := hex.EncodeToString(k[:]); got != want {
				t.Errorf("FlowKey:\n got %s\nwant %s", got, want)
			}
			if got, want := FlowHash(testSeed, tt.f), SipHash24(testSeed, k[:]); got != want {
				t.Errorf("FlowHash = %#x, SipHash24 of the key = %#x", got, want)
			}
		})
	}
}

// TestFlowMappedIPv4 checks that an IPv4 flow hashes like its IPv4-mapped
// IPv6 spelling, since the datapath builds the key in mapped form.
func TestFlowMappedIPv4(t *testing.T) {
	v4 := Flow{Src: netip.MustParseAddr("10.1.2.3"), Dst: netip.MustParseAddr("10.0.0.10"), SrcPort: 1234, DstPort: 80, Proto: 6}
	v6 := v4
	v6.Src = netip.AddrFrom16(v4.Src.As16())
	v6.Dst = netip.AddrFrom16(v4.Dst.As16())
	if FlowHash(testSeed, v4) != FlowHash(testSeed, v6) {
		t.Errorf("IPv4 flow and its IPv4-mapped spelling hash differently")
	}
	other := v4
	other.SrcPort++
	if FlowHash(testSeed, v4) == FlowHash(testSeed, other) {
		t.Errorf("changing the source port did not change the hash")
	}
	reseeded := testSeed
	reseeded[15] ^= 1
	if FlowHash(testSeed, v4) == FlowHash(reseeded, v4) {
		t.Errorf("changing the seed did not change the hash")
	}
}

func TestSlot(t *testing.T) {
	tests := []struct {
		hash uint64
		m    uint32
		want uint32
	}{
		{0, 7, 0},
		{6, 7, 6},
		{7, 7, 0},
		// The full 64 bits take part: 2^64-1 = 7 * 2635249153387078802 + 1.
		{^uint64(0), 7, 1},
		{1 << 32, 65521, uint32((uint64(1) << 32) % 65521)},
	}
	for _, tt := range tests {
		if got := Slot(tt.hash, tt.m); got != tt.want {
			t.Errorf("Slot(%#x, %d) = %d, want %d", tt.hash, tt.m, got, tt.want)
		}
	}
}

func TestLookup(t *testing.T) {
	bs := makeBackends(5)
	table, err := Build(testSeed, 251, bs)
	if err != nil {
		t.Fatal(err)
	}
	f := Flow{Src: netip.MustParseAddr("192.0.2.1"), Dst: netip.MustParseAddr("10.0.0.10"), SrcPort: 5555, DstPort: 80, Proto: 6}
	want := table[FlowHash(testSeed, f)%251]
	if got := Lookup(testSeed, table, f); got != want {
		t.Errorf("Lookup = %d, want table[hash %% 251] = %d", got, want)
	}
	if got := Lookup(testSeed, nil, f); got != -1 {
		t.Errorf("Lookup in an empty table = %d, want -1", got)
	}
}
