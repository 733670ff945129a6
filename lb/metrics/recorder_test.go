// SPDX-License-Identifier: Apache-2.0

package metrics

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

func TestRecorderExactValues(t *testing.T) {
	rec := NewRecorder()
	rec.ConfigLoaded(syncTime)
	rec.ObserveReconcile(300*time.Microsecond, nil)
	rec.ObserveReconcile(20*time.Millisecond, nil)
	rec.ObserveReconcile(2*time.Second, errors.New("backend map full"))
	rec.ObserveReload(syncTime.Add(time.Minute), nil)
	rec.ObserveReload(syncTime.Add(2*time.Minute), errors.New("l4lb.toml:12: unknown key"))
	rec.ServiceRefused(RefusedMapFull)
	rec.ServiceRefused(RefusedMapFull)
	rec.ObserveDrift("maglev", false)
	rec.ObserveDrift("maglev", true)
	rec.ObserveDrift("services", false)
	rec.ObserveCheckPass(syncTime.Add(3*time.Minute), 1500*time.Millisecond)

	want := `
# HELP l4lb_datapath_check_last_pass_seconds Wall time of the last self-check pass, the rests that bound its CPU share included.
# TYPE l4lb_datapath_check_last_pass_seconds gauge
l4lb_datapath_check_last_pass_seconds 1.5
# HELP l4lb_datapath_check_last_pass_timestamp_seconds Unix time at which the last self-check pass over the datapath's maps finished.
# TYPE l4lb_datapath_check_last_pass_timestamp_seconds gauge
l4lb_datapath_check_last_pass_timestamp_seconds 1.7673232255e+09
# HELP l4lb_datapath_drift_repair_failures_total Differences the self-check found but could not write back, by map; the next pass tries again.
# TYPE l4lb_datapath_drift_repair_failures_total counter
l4lb_datapath_drift_repair_failures_total{map="backend_routes"} 0
l4lb_datapath_drift_repair_failures_total{map="backends"} 0
l4lb_datapath_drift_repair_failures_total{map="ingress_macs"} 0
l4lb_datapath_drift_repair_failures_total{map="local_addrs"} 0
l4lb_datapath_drift_repair_failures_total{map="maglev"} 1
l4lb_datapath_drift_repair_failures_total{map="nexthops"} 0
l4lb_datapath_drift_repair_failures_total{map="services"} 0
l4lb_datapath_drift_repair_failures_total{map="src_ranges"} 0
l4lb_datapath_drift_repair_failures_total{map="svc_gen"} 0
l4lb_datapath_drift_repair_failures_total{map="tx_ports"} 0
l4lb_datapath_drift_repair_failures_total{map="vip_filter"} 0
# HELP l4lb_datapath_drift_total Differences the self-check found between a control-plane map and what l4lbd programmed, by map (services, src_ranges, backends, maglev, vip_filter, svc_gen, nexthops, backend_routes, local_addrs, ingress_macs, tx_ports); l4lbd writes each back, and l4lb_datapath_drift_repair_failures_total counts those it could not.
# TYPE l4lb_datapath_drift_total counter
l4lb_datapath_drift_total{map="backend_routes"} 0
l4lb_datapath_drift_total{map="backends"} 0
l4lb_datapath_drift_total{map="ingress_macs"} 0
l4lb_datapath_drift_total{map="local_addrs"} 0
l4lb_datapath_drift_total{map="maglev"} 2
l4lb_datapath_drift_total{map="nexthops"} 0
l4lb_datapath_drift_total{map="services"} 1
l4lb_datapath_drift_total{map="src_ranges"} 0
l4lb_datapath_drift_total{map="svc_gen"} 0
l4lb_datapath_drift_total{map="tx_ports"} 0
l4lb_datapath_drift_total{map="vip_filter"} 0
# HELP l4lb_config_last_reload_success_timestamp_seconds Unix time of the last successful configuration load (the initial one included).
# TYPE l4lb_config_last_reload_success_timestamp_seconds gauge
l4lb_config_last_reload_success_timestamp_seconds 1.7673231055e+09
# HELP l4lb_config_last_reload_successful 1 if the last configuration load succeeded, 0 if the file was rejected and an older configuration is serving.
# TYPE l4lb_config_last_reload_successful gauge
l4lb_config_last_reload_successful 0
# HELP l4lb_config_reloads_total Configuration reloads (SIGHUP or file change) by result: success, failure (the file was rejected and the previous configuration kept).
# TYPE l4lb_config_reloads_total counter
l4lb_config_reloads_total{result="failure"} 1
l4lb_config_reloads_total{result="success"} 1
# HELP l4lb_reconcile_duration_seconds Time a reconcile pass took: diffing the desired services against the datapath and writing the changes, failed passes included.
# TYPE l4lb_reconcile_duration_seconds histogram
l4lb_reconcile_duration_seconds_bucket{le="0.0005"} 1
l4lb_reconcile_duration_seconds_bucket{le="0.001"} 1
l4lb_reconcile_duration_seconds_bucket{le="0.0025"} 1
l4lb_reconcile_duration_seconds_bucket{le="0.005"} 1
l4lb_reconcile_duration_seconds_bucket{le="0.01"} 1
l4lb_reconcile_duration_seconds_bucket{le="0.025"} 2
l4lb_reconcile_duration_seconds_bucket{le="0.05"} 2
l4lb_reconcile_duration_seconds_bucket{le="0.1"} 2
l4lb_reconcile_duration_seconds_bucket{le="0.25"} 2
l4lb_reconcile_duration_seconds_bucket{le="0.5"} 2
l4lb_reconcile_duration_seconds_bucket{le="1"} 2
l4lb_reconcile_duration_seconds_bucket{le="2.5"} 3
l4lb_reconcile_duration_seconds_bucket{le="5"} 3
l4lb_reconcile_duration_seconds_bucket{le="10"} 3
l4lb_reconcile_duration_seconds_bucket{le="30"} 3
l4lb_reconcile_duration_seconds_bucket{le="+Inf"} 3
l4lb_reconcile_duration_seconds_sum 2.0203
l4lb_reconcile_duration_seconds_count 3
# HELP l4lb_reconcile_errors_total Reconcile passes that failed; the daemon retries with backoff and the last good state keeps serving.
# TYPE l4lb_reconcile_errors_total counter
l4lb_reconcile_errors_total 1
# HELP l4lb_service_refusals_total Times a service became refused by the datapath, by reason (unsupported, map_full, local_vip, cannot_work); l4lb_services_refused shows the services refused now.
# TYPE l4lb_service_refusals_total counter
l4lb_service_refusals_total{reason="cannot_work"} 0
l4lb_service_refusals_total{reason="local_vip"} 0
l4lb_service_refusals_total{reason="map_full"} 2
l4lb_service_refusals_total{reason="unsupported"} 0
`
	if err := testutil.CollectAndCompare(rec, strings.NewReader(want)); err != nil {
		t.Fatal(err)
	}
}

func TestRecorderReloadGauges(t *testing.T) {
	tests := []struct {
		name    string
		initial bool
		reloads []error
		wantOK  float64
		wantTS  float64
	}{
		{"fresh recorder", false, nil, 0, 0},
		{"initial load only", true, nil, 1, 1767323045.5},
		{"failed reload keeps the success time", true, []error{errors.New("bad")}, 0, 1767323045.5},
		{"success after failure", true, []error{errors.New("bad"), nil}, 1, 1767323047.5},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rec := NewRecorder()
			if tt.initial {
				rec.ConfigLoaded(syncTime)
			}
			for i, err := range tt.reloads {
				rec.ObserveReload(syncTime.Add(time.Duration(i+1)*time.Second), err)
			}
			if got := testutil.ToFloat64(rec.lastReloadOK); got != tt.wantOK {
				t.Errorf("last_reload_successful = %v, want %v", got, tt.wantOK)
			}
			if got := testutil.ToFloat64(rec.lastReloadSuccess); got != tt.wantTS {
				t.Errorf("last_reload_success_timestamp_seconds = %v, want %v", got, tt.wantTS)
			}
		})
	}
}

func TestNilRecorderIgnoresCalls(t *testing.T) {
	var rec *Recorder
	rec.ObserveReconcile(time.Second, errors.New("x"))
	rec.ConfigLoaded(syncTime)
	rec.ObserveReload(syncTime, nil)
	rec.ServiceRefused(RefusedUnsupported)
}

func TestNewRegistry(t *testing.T) {
	for _, rec := range []*Recorder{NewRecorder(), nil} {
		reg := NewRegistry(&fakeSource{snap: smallSnapshot()}, rec, "v1.2.3")
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		names := map[string]bool{}
		for _, mf := range mfs {
			names[mf.GetName()] = true
		}
		for _, want := range []string{"l4lb_build_info", "l4lb_service_info", "go_goroutines", "process_open_fds"} {
			if !names[want] {
				t.Errorf("recorder %v: registry lacks %s", rec != nil, want)
			}
		}
		if got := names["l4lb_reconcile_duration_seconds"]; got != (rec != nil) {
			t.Errorf("recorder %v: l4lb_reconcile_duration_seconds exposed = %v", rec != nil, got)
		}
	}
}
