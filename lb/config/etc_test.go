// SPDX-License-Identifier: Apache-2.0

package config

import (
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
	cfg, err := Parse(path+" (discovery uncommented)", []byte(doc), Options{})
	if err != nil {
		t.Fatalf("Parse:\n%v", err)
	}
	if cfg.Consul == nil || cfg.Kubernetes == nil {
		t.Fatalf("uncommenting did not enable both sources: consul %v, kubernetes %v", cfg.Consul, cfg.Kubernetes)
	}
	// The documented values are the defaults: an uncommented block must
	// behave exactly like an empty table.
	empty, err := Parse("empty", []byte(head+"[discovery.consul]\n[discovery.kubernetes]\n"), Options{})
	if err != nil {
		t.Fatal(err)
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
	cfg, err := Load(filepath.Join("..", "..", "etc", "l4lb.toml"), Options{})
	if err != nil {
		t.Fatal(err)
	}
	want := Default()
	// The two values every box must set itself.
	want.Datapath.Interfaces = cfg.Datapath.Interfaces
	want.Maglev.Seed = cfg.Maglev.Seed
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
