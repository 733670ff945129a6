// SPDX-License-Identifier: Apache-2.0

package daemon

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"

	"github.com/l4lb/l4lb/discovery"
	"github.com/l4lb/l4lb/lb"
)

// The last snapshot of each source that watches something outside l4lbd
// (Consul, Kubernetes) is kept in a file next to the admin socket
// (/run/l4lb/l4lb.kubernetes.json by default). The pinned datapath only
// holds what forwards (frontends, backends, tables), not the definitions:
// without them an l4lbd restarted while the source is unreachable would
// keep forwarding to its adopted services, but neither check their backends,
// list them, nor announce their VIPs. With the file it serves, of the saved
// services, those it finds pinned, until the source answers; nothing new is
// programmed from it. Like the pins, it lives until a reboot or --cleanup.

// LastGoodPath is the file holding the last snapshot of the named source
// of the l4lbd whose admin socket is socket.
func LastGoodPath(socket, source string) string { return runtimePath(socket, "."+source+".json") }

// lastGood is the file's content.
type lastGood struct {
	Source   string       `json:"source"`
	Saved    time.Time    `json:"saved"`
	Services []lb.Service `json:"services"`
}

// watchedSource says whether snapshots of source are kept.
func watchedSource(source string) bool { return source == consulSource || source == kubernetesSource }

// update hands a snapshot to the merger and has a watched source's last
// one kept on disk. Control loop only (or before it starts).
func (d *Daemon) update(snap discovery.Snapshot) {
	d.merger.Update(snap)
	if watchedSource(snap.Source) {
		d.lastGood.put(snap.Source, &snap)
	}
}

// lastGoodWriter writes the watched sources' files off the control loop:
// encoding 100,000 services takes longer than programming a change, and
// a change must not wait for it. For each source only the newest snapshot
// waits (a newer one replaces it unwritten), and a removal is queued the
// same way, so the file ends as the last call for it said.
type lastGoodWriter struct {
	log    *slog.Logger
	socket string

	mu      sync.Mutex
	pending map[string]*discovery.Snapshot // nil: remove the file
	busy    bool                           // the goroutine runs
	idle    *sync.Cond

	// saved and failed are what the writer last wrote of each source
	// and whether its last write failed; writer goroutine only.
	saved  map[string][]byte
	failed map[string]bool
}

func newLastGoodWriter(log *slog.Logger, socket string) *lastGoodWriter {
	w := &lastGoodWriter{log: log, socket: socket, pending: map[string]*discovery.Snapshot{}, saved: map[string][]byte{}, failed: map[string]bool{}}
	w.idle = sync.NewCond(&w.mu)
	return w
}

// put queues snap (nil: the file's removal) for source.
func (w *lastGoodWriter) put(source string, snap *discovery.Snapshot) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.pending[source] = snap
	if !w.busy {
		w.busy = true
		go w.run()
	}
}

// flush waits until everything queued so far is written.
func (w *lastGoodWriter) flush() {
	w.mu.Lock()
	defer w.mu.Unlock()
	for w.busy {
		w.idle.Wait()
	}
}

func (w *lastGoodWriter) run() {
	for {
		w.mu.Lock()
		var (
			source string
			snap   *discovery.Snapshot
			found  bool
		)
		for source, snap = range w.pending {
			found = true
			break
		}
		if !found {
			w.busy = false
			w.idle.Broadcast()
			w.mu.Unlock()
			return
		}
		delete(w.pending, source)
		w.mu.Unlock()
		if snap == nil {
			w.remove(source)
		} else {
			w.write(*snap)
		}
	}
}

func (w *lastGoodWriter) write(snap discovery.Snapshot) {
	b, err := json.Marshal(snap.Services)
	if err == nil && bytes.Equal(b, w.saved[snap.Source]) {
		return // unchanged: most snapshots are, for every change elsewhere
	}
	if err == nil {
		err = saveLastGood(LastGoodPath(w.socket, snap.Source), lastGood{Source: snap.Source, Saved: time.Now().UTC(), Services: snap.Services})
	}
	if err != nil {
		// Forwarding is unaffected; only a restart during an outage of
		// the source would lack the definitions. Logged once per source.
		if w.saved[snap.Source] != nil || !w.failed[snap.Source] {
			w.log.Error("could not keep the source's last services for a restart during its outage", "source", snap.Source, "error", err)
		}
		delete(w.saved, snap.Source)
		w.failed[snap.Source] = true
		return
	}
	w.saved[snap.Source] = b
	delete(w.failed, snap.Source)
}

func (w *lastGoodWriter) remove(source string) {
	delete(w.saved, source)
	path := LastGoodPath(w.socket, source)
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		w.log.Warn("could not remove the services kept of a source turned off", "source", source, "file", path, "error", err)
	}
}

func saveLastGood(path string, lg lastGood) error {
	b, err := json.Marshal(lg)
	if err != nil {
		return err
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return fmt.Errorf("save %s: %w", path, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("save %s: %w", path, err)
	}
	return nil
}

// forgetLastGood has the file of a source that was turned off removed:
// its services must not come back with a later restart.
func (d *Daemon) forgetLastGood(source string) { d.lastGood.put(source, nil) }

// restoreLastGood gives the merger, for a source that has not answered
// after a restart, its saved services that the adopted datapath holds, so
// that they are checked, listed and announced until it answers. The source
// still counts as not answered: the reconciler keeps every other adopted
// service as well.
func (d *Daemon) restoreLastGood(source string) {
	path := LastGoodPath(d.cfg.Daemon.AdminSocket, source)
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return
	}
	var lg lastGood
	if err == nil {
		err = json.Unmarshal(b, &lg)
	}
	if err == nil && lg.Source != source {
		err = fmt.Errorf("it holds the services of %q", lg.Source)
	}
	if err != nil {
		d.log.Error("cannot read the source's last services; its adopted services keep forwarding, unchecked, until it answers", "source", source, "file", path, "error", err)
		return
	}
	var keep []lb.Service
	for _, s := range lg.Services {
		if d.adopted[s.Frontend] {
			keep = append(keep, s)
		}
	}
	// Not d.update: the file keeps every saved service for another
	// restart before the source answers.
	d.merger.Update(discovery.Snapshot{Source: source, Services: keep})
	d.log.Warn("serving the source's last services that the datapath still holds until it answers", "source", source,
		"services", len(keep), "saved", lg.Saved.Format(time.RFC3339), "left_out", len(lg.Services)-len(keep))
}
