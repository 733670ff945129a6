// SPDX-License-Identifier: Apache-2.0

package daemon

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/l4lb/l4lb/discovery"
	"github.com/l4lb/l4lb/discovery/consul"
	"github.com/l4lb/l4lb/lb"
	"github.com/l4lb/l4lb/lb/config"
)

// standInConsul answers like an agent with an empty catalog and KV store,
// holding blocking queries open until the client gives up.
func standInConsul(t *testing.T) string {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Query().Get("index") != "" {
			<-r.Context().Done()
			return
		}
		w.Header().Set("X-Consul-Index", "7")
		if strings.HasPrefix(r.URL.Path, "/v1/kv/") {
			http.NotFound(w, r)
			return
		}
		io.WriteString(w, "{}")
	}))
	t.Cleanup(srv.Close)
	return strings.TrimPrefix(srv.URL, "http://")
}

func consulDaemon(t *testing.T, addr string) *Daemon {
	t.Helper()
	return testDaemon(t, "[datapath]\ninterfaces = [\"lo\"]\nmode = \"dsr\"\n[discovery.consul]\naddress = \""+addr+"\"\n")
}

// testDaemon is a daemon, not running, of the config doc with its admin
// socket (and the files named after it) in a temporary directory.
func testDaemon(t *testing.T, doc string) *Daemon {
	t.Helper()
	return testDaemonAt(t, filepath.Join(t.TempDir(), "l4lb.sock"), doc)
}

func testDaemonAt(t *testing.T, socket, doc string) *Daemon {
	t.Helper()
	cfg, err := config.Parse("test.toml", []byte("[daemon]\nadmin_socket = \""+socket+"\"\n"+doc), config.Options{Dev: true})
	if err != nil {
		t.Fatal(err)
	}
	d, err := New(Options{ConfigPath: "test.toml", Initial: cfg, Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func TestConsulLifecycle(t *testing.T) {
	old := sourceStartWait
	sourceStartWait = 5 * time.Second
	t.Cleanup(func() { sourceStartWait = old })

	d := consulDaemon(t, standInConsul(t))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stop, err := d.startSources(ctx)
	if err != nil {
		t.Fatalf("startSources: %v", err)
	}
	defer stop()
	first := d.consulRun.Load()
	if first == nil {
		t.Fatal("no Consul source running with [discovery.consul] set")
	}
	// The first (empty) snapshot reached the merger before startSources
	// returned; status shows the source.
	deadline := time.Now().Add(10 * time.Second)
	for {
		st := d.discoveryStatus()
		if len(st) == 1 && st[0].Name == consul.SourceName && !st[0].Stale && !st[0].LastSync.IsZero() {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("discovery status = %+v, want consul, not stale", st)
		}
		time.Sleep(10 * time.Millisecond)
	}

	reload := func(cfg *config.Config) error {
		commit, err := d.reloadConsul(cfg)
		if err == nil {
			commit()
		}
		return err
	}
	// A reload that changes nothing of Consul keeps the source.
	same := *d.cfg
	if err := reload(&same); err != nil || d.consulRun.Load() != first {
		t.Fatalf("reload without change: err %v, restarted %v", err, d.consulRun.Load() != first)
	}
	// A changed setting restarts it.
	changed := *d.cfg
	cc := *d.cfg.Consul
	cc.Tag = "edge"
	changed.Consul = &cc
	if err := reload(&changed); err != nil || d.consulRun.Load() == first {
		t.Fatalf("reload with a new tag: err %v, restarted %v", err, d.consulRun.Load() != first)
	}
	second := d.consulRun.Load()
	// So does a changed default the source validates against.
	defs := changed
	defs.Datapath.Mode = lb.ModeSNAT
	if err := reload(&defs); err != nil || d.consulRun.Load() == second {
		t.Fatalf("reload with new defaults: err %v, restarted %v", err, d.consulRun.Load() != second)
	}
	third := d.consulRun.Load()
	// An unreadable token file rejects the reload and keeps the source.
	bad := defs
	bc := *defs.Consul
	bc.TokenFile = filepath.Join(t.TempDir(), "missing")
	bad.Consul = &bc
	if err := reload(&bad); err == nil || !strings.Contains(err.Error(), "token_file") || d.consulRun.Load() != third {
		t.Fatalf("reload with a missing token file: err %v, source replaced %v", err, d.consulRun.Load() != third)
	}
	// A rotated token restarts it.
	tok := filepath.Join(t.TempDir(), "token")
	os.WriteFile(tok, []byte("one"), 0o600)
	bc.TokenFile = tok
	if err := reload(&bad); err != nil || d.consulRun.Load() == third {
		t.Fatalf("reload with a token file: err %v", err)
	}
	fourth := d.consulRun.Load()
	os.WriteFile(tok, []byte("two"), 0o600)
	if err := reload(&bad); err != nil || d.consulRun.Load() == fourth {
		t.Fatalf("reload with a rotated token: err %v, restarted %v", err, d.consulRun.Load() != fourth)
	}

	// Turning Consul off forgets its services, including a snapshot still
	// queued for the control loop, and keeps the file's.
	fe := func(port uint16) lb.Frontend {
		return lb.Frontend{Addr: netip.MustParseAddr("192.0.2.10"), Port: port, Proto: lb.TCP}
	}
	d.merger.Update(discovery.Snapshot{Source: consul.SourceName, Services: []lb.Service{{Name: "from-consul", Frontend: fe(80)}}})
	d.snaps <- discovery.Snapshot{Source: consul.SourceName, Services: []lb.Service{{Name: "late-consul", Frontend: fe(81)}}}
	d.snaps <- discovery.Snapshot{Source: d.file.Name(), Services: []lb.Service{{Name: "from-file", Frontend: fe(82)}}}
	off := bad
	off.Consul = nil
	if err := reload(&off); err != nil || d.consulRun.Load() != nil {
		t.Fatalf("reload without [discovery.consul]: err %v, still running %v", err, d.consulRun.Load() != nil)
	}
	got, _ := d.merger.Desired()
	if len(got) != 1 || got[0].Name != "from-file" {
		t.Errorf("desired after turning Consul off = %v, want only from-file", got)
	}
	if len(d.snaps) != 0 {
		t.Errorf("%d snapshots still queued", len(d.snaps))
	}
	if st := d.discoveryStatus(); st != nil {
		t.Errorf("discovery status with Consul off = %+v", st)
	}
}
