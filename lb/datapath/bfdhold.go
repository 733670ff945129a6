// SPDX-License-Identifier: Apache-2.0

package datapath

import (
	"errors"
	"fmt"
	"net/netip"
	"time"

	"github.com/cilium/ebpf"

	"github.com/l4lb/l4lb/bpf"
	"github.com/l4lb/l4lb/lb/bfd"
)

// BFDHold is a BFD session held in the datapath (bpf/include/bfd.h), as
// read back by the next l4lbd: the session lb/bfd handed over, with the
// hold's deadline and what the datapath did meanwhile. The session's Local
// address is not kept (the answer goes out from the address the router
// sent to).
type BFDHold struct {
	bfd.Saved
	// Until is when the datapath stops answering.
	Until time.Time
	// Answered counts the control packets the datapath answered.
	Answered uint64
}

// errNoBFDHold is returned by an object without the bfd_hold map.
var errNoBFDHold = errors.New("datapath: this BPF object has no bfd_hold map (an object from before BFD holds)")

// HoldBFD has the datapath answer the routers' control packets of
// sessions for the next d, replacing what was held before. l4lbd calls it
// as it stops for a restart; the next l4lbd takes them back with HeldBFD
// and ReleaseBFD.
func (d *LB) HoldBFD(sessions []bfd.Saved, hold time.Duration) error {
	if d.bfdHold == nil {
		return errNoBFDHold
	}
	now, err := kernelNow()
	if err != nil {
		return err
	}
	if err := d.clearBFDHold(); err != nil {
		return err
	}
	for _, s := range sessions {
		k := bfdHoldKey(s.Peer)
		v := bpf.LbBfdHoldValue{
			Until:       now + uint64(hold),
			LocalDiscr:  s.LocalDiscr,
			RemoteDiscr: s.RemoteDiscr,
			MinTxUs:     uint32(s.MinTx / time.Microsecond),
			MinRxUs:     uint32(s.MinRx / time.Microsecond),
			SrcPort:     s.SrcPort,
			DetectMult:  s.DetectMultiplier,

			RemoteMinTxUs:    uint32(s.RemoteMinTx / time.Microsecond),
			RemoteMinRxUs:    uint32(s.RemoteMinRx / time.Microsecond),
			RemoteDetectMult: s.RemoteDetectMultiplier,
		}
		if err := d.bfdHold.Update(&k, &v, ebpf.UpdateAny); err != nil {
			return fmt.Errorf("datapath: hold the BFD session with %s: %w", s.Peer, err)
		}
	}
	return nil
}

// HeldBFD returns the sessions an earlier l4lbd left held whose deadline
// has not passed, with how many packets the datapath answered for each.
func (d *LB) HeldBFD() ([]BFDHold, error) {
	if d.bfdHold == nil {
		return nil, nil
	}
	now, err := kernelNow()
	if err != nil {
		return nil, err
	}
	wall := time.Now()
	var (
		out []BFDHold
		k   bpf.LbBfdHoldKey
		v   bpf.LbBfdHoldValue
	)
	it := d.bfdHold.Iterate()
	for it.Next(&k, &v) {
		if v.Until <= now {
			continue
		}
		out = append(out, BFDHold{
			Saved: bfd.Saved{
				Peer:             netip.AddrFrom16(k.Peer).Unmap(),
				LocalDiscr:       v.LocalDiscr,
				RemoteDiscr:      v.RemoteDiscr,
				SrcPort:          v.SrcPort,
				DetectMultiplier: v.DetectMult,
				MinTx:            time.Duration(v.MinTxUs) * time.Microsecond,
				MinRx:            time.Duration(v.MinRxUs) * time.Microsecond,

				RemoteDetectMultiplier: v.RemoteDetectMult,
				RemoteMinTx:            time.Duration(v.RemoteMinTxUs) * time.Microsecond,
				RemoteMinRx:            time.Duration(v.RemoteMinRxUs) * time.Microsecond,
			},
			Until:    wall.Add(time.Duration(v.Until - now)),
			Answered: v.Answered,
		})
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("datapath: read bfd_hold: %w", err)
	}
	return out, nil
}

// ReleaseBFD stops the datapath answering for peer, once l4lbd's own
// session sends, and returns how many packets it had answered.
func (d *LB) ReleaseBFD(peer netip.Addr) (answered uint64, err error) {
	if d.bfdHold == nil {
		return 0, nil
	}
	k := bfdHoldKey(peer)
	var v bpf.LbBfdHoldValue
	// LookupAndDelete: the count includes an answer sent meanwhile.
	if err := d.bfdHold.LookupAndDelete(&k, &v); err != nil {
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			return 0, nil
		}
		return 0, fmt.Errorf("datapath: release the BFD session with %s: %w", peer, err)
	}
	return v.Answered, nil
}

// bfdHoldKey is peer's key in bfd_hold (IPv4-mapped for IPv4, as the
// parser writes a packet's source).
func bfdHoldKey(peer netip.Addr) bpf.LbBfdHoldKey {
	return bpf.LbBfdHoldKey{Peer: peer.Unmap().As16()}
}

// clearBFDHold deletes every held session.
func (d *LB) clearBFDHold() error {
	var (
		k    bpf.LbBfdHoldKey
		keys []bpf.LbBfdHoldKey
	)
	var v bpf.LbBfdHoldValue
	it := d.bfdHold.Iterate()
	for it.Next(&k, &v) {
		keys = append(keys, k)
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("datapath: read bfd_hold: %w", err)
	}
	for _, k := range keys {
		if err := d.bfdHold.Delete(&k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return fmt.Errorf("datapath: clear bfd_hold: %w", err)
		}
	}
	return nil
}
