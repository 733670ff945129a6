// SPDX-License-Identifier: Apache-2.0

package metrics

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Values of the result label of l4lb_config_reloads_total.
const (
	resultSuccess = "success"
	resultFailure = "failure"
)

// ReconcileBuckets are the upper bounds of l4lb_reconcile_duration_seconds.
// An unchanged pass takes well under a millisecond and a backend change a
// few map writes; programming thousands of services with large Maglev
// tables (after a restart or a big reload) takes seconds, and anything past
// ten seconds is a problem worth its own bucket.
var ReconcileBuckets = []float64{0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30}

// Recorder holds the metrics of events that cannot be read back at scrape
// time: the daemon calls it as they happen. Its methods are safe for
// concurrent use, and a nil *Recorder ignores every call, so code paths
// (and tests) without metrics need no checks.
type Recorder struct {
	reconcileDuration prometheus.Histogram
	reconcileErrors   prometheus.Counter
	reloads           *prometheus.CounterVec
	lastReloadOK      prometheus.Gauge
	lastReloadSuccess prometheus.Gauge
	refusals          *prometheus.CounterVec
	drift             *prometheus.CounterVec
	driftUnrepaired   *prometheus.CounterVec
	checkLastPass     prometheus.Gauge
	checkPassDuration prometheus.Gauge
}

// DriftMaps are the values of the map label of l4lb_datapath_drift_total:
// the maps the self-check reads back (reconciler.Map*, and the maps the
// datapath fills from its own records: the frontend filter, the service
// words, next hops and backend routes, the box's addresses and MACs, the
// XDP transmit ports).
var DriftMaps = []string{"services", "src_ranges", "backends", "maglev", "vip_filter",
	"svc_gen", "nexthops", "backend_routes", "local_addrs", "ingress_macs", "tx_ports"}

// NewRecorder returns a Recorder; register it (NewRegistry does) to expose
// its metrics.
func NewRecorder() *Recorder {
	r := &Recorder{
		reconcileDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "l4lb_reconcile_duration_seconds",
			Help:    "Time a reconcile pass took: diffing the desired services against the datapath and writing the changes, failed passes included.",
			Buckets: ReconcileBuckets,
		}),
		reconcileErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "l4lb_reconcile_errors_total",
			Help: "Reconcile passes that failed; the daemon retries with backoff and the last good state keeps serving.",
		}),
		reloads: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "l4lb_config_reloads_total",
			Help: "Configuration reloads (SIGHUP or file change) by result: success, failure (the file was rejected and the previous configuration kept).",
		}, []string{labelResult}),
		lastReloadOK: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "l4lb_config_last_reload_successful",
			Help: "1 if the last configuration load succeeded, 0 if the file was rejected and an older configuration is serving.",
		}),
		lastReloadSuccess: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "l4lb_config_last_reload_success_timestamp_seconds",
			Help: "Unix time of the last successful configuration load (the initial one included).",
		}),
		refusals: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "l4lb_service_refusals_total",
			Help: "Times a service became refused by the datapath, by reason (unsupported, map_full, local_vip, cannot_work); l4lb_services_refused shows the services refused now.",
		}, []string{labelReason}),
		drift: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "l4lb_datapath_drift_total",
			Help: "Differences the self-check found between a control-plane map and what l4lbd programmed, by map (services, src_ranges, backends, maglev, vip_filter, svc_gen, nexthops, backend_routes, local_addrs, ingress_macs, tx_ports); l4lbd writes each back, and l4lb_datapath_drift_repair_failures_total counts those it could not.",
		}, []string{labelMap}),
		driftUnrepaired: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "l4lb_datapath_drift_repair_failures_total",
			Help: "Differences the self-check found but could not write back, by map; the next pass tries again.",
		}, []string{labelMap}),
		checkLastPass: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "l4lb_datapath_check_last_pass_timestamp_seconds",
			Help: "Unix time at which the last self-check pass over the datapath's maps finished.",
		}),
		checkPassDuration: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "l4lb_datapath_check_last_pass_seconds",
			Help: "Wall time of the last self-check pass, the rests that bound its CPU share included.",
		}),
	}
	// Known label values start at zero so rate() and absent-series alerts
	// work before the first event.
	r.reloads.WithLabelValues(resultSuccess)
	r.reloads.WithLabelValues(resultFailure)
	for _, reason := range refusalReasons {
		r.refusals.WithLabelValues(string(reason))
	}
	for _, m := range DriftMaps {
		r.drift.WithLabelValues(m)
		r.driftUnrepaired.WithLabelValues(m)
	}
	return r
}

func (r *Recorder) collectors() []prometheus.Collector {
	return []prometheus.Collector{r.reconcileDuration, r.reconcileErrors, r.reloads, r.lastReloadOK, r.lastReloadSuccess, r.refusals,
		r.drift, r.driftUnrepaired, r.checkLastPass, r.checkPassDuration}
}

// Describe implements prometheus.Collector.
func (r *Recorder) Describe(ch chan<- *prometheus.Desc) {
	for _, c := range r.collectors() {
		c.Describe(ch)
	}
}

// Collect implements prometheus.Collector.
func (r *Recorder) Collect(ch chan<- prometheus.Metric) {
	for _, c := range r.collectors() {
		c.Collect(ch)
	}
}

// ObserveReconcile records one reconcile pass that took d and ended with
// err (nil on success).
func (r *Recorder) ObserveReconcile(d time.Duration, err error) {
	if r == nil {
		return
	}
	r.reconcileDuration.Observe(d.Seconds())
	if err != nil {
		r.reconcileErrors.Inc()
	}
}

// ConfigLoaded records the configuration loaded at start: it sets the
// last-reload gauges without counting a reload, so that a fresh daemon does
// not look as if its last reload had failed.
func (r *Recorder) ConfigLoaded(at time.Time) {
	if r == nil {
		return
	}
	r.lastReloadOK.Set(1)
	r.lastReloadSuccess.Set(unixSeconds(at))
}

// ObserveReload records a configuration reload finished at at, with err
// the reason the file was rejected (nil on success).
func (r *Recorder) ObserveReload(at time.Time, err error) {
	if r == nil {
		return
	}
	if err != nil {
		r.reloads.WithLabelValues(resultFailure).Inc()
		r.lastReloadOK.Set(0)
		return
	}
	r.reloads.WithLabelValues(resultSuccess).Inc()
	r.lastReloadOK.Set(1)
	r.lastReloadSuccess.Set(unixSeconds(at))
}

// ServiceRefused records that a service became refused for reason. Call it
// when a service enters the refused set, not on every pass that still
// refuses it: the counter then tells how often services were turned away,
// independent of the retry rate.
func (r *Recorder) ServiceRefused(reason RefusalReason) {
	if r == nil {
		return
	}
	r.refusals.WithLabelValues(string(reason)).Inc()
}

// ObserveDrift records one difference the self-check found in map m, and
// whether writing it back failed.
func (r *Recorder) ObserveDrift(m string, failed bool) {
	if r == nil {
		return
	}
	r.drift.WithLabelValues(m).Inc()
	if failed {
		r.driftUnrepaired.WithLabelValues(m).Inc()
	}
}

// ObserveCheckPass records a self-check pass that finished at end and took
// took.
func (r *Recorder) ObserveCheckPass(end time.Time, took time.Duration) {
	if r == nil {
		return
	}
	r.checkLastPass.Set(unixSeconds(end))
	r.checkPassDuration.Set(took.Seconds())
}

func unixSeconds(t time.Time) float64 {
	return float64(t.UnixNano()) / 1e9
}
