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

// watchDoc is a config whose [daemon] table holds extra (watch_config),
// told apart from the others by comment.
func watchDoc(comment, extra string) string {
	return "# " + comment + "\n[daemon]\n" + extra + "\n[datapath]\ninterfaces = [\"lo\"]\n"
}

func newWatchDaemon(t *testing.T, doc string) (*Daemon, func(string)) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "l4lb.toml")
	write := func(doc string) {
		t.Helper()
		if err := os.WriteFile(path, []byte(doc), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write(doc)
	d, err := New(Options{ConfigPath: path, Config: config.Options{Dev: true}, Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	return d, write
}

// TestWatchSkipsWhatAReloadRead: a file saved and then signalled is read
// by the SIGHUP's reload only; the watch reloads for content no reload has
// read, once.
func TestWatchSkipsWhatAReloadRead(t *testing.T) {
	d, write := newWatchDaemon(t, watchDoc("first", "watch_config = true"))
	last := fileDigest(d.opts.ConfigPath)
	if d.watchWants(&last) {
		t.Fatal("the watch saw a change in a file nobody changed")
	}

	write(watchDoc("saved, then SIGHUP", "watch_config = true"))
	if err := d.doReload(); err != nil {
		t.Fatalf("reload: %v", err)
	}
	if d.watchWants(&last) {
		t.Error("the watch would reload content the SIGHUP's reload already read")
	}

	write(watchDoc("saved only", "watch_config = true"))
	if !d.watchWants(&last) {
		t.Error("the watch missed content no reload has read")
	}
	if d.watchWants(&last) {
		t.Error("the watch would reload the same content twice")
	}
}

// TestWatchOffByDefault: saving the file applies nothing unless
// daemon.watch_config is on; a reload that turns it on (or off) takes
// effect at once. Before, every saved file went live within two seconds.
func TestWatchOffByDefault(t *testing.T) {
	d, write := newWatchDaemon(t, watchDoc("first", ""))
	last := fileDigest(d.opts.ConfigPath)
	write(watchDoc("saved, not reloaded", ""))
	if d.watchWants(&last) {
		t.Fatal("the watch reloads a saved file with daemon.watch_config unset")
	}

	write(watchDoc("opt in", "watch_config = true"))
	if err := d.doReload(); err != nil {
		t.Fatalf("reload: %v", err)
	}
	write(watchDoc("saved with the watch on", "watch_config = true"))
	if !d.watchWants(&last) {
		t.Error("the watch missed a saved file with daemon.watch_config = true")
	}

	write(watchDoc("opt out", "watch_config = false"))
	if err := d.doReload(); err != nil {
		t.Fatalf("reload: %v", err)
	}
	write(watchDoc("saved with the watch off again", "watch_config = false"))
	if d.watchWants(&last) {
		t.Error("the watch still reloads after a reload turned it off")
	}
}
