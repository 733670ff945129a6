// SPDX-License-Identifier: Apache-2.0

package topo

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/l4lb/l4lb/lb/api"
	lbconfig "github.com/l4lb/l4lb/lb/config"
)

// BuildBinaries compiles l4lbd and l4lbctl from the module at root into dir.
func BuildBinaries(root, dir string) error {
	for _, cmd := range []string{"l4lbd", "l4lbctl"} {
		out, err := exec.Command("go", "build", "-C", root, "-o", filepath.Join(dir, cmd), "./cmd/"+cmd).CombinedOutput()
		if err != nil {
			return fmt.Errorf("build %s: %v\n%s", cmd, err, out)
		}
	}
	return nil
}

// Proc is a process started in a host's namespace.
type Proc struct {
	cmd  *exec.Cmd
	log  *lockedBuffer
	done chan struct{}
	err  error
}

type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// Start runs a command in h's namespace (nsenter keeps /sys/fs/bpf). It is
// killed when the test ends if still running.
func (h *Host) Start(name string, args ...string) *Proc {
	t := h.top.T
	t.Helper()
	cmd := h.NS.Command(name, args...)
	p := &Proc{cmd: cmd, log: &lockedBuffer{}, done: make(chan struct{})}
	cmd.Stdout = p.log
	cmd.Stderr = p.log
	if err := cmd.Start(); err != nil {
		t.Fatalf("%s: start %s: %v", h.Name, name, err)
	}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() {
		select {
		case <-p.done:
		default:
			_ = cmd.Process.Signal(syscall.SIGKILL)
			<-p.done
		}
	})
	return p
}

// Pid is the process id.
func (p *Proc) Pid() int { return p.cmd.Process.Pid }

// Signal sends sig to the process.
func (p *Proc) Signal(sig os.Signal) error { return p.cmd.Process.Signal(sig) }

// Stop sends SIGTERM and waits (up to 10 s) for the exit; it returns the
// process's error, if any.
func (p *Proc) Stop() error {
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
		return p.err
	case <-time.After(10 * time.Second):
		_ = p.cmd.Process.Signal(syscall.SIGKILL)
		<-p.done
		return fmt.Errorf("did not stop within 10s after SIGTERM")
	}
}

// Exited reports whether the process ended.
func (p *Proc) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// Log is the process's combined output so far.
func (p *Proc) Log() string { return p.log.String() }

// L4LBD is an l4lbd running on an LB box.
type L4LBD struct {
	*Proc
	Host   *Host
	Config string // path of its config file
	Socket string
	PinDir string
	bin    string
	// wrapper and args reproduce the command line on Restart.
	wrapper []string
	args    []string
}

func (d *L4LBD) start() {
	argv := append(append(append([]string{}, d.wrapper...), d.bin, "--config", d.Config), d.args...)
	d.Proc = d.Host.Start(argv[0], argv[1:]...)
}

// Restart stops l4lbd with SIGTERM and starts it again with the same
// command line, then waits until it answers.
func (d *L4LBD) Restart() {
	t := d.Host.top.T
	t.Helper()
	if err := d.Stop(); err != nil {
		t.Fatalf("%s: stop l4lbd: %v\n%s", d.Host.Name, err, d.Log())
	}
	d.start()
	d.WaitReady()
}

// KillAndStart kills l4lbd with SIGKILL, as a crash would, and starts it
// again with the same command line, then waits until it answers. The
// pinned datapath forwards meanwhile.
func (d *L4LBD) KillAndStart() {
	d.Host.top.T.Helper()
	d.Kill()
	d.Start()
}

// Kill kills l4lbd with SIGKILL, as a crash would, and waits for the
// exit. The pinned datapath forwards meanwhile.
func (d *L4LBD) Kill() {
	_ = d.Signal(syscall.SIGKILL)
	<-d.done
}

// Start starts l4lbd again with the same command line, after Kill or
// Stop, and waits until it answers.
func (d *L4LBD) Start() {
	d.Host.top.T.Helper()
	d.start()
	d.WaitReady()
}

// StartL4LBD writes config to the topology's directory and starts l4lbd
// with it in h's namespace, then waits until its admin API answers.
// config may use {{socket}} and {{bpffs}}, replaced by per-host paths.
func (h *Host) StartL4LBD(bin, config string, extraArgs ...string) *L4LBD {
	h.top.T.Helper()
	return h.StartL4LBDWrapped(nil, bin, config, extraArgs...)
}

// StartL4LBDWrapped is StartL4LBD with l4lbd run under a wrapper command
// (e.g. setpriv with a capability set).
func (h *Host) StartL4LBDWrapped(wrapper []string, bin, config string, extraArgs ...string) *L4LBD {
	t := h.top.T
	t.Helper()
	d := &L4LBD{
		wrapper: wrapper,
		args:    extraArgs,
		Host:    h,
		Config:  filepath.Join(h.top.Dir, h.Name+".toml"),
		Socket:  filepath.Join(h.top.Dir, h.Name+".sock"),
		PinDir:  filepath.Join(h.top.PinRoot, h.Name),
		bin:     bin,
	}
	d.WriteConfig(config)
	// A config may name its own socket and bpffs directory.
	if cfg, err := lbconfig.Load(d.Config, lbconfig.Options{Dev: true}); err == nil {
		d.Socket, d.PinDir = cfg.Daemon.AdminSocket, cfg.Daemon.BPFFS
	}
	d.start()
	t.Cleanup(func() {
		// Pins outlive the process on purpose (hitless restart): the
		// test removes them, once l4lbd is gone (--cleanup refuses
		// while it holds its lock).
		if !d.Exited() {
			_ = d.Stop()
		}
		_ = exec.Command(bin, "--config", d.Config, "--cleanup").Run()
	})
	d.WaitReady()
	return d
}

// WriteConfig replaces the daemon's config file, in one rename: with
// daemon.watch_config on, l4lbd reloads by itself when the file changes,
// and must never read half of it. Otherwise the test reloads (Reload).
func (d *L4LBD) WriteConfig(config string) {
	t := d.Host.top.T
	t.Helper()
	config = strings.ReplaceAll(config, "{{socket}}", d.Socket)
	config = strings.ReplaceAll(config, "{{bpffs}}", d.PinDir)
	tmp := d.Config + ".new"
	if err := os.WriteFile(tmp, []byte(config), 0o600); err != nil {
		t.Fatalf("write %s: %v", tmp, err)
	}
	if err := os.Rename(tmp, d.Config); err != nil {
		t.Fatalf("rename %s: %v", tmp, err)
	}
}

// API returns a client for the daemon's admin socket.
func (d *L4LBD) API() *api.Client { return api.NewClient(d.Socket) }

// readyWait is how long WaitReady waits for a start: generous, because on
// a machine busy with other builds loading and verifying the programs and
// allocating the maps has taken more than 20 s; an exit fails at once.
const readyWait = 2 * time.Minute

// WaitReady waits (up to readyWait) for the admin API to answer.
func (d *L4LBD) WaitReady() {
	t := d.Host.top.T
	t.Helper()
	deadline := time.Now().Add(readyWait)
	for time.Now().Before(deadline) {
		if d.Exited() {
			t.Fatalf("%s: l4lbd exited: %v\n%s", d.Host.Name, d.err, d.Log())
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_, err := d.API().Status(ctx)
		cancel()
		if err == nil {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("%s: l4lbd not ready after %s\n%s", d.Host.Name, readyWait, d.Log())
}

// Reload sends SIGHUP and waits until the daemon reports the new reload.
func (d *L4LBD) Reload() api.Reload {
	t := d.Host.top.T
	t.Helper()
	ctx := context.Background()
	before, err := d.API().Status(ctx)
	if err != nil {
		t.Fatalf("%s: status: %v", d.Host.Name, err)
	}
	if err := d.Signal(syscall.SIGHUP); err != nil {
		t.Fatalf("%s: SIGHUP: %v", d.Host.Name, err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		st, err := d.API().Status(ctx)
		if err == nil && st.LastReload.Count > before.LastReload.Count {
			return st.LastReload
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("%s: reload not observed within 10s\n%s", d.Host.Name, d.Log())
	return api.Reload{}
}

// StartCompanion runs `l4lbd backend` on a backend for the VIPs.
func (h *Host) StartCompanion(bin string, vips ...string) *Proc {
	t := h.top.T
	t.Helper()
	pin := filepath.Join(h.top.PinRoot, h.Name+"-companion")
	args := []string{"backend", "--interface", h.Iface, "--bpffs", pin}
	for _, v := range vips {
		args = append(args, "--vip", v)
	}
	p := h.Start(bin, args...)
	// The companion attaches within milliseconds; wait for its log line so
	// no test packet races the attach.
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(p.Log(), "backend companion running") {
		if p.Exited() || time.Now().After(deadline) {
			t.Fatalf("%s: companion did not start: %v\n%s", h.Name, p.err, p.Log())
		}
		time.Sleep(20 * time.Millisecond)
	}
	return p
}
