// SPDX-License-Identifier: Apache-2.0

package maglev

import (
	"encoding/binary"
	"net/netip"
)

// Flow is the 5-tuple of a packet as the datapath sees it on the way in:
// Src is the client, Dst the VIP. Ports are host-order numbers; the flow key
// stores them big endian, as they appear on the wire.
type Flow struct {
	Src, Dst         netip.Addr
	SrcPort, DstPort uint16
	Proto            uint8
}

// FlowKey returns the 40-byte hash input of f laid out as the package
// documentation specifies (the MUST NOT CHANGE wire contract). An invalid
// (zero) address encodes as 16 zero bytes.
func FlowKey(f Flow) [40]byte {
	var k [40]byte
	src := f.Src.As16()
	dst := f.Dst.As16()
	copy(k[0:16], src[:])
	copy(k[16:32], dst[:])
	binary.BigEndian.PutUint16(k[32:34], f.SrcPort)
	binary.BigEndian.PutUint16(k[34:36], f.DstPort)
	k[36] = f.Proto
	return k
}

// FlowHash returns SipHash24(seed, FlowKey(f)), the value the datapath
// computes for a packet of f.
func FlowHash(seed Seed, f Flow) uint64 {
	k := FlowKey(f)
	return SipHash24(seed, k[:])
}

// Slot returns the table slot of a flow hash in a table of size m: the
// 64-bit remainder hash % m. The datapath uses the same 64-bit modulo, so
// no high bits of the hash are dropped first.
func Slot(hash uint64, m uint32) uint32 {
	return uint32(hash % uint64(m))
}

// Lookup returns the backend index for f in a table built with the same seed,
// or -1 when the table is empty (no eligible backend).
func Lookup(seed Seed, table []int32, f Flow) int32 {
	if len(table) == 0 {
		return -1
	}
	return table[Slot(FlowHash(seed, f), uint32(len(table)))]
}
