// SPDX-License-Identifier: Apache-2.0

package bfd

import (
	"encoding/binary"
	"errors"
	"testing"
	"time"
)

func TestPacketEncodeDecode(t *testing.T) {
	full := validPacket()
	full.diag = diagNeighborDown
	full.state = Up
	full.poll, full.final, full.cpi, full.demand = true, true, true, true
	full.detectMult = 7
	full.yourDiscr = 0x01020304
	full.minEchoRx = 1234

	tests := []struct {
		name string
		p    packet
		// Fields checked at their RFC 5880 section 4.1 offsets.
		byte0, byte1 byte
	}{
		{"down, no flags", validPacket(), 1 << 5, byte(Down) << 6},
		{"every flag but A and M", full, 1<<5 | diagNeighborDown, byte(Up)<<6 | bitPoll | bitFinal | bitCPI | bitDemand},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := tt.p.appendTo(nil)
			if len(b) != packetLen {
				t.Fatalf("encoded length %d, want %d", len(b), packetLen)
			}
			if b[0] != tt.byte0 || b[1] != tt.byte1 {
				t.Errorf("first bytes %08b %08b, want %08b %08b", b[0], b[1], tt.byte0, tt.byte1)
			}
			if b[2] != tt.p.detectMult || b[3] != packetLen {
				t.Errorf("detect mult %d length %d, want %d %d", b[2], b[3], tt.p.detectMult, packetLen)
			}
			for _, f := range []struct {
				off  int
				want uint32
			}{{4, tt.p.myDiscr}, {8, tt.p.yourDiscr}, {12, tt.p.minTx}, {16, tt.p.minRx}, {20, tt.p.minEchoRx}} {
				if got := binary.BigEndian.Uint32(b[f.off:]); got != f.want {
					t.Errorf("word at %d = %d, want %d", f.off, got, f.want)
				}
			}
			got, err := parse(b)
			if err != nil {
				t.Fatalf("parse: %v", err)
			}
			if got != tt.p {
				t.Errorf("round trip:\n got %+v\nwant %+v", got, tt.p)
			}
		})
	}
}

func TestPacketParseRejects(t *testing.T) {
	tests := []struct {
		name   string
		mutate func(*packet)
		extra  int // bytes appended after the packet
		want   error
	}{
		{"version 0", func(p *packet) { p.version = 0 }, 0, errVersion},
		{"version 2", func(p *packet) { p.version = 2 }, 0, errVersion},
		{"length 23", func(p *packet) { p.length = 23 }, 0, errLength},
		{"length beyond payload", func(p *packet) { p.length = 26 }, 1, errLength},
		{"detect mult 0", func(p *packet) { p.detectMult = 0 }, 0, errDetectMult},
		{"multipoint", func(p *packet) { p.multipoint = true }, 0, errMultipoint},
		{"my discr 0", func(p *packet) { p.myDiscr = 0 }, 0, errMyDiscr},
		{"auth", func(p *packet) { p.auth = true; p.length = 26 }, 2, errAuth},
		{"length within payload", func(p *packet) { p.length = 26 }, 2, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := validPacket()
			tt.mutate(&p)
			b := append(p.appendTo(nil), make([]byte, tt.extra)...)
			if _, err := parse(b); !errors.Is(err, tt.want) {
				t.Errorf("parse: %v, want %v", err, tt.want)
			}
		})
	}
	p := validPacket()
	if _, err := parse(p.appendTo(nil)[:packetLen-1]); !errors.Is(err, errShort) {
		t.Errorf("parse of 23 bytes: %v, want %v", err, errShort)
	}
}

func TestIntervalsOnTheWire(t *testing.T) {
	tests := []struct {
		d    time.Duration
		want uint32
	}{
		{50 * time.Millisecond, 50000},
		{time.Second, 1000000},
		{-time.Second, 0},
		{2 * time.Hour, 1<<32 - 1},
	}
	for _, tt := range tests {
		if got := micros(tt.d); got != tt.want {
			t.Errorf("micros(%v) = %d, want %d", tt.d, got, tt.want)
		}
	}
	if got := duration(1500); got != 1500*time.Microsecond {
		t.Errorf("duration(1500) = %v", got)
	}
}

func TestStateString(t *testing.T) {
	for s, want := range map[State]string{AdminDown: "admin_down", Down: "down", Init: "init", Up: "up", 4: "state(4)"} {
		if got := s.String(); got != want {
			t.Errorf("State(%d).String() = %q, want %q", s, got, want)
		}
	}
}
