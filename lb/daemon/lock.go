// SPDX-License-Identifier: Apache-2.0

package daemon

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/l4lb/l4lb/lb/config"
	"github.com/l4lb/l4lb/lb/datapath"
)

// One l4lbd per state: two daemons on the same pins would replace each
// other's programs and delete each other's socket. A running l4lbd (and
// `l4lbd --cleanup`) holds two exclusive flocks: one on a lock file next to
// the admin socket, one on the bpffs directory itself, so a second daemon
// is refused whether it shares the socket or the pins. flock is released by
// the kernel when the process dies, so a crash leaves nothing to clear.

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
}

func (e *RunningError) Error() string {
	pid := "pid unknown"
	if e.PID > 0 {
		pid = "pid " + strconv.Itoa(e.PID)
	}
	return fmt.Sprintf("l4lbd already running (%s, lock %s)", pid, e.Lock)
}

// Lock is the held lock of one l4lbd's state.
type Lock struct {
	files []*os.File
}

// Acquire takes the lock of cfg's state, before anything of that state is
// touched: it first checks that daemon.bpffs can hold pins at all (so a
// bad path creates nothing), then locks the file next to the admin socket
// and the bpffs directory. A lock another process holds is a
// *RunningError naming it.
func Acquire(cfg *config.Config) (*Lock, error) {
	return acquire(cfg, true)
}

// acquire is Acquire; without pins it takes the lock file only and leaves
// daemon.bpffs alone (a cleanup that finds no bpffs directory: a running
// l4lbd always has one, and holds the lock file too).
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
	// For whoever reads the file; the holder is found in /proc/locks.
	_ = f.Truncate(0)
	_, _ = f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	return l, nil
}

// Release drops the lock. The lock file stays: it holds no state, and
// removing it would let a daemon that opened it just before lock a file
// no other daemon sees.
func (l *Lock) Release() {
	if l == nil {
		return
	}
	for _, f := range l.files {
		f.Close()
	}
	l.files = nil
}

// lockPath opens path (creating a lock file, or opening a directory) and
// takes an exclusive flock on it without waiting. It retries when the path
// was replaced between open and lock (a --cleanup removing the directory),
// so the lock is always on what the path names.
func lockPath(path string, dir bool) (*os.File, error) {
	for range 10 {
		var (
			f   *os.File
			err error
		)
		if dir {
			f, err = os.OpenFile(path, os.O_RDONLY|unix.O_DIRECTORY, 0)
		} else {
			f, err = os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
		}
		if err != nil {
			return nil, fmt.Errorf("lock: open %s: %w", path, err)
		}
		if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
			f.Close()
			if errors.Is(err, unix.EWOULDBLOCK) {
				return nil, &RunningError{PID: holder(path), Lock: path}
			}
			return nil, fmt.Errorf("lock: flock %s: %w", path, err)
		}
		if sameFile(f, path) {
			return f, nil
		}
		f.Close()
	}
	return nil, fmt.Errorf("lock: %s keeps being replaced", path)
}

func sameFile(f *os.File, path string) bool {
	a, err1 := f.Stat()
	b, err2 := os.Stat(path)
	return err1 == nil && err2 == nil && os.SameFile(a, b)
}

// holder finds the pid holding a flock on path in /proc/locks (lines like
// `1: FLOCK  ADVISORY  WRITE 1234 00:1f:5678 0 EOF`, the device in hex),
// falling back to the pid written in a lock file.
func holder(path string) int {
	fi, err := os.Stat(path)
	if err != nil {
		return 0
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return 0
	}
	want := fmt.Sprintf("%02x:%02x:%d", unix.Major(st.Dev), unix.Minor(st.Dev), st.Ino)
	if f, err := os.Open("/proc/locks"); err == nil {
		defer f.Close()
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			fields := strings.Fields(sc.Text())
			if len(fields) >= 6 && fields[1] == "FLOCK" && fields[5] == want {
				if pid, err := strconv.Atoi(fields[4]); err == nil {
					return pid
				}
			}
		}
	}
	if fi.Mode().IsRegular() {
		if b, err := os.ReadFile(path); err == nil {
			if pid, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil {
				return pid
			}
		}
	}
	return 0
}
