// SPDX-License-Identifier: Apache-2.0

package config

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// TestEtcExamplesParse keeps the shipped configs valid: documentation that
// no longer parses is worse than none.
func TestEtcExamplesParse(t *testing.T) {
	root := filepath.Join("..", "..", "etc")
	var files []string
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() && strings.HasSuffix(path, ".toml") {
			files = append(files, path)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("walk %s: %v", root, err)
	}
	// The default config and the five examples must all be found, so a
	// moved directory cannot make this test pass vacuously.
	if len(files) < 6 {
		t.Fatalf("found %d .toml files under %s, want at least 6: %v", len(files), root, files)
	}
	for _, path := range files {
		t.Run(filepath.Base(path), func(t *testing.T) {
			data, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			if filepath.Base(path) == "l4lb.toml" {
				checkShippedConfig(t, path, data)
				return
			}
			cfg, err := Parse(path, data, Options{})
			if err != nil {
				t.Fatalf("Parse:\n%v", err)
			}
			if len(cfg.Services) == 0 && cfg.Consul == nil && cfg.Kubernetes == nil {
				t.Errorf("%s defines no service and no discovery source", path)
			}
		})
	}
}

// checkShippedConfig: the default config that `make install` and the
// package put in /etc serves nothing by itself. It has no seed, so l4lbd
// refuses it until the operator sets one, and no service or discovery
// source, so a box that starts with it serves no example VIP.
func checkShippedConfig(t *testing.T, path string, data []byte) {
	t.Helper()
	_, err := Parse(path, data, Options{})
	if err == nil || !strings.Contains(err.Error(), "maglev.hash_seed is missing") {
		t.Errorf("the shipped config without --dev: %v, want only the missing seed refused", err)
	}
	var list ErrorList
	if errors.As(err, &list) && len(list) != 1 {
		t.Errorf("the shipped config has %d errors, want only the missing seed:\n%v", len(list), err)
	}
	cfg, err := Parse(path, data, Options{Dev: true})
	if err != nil {
		t.Fatalf("Parse with --dev:\n%v", err)
	}
	if len(cfg.Services) != 0 || cfg.Consul != nil || cfg.Kubernetes != nil {
		t.Errorf("the shipped config serves something: %d services, consul %v, kubernetes %v", len(cfg.Services), cfg.Consul != nil, cfg.Kubernetes != nil)
	}
}

// uncomment turns the commented block of text from the line starting with
// from up to the line starting with until into TOML: "# key = v" becomes
// "key = v", "# # comment" stays a comment.
func uncomment(t *testing.T, text, from, until string) string {
	t.Helper()
	start := strings.Index(text, from)
	if start < 0 {
		t.Fatalf("no commented block %q", from)
	}
	end := len(text)
	if until != "" {
		if e := strings.Index(text[start:], until); e >= 0 {
			end = start + e
		}
	}
	lines := strings.Split(text[start:end], "\n")
	for i, l := range lines {
		if l == "#" {
			l = ""
		}
		lines[i] = strings.TrimPrefix(l, "# ")
	}
	return text[:start] + strings.Join(lines, "\n") + text[end:]
}

// TestEtcServiceBlockParses uncomments the example services of the default
// config: they are documentation and must stay valid.
func TestEtcServiceBlockParses(t *testing.T) {
	path := filepath.Join("..", "..", "etc", "l4lb.toml")
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	doc := uncomment(t, string(data), "# # A TCP service in DSR mode", "# Discovery sources.")
	cfg, err := Parse(path+" (services uncommented)", []byte(doc), Options{Dev: true})
	if err != nil {
		t.Fatalf("Parse:\n%v", err)
	}
	if len(cfg.Services) != 2 {
		t.Fatalf("uncommenting gave %d services, want the 2 examples", len(cfg.Services))
	}
}

// TestEtcDiscoveryBlockParses uncomments the optional discovery tables of
// the default config, which are shipped commented out, so they cannot rot
// unnoticed either.
func TestEtcDiscoveryBlockParses(t *testing.T) {
	path := filepath.Join("..", "..", "etc", "l4lb.toml")
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	text := string(data)
	start := strings.Index(text, "# [discovery.consul]")
	if start < 0 {
		t.Fatalf("%s has no commented [discovery.consul] block", path)
	}
	lines := strings.Split(text[start:], "\n")
	for i, l := range lines {
		// "# key = v" becomes "key = v"; "# # comment" stays a comment.
		lines[i] = strings.TrimPrefix(l, "# ")
	}
	doc := text[:start] + strings.Join(lines, "\n")
	cfg, err := Parse(path+" (discovery uncommented)", []byte(doc), Options{Dev: true})
	if err != nil {
		t.Fatalf("Parse:\n%v", err)
	}
	if cfg.Consul == nil || cfg.Kubernetes == nil {
		t.Fatalf("uncommenting did not enable both sources: consul %v, kubernetes %v", cfg.Consul, cfg.Kubernetes)
	}
	if cfg.BGP == nil || cfg.L2 == nil || cfg.Fleet == nil {
		t.Fatalf("uncommenting did not enable [bgp], [l2] and [fleet]: %v %v %v", cfg.BGP, cfg.L2, cfg.Fleet)
	}
	// The documented values are the defaults: an uncommented block must
	// behave exactly like an empty table.
	empty, err := Parse("empty", []byte(head+"[discovery.consul]\n[discovery.kubernetes]\n"), Options{})
	if err != nil {
		t.Fatal(err)
	}
	// [bgp] has required keys; the rest must be the defaults.
	minimal, err := Parse("minimal bgp", []byte(head+"[discovery.consul]\n[bgp]\nasn = 65001\nrouter_id = \"10.0.0.2\"\n[[bgp.peer]]\naddress = \"10.0.0.1\"\nasn = 65000\n[l2]\n[l2.failover]\n[fleet]\n"), Options{})
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(minimal.BGP, cfg.BGP, netipComparers); diff != "" {
		t.Errorf("documented [bgp] values differ from the defaults (-default +etc):\n%s", diff)
	}
	if diff := cmp.Diff(minimal.L2, cfg.L2); diff != "" {
		t.Errorf("documented [l2] values differ from the defaults (-default +etc):\n%s", diff)
	}
	if diff := cmp.Diff(minimal.Fleet, cfg.Fleet); diff != "" {
		t.Errorf("documented [fleet] values differ from the defaults (-default +etc):\n%s", diff)
	}
	// [ipfix] needs its collectors; the rest (counts on) the defaults.
	ipfixMin, err := Parse("minimal ipfix", []byte(head+"[ipfix]\ncollectors = [\"192.0.2.50:4739\"]\n"), Options{})
	if err != nil {
		t.Fatal(err)
	}
	if cfg.IPFIX == nil || !ipfixMin.IPFIX.Counts {
		t.Errorf("uncommented [ipfix]: %+v; defaults: %+v (counts must default to on)", cfg.IPFIX, ipfixMin.IPFIX)
	} else if diff := cmp.Diff(ipfixMin.IPFIX, cfg.IPFIX); diff != "" {
		t.Errorf("documented [ipfix] values differ from the defaults (-default +etc):\n%s", diff)
	}
	if *cfg.Consul != *empty.Consul {
		t.Errorf("documented [discovery.consul] values differ from the defaults:\n%+v\nvs\n%+v", *cfg.Consul, *empty.Consul)
	}
	if diff := cmp.Diff(empty.Kubernetes, cfg.Kubernetes, netipComparers); diff != "" {
		t.Errorf("documented [discovery.kubernetes] values differ from the defaults (-default +etc):\n%s", diff)
	}
}

// TestEtcDocumentsDefaults checks that the global values written in the
// default config are the real defaults, as its comments claim.
func TestEtcDocumentsDefaults(t *testing.T) {
	cfg, err := Load(filepath.Join("..", "..", "etc", "l4lb.toml"), Options{Dev: true})
	if err != nil {
		t.Fatal(err)
	}
	want := Default()
	// The two values every box must set itself.
	want.Datapath.Interfaces = cfg.Datapath.Interfaces
	want.Maglev.Seed, want.Maglev.DevSeed = cfg.Maglev.Seed, cfg.Maglev.DevSeed
	if diff := cmp.Diff(want.Daemon, cfg.Daemon); diff != "" {
		t.Errorf("[daemon] differs from the defaults (-default +etc):\n%s", diff)
	}
	if diff := cmp.Diff(want.Datapath, cfg.Datapath, netipComparers); diff != "" {
		t.Errorf("[datapath] differs from the defaults (-default +etc):\n%s", diff)
	}
	if diff := cmp.Diff(want.Maglev, cfg.Maglev); diff != "" {
		t.Errorf("[maglev] differs from the defaults (-default +etc):\n%s", diff)
	}
}
