// SPDX-License-Identifier: Apache-2.0

package fleet

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/l4lb/l4lb/lb/api"
)

// Fetch reads a box's record from target: an http(s) URL of its metrics
// endpoint (daemon.metrics_listen; the path defaults to /metrics), or its
// admin socket as unix:PATH or an absolute PATH.
func Fetch(ctx context.Context, target string) (Box, error) {
	switch {
	case strings.HasPrefix(target, "http://"), strings.HasPrefix(target, "https://"):
		return fetchMetrics(ctx, target)
	case strings.HasPrefix(target, "unix:"):
		return fetchAdmin(ctx, target, strings.TrimPrefix(target, "unix:"))
	case strings.HasPrefix(target, "/"):
		return fetchAdmin(ctx, target, target)
	}
	return Box{}, fmt.Errorf("%q: give a metrics URL (http://HOST:9842) or an admin socket (unix:/run/l4lb/l4lb.sock)", target)
}

func fetchAdmin(ctx context.Context, name, socket string) (Box, error) {
	c := api.NewClient(socket)
	st, err := c.Status(ctx)
	if err != nil {
		return Box{}, fmt.Errorf("%s: %w", name, err)
	}
	svcs, err := c.Services(ctx)
	if err != nil {
		return Box{}, fmt.Errorf("%s: %w", name, err)
	}
	b := Box{Name: name, Version: st.Version, SeedFingerprint: st.SeedFingerprint, Seen: time.Now()}
	for _, s := range svcs {
		if s.Fingerprint != "" {
			b.Services = append(b.Services, Service{Name: s.Name, Frontend: s.Frontend, Fingerprint: s.Fingerprint})
		}
	}
	return b, nil
}

func fetchMetrics(ctx context.Context, target string) (Box, error) {
	u, err := url.Parse(target)
	if err != nil {
		return Box{}, fmt.Errorf("%q: %w", target, err)
	}
	if u.Path == "" || u.Path == "/" {
		u.Path = "/metrics"
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return Box{}, err
	}
	// The text format: every l4lbd serves it, whatever it negotiates.
	req.Header.Set("Accept", "text/plain")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return Box{}, fmt.Errorf("%s: %w (is it in daemon.metrics_listen?)", u, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return Box{}, fmt.Errorf("%s answered %s", u, resp.Status)
	}
	b, err := FromMetrics(u.Host, resp.Body)
	if err != nil {
		return Box{}, fmt.Errorf("%s: %w", u, err)
	}
	b.Seen = time.Now()
	return b, nil
}

// FromMetrics builds the record of the box named name from its metrics
// exposition (text format): l4lb_service_info, l4lb_maglev_seed_info and
// l4lb_build_info.
func FromMetrics(name string, r io.Reader) (Box, error) {
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(r)
	if err != nil {
		return Box{}, fmt.Errorf("not a Prometheus exposition: %w", err)
	}
	label := func(m *dto.Metric, name string) string {
		for _, l := range m.GetLabel() {
			if l.GetName() == name {
				return l.GetValue()
			}
		}
		return ""
	}
	b := Box{Name: name}
	seed, ok := fams["l4lb_maglev_seed_info"]
	if !ok || len(seed.GetMetric()) == 0 {
		return Box{}, fmt.Errorf("no l4lb_maglev_seed_info: not an l4lbd, or one too old for the fleet check")
	}
	b.SeedFingerprint = label(seed.GetMetric()[0], "fingerprint")
	if bi, ok := fams["l4lb_build_info"]; ok && len(bi.GetMetric()) > 0 {
		b.Version = label(bi.GetMetric()[0], "version")
	}
	for _, m := range fams["l4lb_service_info"].GetMetric() {
		if fp := label(m, "fingerprint"); fp != "" {
			b.Services = append(b.Services, Service{Name: label(m, "service"), Frontend: label(m, "frontend"), Fingerprint: fp})
		}
	}
	return b, nil
}
