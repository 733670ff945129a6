// SPDX-License-Identifier: Apache-2.0

package metrics

import (
	"encoding/json"
	"errors"
	"os"
	"regexp"
	"sort"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
)

const dashboardPath = "../../etc/grafana/l4lb-dashboard.json"

// exposedNames returns every sample name l4lbd exposes with a fully
// populated snapshot and recorder: family names, plus _bucket, _sum and
// _count for histograms.
func exposedNames(t *testing.T) map[string]bool {
	t.Helper()
	rec := NewRecorder()
	rec.ObserveReconcile(time.Millisecond, errors.New("x"))
	reg := NewRegistry(&fakeSource{snap: smallSnapshot()}, rec, "v1")
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{}
	for _, mf := range mfs {
		n := mf.GetName()
		names[n] = true
		if mf.GetType() == dto.MetricType_HISTOGRAM {
			names[n+"_bucket"], names[n+"_sum"], names[n+"_count"] = true, true, true
		}
	}
	return names
}

// dashboard is the part of Grafana's dashboard model the test checks.
type dashboard struct {
	UID           string                    `json:"uid"`
	Title         string                    `json:"title"`
	SchemaVersion int                       `json:"schemaVersion"`
	Panels        []panel                   `json:"panels"`
	Templating    struct{ List []variable } `json:"templating"`
	Annotations   struct {
		List []struct {
			Expr string `json:"expr"`
		} `json:"list"`
	} `json:"annotations"`
}

type panel struct {
	ID         int                      `json:"id"`
	Type       string                   `json:"type"`
	Title      string                   `json:"title"`
	Datasource *reference               `json:"datasource"`
	GridPos    struct{ H, W, X, Y int } `json:"gridPos"`
	Targets    []struct {
		Expr       string     `json:"expr"`
		RefID      string     `json:"refId"`
		Datasource *reference `json:"datasource"`
	} `json:"targets"`
	Panels []panel `json:"panels"` // of collapsed rows
}

type reference struct {
	Type string `json:"type"`
	UID  string `json:"uid"`
}

type variable struct {
	Type       string          `json:"type"`
	Name       string          `json:"name"`
	Query      json.RawMessage `json:"query"`
	Definition string          `json:"definition"`
	Datasource *reference      `json:"datasource"`
}

var metricName = regexp.MustCompile(`\bl4lb_[a-zA-Z0-9_]+`)

func TestDashboard(t *testing.T) {
	b, err := os.ReadFile(dashboardPath)
	if err != nil {
		t.Fatalf("read the dashboard: %v", err)
	}
	var d dashboard
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatalf("%s is not valid JSON: %v", dashboardPath, err)
	}
	if d.UID == "" || d.Title == "" || d.SchemaVersion == 0 {
		t.Errorf("dashboard lacks uid, title or schemaVersion: %q %q %d", d.UID, d.Title, d.SchemaVersion)
	}

	hasDatasourceVar := false
	var exprs []string
	for _, v := range d.Templating.List {
		if v.Type == "datasource" && v.Name == "datasource" && string(v.Query) == `"prometheus"` {
			hasDatasourceVar = true
		}
		if v.Type == "query" {
			exprs = append(exprs, v.Definition)
			var q struct{ Query string }
			if err := json.Unmarshal(v.Query, &q); err != nil {
				t.Errorf("variable %s: query: %v", v.Name, err)
			}
			exprs = append(exprs, q.Query)
			checkDatasource(t, "variable "+v.Name, v.Datasource)
		}
	}
	if !hasDatasourceVar {
		t.Error("dashboard has no Prometheus datasource variable named datasource")
	}
	for _, a := range d.Annotations.List {
		exprs = append(exprs, a.Expr)
	}

	ids := map[int]string{}
	var walk func([]panel)
	walk = func(ps []panel) {
		for _, p := range ps {
			if prev, dup := ids[p.ID]; dup || p.ID == 0 {
				t.Errorf("panel %q: id %d missing or also used by %q", p.Title, p.ID, prev)
			}
			ids[p.ID] = p.Title
			if p.GridPos.W <= 0 || p.GridPos.H <= 0 || p.GridPos.X+p.GridPos.W > 24 {
				t.Errorf("panel %q: gridPos %+v does not fit the 24-column grid", p.Title, p.GridPos)
			}
			walk(p.Panels)
			if p.Type == "row" {
				continue
			}
			checkDatasource(t, "panel "+p.Title, p.Datasource)
			if len(p.Targets) == 0 {
				t.Errorf("panel %q has no query", p.Title)
			}
			refs := map[string]bool{}
			for _, tg := range p.Targets {
				if tg.Expr == "" || tg.RefID == "" || refs[tg.RefID] {
					t.Errorf("panel %q: query %q lacks an expression or a unique refId", p.Title, tg.RefID)
				}
				refs[tg.RefID] = true
				checkDatasource(t, "panel "+p.Title+" query "+tg.RefID, tg.Datasource)
				exprs = append(exprs, tg.Expr)
			}
		}
	}
	walk(d.Panels)

	exposed := exposedNames(t)
	used := map[string]bool{}
	for _, e := range exprs {
		for _, n := range metricName.FindAllString(e, -1) {
			used[n] = true
			if !exposed[n] {
				t.Errorf("dashboard uses %s, which l4lbd does not expose (in %q)", n, e)
			}
		}
	}

	// Each topic the dashboard is for must stay on it.
	for _, n := range []string{
		"l4lb_service_packets_total", "l4lb_service_bytes_total", "l4lb_backend_packets_total", "l4lb_backend_bytes_total",
		"l4lb_datapath_packets_total", "l4lb_conntrack_entries", "l4lb_conntrack_capacity", "l4lb_snat_entries",
		"l4lb_snat_capacity", "l4lb_map_entries", "l4lb_map_capacity", "l4lb_reconcile_duration_seconds_bucket",
		"l4lb_config_reloads_total", "l4lb_config_last_reload_successful", "l4lb_backend_health_state",
		"l4lb_backend_admin_state", "l4lb_discovery_last_sync_timestamp_seconds", "l4lb_services_conflicting",
		// ipvsadm --rate and its connection columns.
		"l4lb_service_new_flows_total", "l4lb_backend_new_flows_total", "l4lb_service_reply_packets_total",
		"l4lb_service_reply_bytes_total", "l4lb_backend_connections",
	} {
		if !used[n] {
			t.Errorf("dashboard has no panel using %s", n)
		}
	}
	if testing.Verbose() {
		var unused []string
		for n := range exposed {
			if !used[n] && metricName.MatchString(n) {
				unused = append(unused, n)
			}
		}
		sort.Strings(unused)
		t.Logf("exposed but not on the dashboard: %v", unused)
	}
}

func checkDatasource(t *testing.T, where string, r *reference) {
	t.Helper()
	if r == nil || r.Type != "prometheus" || r.UID != "${datasource}" {
		t.Errorf("%s: datasource %+v, want the ${datasource} variable", where, r)
	}
}

// TestDashboardNamesAreChecked makes sure the name check can fail: a name
// the collector does not expose is reported.
func TestDashboardNamesAreChecked(t *testing.T) {
	exposed := exposedNames(t)
	for _, n := range []string{"l4lb_service_packets", "l4lb_reconcile_duration_seconds_total", "l4lb_drops_total"} {
		if exposed[n] {
			t.Errorf("%s should not be exposed", n)
		}
	}
	if !exposed["l4lb_reconcile_duration_seconds_bucket"] {
		t.Error("histogram buckets missing from the exposed names")
	}
}
