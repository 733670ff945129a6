// SPDX-License-Identifier: Apache-2.0

package daemon

import (
	"context"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/l4lb/l4lb/lb"
	"github.com/l4lb/l4lb/lb/config"
	"github.com/l4lb/l4lb/lb/datapath"
	"github.com/l4lb/l4lb/lb/ipfix"
	"github.com/l4lb/l4lb/lb/metrics"
	"github.com/l4lb/l4lb/lb/reconciler"
)

// ipfixRun is the running flow export: a scan of the connection table
// every ipfix.scan_interval, its records sent to the collectors.
type ipfixRun struct {
	exp     *ipfix.Exporter
	tracker *ipfix.Tracker
	records [ipfix.EventEnded + 1]atomic.Uint64
	// tracked, untracked and scanNanos are the latest scan's, for metrics.
	tracked   atomic.Int64
	untracked atomic.Uint64
	scanNanos atomic.Int64
}

// startIPFIX starts the export when [ipfix] is set. Its settings apply
// until a restart.
func (d *Daemon) startIPFIX(ctx context.Context, wg *sync.WaitGroup, cfg *config.Config) error {
	x := cfg.IPFIX
	if x == nil {
		return nil
	}
	exp, err := ipfix.NewExporter(ipfix.ExporterConfig{
		Collectors: x.Collectors, TemplateRefresh: x.TemplateRefresh,
		ObservationDomain: x.ObservationDomain, Enterprise: x.EnterpriseNumber, Counts: x.Counts,
	})
	if err != nil {
		return err
	}
	r := &ipfixRun{exp: exp, tracker: ipfix.NewTracker(ipfix.TrackerConfig{
		ActiveTimeout: x.ActiveTimeout, IdleTimeout: x.IdleTimeout, Sampling: x.Sampling, MaxFlows: x.MaxFlows,
	})}
	d.ipfix = r
	wg.Add(1)
	go func() {
		defer wg.Done()
		defer exp.Close()
		t := time.NewTicker(x.ScanInterval)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case now := <-t.C:
				d.ipfixScan(r, now)
			}
		}
	}()
	d.log.Info("IPFIX export started", "collectors", x.Collectors, "scan_interval", x.ScanInterval, "sampling", x.Sampling)
	return nil
}

// ipfixScan walks the connection table once and sends what changed.
func (d *Daemon) ipfixScan(r *ipfixRun, now time.Time) {
	v := d.view.Load()
	names := namesOf(viewFlowServices(v))
	modes := map[reconciler.ServiceID]string{}
	for _, svc := range v.Services.All() {
		if id := v.programmedOf(svc.Frontend).ID; id != 0 {
			modes[id] = modeName(svc)
		}
	}
	start := time.Now()
	recs, untracked, err := r.tracker.Scan(now, func(yield func(ipfix.Flow) bool) error {
		return d.dp.Flows(datapath.FlowFilter{Counts: true}, func(fl datapath.Flow) bool {
			f := ipfix.Flow{
				Client:   fl.Client,
				VIP:      netip.AddrPortFrom(fl.Frontend.Addr, fl.Frontend.Port),
				Proto:    uint8(fl.Frontend.Proto),
				SNAT:     fl.SNAT,
				Service:  names.services[fl.Service],
				Mode:     modes[fl.Service],
				LastSeen: now.Add(-fl.Age),
				Closing:  fl.State == datapath.FlowClosing,
				Packets:  fl.Packets,
				Bytes:    fl.Bytes,
			}
			if be, ok := names.backends[fl.Backend]; ok && names.owner[fl.Backend] == fl.Service {
				f.Backend = be
			}
			return yield(f)
		})
	})
	r.scanNanos.Store(int64(time.Since(start)))
	r.tracked.Store(int64(r.tracker.Tracked()))
	r.untracked.Add(uint64(untracked))
	if err != nil {
		d.log.Warn("IPFIX: could not read the whole connection table; flows not reached are kept until the next scan", "error", err)
	}
	var done []datapath.FlowID
	for _, rec := range recs {
		r.records[rec.Event].Add(1)
		if rec.Final() {
			done = append(done, datapath.FlowID{Client: rec.Client, Frontend: lb.Frontend{Addr: rec.VIP.Addr(), Port: rec.VIP.Port(), Proto: lb.Protocol(rec.Proto)}})
		}
	}
	// Their records are made: the counters go, so that the datapath's
	// table holds the flows still reported.
	if err := d.dp.ForgetFlowCounts(done); err != nil {
		d.log.Warn("IPFIX: counters of ended flows not deleted; the table's LRU drops them when it needs room", "error", err)
	}
	if err := r.exp.Export(now, recs); err != nil {
		d.log.Warn("IPFIX: records not sent", "error", err)
	}
}

// modeName is how records name a service's forwarding: snat, or dsr and
// its dispatch.
func modeName(svc lb.Service) string {
	m := svc.ModeFor(svc.Frontend.Proto)
	if m == lb.ModeDSR {
		return m.String() + "/" + svc.Dispatch.String()
	}
	return m.String()
}

// ipfixMetrics is the export's part of a metrics snapshot; nil when off.
func (d *Daemon) ipfixMetrics() *metrics.IPFIX {
	r := d.ipfix
	if r == nil {
		return nil
	}
	out := &metrics.IPFIX{
		Records:     map[string]uint64{},
		Tracked:     int(r.tracked.Load()),
		Untracked:   r.untracked.Load(),
		ScanSeconds: time.Duration(r.scanNanos.Load()).Seconds(),
	}
	for ev := ipfix.EventCreated; ev <= ipfix.EventEnded; ev++ {
		out.Records[ev.String()] = r.records[ev].Load()
	}
	for _, c := range r.exp.Stats() {
		out.Collectors = append(out.Collectors, metrics.IPFIXCollector{Address: c.Collector, Sent: c.Sent, Dropped: c.Dropped})
	}
	return out
}
