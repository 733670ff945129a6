// SPDX-License-Identifier: Apache-2.0

package bfd

import (
	"math/rand/v2"
	"net"
	"sync/atomic"
	"time"
)

// session is one BFD session. The fields after mu's comment are guarded by
// the Server's mu; the rest are set by Add and then only read, or are
// safe to use concurrently.
type session struct {
	cfg     Config
	conn    *net.UDPConn
	srcPort uint16
	// wake asks the session's goroutine to transmit now.
	wake chan struct{}
	// detect fires when the detection time passes without a packet;
	// detectAt says when that is, so that a firing raced by a packet
	// that rearmed it is recognised and ignored.
	detect         *time.Timer
	sent, received atomic.Uint64

	// Guarded by Server.mu.
	state       State
	diag        uint8
	since       time.Time
	transitions [4]uint64
	localDiscr  uint32
	remoteDiscr uint32
	remoteState State
	remoteMult  uint8
	remoteMinRx time.Duration
	remoteMinTx time.Duration
	// advTx and advRx are bfd.DesiredMinTxInterval and
	// bfd.RequiredMinRxInterval, the values sent to the peer. txInForce
	// and rxInForce are the ones this end acts on: they differ from the
	// advertised ones while a Poll sequence is in progress (polling),
	// since the peer may not have seen the new values yet.
	advTx, advRx         time.Duration
	txInForce, rxInForce time.Duration
	polling              bool
	// final asks for the next packet to carry the Final bit, the
	// answer to a received Poll.
	final    bool
	detectAt time.Time
	// removing counts the AdminDown packets still to send after Remove.
	removing int
}

func newSession(cfg Config, conn *net.UDPConn, port uint16) *session {
	ss := &session{
		cfg:     cfg,
		conn:    conn,
		srcPort: port,
		wake:    make(chan struct{}, 1),
		detect:  time.NewTimer(time.Hour),
		state:   Down,
		// Section 6.8.1: the peer's RequiredMinRx is taken as 1 µs
		// until it is heard, so the first packets go at our rate.
		remoteMinRx: time.Microsecond,
		remoteState: Down,
	}
	ss.detect.Stop()
	ss.slowDown()
	return ss
}

// resume restores the state a previous process saved, Up and with the
// timers the peer knows, then negotiates the configured ones if they
// differ.
func (ss *session) resume(r *Saved) {
	ss.state = Up
	ss.remoteState = Up
	ss.localDiscr, ss.remoteDiscr = r.LocalDiscr, r.RemoteDiscr
	ss.remoteMult, ss.remoteMinRx, ss.remoteMinTx = r.RemoteDetectMultiplier, r.RemoteMinRx, r.RemoteMinTx
	if ss.remoteMult == 0 || ss.remoteMinTx == 0 {
		// Saved without the peer's timers: time it by our own until
		// its first packet says (a detection time of 0 would expire
		// at once).
		ss.remoteMult, ss.remoteMinTx = ss.cfg.DetectMultiplier, ss.cfg.MinRx
	}
	if ss.remoteMinRx == 0 {
		// 0 would mean "send nothing"; the peer said otherwise before.
		ss.remoteMinRx = time.Microsecond
	}
	if r.MinTx > 0 && r.MinRx > 0 {
		ss.advTx, ss.advRx = r.MinTx, r.MinRx
		ss.txInForce, ss.rxInForce = r.MinTx, r.MinRx
	}
	ss.setTimers(ss.cfg.MinTx, ss.cfg.MinRx)
	ss.armDetect()
}

// saved returns what the next process needs to resume the session.
func (ss *session) saved() Saved {
	return Saved{
		Peer:                   ss.cfg.Peer,
		Local:                  ss.cfg.Local,
		LocalDiscr:             ss.localDiscr,
		RemoteDiscr:            ss.remoteDiscr,
		SrcPort:                ss.srcPort,
		DetectMultiplier:       ss.cfg.DetectMultiplier,
		MinRx:                  ss.advRx,
		MinTx:                  ss.advTx,
		RemoteDetectMultiplier: ss.remoteMult,
		RemoteMinRx:            ss.remoteMinRx,
		RemoteMinTx:            ss.remoteMinTx,
	}
}

// setTimers changes the advertised intervals of an Up session through a
// Poll sequence (RFC 5880 section 6.8.3): the peer acknowledges the new
// values with Final before this end transmits faster, and until then the
// detection time stays long enough for either value.
func (ss *session) setTimers(tx, rx time.Duration) {
	if tx == ss.advTx && rx == ss.advRx {
		return
	}
	ss.advTx, ss.advRx = tx, rx
	// Transmitting faster needs no acknowledgement (only a slower rate
	// must wait for the Final): the peer times us by the value we
	// advertise from the Poll on, and a lost Final must not leave us
	// sending slower than that.
	ss.txInForce = min(ss.txInForce, tx)
	ss.rxInForce = max(ss.rxInForce, rx)
	ss.polling = true
}

// pollDone ends a Poll sequence: the advertised values take force.
func (ss *session) pollDone() {
	ss.polling = false
	ss.txInForce, ss.rxInForce = ss.advTx, ss.advRx
}

// slowDown sets the timers of a session that is not Up: at most a packet
// a second (section 6.8.3), applied at once since the peer does not time
// a session that is not Up by them.
func (ss *session) slowDown() {
	ss.advTx = max(ss.cfg.MinTx, slowTx)
	ss.advRx = ss.cfg.MinRx
	ss.txInForce, ss.rxInForce = ss.advTx, ss.advRx
	ss.polling = false
}

// armDetect restarts the detection time: the peer's multiplier times the
// slower of what we accept and what it sends at (section 6.8.4).
func (ss *session) armDetect() {
	d := time.Duration(ss.remoteMult) * max(ss.rxInForce, ss.remoteMinTx)
	ss.detectAt = time.Now().Add(d)
	ss.detect.Reset(d)
}

// interval returns the wait before the next periodic packet: the slower
// of our rate and the peer's, less 0–25% jitter (10–25% with a detect
// multiplier of 1, so that one late packet never looks like silence),
// section 6.8.7.
func (ss *session) interval() time.Duration {
	base := max(ss.txInForce, ss.remoteMinRx)
	least := 75
	most := 100
	if ss.cfg.DetectMultiplier == 1 {
		most = 90
	}
	pct := least + rand.IntN(most-least+1)
	return base * time.Duration(pct) / 100
}

// packet returns the control packet describing the session now.
func (ss *session) packet() packet {
	return packet{
		version:    1,
		diag:       ss.wireDiag(),
		state:      ss.state,
		poll:       ss.polling,
		detectMult: ss.cfg.DetectMultiplier,
		length:     packetLen,
		myDiscr:    ss.localDiscr,
		yourDiscr:  ss.remoteDiscr,
		minTx:      micros(ss.advTx),
		minRx:      micros(ss.advRx),
	}
}

// wireDiag is the diagnostic sent to the peer: it explains the latest
// state change, and a change up needs no explaining.
func (ss *session) wireDiag() uint8 {
	if ss.state == Init || ss.state == Up {
		return diagNone
	}
	return ss.diag
}
