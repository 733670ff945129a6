// SPDX-License-Identifier: Apache-2.0

// Package tests holds tests about the code base as a whole; the end-to-end
// tests live in tests/e2e.
package tests

import (
	"encoding/json"
	"io"
	"os/exec"
	"strings"
	"testing"
)

const module = "github.com/l4lb/l4lb"

type pkg struct {
	ImportPath string
	Standard   bool
	Imports    []string
	Deps       []string
}

// listPackages runs go list over the module (non-test code).
func listPackages(t *testing.T, args ...string) []pkg {
	t.Helper()
	cmd := exec.Command("go", append([]string{"list", "-json"}, args...)...)
	cmd.Dir = ".."
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	dec := json.NewDecoder(strings.NewReader(string(out)))
	var pkgs []pkg
	for {
		var p pkg
		if err := dec.Decode(&p); err == io.EOF {
			break
		} else if err != nil {
			t.Fatal(err)
		}
		pkgs = append(pkgs, p)
	}
	return pkgs
}

// TestDependencyEdges keeps the layering of STYLE.md true: the model is
// standard-library only, Maglev is pure, the reconciler never reaches the
// kernel, only the datapath binding touches BPF and netlink, only the
// Kubernetes source imports k8s.io, only lb/announce speaks BGP (and takes
// what it announces from the daemon), and the fleet comparison knows
// nothing of Consul, the pipeline (lb/plan) never reaches the kernel, and
// BFD (lb/bfd) is sockets only.
func TestDependencyEdges(t *testing.T) {
	std := map[string]bool{}
	for _, p := range listPackages(t, "std") {
		std[p.ImportPath] = true
	}
	pkgs := listPackages(t, "-deps=false", "./...")
	byPath := map[string]pkg{}
	for _, p := range listPackages(t, "-deps", "./...") {
		byPath[p.ImportPath] = p
	}

	onlyStdAnd := func(path string, allowed ...string) {
		p, ok := byPath[module+path]
		if !ok {
			t.Errorf("package %s not found", path)
			return
		}
		for _, d := range p.Deps {
			if std[d] || byPath[d].Standard {
				continue
			}
			ok := false
			for _, a := range allowed {
				if d == module+a {
					ok = true
				}
			}
			if !ok {
				t.Errorf("%s depends on %s; it may use only the standard library%s", path, d, list(allowed))
			}
		}
	}
	onlyStdAnd("/lb")
	onlyStdAnd("/lb/maglev", "/lb")
	onlyStdAnd("/lb/reconciler", "/lb", "/lb/maglev", "/internal/reset")
	onlyStdAnd("/lb/change", "/lb", "/lb/maglev")
	onlyStdAnd("/lb/selfcheck", "/lb", "/lb/maglev", "/lb/reconciler", "/internal/reset")
	onlyStdAnd("/lb/ipfix", "/lb")
	// internal/cow holds immutable collections and nothing else: any
	// layer may keep its published state in them.
	onlyStdAnd("/internal/cow")
	onlyStdAnd("/internal/reset")
	onlyStdAnd("/discovery", "/lb", "/internal/cow")
	// BFD is a protocol on sockets: the standard library and the socket
	// options of x/sys, nothing of l4lb or the kernel's BPF.
	for _, d := range byPath[module+"/lb/bfd"].Deps {
		if !std[d] && !byPath[d].Standard && !strings.HasPrefix(d, "golang.org/x/sys/") {
			t.Errorf("/lb/bfd depends on %s; it may use only the standard library and golang.org/x/sys", d)
		}
	}

	kernel := []string{"github.com/cilium/ebpf", "github.com/vishvananda/netlink", "github.com/vishvananda/netns"}
	// The pipeline runs against the fake datapath in tests: nothing it
	// depends on may reach the kernel.
	for _, d := range byPath[module+"/lb/plan"].Deps {
		for _, k := range append(kernel, module+"/lb/datapath") {
			if d == k || strings.HasPrefix(d, k+"/") {
				t.Errorf("lb/plan depends on %s: the pipeline must run without a kernel", d)
			}
		}
	}
	mayTouchKernel := func(path string) bool {
		rel := strings.TrimPrefix(path, module)
		return rel == "/bpf" || rel == "/lb/datapath" ||
			strings.HasPrefix(rel, "/internal/") || strings.HasPrefix(rel, "/tests/")
	}
	for _, p := range pkgs {
		if !strings.HasPrefix(p.ImportPath, module) {
			continue
		}
		for _, imp := range p.Imports {
			for _, k := range kernel {
				if (imp == k || strings.HasPrefix(imp, k+"/")) && !mayTouchKernel(p.ImportPath) {
					t.Errorf("%s imports %s: only lb/datapath touches kernel objects", p.ImportPath, imp)
				}
			}
			if strings.HasPrefix(imp, "k8s.io/") && p.ImportPath != module+"/discovery/kubernetes" && p.ImportPath != kubetest && !benchTool(p.ImportPath) {
				t.Errorf("%s imports %s: only discovery/kubernetes may import k8s.io", p.ImportPath, imp)
			}
			if (imp == kubetest && !benchTool(p.ImportPath)) || imp == module+"/internal/discoverytest" {
				t.Errorf("%s imports %s: it is test support, for _test.go files only", p.ImportPath, imp)
			}
			if strings.HasPrefix(imp, "github.com/osrg/gobgp") && p.ImportPath != module+"/lb/announce" {
				t.Errorf("%s imports %s: only lb/announce speaks BGP", p.ImportPath, imp)
			}
			if p.ImportPath == module+"/lb/announce" && (strings.HasPrefix(imp, module+"/lb/datapath") || strings.HasPrefix(imp, module+"/lb/health") ||
				strings.HasPrefix(imp, module+"/lb/reconciler")) {
				t.Errorf("%s imports %s: the announcers get the programmed, healthy VIPs from the daemon, not from the datapath or the checker", p.ImportPath, imp)
			}
			if p.ImportPath == module+"/lb/fleet" && strings.HasPrefix(imp, "github.com/hashicorp/consul") {
				t.Errorf("%s imports %s: the fleet comparison is pure; discovery/consul carries it", p.ImportPath, imp)
			}
			if strings.HasPrefix(p.ImportPath, module+"/discovery") && strings.HasPrefix(imp, module+"/lb/datapath") {
				t.Errorf("%s imports %s: discovery sources know nothing of the datapath", p.ImportPath, imp)
			}
		}
	}
}

// kubetest runs a real apiserver for tests; it speaks k8s.io like the
// source it tests, and no program may depend on it.
const kubetest = module + "/discovery/kubernetes/kubetest"

// benchTool reports whether path is a benchmark command under tests/ (such
// as tests/benchcontrol, which drives a real apiserver through kubetest):
// like the tests, no program depends on it.
func benchTool(path string) bool { return strings.HasPrefix(path, module+"/tests/") }

func list(allowed []string) string {
	if len(allowed) == 0 {
		return ""
	}
	return " and " + strings.Join(allowed, ", ")
}
