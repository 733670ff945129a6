// SPDX-License-Identifier: Apache-2.0

package bfd

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"time"
)

// State is a BFD session state; the values are the ones on the wire.
type State uint8

// The session states of RFC 5880 section 4.1.
const (
	AdminDown State = 0
	Down      State = 1
	Init      State = 2
	Up        State = 3
)

// String returns the name l4lbctl and the metrics use.
func (s State) String() string {
	switch s {
	case AdminDown:
		return "admin_down"
	case Down:
		return "down"
	case Init:
		return "init"
	case Up:
		return "up"
	}
	return fmt.Sprintf("state(%d)", uint8(s))
}

// Local diagnostic codes (RFC 5880 section 4.1) that this package sets.
const (
	diagNone         uint8 = 0
	diagTimeExpired  uint8 = 1
	diagNeighborDown uint8 = 3
	diagAdminDown    uint8 = 7
)

// packetLen is the length of a control packet without authentication, the
// only kind this package sends or accepts.
const packetLen = 24

// packet is one BFD control packet. Intervals are kept in microseconds, as
// on the wire, so that a decoded packet encodes to the same bytes.
type packet struct {
	version    uint8
	diag       uint8
	state      State
	poll       bool
	final      bool
	cpi        bool // control plane independent
	auth       bool
	demand     bool
	multipoint bool
	detectMult uint8
	length     uint8
	myDiscr    uint32
	yourDiscr  uint32
	minTx      uint32 // Desired Min TX Interval, µs
	minRx      uint32 // Required Min RX Interval, µs
	minEchoRx  uint32 // Required Min Echo RX Interval, µs
}

// Bits of the second byte, after the two state bits.
const (
	bitPoll       = 1 << 5
	bitFinal      = 1 << 4
	bitCPI        = 1 << 3
	bitAuth       = 1 << 2
	bitDemand     = 1 << 1
	bitMultipoint = 1 << 0
)

// appendTo appends the packet's 24 bytes to b. The version and length
// fields are written as they are, so that tests can build invalid packets.
func (p *packet) appendTo(b []byte) []byte {
	flags := byte(p.state&3) << 6
	for _, f := range []struct {
		set bool
		bit byte
	}{{p.poll, bitPoll}, {p.final, bitFinal}, {p.cpi, bitCPI}, {p.auth, bitAuth}, {p.demand, bitDemand}, {p.multipoint, bitMultipoint}} {
		if f.set {
			flags |= f.bit
		}
	}
	b = append(b, p.version<<5|p.diag&0x1f, flags, p.detectMult, p.length)
	for _, v := range []uint32{p.myDiscr, p.yourDiscr, p.minTx, p.minRx, p.minEchoRx} {
		b = binary.BigEndian.AppendUint32(b, v)
	}
	return b
}

// Reasons to discard a received packet (RFC 5880 section 6.8.6, and what
// this implementation does not support).
var (
	errShort      = errors.New("shorter than a control packet")
	errVersion    = errors.New("version is not 1")
	errLength     = errors.New("length field below 24 or beyond the payload")
	errDetectMult = errors.New("detect multiplier is zero")
	errMultipoint = errors.New("multipoint bit set")
	errMyDiscr    = errors.New("my discriminator is zero")
	errAuth       = errors.New("authentication bit set (not supported)")
)

// parse decodes and validates a control packet as section 6.8.6 requires
// before any session is looked up.
func parse(b []byte) (packet, error) {
	if len(b) < packetLen {
		return packet{}, errShort
	}
	p := packet{
		version:    b[0] >> 5,
		diag:       b[0] & 0x1f,
		state:      State(b[1] >> 6),
		poll:       b[1]&bitPoll != 0,
		final:      b[1]&bitFinal != 0,
		cpi:        b[1]&bitCPI != 0,
		auth:       b[1]&bitAuth != 0,
		demand:     b[1]&bitDemand != 0,
		multipoint: b[1]&bitMultipoint != 0,
		detectMult: b[2],
		length:     b[3],
		myDiscr:    binary.BigEndian.Uint32(b[4:]),
		yourDiscr:  binary.BigEndian.Uint32(b[8:]),
		minTx:      binary.BigEndian.Uint32(b[12:]),
		minRx:      binary.BigEndian.Uint32(b[16:]),
		minEchoRx:  binary.BigEndian.Uint32(b[20:]),
	}
	switch {
	case p.version != 1:
		return p, errVersion
	case int(p.length) < packetLen || int(p.length) > len(b):
		return p, errLength
	case p.detectMult == 0:
		return p, errDetectMult
	case p.multipoint:
		return p, errMultipoint
	case p.myDiscr == 0:
		return p, errMyDiscr
	case p.auth:
		return p, errAuth
	}
	return p, nil
}

// micros converts an interval to the wire's microseconds, saturating
// rather than wrapping: an interval beyond 71 minutes is a configuration
// error that Add rejects, and a wrapped value would be a short one.
func micros(d time.Duration) uint32 {
	us := d.Microseconds()
	if us > math.MaxUint32 {
		return math.MaxUint32
	}
	return uint32(max(us, 0))
}

// duration converts the wire's microseconds to an interval.
func duration(us uint32) time.Duration {
	return time.Duration(us) * time.Microsecond
}
