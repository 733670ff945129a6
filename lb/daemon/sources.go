// SPDX-License-Identifier: Apache-2.0

package daemon

import (
	"context"
	"sync"
	"time"

	"github.com/l4lb/l4lb/discovery"
	"github.com/l4lb/l4lb/lb/api"
)

// runner runs one discovery source that watches something outside l4lbd
// (Consul, Kubernetes) and forwards its snapshots to the control loop.
type runner struct {
	out    chan discovery.Snapshot
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup // Run and the forwarder
}

func newRunner(parent context.Context) *runner {
	ctx, cancel := context.WithCancel(parent)
	return &runner{out: make(chan discovery.Snapshot), ctx: ctx, cancel: cancel}
}

func (r *runner) run(src discovery.Source) {
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		_ = src.Run(r.ctx, r.out)
	}()
}

// first waits up to wait for the source's first snapshot. A start waits
// for it before programming the datapath: after a restart the pinned maps
// still hold the source's services, and programming without them would
// withdraw them until the source answers.
func (r *runner) first(ctx context.Context, wait time.Duration) (discovery.Snapshot, bool) {
	select {
	case snap := <-r.out:
		return snap, true
	case <-time.After(wait):
	case <-ctx.Done():
	}
	return discovery.Snapshot{}, false
}

// forward passes the source's snapshots to the control loop until stopped.
func (r *runner) forward(to chan<- discovery.Snapshot) {
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		for {
			select {
			case snap := <-r.out:
				select {
				case to <- snap:
				case <-r.ctx.Done():
					return
				}
			case <-r.ctx.Done():
				return
			}
		}
	}()
}

// stop ends the source and the forwarder, and waits for both.
func (r *runner) stop() {
	r.cancel()
	r.wg.Wait()
}

// dropSnapshots takes what is queued for the control loop and applies all
// but the stopped source's snapshots, which must not bring its services
// back after the merger forgot them.
func (d *Daemon) dropSnapshots(source string) {
	for {
		select {
		case snap := <-d.snaps:
			if snap.Source != source {
				d.merger.Update(snap)
			}
		default:
			return
		}
	}
}

// discoveryStatus reports the sources that can go stale.
func (d *Daemon) discoveryStatus() []api.SourceStatus {
	now := time.Now()
	return append(d.consulStatus(now), d.kubernetesStatus(now)...)
}
