// SPDX-License-Identifier: Apache-2.0

// Package bpftest runs BPF programs with BPF_PROG_TEST_RUN and returns the
// kernel's own timing, which cilium/ebpf's Program.Run does not expose
// together with a context. Benchmarks use it to time one run of a program on
// a fresh packet: with repeat > 1 the kernel runs the program again on the
// packet the previous run already rewrote, which is meaningless for paths
// that encapsulate.
package bpftest

import (
	"encoding/binary"
	"fmt"
	"runtime"
	"time"
	"unsafe"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
)

// progRunAttr is the BPF_PROG_TEST_RUN part of union bpf_attr.
type progRunAttr struct {
	progFD      uint32
	retval      uint32
	dataSizeIn  uint32
	dataSizeOut uint32
	dataIn      uint64
	dataOut     uint64
	repeat      uint32
	duration    uint32
	ctxSizeIn   uint32
	ctxSizeOut  uint32
	ctxIn       uint64
	ctxOut      uint64
	flags       uint32
	cpu         uint32
	batchSize   uint32
	_           uint32
}

const bpfProgTestRun = 10 // BPF_PROG_TEST_RUN

// Result is one test run.
type Result struct {
	Verdict uint32
	// Duration is the kernel's measurement per repetition.
	Duration time.Duration
	// Out is the packet after the (last) run.
	Out []byte
}

// Run runs prog on data repeat times (at least once) with the given
// context (a struct, serialised in native byte order; nil for none).
func Run(prog *ebpf.Program, data []byte, ctx any, repeat uint32) (Result, error) {
	var ctxIn []byte
	if ctx != nil {
		var err error
		if ctxIn, err = binary.Append(nil, binary.NativeEndian, ctx); err != nil {
			return Result{}, fmt.Errorf("serialise context: %w", err)
		}
	}
	out := make([]byte, len(data)+256)
	attr := progRunAttr{
		progFD:      uint32(prog.FD()),
		dataSizeIn:  uint32(len(data)),
		dataSizeOut: uint32(len(out)),
		dataIn:      uint64(uintptr(unsafe.Pointer(unsafe.SliceData(data)))),
		dataOut:     uint64(uintptr(unsafe.Pointer(unsafe.SliceData(out)))),
		repeat:      max(repeat, 1),
	}
	if len(ctxIn) > 0 {
		attr.ctxSizeIn = uint32(len(ctxIn))
		attr.ctxIn = uint64(uintptr(unsafe.Pointer(unsafe.SliceData(ctxIn))))
	}
	for {
		_, _, errno := unix.Syscall(unix.SYS_BPF, bpfProgTestRun, uintptr(unsafe.Pointer(&attr)), unsafe.Sizeof(attr))
		runtime.KeepAlive(data)
		runtime.KeepAlive(out)
		runtime.KeepAlive(ctxIn)
		if errno == unix.EINTR {
			continue
		}
		if errno != 0 {
			return Result{}, fmt.Errorf("BPF_PROG_TEST_RUN: %w", errno)
		}
		break
	}
	return Result{
		Verdict:  attr.retval,
		Duration: time.Duration(attr.duration),
		Out:      out[:attr.dataSizeOut],
	}, nil
}

// KernelNow is the kernel's monotonic clock, the one bpf_ktime_get_ns and
// bpf_ktime_get_coarse_ns read: time since boot. Tests that age a map entry
// must compute the age from it, never from a constant such as 1, because a
// machine booted minutes ago has a small clock. The coarse clock the
// datapath reads may lag this one by a tick (a few milliseconds).
func KernelNow() time.Duration {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		// CLOCK_MONOTONIC exists on every Linux the datapath runs on.
		panic(fmt.Sprintf("clock_gettime(CLOCK_MONOTONIC): %v", err))
	}
	return time.Duration(ts.Nano())
}

// AgeableTimeout is a timeout that entries can be aged past with
// KernelNow: at most hi, and at most a quarter of the kernel's clock, so
// that "now minus twice the timeout" still lies after boot. On a machine up
// for less than four times lo it waits until the clock gets there (a few
// seconds at most), so callers hold at any uptime.
func AgeableTimeout(lo, hi time.Duration) time.Duration {
	for KernelNow() < 4*lo {
		time.Sleep(100 * time.Millisecond)
	}
	return max(lo, min(KernelNow()/4, hi))
}
