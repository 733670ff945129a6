// SPDX-License-Identifier: Apache-2.0

package datapath_test

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/l4lb/l4lb/lb"
	"github.com/l4lb/l4lb/lb/datapath"
)

// TestCleanupRemovesOnlyOwnPins: --cleanup removes the links, maps and
// Maglev tables l4lbd pinned, by name, and leaves everything else in its
// directory where it was, saying so: an earlier version removed the whole
// directory recursively, taking another program's pins with it, and
// listed as removed what it had failed to remove.
func TestCleanupRemovesOnlyOwnPins(t *testing.T) {
	dir := pinDir(t, "cleanup")
	e := newEnvWith(t, envOptions{pinPath: dir})
	e.reconcile(t, dsrService("web", vip4, 80, lb.TCP, backends4[0]))
	if err := e.ns.Do(func() error { return e.lb.AttachXDP("lb0", datapath.XDPGeneric) }); err != nil {
		t.Fatal(err)
	}

	// Another program's map pinned next to l4lbd's, another program's
	// directory, and a directory squatting one of l4lbd's map names.
	foreign, err := ebpf.NewMapWithOptions(&ebpf.MapSpec{Name: "other_prog", Type: ebpf.Array, KeySize: 4, ValueSize: 4, MaxEntries: 1, Pinning: ebpf.PinByName},
		ebpf.MapOptions{PinPath: dir})
	if err != nil {
		t.Fatal(err)
	}
	foreign.Close()
	if err := os.MkdirAll(filepath.Join(dir, "cilium", "sub"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(dir, "services")); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(dir, "services", "keep"), 0o700); err != nil {
		t.Fatal(err)
	}
	e.lb.Close()

	r, err := datapath.Cleanup(dir)
	if err == nil || !strings.Contains(err.Error(), "remove "+filepath.Join(dir, "services")) {
		t.Errorf("cleanup error %v; want the failure to remove %s", err, filepath.Join(dir, "services"))
	}
	if !slices.Contains(r.Links, datapath.PinnedLink{Interface: "lb0", Hook: "xdp"}) {
		t.Errorf("detached %v; want the XDP link of lb0", r.Links)
	}
	if r.Tables != 1 {
		t.Errorf("removed %d Maglev table pins, want 1", r.Tables)
	}
	for _, want := range []string{"backends", "conntrack_v2", "maglev"} {
		if !slices.Contains(r.Pins, want) {
			t.Errorf("removed pins %v lack %s", r.Pins, want)
		}
	}
	if slices.Contains(r.Pins, "services") || slices.Contains(r.Pins, "other_prog") {
		t.Errorf("removed pins %v list what was not removed or not l4lbd's", r.Pins)
	}
	if len(r.Failed) != 1 || !strings.HasPrefix(r.Failed[0], "remove "+filepath.Join(dir, "services")) {
		t.Errorf("failed %q; want the services directory alone", r.Failed)
	}
	if want := []string{"cilium/", "other_prog"}; !slices.Equal(r.Foreign, want) {
		t.Errorf("foreign %q, want %q", r.Foreign, want)
	}
	if r.DirRemoved {
		t.Error("the directory was removed with foreign entries in it")
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var left []string
	for _, en := range entries {
		left = append(left, en.Name())
	}
	if want := []string{"cilium", "other_prog", "services"}; !slices.Equal(left, want) {
		t.Errorf("left in %s: %q, want %q", dir, left, want)
	}
	if _, err := os.Stat(filepath.Join(dir, "cilium", "sub")); err != nil {
		t.Errorf("another program's directory lost its content: %v", err)
	}
	out := e.ns.Run(t, "ip", "link", "show", "lb0")
	if strings.Contains(out, "xdp") {
		t.Errorf("XDP still attached after cleanup:\n%s", out)
	}

	// Once only l4lbd's pins are there, the directory goes too.
	for _, name := range []string{"cilium", "other_prog", "services"} {
		if err := os.RemoveAll(filepath.Join(dir, name)); err != nil {
			t.Fatal(err)
		}
	}
	e2 := newEnvWith(t, envOptions{pinPath: dir})
	e2.lb.Close()
	r, err = datapath.Cleanup(dir)
	if err != nil || !r.DirRemoved || len(r.Foreign) != 0 {
		t.Errorf("cleanup of l4lbd's pins alone: err %v, directory removed %v, foreign %q", err, r.DirRemoved, r.Foreign)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("%s still there: %v", dir, err)
	}
}

// TestCheckPinPathRefusesMountRoot: the root of a bpffs mount is shared
// with every other BPF program, so it is never l4lbd's directory.
func TestCheckPinPathRefusesMountRoot(t *testing.T) {
	pinDir(t, "root") // root and a bpffs at /sys/fs/bpf
	err := datapath.CheckPinPath("/sys/fs/bpf")
	if err == nil || !strings.Contains(err.Error(), "root of a bpffs mount") || !strings.Contains(err.Error(), "/sys/fs/bpf/l4lb") {
		t.Errorf("CheckPinPath(/sys/fs/bpf) = %v; want it refused, naming /sys/fs/bpf/l4lb", err)
	}
	if err := datapath.CheckPinPath("/sys/fs/bpf/l4lb-check-test"); err != nil {
		t.Errorf("a directory under the mount: %v", err)
	}
}
