// SPDX-License-Identifier: Apache-2.0

package daemon

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/l4lb/l4lb/internal/runlock"
	"github.com/l4lb/l4lb/lb/config"
	"github.com/l4lb/l4lb/lb/datapath"
)

// One l4lbd per state and per interface: two daemons on the same pins would
// replace each other's programs and delete each other's socket, and two on
// one interface (one at XDP, one at tc, each with its own state) would both
// see every packet. A running l4lbd holds exclusive flocks (internal/runlock)
// on a lock file next to the admin socket, on the bpffs directory itself,
// and on one lock file per interface it serves; `l4lbd --cleanup` holds the
// first two. flock is released by the kernel when the process dies, so a
// crash leaves nothing to clear.

// runtimePath names a runtime file of the l4lbd that owns socket: next to
// the socket and named after it (/run/l4lb/l4lb.lock for
// /run/l4lb/l4lb.sock), so two daemons whose sockets share a directory
// never share a file.
func runtimePath(socket, suffix string) string {
	base := strings.TrimSuffix(filepath.Base(socket), ".sock")
	return filepath.Join(filepath.Dir(socket), base+suffix)
}

// LockPath is the lock file of the l4lbd configured with cfg.
func LockPath(cfg *config.Config) string { return runtimePath(cfg.Daemon.AdminSocket, ".lock") }

// RunningError says that another l4lbd holds the lock.
type RunningError struct {
	// PID of the holder; 0 when it cannot be found out.
	PID  int
	Lock string
	// Interface is set when the lock is that of an interface: another
	// l4lbd, with its own state, serves it.
	Interface string
}

func (e *RunningError) Error() string {
	pid := "pid unknown"
	if e.PID > 0 {
		pid = "pid " + strconv.Itoa(e.PID)
	}
	if e.Interface != "" {
		return fmt.Sprintf("interface %s is served by another l4lbd (%s, lock %s): one load balancer per interface, whichever hook (XDP or tc) and state each uses, or both would see every packet; stop that one (its config names %s in datapath.interfaces), or serve another interface",
			e.Interface, pid, e.Lock, e.Interface)
	}
	return fmt.Sprintf("l4lbd already running (%s, lock %s)", pid, e.Lock)
}

// Lock is the held lock of one l4lbd's state.
type Lock struct {
	files []*runlock.File
}

// Acquire takes the locks of cfg's state and interfaces, before anything of
// that state is touched: it first checks that daemon.bpffs can hold pins at
// all (so a bad path creates nothing), then locks the file next to the
// admin socket, the bpffs directory and each of datapath.interfaces. A lock
// another process holds is a *RunningError naming it.
func Acquire(cfg *config.Config) (*Lock, error) {
	_, serr := os.Stat(cfg.Daemon.BPFFS)
	l, err := acquire(cfg, true)
	if err != nil {
		return nil, err
	}
	for _, name := range cfg.Datapath.Interfaces {
		f, ok, err := runlock.LockInterface(name)
		if err != nil {
			l.Release()
			if errors.Is(serr, os.ErrNotExist) {
				// Refused, it leaves nothing: the directory it
				// made is empty.
				_ = os.Remove(cfg.Daemon.BPFFS)
			}
			var held *runlock.HeldError
			if errors.As(err, &held) {
				return nil, &RunningError{PID: held.PID, Lock: held.Lock, Interface: name}
			}
			return nil, err
		}
		if ok {
			l.files = append(l.files, f)
		}
	}
	return l, nil
}

// acquire takes the locks of cfg's state; without pins it takes the lock
// file only and leaves daemon.bpffs alone (a cleanup that finds no bpffs
// directory: a running l4lbd always has one, and holds the lock file too).
func acquire(cfg *config.Config, pins bool) (*Lock, error) {
	if pins {
		if err := datapath.CheckPinPath(cfg.Daemon.BPFFS); err != nil {
			return nil, err
		}
	}
	l := &Lock{}
	path := LockPath(cfg)
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, fmt.Errorf("lock: create %s: %w", filepath.Dir(path), err)
	}
	f, err := lockPath(path, false)
	if err != nil {
		return nil, err
	}
	l.files = append(l.files, f)
	if !pins {
		return l, nil
	}
	if err := os.MkdirAll(cfg.Daemon.BPFFS, 0o700); err != nil {
		l.Release()
		return nil, fmt.Errorf("lock: create bpffs directory %s: %w", cfg.Daemon.BPFFS, err)
	}
	d, err := lockPath(cfg.Daemon.BPFFS, true)
	if err != nil {
		l.Release()
		return nil, err
	}
	l.files = append(l.files, d)
	return l, nil
}

// Release drops the locks and removes the lock files (the interfaces' and
// the one next to the admin socket): a stopped l4lbd leaves none behind.
func (l *Lock) Release() {
	if l == nil {
		return
	}
	for _, f := range slices.Backward(l.files) {
		f.Release()
	}
	l.files = nil
}

// lockPath is runlock.Lock, a lock held by another l4lbd a *RunningError.
func lockPath(path string, dir bool) (*runlock.File, error) {
	f, err := runlock.Lock(path, dir, "")
	var held *runlock.HeldError
	if errors.As(err, &held) {
		return nil, &RunningError{PID: held.PID, Lock: held.Lock}
	}
	return f, err
}
