// SPDX-License-Identifier: Apache-2.0

package daemon

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"hash/maphash"
	"io"
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

// The file is one JSON object holding every service (lastGood), followed
// by the patches appended since (lastGoodPatch, one JSON value each): a
// snapshot that names its changes (discovery.Snapshot.Changed) costs an
// append of the services it changed, not an encoding of every service,
// which at 100,000 services is most of the CPU of a change. Any other
// snapshot writes the file whole again, and so does a patch that would
// make the patches outweigh the whole: each rewrite is paid for by at
// least as many bytes of patches, so a change costs its own size. A file
// without patches is what l4lbd wrote before there were patches.

// lastGood is the file's first value.
type lastGood struct {
	Source   string       `json:"source"`
	Saved    time.Time    `json:"saved"`
	Services []lb.Service `json:"services"`
}

// lastGoodPatch is a later value: services replaced, by name, in place.
type lastGoodPatch struct {
	Saved    time.Time    `json:"saved"`
	Services []lb.Service `json:"patch"`
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

// lastGoodWriter writes the watched sources' files off the control loop,
// so that a change never waits for the disk. For each source only the
// newest snapshot waits: a newer one replaces it unwritten (and the
// changes both name are patched), and a removal is queued the same way, so
// the file ends as the last call for it said.
type lastGoodWriter struct {
	log    *slog.Logger
	socket string

	mu      sync.Mutex
	pending map[string]*queuedSnapshot // nil: remove the file
	busy    bool                       // the goroutine runs
	idle    *sync.Cond

	// kept is what the writer last wrote of each source, and failed
	// whether its last write failed; writer goroutine only.
	kept   map[string]*keptFile
	failed map[string]bool
	seed   maphash.Seed
}

// queuedSnapshot is a snapshot waiting to be written, with the names of
// the services it changed since the last one written; nil changed: write
// it whole.
type queuedSnapshot struct {
	snap    discovery.Snapshot
	changed map[string]struct{}
}

// keptFile is what a source's file holds.
type keptFile struct {
	at      map[string]int // each service's position
	n       int            // services
	sum     uint64         // hash of the services' encoding when written whole, 0 once patched
	whole   int            // bytes written whole
	patched int            // bytes of patches appended since
}

func newLastGoodWriter(log *slog.Logger, socket string) *lastGoodWriter {
	w := &lastGoodWriter{log: log, socket: socket, pending: map[string]*queuedSnapshot{},
		kept: map[string]*keptFile{}, failed: map[string]bool{}, seed: maphash.MakeSeed()}
	w.idle = sync.NewCond(&w.mu)
	return w
}

// put queues snap (nil: the file's removal) for source.
func (w *lastGoodWriter) put(source string, snap *discovery.Snapshot) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.putLocked(source, snap)
}

func (w *lastGoodWriter) putLocked(source string, snap *discovery.Snapshot) {
	var q *queuedSnapshot
	if snap != nil {
		q = &queuedSnapshot{snap: *snap}
		prev, waiting := w.pending[source]
		// Patchable when nothing waits, or what waits is patchable: the
		// newer snapshot holds the newest of every service either named.
		if snap.Changed != nil && (!waiting || prev != nil && prev.changed != nil) {
			q.changed = map[string]struct{}{}
			if waiting {
				q.changed = prev.changed
			}
			for _, name := range snap.Changed {
				q.changed[name] = struct{}{}
			}
		}
	}
	w.pending[source] = q
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
			q      *queuedSnapshot
			found  bool
		)
		for source, q = range w.pending {
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
		if q == nil {
			w.remove(source)
			continue
		}
		err := w.write(q)
		if err != nil {
			// Forwarding is unaffected; only a restart during an
			// outage of the source would lack the definitions. Logged
			// once per source.
			if w.kept[source] != nil || !w.failed[source] {
				w.log.Error("could not keep the source's last services for a restart during its outage", "source", source, "error", err)
			}
			delete(w.kept, source)
			w.failed[source] = true
			continue
		}
		delete(w.failed, source)
	}
}

// write appends q's changes as a patch when the file holds the snapshot q
// patches, and writes the file whole otherwise.
func (w *lastGoodWriter) write(q *queuedSnapshot) error {
	snap := q.snap
	kf := w.kept[snap.Source]
	if q.changed == nil || kf == nil || kf.n != len(snap.Services) {
		return w.writeWhole(snap)
	}
	if len(q.changed) == 0 {
		return nil
	}
	patch := lastGoodPatch{Saved: time.Now().UTC(), Services: make([]lb.Service, 0, len(q.changed))}
	for name := range q.changed {
		i, ok := kf.at[name]
		if !ok || snap.Services[i].Name != name {
			return w.writeWhole(snap)
		}
		patch.Services = append(patch.Services, snap.Services[i])
	}
	b, err := json.Marshal(patch)
	if err != nil {
		return err
	}
	b = append(b, '\n')
	if kf.patched+len(b) > kf.whole {
		return w.writeWhole(snap)
	}
	path := LastGoodPath(w.socket, snap.Source)
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		return fmt.Errorf("save %s: %w", path, err)
	}
	_, err = f.Write(b)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("save %s: %w", path, err)
	}
	kf.patched += len(b)
	kf.sum = 0
	return nil
}

// writeWhole writes every service of snap, unless the file holds exactly
// those already (most full snapshots repeat the last one).
func (w *lastGoodWriter) writeWhole(snap discovery.Snapshot) error {
	svcs, err := json.Marshal(snap.Services)
	if err != nil {
		return err
	}
	sum := maphash.Bytes(w.seed, svcs) | 1
	if kf := w.kept[snap.Source]; kf != nil && kf.sum == sum {
		return nil
	}
	// The first value is lastGood, encoded around the services already
	// encoded rather than encoding them a second time.
	head, err := json.Marshal(lastGood{Source: snap.Source, Saved: time.Now().UTC()})
	if err != nil {
		return err
	}
	const null = `null}`
	if !bytes.HasSuffix(head, []byte(null)) {
		return fmt.Errorf("encoding the saved services: unexpected head %s", head)
	}
	b := make([]byte, 0, len(head)+len(svcs)+1)
	b = append(b, head[:len(head)-len(null)]...)
	b = append(b, svcs...)
	b = append(b, "}\n"...)
	path := LastGoodPath(w.socket, snap.Source)
	if err := writeAtomic(path, b); err != nil {
		return fmt.Errorf("save %s: %w", path, err)
	}
	kf := &keptFile{at: make(map[string]int, len(snap.Services)), n: len(snap.Services), sum: sum, whole: len(b)}
	for i, s := range snap.Services {
		kf.at[s.Name] = i
	}
	w.kept[snap.Source] = kf
	return nil
}

func (w *lastGoodWriter) remove(source string) {
	delete(w.kept, source)
	path := LastGoodPath(w.socket, source)
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		w.log.Warn("could not remove the services kept of a source turned off", "source", source, "file", path, "error", err)
	}
}

// writeAtomic replaces the file at path with b (mode 0600): a reader (or a
// restart) sees the old file or the new one, never a part. Its errors are
// the os package's, which name the file; callers say what was saved.
func writeAtomic(path string, b []byte) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// readLastGood reads a source's file: its services with every patch
// applied. A patch cut short (l4lbd killed while appending it) ends the
// read: torn says so, and lg holds the services as of the patch before.
func readLastGood(path string) (lg lastGood, torn, err error) {
	f, err := os.Open(path)
	if err != nil {
		return lg, nil, err
	}
	defer f.Close()
	dec := json.NewDecoder(bufio.NewReader(f))
	if err := dec.Decode(&lg); err != nil {
		return lg, nil, err
	}
	at := make(map[string]int, len(lg.Services))
	for i, s := range lg.Services {
		at[s.Name] = i
	}
	for n := 1; ; n++ {
		var p lastGoodPatch
		if err := dec.Decode(&p); err == io.EOF {
			return lg, nil, nil
		} else if err != nil {
			return lg, fmt.Errorf("patch %d: %w", n, err), nil
		}
		for _, s := range p.Services {
			if i, ok := at[s.Name]; ok {
				lg.Services[i] = s
			} else {
				at[s.Name] = len(lg.Services)
				lg.Services = append(lg.Services, s)
			}
		}
		lg.Saved = p.Saved
	}
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
	lg, torn, err := readLastGood(path)
	if errors.Is(err, os.ErrNotExist) {
		return
	}
	if torn != nil {
		d.log.Warn("the source's last services end in a torn write; using them as saved before it", "source", source, "file", path, "error", torn)
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
