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
