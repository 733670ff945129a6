// SPDX-License-Identifier: Apache-2.0

// Package runlock holds the exclusive locks (flock) that keep two l4lbd
// processes off the same state: the same pins, the same interface, the
// same backend host. The kernel drops a flock when its holder dies, so a
// crash leaves nothing to clear; a lock file is removed by the holder that
// releases it, and a locker that finds the file replaced under it locks
// the new one.
package runlock

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// Dir holds the locks that are per host (per network namespace) rather
// than per state directory: the interfaces an l4lbd serves and the backend
// companion's. systemd's RuntimeDirectory=l4lb makes it, and removes it
// at reboot.
const Dir = "/run/l4lb"

// HeldError says that another process holds a lock.
type HeldError struct {
	// PID of the holder; 0 when it cannot be found out.
	PID int
	// Lock is the path locked.
	Lock string
}

func (e *HeldError) Error() string { return "lock held (" + e.Who() + ")" }

// Who names the holder and the lock: "pid 1234, lock /run/l4lb/x.lock".
func (e *HeldError) Who() string {
	pid := "pid unknown"
	if e.PID > 0 {
		pid = "pid " + strconv.Itoa(e.PID)
	}
	return pid + ", lock " + e.Lock
}

// File is one held lock.
type File struct {
	f      *os.File
	path   string
	remove bool
}

// Lock opens path (creating a lock file, or opening a directory when dir
// is set) and takes an exclusive flock on it without waiting; note is
// written into a lock file for whoever reads it (the holder's pid is
// found in /proc/locks either way). It retries when the path was replaced
// between open and lock (a holder removing its lock file, a --cleanup
// removing a directory), so the lock is always on what the path names. A
// lock another process holds is a *HeldError.
func Lock(path string, dir bool, note string) (*File, error) {
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
				return nil, &HeldError{PID: holder(path), Lock: path}
			}
			return nil, fmt.Errorf("lock: flock %s: %w", path, err)
		}
		if sameFile(f, path) {
			if !dir {
				_ = f.Truncate(0)
				_, _ = f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"+note), 0)
			}
			return &File{f: f, path: path, remove: !dir}, nil
		}
		f.Close()
	}
	return nil, fmt.Errorf("lock: %s keeps being replaced", path)
}

// Release drops the lock and removes a lock file: removed first, so that
// a process that opened it just before and locks it now sees it replaced
// (Lock's retry) rather than holding a lock no one else sees.
func (l *File) Release() {
	if l == nil || l.f == nil {
		return
	}
	if l.remove && sameFile(l.f, l.path) {
		_ = os.Remove(l.path)
	}
	l.f.Close()
	l.f = nil
}

// Path is the path locked.
func (l *File) Path() string { return l.path }

func sameFile(f *os.File, path string) bool {
	a, err1 := f.Stat()
	b, err2 := os.Stat(path)
	return err1 == nil && err2 == nil && os.SameFile(a, b)
}

// holder finds the pid holding a flock on path in /proc/locks (lines like
// `1: FLOCK  ADVISORY  WRITE 1234 00:1f:5678 0 EOF`, the device in hex),
// falling back to the pid written first in a lock file.
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
			first, _, _ := strings.Cut(string(b), "\n")
			if pid, err := strconv.Atoi(strings.TrimSpace(first)); err == nil {
				return pid
			}
		}
	}
	return 0
}

// Netns identifies the calling thread's network namespace as
// "DEV-INODE" of its nsfs file: names of interfaces, and "one companion
// per host", are per namespace, and tests run many namespaces on one box.
// The caller keeps its goroutine on one thread (runtime.LockOSThread)
// when it also looks up interfaces, so both answers are of one namespace.
func Netns() (string, error) {
	var st unix.Stat_t
	if err := unix.Stat("/proc/thread-self/ns/net", &st); err != nil {
		return "", fmt.Errorf("lock: network namespace: %w", err)
	}
	return fmt.Sprintf("%x-%d", st.Dev, st.Ino), nil
}

// InterfacePath is the lock of the interface with index ifindex in the
// network namespace netns (Netns): one load balancer per interface,
// whichever hook (XDP or tc) and state directory each would use.
func InterfacePath(netns string, ifindex int) string {
	return filepath.Join(Dir, "interfaces", fmt.Sprintf("%s-%d.lock", netns, ifindex))
}

// CompanionPath is the lock of the backend companion of the network
// namespace netns: one per host.
func CompanionPath(netns string) string {
	return filepath.Join(Dir, "backend-"+netns+".lock")
}

// LockInterface locks the interface named name of the calling thread's
// network namespace. It reports ok false, holding nothing, when there is
// no such interface (validation names it; the attach fails anyway).
func LockInterface(name string) (l *File, ok bool, err error) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	ns, err := Netns()
	if err != nil {
		return nil, false, err
	}
	ifc, err := net.InterfaceByName(name)
	if err != nil {
		return nil, false, nil
	}
	path := InterfacePath(ns, ifc.Index)
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, false, fmt.Errorf("lock: create %s: %w", filepath.Dir(path), err)
	}
	l, err = Lock(path, false, "interface "+name+"\n")
	return l, err == nil, err
}

// Set is several held locks, released together.
type Set []*File

// Release releases every lock of s, the last taken first.
func (s Set) Release() {
	for i := len(s) - 1; i >= 0; i-- {
		s[i].Release()
	}
}

// CompanionError says that another backend companion holds a lock.
type CompanionError struct {
	HeldError
	// PinPath is set when the lock is the --bpffs directory's.
	PinPath string
}

func (e *CompanionError) Error() string {
	if e.PinPath != "" {
		return fmt.Sprintf("another backend companion uses --bpffs %s (%s): two would rewrite each other's VIP list, and the first to stop would remove the other's pins; stop it first, or give this one another --bpffs",
			e.PinPath, e.Who())
	}
	return fmt.Sprintf("another backend companion runs on this host (%s): one per host, since each would decapsulate and rewrite the same traffic by its own VIP list; stop it first, or give it every --vip", e.Who())
}

// LockCompanion takes the backend companion's locks before it touches
// anything: the host's (one companion per network namespace) and that of
// its bpffs directory pinPath, which it creates (two companions on one set
// of pins would rewrite each other's VIP list, and the first to stop would
// remove the other's pins). A lock another companion holds is a
// *CompanionError.
func LockCompanion(pinPath string) (Set, error) {
	ns, err := Netns()
	if err != nil {
		return nil, err
	}
	path := CompanionPath(ns)
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, fmt.Errorf("lock: create %s: %w", filepath.Dir(path), err)
	}
	var held *HeldError
	host, err := Lock(path, false, "backend companion\n")
	if errors.As(err, &held) {
		return nil, &CompanionError{HeldError: *held}
	}
	if err != nil {
		return nil, err
	}
	set := Set{host}
	if pinPath == "" {
		return set, nil
	}
	if err := os.MkdirAll(pinPath, 0o700); err != nil {
		set.Release()
		return nil, fmt.Errorf("lock: create --bpffs directory %s: %w", pinPath, err)
	}
	pins, err := Lock(pinPath, true, "")
	if err != nil {
		set.Release()
		if errors.As(err, &held) {
			return nil, &CompanionError{HeldError: *held, PinPath: pinPath}
		}
		return nil, err
	}
	return append(set, pins), nil
}
