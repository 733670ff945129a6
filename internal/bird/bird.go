// SPDX-License-Identifier: Apache-2.0

// Package bird runs Debian's BIRD 2 (bird2, installed by scripts/deps.sh)
// as the real BGP router of tests: in the test's own namespace or on
// loopback, with a config the test writes, and with birdc to ask it what it
// learned. The daemon is stopped when the test ends.
package bird

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/l4lb/l4lb/internal/testnet"
)

// Paths of Debian's bird2 binaries.
const (
	birdPath  = "/usr/sbin/bird"
	birdcPath = "/usr/sbin/birdc"
)

// Require finds BIRD; without it a test skips, or fails under `make test`
// (testnet.PrivilegedEnv), where scripts/deps.sh installs it.
func Require(t testnet.TB) {
	t.Helper()
	testnet.SkipShort(t, "runs BIRD")
	for _, p := range []string{birdPath, birdcPath} {
		if _, err := os.Stat(p); err != nil {
			msg := fmt.Sprintf("%s not found: install Debian's bird2 (scripts/deps.sh test does)", p)
			if os.Getenv(testnet.PrivilegedEnv) != "" {
				t.Fatalf("%s; %s is set, so this is a failure", msg, testnet.PrivilegedEnv)
			}
			t.Skipf("skipping: %s", msg)
		}
	}
}

// Router is a running BIRD.
type Router struct {
	t      testnet.TB
	Dir    string
	socket string
	ns     *testnet.NS
	cmd    *exec.Cmd
	log    string
	done   chan struct{}
	mu     sync.Mutex
	err    error
}

// Start writes conf to dir and runs BIRD in the foreground with it, inside
// ns (nil: the test's own namespace), until the test ends.
func Start(t testnet.TB, dir string, ns *testnet.NS, conf string) *Router {
	t.Helper()
	Require(t)
	r := &Router{t: t, Dir: dir, socket: filepath.Join(dir, "bird.ctl"), ns: ns, log: filepath.Join(dir, "bird.log"), done: make(chan struct{})}
	confPath := filepath.Join(dir, "bird.conf")
	if err := os.WriteFile(confPath, []byte(conf), 0o644); err != nil {
		t.Fatalf("write %s: %v", confPath, err)
	}
	args := []string{"-f", "-c", confPath, "-s", r.socket, "-P", filepath.Join(dir, "bird.pid")}
	if ns != nil {
		r.cmd = ns.Command(birdPath, args...)
	} else {
		r.cmd = exec.Command(birdPath, args...)
	}
	out, err := os.Create(filepath.Join(dir, "bird.out"))
	if err != nil {
		t.Fatalf("bird output: %v", err)
	}
	r.cmd.Stdout, r.cmd.Stderr = out, out
	if err := r.cmd.Start(); err != nil {
		out.Close()
		t.Fatalf("start bird: %v", err)
	}
	go func() {
		err := r.cmd.Wait()
		out.Close()
		r.mu.Lock()
		r.err = err
		r.mu.Unlock()
		close(r.done)
	}()
	t.Cleanup(r.stop)
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, err := r.Show("show", "status"); err == nil {
			return r
		}
		select {
		case <-r.done:
			t.Fatalf("bird exited: %v\n%s", r.err, r.Logs())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("bird did not answer on %s within 10s\n%s", r.socket, r.Logs())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (r *Router) stop() {
	select {
	case <-r.done:
		return
	default:
	}
	_ = r.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-r.done:
	case <-time.After(5 * time.Second):
		_ = r.cmd.Process.Kill()
		<-r.done
	}
}

// Show runs a birdc command ("show route all") and returns its output.
func (r *Router) Show(args ...string) (string, error) {
	out, err := exec.Command(birdcPath, append([]string{"-s", r.socket}, args...)...).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("birdc %s: %v: %s", strings.Join(args, " "), err, out)
	}
	return string(out), nil
}

// Logs returns BIRD's log and console output so far, for failure messages.
func (r *Router) Logs() string {
	var b strings.Builder
	for _, f := range []string{r.log, filepath.Join(r.Dir, "bird.out")} {
		data, _ := os.ReadFile(f)
		fmt.Fprintf(&b, "--- %s\n%s", filepath.Base(f), data)
	}
	return b.String()
}

// Reconfigure replaces BIRD's config with conf and applies it (`birdc
// configure`); BIRD restarts only the protocols whose settings changed.
func (r *Router) Reconfigure(conf string) {
	r.t.Helper()
	path := filepath.Join(r.Dir, "bird.conf")
	if err := os.WriteFile(path, []byte(conf), 0o644); err != nil {
		r.t.Fatalf("write %s: %v", path, err)
	}
	out, err := r.Show("configure")
	if err != nil || !strings.Contains(out, "Reconfigured") {
		r.t.Fatalf("birdc configure: %v\n%s\n%s", err, out, r.Logs())
	}
}
