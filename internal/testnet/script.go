// SPDX-License-Identifier: Apache-2.0

package testnet

import "fmt"

// Script is a TB for programs that are not tests (the demo, the benchmark
// runner): Fatalf and Skipf abort by panicking with a *Failure, and Run
// turns that into an error after every cleanup has run.
type Script struct{ cleanups []func() }

// Failure is what Fatalf and Skipf panic with.
type Failure struct{ Msg string }

func (f *Failure) Error() string { return f.Msg }

// Helper implements TB.
func (s *Script) Helper() {}

// Cleanup implements TB.
func (s *Script) Cleanup(f func()) { s.cleanups = append(s.cleanups, f) }

// Fatalf implements TB.
func (s *Script) Fatalf(format string, a ...any) { panic(&Failure{fmt.Sprintf(format, a...)}) }

// Skipf implements TB; a script cannot skip, so it fails.
func (s *Script) Skipf(format string, a ...any) { panic(&Failure{fmt.Sprintf(format, a...)}) }

// Run calls body, then the cleanups in reverse order, and returns the
// failure body aborted with, if any. Other panics are re-raised after the
// cleanups.
func (s *Script) Run(body func()) (err error) {
	defer func() {
		r := recover()
		for i := len(s.cleanups) - 1; i >= 0; i-- {
			s.cleanups[i]()
		}
		s.cleanups = nil
		if r == nil {
			return
		}
		if f, ok := r.(*Failure); ok {
			err = f
			return
		}
		panic(r)
	}()
	body()
	return nil
}
