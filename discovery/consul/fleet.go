// SPDX-License-Identifier: Apache-2.0

package consul

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/consul/api"
	"golang.org/x/time/rate"

	"github.com/l4lb/l4lb/lb/config"
	"github.com/l4lb/l4lb/lb/fleet"
)

// The fleet check's Consul side (docs/scale-out.md): each box writes its
// fleet.Box as JSON under KVPrefix+name (a header and shards of services,
// fleet_record.go), every key held by a session of its own with behaviour
// "delete", so that the record goes when the box does (its session expires
// after the TTL, or its agent's node fails); and it watches the whole
// prefix with a blocking query, so that another box's change is seen as
// soon as Consul has it.

// sessionPrefix names the sessions that hold fleet records: a box that
// restarts after a crash recognises its previous session by it.
const sessionPrefix = "l4lb-fleet "

// FleetOptions tune a Fleet; zero fields take the source's defaults.
type FleetOptions struct {
	Log *slog.Logger
	// Wait is the longest a blocking query waits (default DefaultWait).
	Wait time.Duration
	// RetryMin and RetryMax bound the back-off after a failed call.
	RetryMin, RetryMax time.Duration
}

// consulKVMaxValue is the default of Consul's limits.kv_max_value_size.
const consulKVMaxValue = 512 << 10

// publishEvery is the least time between two writes of this box's record,
// but for the first after a quiet second, which goes at once.
const publishEvery = time.Second

// goneFor is how long a box whose record went is remembered, for
// operators asking where it went.
const goneFor = time.Hour

// writeStats count what a Fleet wrote to Consul: transactions, keys
// written or deleted, and bytes of values (before base64).
type writeStats struct{ txns, keys, bytes int }

// FleetStatus says how current the fleet view is.
type FleetStatus struct {
	// LastSync is when Consul last answered the watch.
	LastSync time.Time
	// Error is the latest failure publishing or watching; empty when
	// both work.
	Error string
	// Gone maps the boxes whose records went within goneFor to when they
	// were last seen.
	Gone map[string]time.Time
}

// Fleet publishes this box's record and watches the others'. Its methods
// are safe for concurrent use.
type Fleet struct {
	client *api.Client
	cfg    config.Fleet
	name   string
	opts   FleetOptions
	log    *slog.Logger

	wake chan struct{}
	mu   sync.Mutex
	// local is the record to publish (nil: none yet).
	local            *fleet.Box
	wrote            writeStats
	boxes            []fleet.Box
	gone             map[string]time.Time
	lastSync         time.Time
	pubErr, watchErr error
}

// NewFleet prepares the fleet check for the [discovery.consul] agent.
func NewFleet(cc *config.Consul, fc *config.Fleet, opts FleetOptions) (*Fleet, error) {
	if cc == nil || fc == nil {
		return nil, errors.New("consul: the fleet check needs [discovery.consul] and [fleet]")
	}
	// The source's defaults and rules, for the fields the two share.
	shared := Options{Log: opts.Log, Wait: opts.Wait, RetryMin: opts.RetryMin, RetryMax: opts.RetryMax}
	shared.fill()
	opts.Log, opts.Wait, opts.RetryMin, opts.RetryMax = shared.Log, shared.Wait, shared.RetryMin, shared.RetryMax
	name := fc.Name
	if name == "" {
		h, err := os.Hostname()
		if err != nil || h == "" {
			return nil, fmt.Errorf("fleet: no host name to name this box by (%v): set fleet.name", err)
		}
		name = h
	}
	ac, err := clientConfig(cc)
	if err != nil {
		return nil, err
	}
	client, err := api.NewClient(ac)
	if err != nil {
		return nil, fmt.Errorf("fleet: cannot set up the Consul client for %s: %v", cc.Address, err)
	}
	return &Fleet{client: client, cfg: *fc, name: name, opts: opts, log: opts.Log.With("component", "fleet", "box", name), wake: make(chan struct{}, 1)}, nil
}

// Name is this box's name in the fleet.
func (f *Fleet) Name() string { return f.name }

// Publish sets the record to publish, which is written soon if it
// changed. b.Name is replaced by the box's name. b is the caller's no more:
// it is encoded later, off the caller's goroutine (at 100,000 services the
// record is megabytes), and a newer record replaces one not yet written.
func (f *Fleet) Publish(b fleet.Box) {
	b.Name = f.name
	f.mu.Lock()
	f.local = &b
	f.mu.Unlock()
	select {
	case f.wake <- struct{}{}:
	default:
	}
}

// Boxes returns the records Consul holds, this box's included, and how
// current they are.
func (f *Fleet) Boxes() ([]fleet.Box, FleetStatus) {
	f.mu.Lock()
	defer f.mu.Unlock()
	st := FleetStatus{LastSync: f.lastSync, Gone: maps.Clone(f.gone)}
	if err := errors.Join(f.pubErr, f.watchErr); err != nil {
		st.Error = err.Error()
	}
	return slices.Clone(f.boxes), st
}

// Run publishes and watches until ctx ends, then destroys the session,
// which deletes this box's record.
func (f *Fleet) Run(ctx context.Context) {
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); f.publishLoop(ctx) }()
	go func() { defer wg.Done(); f.watchLoop(ctx) }()
	wg.Wait()
}

func (f *Fleet) key() string { return f.cfg.KVPrefix + f.name }

func (f *Fleet) setErr(dst *error, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if (*dst == nil) != (err == nil) {
		if err != nil {
			f.log.Warn("fleet check: Consul call failing; retrying", "error", err)
		} else {
			f.log.Info("fleet check: Consul answers again")
		}
	}
	*dst = err
}

func (f *Fleet) backoff(ctx context.Context, d *time.Duration) bool {
	ok := sleep(ctx, jitter(*d))
	*d = min(*d*2, f.opts.RetryMax)
	return ok
}

// publishLoop keeps a session and this box's record under it.
func (f *Fleet) publishLoop(ctx context.Context) {
	var (
		session string
		lost    chan struct{}
		stopRen chan struct{}
		retry   = f.opts.RetryMin
		lim     = rate.NewLimiter(rate.Every(publishEvery), 1)
		encoded *fleet.Box // the record want lays out
		want    map[string][]byte
		shards  int // want's number of shards
		// have is what the session holds, as written: a key is written
		// again only when its value differs.
		have map[string][]byte
	)
	defer func() {
		if session == "" {
			return
		}
		close(stopRen)
		// Destroying the session deletes the record (behaviour delete),
		// so the others stop comparing with a box that is gone.
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if _, err := f.client.Session().Destroy(session, (&api.WriteOptions{}).WithContext(dctx)); err != nil {
			f.log.Warn("fleet check: could not remove this box's record; it goes when its session expires", "error", err, "ttl", f.cfg.SessionTTL)
		}
	}()
	for ctx.Err() == nil {
		if session == "" {
			id, err := f.createSession(ctx)
			if err != nil {
				f.setErr(&f.pubErr, err)
				if !f.backoff(ctx, &retry) {
					return
				}
				continue
			}
			session, lost, stopRen = id, make(chan struct{}), make(chan struct{})
			go func(id string, lost, stop chan struct{}) {
				err := f.client.Session().RenewPeriodic(f.cfg.SessionTTL.String(), id, (&api.WriteOptions{}).WithContext(ctx), stop)
				if err != nil && ctx.Err() == nil {
					f.log.Warn("fleet check: session lost; publishing under a new one", "error", err)
				}
				close(lost)
			}(id, lost, stopRen)
			// The previous session's keys went with it.
			have = map[string][]byte{}
		}
		f.mu.Lock()
		local := f.local
		f.mu.Unlock()
		if local != encoded {
			// A record is encoded whole and written where it
			// changed: under a stream of changes, one a second
			// carries them all. The newest is taken after the wait.
			if lim.Wait(ctx) != nil {
				return
			}
			f.mu.Lock()
			local = f.local
			f.mu.Unlock()
			encoded, want = local, nil
			if w, n, err := encodeRecord(f.key(), local, shards); err != nil {
				// What Consul holds stays; a record that fits
				// clears the error.
				f.setErr(&f.pubErr, err)
			} else {
				want, shards = w, n
			}
		}
		if want != nil && !maps.EqualFunc(want, have, bytes.Equal) {
			if err := f.write(ctx, session, want, have); err != nil {
				f.setErr(&f.pubErr, err)
				if !f.backoff(ctx, &retry) {
					return
				}
				continue
			}
			f.setErr(&f.pubErr, nil)
			retry = f.opts.RetryMin
		}
		select {
		case <-ctx.Done():
		case <-f.wake:
		case <-lost:
			session = ""
		}
	}
}

func (f *Fleet) createSession(ctx context.Context) (string, error) {
	id, _, err := f.client.Session().Create(&api.SessionEntry{
		Name:     sessionPrefix + f.name,
		TTL:      f.cfg.SessionTTL.String(),
		Behavior: api.SessionBehaviorDelete,
		// The default lock delay (15 s) would keep a restarted box from
		// taking its own key back that long.
		LockDelay: time.Millisecond,
	}, (&api.WriteOptions{}).WithContext(ctx))
	if err != nil {
		return "", fmt.Errorf("fleet: create a Consul session: %w", err)
	}
	return id, nil
}

// write makes the session hold want: it writes the keys whose values
// differ from have and deletes the keys of have that want lacks, in as few
// transactions as Consul's limits allow, and updates have as each one
// succeeds.
func (f *Fleet) write(ctx context.Context, session string, want, have map[string][]byte) error {
	for _, ops := range txnBatches(recordOps(f.key(), session, want, have)) {
		if err := f.commit(ctx, ops); err != nil {
			return err
		}
		st := writeStats{txns: 1}
		for _, op := range ops {
			if op.KV.Verb == api.KVDelete {
				delete(have, op.KV.Key)
			} else {
				have[op.KV.Key] = op.KV.Value
			}
			st.keys++
			st.bytes += len(op.KV.Value)
		}
		f.mu.Lock()
		f.wrote.txns, f.wrote.keys, f.wrote.bytes = f.wrote.txns+st.txns, f.wrote.keys+st.keys, f.wrote.bytes+st.bytes
		f.mu.Unlock()
	}
	return nil
}

// commit applies one transaction. A key still held by this box's previous
// session (l4lbd crashed or was killed, and the session has not expired)
// is taken back, by destroying that session, which removes every key it
// held; one held by another box means two boxes share a name.
func (f *Fleet) commit(ctx context.Context, ops api.TxnOps) error {
	wo := (&api.WriteOptions{}).WithContext(ctx)
	qo := (&api.QueryOptions{}).WithContext(ctx)
	key, what := ops[0].KV.Key, ""
	for attempt := 0; attempt < 2; attempt++ {
		ok, resp, _, err := f.client.Txn().Txn(ops, qo)
		if err != nil && strings.Contains(err.Error(), "too large") {
			return fmt.Errorf("fleet: write %d keys of this box's record in one transaction: %w (the Consul servers' txn_max_req_len or kv_max_value_size is below the 512 KiB default this box writes within: restore it, or set fleet.publish = false)", len(ops), err)
		}
		if err != nil {
			return fmt.Errorf("fleet: write %d keys of this box's record in one transaction: %w", len(ops), err)
		}
		if ok {
			return nil
		}
		if resp == nil || len(resp.Errors) == 0 || resp.Errors[0].OpIndex >= len(ops) {
			continue
		}
		key, what = ops[resp.Errors[0].OpIndex].KV.Key, resp.Errors[0].What
		pair, _, err := f.client.KV().Get(key, qo)
		if err != nil || pair == nil || pair.Session == "" {
			continue
		}
		info, _, err := f.client.Session().Info(pair.Session, qo)
		if err != nil || info == nil {
			continue
		}
		if info.Name != sessionPrefix+f.name {
			return fmt.Errorf("fleet: %s is held by session %q: another box uses the name %q; give each box its own fleet.name", key, info.Name, f.name)
		}
		f.log.Info("fleet check: taking this box's record back from its previous session", "session", pair.Session, "key", key)
		if _, err := f.client.Session().Destroy(pair.Session, wo); err != nil {
			return fmt.Errorf("fleet: remove the previous session: %w", err)
		}
	}
	return fmt.Errorf("fleet: %s stays held by another session (%s)", key, what)
}

// watchLoop keeps the view of every box's record current.
func (f *Fleet) watchLoop(ctx context.Context) {
	var index uint64
	var cache map[string]decodedShard
	retry := f.opts.RetryMin
	for ctx.Err() == nil {
		q := (&api.QueryOptions{WaitIndex: index, WaitTime: f.opts.Wait, AllowStale: true}).WithContext(ctx)
		pairs, meta, err := f.client.KV().List(f.cfg.KVPrefix, q)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			f.setErr(&f.watchErr, fmt.Errorf("fleet: watch %s: %w", f.cfg.KVPrefix, err))
			if !f.backoff(ctx, &retry) {
				return
			}
			index = 0
			continue
		}
		retry = f.opts.RetryMin
		now := time.Now()
		boxes, next := assembleBoxes(f.cfg.KVPrefix, pairs, cache, f.log)
		cache = next
		for i := range boxes {
			boxes[i].Seen = now
		}
		f.mu.Lock()
		f.gone = goneBoxes(f.gone, f.boxes, boxes, now)
		f.boxes, f.lastSync = boxes, now
		f.mu.Unlock()
		f.setErr(&f.watchErr, nil)
		index = nextIndex(index, meta.LastIndex)
	}
}

// goneBoxes updates gone (name: last seen) from one answer of the watch to
// the next: boxes of prev missing from cur are gone since they were last
// seen, boxes in cur are back, and entries older than goneFor are dropped.
func goneBoxes(gone map[string]time.Time, prev, cur []fleet.Box, now time.Time) map[string]time.Time {
	out := map[string]time.Time{}
	for name, seen := range gone {
		if now.Sub(seen) < goneFor {
			out[name] = seen
		}
	}
	for _, b := range prev {
		out[b.Name] = b.Seen
	}
	for _, b := range cur {
		delete(out, b.Name)
	}
	return out
}
