// SPDX-License-Identifier: Apache-2.0

package runlock

import (
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/l4lb/l4lb/internal/testnet"
)

// TestLockHeldReleasedRemoved: a held lock refuses a second locker with
// the holder's pid; released, its file is gone and it can be taken again.
func TestLockHeldReleasedRemoved(t *testing.T) {
	path := filepath.Join(t.TempDir(), "x.lock")
	l, err := Lock(path, false, "note\n")
	if err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(path); !strings.HasPrefix(string(b), strconv.Itoa(os.Getpid())+"\n") || !strings.Contains(string(b), "note") {
		t.Errorf("lock file holds %q", b)
	}
	_, err = Lock(path, false, "")
	var held *HeldError
	if !errors.As(err, &held) || held.PID != os.Getpid() || held.Lock != path {
		t.Fatalf("second Lock: %v, want held by pid %d", err, os.Getpid())
	}
	l.Release()
	if _, err := os.Stat(path); !os.IsNotExist(err) {
		t.Errorf("lock file left after Release: %v", err)
	}
	l2, err := Lock(path, false, "")
	if err != nil {
		t.Fatalf("Lock after Release: %v", err)
	}
	l2.Release()
}

// TestLockDirectoryStays: a directory lock is released without removing
// the directory (it holds the state).
func TestLockDirectoryStays(t *testing.T) {
	dir := t.TempDir()
	l, err := Lock(dir, true, "")
	if err != nil {
		t.Fatal(err)
	}
	var held *HeldError
	if _, err := Lock(dir, true, ""); !errors.As(err, &held) {
		t.Fatalf("second directory Lock: %v", err)
	}
	l.Release()
	if _, err := os.Stat(dir); err != nil {
		t.Errorf("directory gone after Release: %v", err)
	}
}

// TestLockInterfacePerNamespace: an interface is locked once in its
// namespace; the same name in another namespace is another lock, and a
// missing interface locks nothing.
func TestLockInterfacePerNamespace(t *testing.T) {
	testnet.RequireRoot(t)
	a, b := testnet.NewAnonNS(t, "rla"), testnet.NewAnonNS(t, "rlb")
	var first *File
	if err := a.Do(func() error {
		l, ok, err := LockInterface("lo")
		if err != nil || !ok {
			return errors.Join(err, errors.New("lo not locked"))
		}
		first = l
		_, _, err = LockInterface("lo")
		var held *HeldError
		if !errors.As(err, &held) || held.PID != os.Getpid() {
			return errors.Join(errors.New("second lock of lo in one namespace"), err)
		}
		if _, ok, err := LockInterface("nosuch0"); ok || err != nil {
			return errors.Join(errors.New("a missing interface was locked"), err)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	defer first.Release()
	if err := b.Do(func() error {
		l, ok, err := LockInterface("lo")
		if err != nil || !ok {
			return errors.Join(errors.New("lo of another namespace not locked"), err)
		}
		if l.Path() == first.Path() {
			return errors.New("two namespaces share a lock path: " + l.Path())
		}
		l.Release()
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}

// TestLockCompanion: one companion per network namespace, and one per
// --bpffs directory across namespaces; each refusal names its cause.
func TestLockCompanion(t *testing.T) {
	testnet.RequireRoot(t)
	a, b := testnet.NewAnonNS(t, "rca"), testnet.NewAnonNS(t, "rcb")
	pins := filepath.Join(t.TempDir(), "companion")
	var first Set
	if err := a.Do(func() (err error) {
		first, err = LockCompanion(pins)
		if err != nil {
			return err
		}
		_, err = LockCompanion(filepath.Join(t.TempDir(), "other"))
		var ce *CompanionError
		if !errors.As(err, &ce) || ce.PinPath != "" || !strings.Contains(err.Error(), "another backend companion runs on this host") {
			return errors.Join(errors.New("a second companion in one namespace"), err)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if err := b.Do(func() error {
		_, err := LockCompanion(pins)
		var ce *CompanionError
		if !errors.As(err, &ce) || ce.PinPath != pins || ce.PID != os.Getpid() {
			return errors.Join(errors.New("a companion of another namespace on the same pins"), err)
		}
		// The host lock it took on the way is released: another
		// --bpffs in that namespace is fine.
		s, err := LockCompanion(filepath.Join(t.TempDir(), "own"))
		if err != nil {
			return err
		}
		s.Release()
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	first.Release()
	if _, err := os.Stat(pins); err != nil {
		t.Errorf("the pins directory is gone after Release: %v", err)
	}
}
