// SPDX-License-Identifier: Apache-2.0

package daemon

import (
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/l4lb/l4lb/discovery"
	"github.com/l4lb/l4lb/lb/config"
	"github.com/l4lb/l4lb/lb/reconciler"
	"github.com/l4lb/l4lb/lb/reconciler/reconcilertest"
)

// BenchmarkReload is the control loop's share of `l4lbctl reload` after
// one backend's weight changed in a file of n services of 10 backends:
// read and parse the file, merge, and the pass, into the fake datapath.
// It is what the file path of make bench-control costs besides the BPF
// writes and the admin API.
func BenchmarkReload(b *testing.B) {
	for _, n := range []int{1000, 10000} {
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			d, path, data := reloadRig(b, n, "")
			// The weight of one backend of the middle service flips
			// between 1 and 2.
			at := strings.Index(data, fmt.Sprintf("name = \"s%06d\"", n/2))
			at += strings.Index(data[at:], "weight = 1")
			b.ResetTimer()
			for i := range b.N {
				w := "1"
				if i%2 == 0 {
					w = "2"
				}
				if err := os.WriteFile(path, []byte(data[:at]+"weight = "+w+data[at+len("weight = 1"):]), 0o600); err != nil {
					b.Fatal(err)
				}
				start := time.Now()
				if err := d.doReload(); err != nil {
					b.Fatal(err)
				}
				res := d.plan.Pass(start)
				if err := d.run(res); err != nil || res.View == nil || res.Full {
					b.Fatalf("reload: error %v, or not a pass over one service", err)
				}
			}
		})
	}
}

// reloadRig writes a file of n services of 10 backends (extra goes into
// [daemon]) and returns a daemon that programmed it into the fake datapath,
// the file's path and its content. Services are named s000000 on, at VIP
// 10.x.y.z, with backends 11.x.y.z:8000-8009 of weight 1; there is room
// for as many backends again (replaced ones drain).
func reloadRig(tb testing.TB, n int, extra string) (d *Daemon, path, data string) {
	dir := tb.TempDir()
	var doc strings.Builder
	fmt.Fprintf(&doc, "[daemon]\nadmin_socket = %q\n%s[datapath]\ninterfaces = [\"lo\"]\nmode = \"snat\"\nmax_services = %d\nmax_backends = %d\n[maglev]\ntable_size = 1021\n", filepath.Join(dir, "l4lb.sock"), extra, n, 20*n)
	for i := range n {
		fmt.Fprintf(&doc, "\n[[service]]\nname = \"s%06d\"\nvip = \"10.%d.%d.%d\"\nport = 80\nprotocol = \"tcp\"\n", i, i>>16, (i>>8)&255, i&255)
		for j := range 10 {
			fmt.Fprintf(&doc, "[[service.backend]]\naddress = \"11.%d.%d.%d\"\nport = %d\nweight = 1\n", i>>16, (i>>8)&255, i&255, 8000+j)
		}
	}
	path = filepath.Join(dir, "l4lb.toml")
	data = doc.String()
	if err := os.WriteFile(path, []byte(data), 0o600); err != nil {
		tb.Fatal(err)
	}
	p := config.NewParser()
	cfg, err := p.Load(path, config.Options{Dev: true})
	if err != nil {
		tb.Fatal(err)
	}
	d, err = New(Options{ConfigPath: path, Initial: cfg, Parser: p, Config: config.Options{Dev: true}, Log: slog.New(slog.DiscardHandler)})
	if err != nil {
		tb.Fatal(err)
	}
	d.rec = reconciler.New(reconciler.Config{Seed: cfg.Maglev.Seed, MaxServices: uint32(n), MaxBackends: uint32(20 * n)}, reconcilertest.NewFake(), slog.New(slog.DiscardHandler))
	d.plan.SetDatapath(d.rec, nil)
	d.merger.Update(discovery.Snapshot{Source: d.file.Name(), Services: cfg.Services})
	if err := d.apply(); err != nil {
		tb.Fatal(err)
	}
	return d, path, data
}
