// SPDX-License-Identifier: Apache-2.0

package pkttest

import (
	"bytes"
	"encoding/binary"
	"testing"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"
)

// TestICMPError builds errors of both families and checks them with
// gopacket's own decoder and checksum code, then checks that
// ICMPChecksumValid notices a flipped bit.
func TestICMPError(t *testing.T) {
	for _, tt := range []struct {
		name string
		src  Packet
		typ  uint8
	}{
		{"IPv4", Packet{Src: src4, Dst: dst4}, ICMPv4DestUnreachable},
		{"IPv6", Packet{Src: src6, Dst: dst6}, ICMPv6PacketTooBig},
	} {
		t.Run(tt.name, func(t *testing.T) {
			quote := IPPacket(t, Build(t, tt.src))[:28]
			e := ICMPError{Src: tt.src.Dst.Addr(), Dst: tt.src.Src.Addr(), Type: tt.typ, Code: 4, Info: 1400, Quote: quote}
			frame := BuildICMPError(t, e)
			pkt := gopacket.NewPacket(frame, layers.LayerTypeEthernet, gopacket.Default)
			var (
				err    error
				res    gopacket.ChecksumVerificationResult
				header []byte
			)
			if l, ok := pkt.Layer(layers.LayerTypeICMPv4).(*layers.ICMPv4); ok {
				err, res = l.VerifyChecksum()
				header = l.Contents
			} else if l, ok := pkt.Layer(layers.LayerTypeICMPv6).(*layers.ICMPv6); ok {
				if err = l.SetNetworkLayerForChecksum(pkt.NetworkLayer()); err != nil {
					t.Fatal(err)
				}
				err, res = l.VerifyChecksum()
				header = l.Contents
			} else {
				t.Fatalf("gopacket finds no ICMP layer:\n%s", pkt.Dump())
			}
			if err != nil || !res.Valid {
				t.Errorf("gopacket: checksum %#04x is not valid (correct %#04x, err %v)", res.Actual, res.Correct, err)
			}
			if ok, carried, computed, err := ICMPChecksumValid(frame); !ok || err != nil {
				t.Errorf("ICMPChecksumValid: carried %#04x, computed %#04x, err %v", carried, computed, err)
			}
			if len(header) < 4 || header[0] != tt.typ || header[1] != 4 {
				t.Errorf("type/code %x, want %d/4", header, tt.typ)
			}
			l := MustLayout(t, frame)
			if got := binary.BigEndian.Uint32(frame[l.L4+4:]); got != 1400 {
				t.Errorf("info word %d, want 1400", got)
			}
			if got := frame[l.L4+8:]; !bytes.Equal(got, quote) {
				t.Errorf("quote %x, want %x", got, quote)
			}

			bad := bytes.Clone(frame)
			bad[len(bad)-1] ^= 0x40
			if ok, _, _, _ := ICMPChecksumValid(bad); ok {
				t.Error("ICMPChecksumValid accepts a message with a flipped bit")
			}
		})
	}
}

// TestCompletedChecksum checks the helper against the L4 checksum gopacket
// computes: completing a segment whose field holds the pseudo-header sum
// yields the full checksum.
func TestCompletedChecksum(t *testing.T) {
	frame := Build(t, Packet{Src: src4, Dst: dst4, Payload: []byte("some payload bytes")})
	l := MustLayout(t, frame)
	seg := bytes.Clone(frame[l.L4 : l.L3+l.L3Len])
	want := binary.BigEndian.Uint16(seg[16:])
	// The pseudo-header's sum (not complemented), as a sender leaving
	// the checksum partial puts it in the field.
	ip := frame[l.L3:]
	pseudo := fold(sum16(sum16(0, ip[12:20]), nil) + uint32(layers.IPProtocolTCP) + uint32(len(seg)))
	binary.BigEndian.PutUint16(seg[16:], pseudo)
	if got := CompletedChecksum(seg); got != want {
		t.Errorf("CompletedChecksum = %#04x, want gopacket's %#04x", got, want)
	}
}
