// SPDX-License-Identifier: Apache-2.0

package kubernetes

import (
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/l4lb/l4lb/lb"
	"github.com/l4lb/l4lb/lb/config"
)

// The annotations a Service (and, for weight, a Node) can carry. Every
// l4lb.io/ annotation on a served Service must be one of these: an unknown
// one is refused like an unknown key in the TOML file, since an ignored
// typo hides a setting the operator believes in force.
const (
	Prefix = "l4lb.io/"

	AnnotationIPs        = Prefix + "ips"         // comma-separated VIPs, one per family
	AnnotationPool       = Prefix + "pool"        // a named pool to allocate from
	AnnotationSharingKey = Prefix + "sharing-key" // Services that may share a VIP
	AnnotationBackends   = Prefix + "backends"    // nodeport | pod

	AnnotationMode            = Prefix + "mode"
	AnnotationDispatch        = Prefix + "dispatch"
	AnnotationTableSize       = Prefix + "table-size"
	AnnotationAlgorithm       = Prefix + "algorithm"
	AnnotationAffinity        = Prefix + "affinity"
	AnnotationAffinityTimeout = Prefix + "affinity-timeout"
	AnnotationDrainTimeout    = Prefix + "drain-timeout"
	// AnnotationAnnounce "false" keeps the Service from getting its VIP
	// announced (BGP, ARP/NDP); AnnotationAnnounceMinHealthy is its
	// threshold of healthy backends.
	AnnotationAnnounce           = Prefix + "announce"
	AnnotationAnnounceMinHealthy = Prefix + "announce-min-healthy"

	AnnotationHealthCheck    = Prefix + "health-check" // tcp | http | udp | none
	AnnotationHealthPort     = Prefix + "health-port"
	AnnotationHealthPath     = Prefix + "health-path"
	AnnotationHealthInterval = Prefix + "health-interval"
	AnnotationHealthTimeout  = Prefix + "health-timeout"
	AnnotationHealthRise     = Prefix + "health-rise"
	AnnotationHealthFall     = Prefix + "health-fall"
	AnnotationHealthStatus   = Prefix + "health-expect-status"

	// AnnotationWeight on a Node is its weight in every Service it backs.
	AnnotationWeight = Prefix + "weight"
)

// serviceKeys maps each per-Service setting annotation onto the key of the
// file's [[service]] schema it stands for: the Service is validated by
// config.ParseService, exactly like a service of the file. Values that
// look like integers are passed as integers for the keys that take one.
var serviceKeys = map[string]string{
	AnnotationMode:            "mode",
	AnnotationDispatch:        "dsr_dispatch",
	AnnotationTableSize:       "table_size",
	AnnotationAlgorithm:       "algorithm",
	AnnotationAffinity:        "affinity",
	AnnotationAffinityTimeout: "affinity_timeout",
	AnnotationDrainTimeout:    "drain_timeout",

	AnnotationAnnounce:           "announce",
	AnnotationAnnounceMinHealthy: "announce_min_healthy",
}

var healthKeys = map[string]string{
	AnnotationHealthCheck:    "type",
	AnnotationHealthPort:     "port",
	AnnotationHealthPath:     "path",
	AnnotationHealthInterval: "interval",
	AnnotationHealthTimeout:  "timeout",
	AnnotationHealthRise:     "rise",
	AnnotationHealthFall:     "fall",
	AnnotationHealthStatus:   "expect_status",
}

var integerKeys = map[string]bool{"table_size": true, "port": true, "rise": true, "fall": true, "expect_status": true, "announce_min_healthy": true}

// booleanKeys take "true" or "false"; anything else is passed as the
// string it is, which the file's rules refuse.
var booleanKeys = map[string]bool{"announce": true}

// otherAnnotations are read elsewhere (VIP choice, backends).
var otherAnnotations = []string{AnnotationIPs, AnnotationPool, AnnotationSharingKey, AnnotationBackends}

// settings are a Service's l4lb settings, validated once per frontend
// family: everything of lb.Service but the frontend and backends.
type settings struct {
	tmpl     lb.Service // Name, Frontend and Backends unset
	backends config.K8sBackends
}

// parseSettings validates the settings of svc for a frontend on vip (the
// family matters to source ranges). health is the default check of the
// Service's backends, before annotations. Problems name the annotation or
// field they come from; any problem refuses the Service.
func parseSettings(svc *corev1.Service, vip string, health lb.HealthCheck, defaults lb.Defaults, defBackends config.K8sBackends) (settings, []string) {
	var problems []string
	ann := svc.Annotations
	for _, k := range slices.Sorted(maps.Keys(ann)) {
		if !strings.HasPrefix(k, Prefix) {
			continue
		}
		if _, ok := serviceKeys[k]; ok {
			continue
		}
		if _, ok := healthKeys[k]; ok || slices.Contains(otherAnnotations, k) {
			continue
		}
		problems = append(problems, fmt.Sprintf("annotation %s is unknown (known: %s)", k, strings.Join(knownAnnotations(), ", ")))
	}
	st := settings{backends: defBackends}
	if v, ok := ann[AnnotationBackends]; ok {
		b, err := config.ParseK8sBackends(strings.TrimSpace(v))
		if err != nil {
			problems = append(problems, fmt.Sprintf("annotation %s: %v", AnnotationBackends, err))
		}
		st.backends = b
	}

	base := func() map[string]any {
		return map[string]any{"name": "k8s", "vip": vip, "port": 1, "protocol": "tcp"}
	}
	// Each annotation alone first, so that a problem names the annotation
	// that causes it; then all of them together for the checks that
	// combine keys.
	full := base()
	for _, a := range slices.Sorted(maps.Keys(serviceKeys)) {
		v, ok := ann[a]
		if !ok {
			continue
		}
		doc := base()
		doc[serviceKeys[a]] = value(serviceKeys[a], v)
		if a == AnnotationAffinityTimeout {
			doc["affinity"] = "client-ip"
		}
		if _, errs := validate(doc, defaults); len(errs) > 0 {
			problems = append(problems, annotationProblems(a, v, errs)...)
			continue
		}
		full[serviceKeys[a]] = doc[serviceKeys[a]]
	}
	// Kubernetes's own fields, mapped onto the same keys.
	if svc.Spec.SessionAffinity == corev1.ServiceAffinityClientIP {
		if _, set := ann[AnnotationAffinity]; !set {
			full["affinity"] = "client-ip"
			if c := svc.Spec.SessionAffinityConfig; c != nil && c.ClientIP != nil && c.ClientIP.TimeoutSeconds != nil {
				full["affinity_timeout"] = (time.Duration(*c.ClientIP.TimeoutSeconds) * time.Second).String()
			}
		}
	}
	var ranges []string
	for _, r := range svc.Spec.LoadBalancerSourceRanges {
		r = strings.TrimSpace(r)
		// A range of the other family does not apply to this frontend:
		// a dual-stack Service lists both.
		if strings.Contains(r, ":") == strings.Contains(vip, ":") {
			ranges = append(ranges, r)
		}
	}
	if len(ranges) > 0 {
		full["source_ranges"] = ranges
	}
	h, hp := healthDoc(ann, health, base, defaults)
	problems = append(problems, hp...)
	if h != nil {
		full["health"] = h
	}
	if len(problems) > 0 {
		return st, problems
	}
	tmpl, errs := validate(full, defaults)
	for _, e := range errs {
		problems = append(problems, fieldProblem(e))
	}
	tmpl.Name, tmpl.Frontend = "", lb.Frontend{}
	st.tmpl = tmpl
	return st, problems
}

// healthDoc is the [health] table of the Service: the default check with
// the annotations laid over it. Naming another check type starts from that
// type's own defaults, keeping only the timing.
func healthDoc(ann map[string]string, def lb.HealthCheck, base func() map[string]any, defaults lb.Defaults) (map[string]any, []string) {
	h := map[string]any{"type": def.Type.String()}
	if def.Type != lb.HealthNone {
		h["interval"], h["timeout"] = def.Interval.String(), def.Timeout.String()
		h["rise"], h["fall"] = def.Rise, def.Fall
		if def.Port != 0 {
			h["port"] = int(def.Port)
		}
		if def.Type == lb.HealthHTTP {
			h["path"], h["expect_status"] = def.Path, def.ExpectStatus
		}
	}
	var problems []string
	if v, ok := ann[AnnotationHealthCheck]; ok && strings.TrimSpace(v) != def.Type.String() {
		t, err := lb.ParseHealthType(strings.TrimSpace(v))
		if err != nil {
			return nil, []string{fmt.Sprintf("annotation %s = %q: %v", AnnotationHealthCheck, v, err)}
		}
		timing := map[string]any{"type": t.String()}
		if t != lb.HealthNone {
			for _, k := range []string{"interval", "timeout", "rise", "fall"} {
				if x, ok := h[k]; ok {
					timing[k] = x
				}
			}
		}
		h = timing
	}
	for _, a := range slices.Sorted(maps.Keys(healthKeys)) {
		v, ok := ann[a]
		if !ok || a == AnnotationHealthCheck {
			continue
		}
		k := healthKeys[a]
		try := maps.Clone(h)
		try[k] = value(k, v)
		doc := base()
		doc["health"] = try
		if _, errs := validate(doc, defaults); len(errs) > 0 {
			problems = append(problems, annotationProblems(a, v, errs)...)
			continue
		}
		h = try
	}
	if h["type"] == lb.HealthNone.String() && len(h) == 1 && def.Type == lb.HealthNone {
		return nil, problems
	}
	return h, problems
}

func knownAnnotations() []string {
	out := slices.Concat(slices.Collect(maps.Keys(serviceKeys)), slices.Collect(maps.Keys(healthKeys)), otherAnnotations)
	slices.Sort(out)
	return out
}

// value turns an annotation's text into the JSON value of key k.
func value(k, v string) any {
	v = strings.TrimSpace(v)
	if integerKeys[k] {
		if n, err := strconv.ParseInt(v, 10, 64); err == nil {
			return n
		}
	}
	if booleanKeys[k] && (v == "true" || v == "false") {
		return v == "true"
	}
	return v
}

// validate runs doc through the file's rules.
func validate(doc map[string]any, defaults lb.Defaults) (lb.Service, []*config.Error) {
	data, err := json.Marshal(doc)
	if err != nil {
		return lb.Service{}, []*config.Error{{Msg: err.Error()}}
	}
	svc, err := config.ParseService("annotations", data, defaults)
	if err == nil {
		return svc, nil
	}
	var out []*config.Error
	if list, ok := err.(config.ErrorList); ok {
		out = append(out, list...)
	} else {
		out = append(out, &config.Error{Msg: err.Error()})
	}
	return lb.Service{}, out
}

func annotationProblems(a, v string, errs []*config.Error) []string {
	out := make([]string, 0, len(errs))
	for _, e := range errs {
		out = append(out, fmt.Sprintf("annotation %s = %q: %s", a, v, e.Msg))
	}
	return out
}

// fieldProblem words an error of the combined settings, which come from
// several annotations or from the Service's own fields.
func fieldProblem(e *config.Error) string {
	msg := e.Msg
	switch {
	case strings.HasPrefix(msg, "source_ranges"):
		return "spec.loadBalancerSourceRanges: " + msg
	case strings.HasPrefix(msg, "affinity"):
		return "spec.sessionAffinity / l4lb.io/affinity: " + msg
	case strings.HasPrefix(msg, "announce"):
		return AnnotationAnnounce + " / " + AnnotationAnnounceMinHealthy + ": " + msg
	}
	return msg
}
