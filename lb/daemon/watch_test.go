// SPDX-License-Identifier: Apache-2.0

package daemon

import (
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"testing"

	"github.com/l4lb/l4lb/lb/config"
)

// TestWatchSkipsWhatAReloadRead: a file saved and then signalled is read
// by the SIGHUP's reload only; the watch reloads for content no reload has
// read, once.
func TestWatchSkipsWhatAReloadRead(t *testing.T) {
	path := filepath.Join(t.TempDir(), "l4lb.toml")
	write := func(comment string) {
		t.Helper()
		if err := os.WriteFile(path, []byte("# "+comment+"\n[datapath]\ninterfaces = [\"lo\"]\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("first")
	d, err := New(Options{ConfigPath: path, Config: config.Options{Dev: true}, Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	last := fileDigest(path)
	if d.configChanged(&last) {
		t.Fatal("the watch saw a change in a file nobody changed")
	}

	write("saved, then SIGHUP")
	if err := d.doReload(); err != nil {
		t.Fatalf("reload: %v", err)
	}
	if d.configChanged(&last) {
		t.Error("the watch would reload content the SIGHUP's reload already read")
	}

	write("saved only")
	if !d.configChanged(&last) {
		t.Error("the watch missed content no reload has read")
	}
	if d.configChanged(&last) {
		t.Error("the watch would reload the same content twice")
	}
}
