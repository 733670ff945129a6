// SPDX-License-Identifier: Apache-2.0

package main

import (
	"bufio"
	"cmp"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"

	"github.com/cilium/ebpf"

	"github.com/l4lb/l4lb/internal/testnet"
)

// Where a path's time goes, by C source line. perf samples the bench's
// BPF programs by their JIT symbols (bpf_prog_<tag>_<function>), but this
// box's perf cannot disassemble BPF (no libopcodes), so `perf annotate`
// shows nothing. The kernel keeps, for every loaded program, the JIT
// address of each of its BTF line-info records; with those, a sampled
// address names the C line it was compiled from. `-jitlines FILE` writes
// that map for every LB program the A/B run loads, and `-lines FILE` reads
// `perf script -F ip,sym` on stdin and prints the hottest lines:
//
//	perf record -e cpu-clock -F 20000 -a -g -o p.data -- go run ./tests/bench -a a.o -b b.o -paths 'ipip.*ACK after' -jitlines /tmp/jit.txt
//	perf script -i p.data --comm bench -F ip,sym | go run ./tests/bench -lines /tmp/jit.txt

// writeJITLines appends the JIT address of every line-info record of prog
// to w, one "address file:line source" a line.
func writeJITLines(w io.Writer, prog *ebpf.Program) error {
	info, err := prog.Info()
	if err != nil {
		return fmt.Errorf("program info: %w", err)
	}
	addrs, ok := info.JitedLineInfos()
	if !ok {
		return fmt.Errorf("program %s: the kernel gave no JIT line info (not JITed, or no BTF)", info.Name)
	}
	lines, err := info.LineInfos()
	if err != nil {
		return fmt.Errorf("program %s: line info: %w", info.Name, err)
	}
	if len(lines) != len(addrs) {
		return fmt.Errorf("program %s: %d line-info records but %d JIT addresses", info.Name, len(lines), len(addrs))
	}
	// The functions' extents first, so that a reader counts only addresses
	// inside them (jitRange).
	starts, ok1 := info.JitedKsymAddrs()
	lens, ok2 := info.JitedFuncLens()
	if !ok1 || !ok2 || len(starts) != len(lens) {
		return fmt.Errorf("program %s: the kernel gave no JIT function extents", info.Name)
	}
	for i, a := range starts {
		fmt.Fprintf(w, "range %x %x\n", a, uint64(a)+uint64(lens[i]))
	}
	for i, a := range addrs {
		l := lines[i].Line
		fmt.Fprintf(w, "%x %s:%d %s\n", a, l.FileName(), l.LineNumber(), strings.TrimSpace(l.Line()))
	}
	return nil
}

// jitLine is one record of a -jitlines file.
type jitLine struct {
	addr uint64
	line string
}

// jitRange is a JITed function's extent, [start, end).
type jitRange struct{ start, end uint64 }

// jitMap is a -jitlines file: its lines sorted by address, and the
// functions they belong to.
type jitMap struct {
	lines  []jitLine
	ranges []jitRange
}

func readJITLines(path string) (*jitMap, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	m := &jitMap{}
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var r jitRange
		if _, err := fmt.Sscanf(sc.Text(), "range %x %x", &r.start, &r.end); err == nil {
			m.ranges = append(m.ranges, r)
			continue
		}
		a, rest, ok := strings.Cut(sc.Text(), " ")
		addr, err := strconv.ParseUint(a, 16, 64)
		if !ok || err != nil {
			return nil, fmt.Errorf("%s: not a -jitlines file: %q", path, sc.Text())
		}
		m.lines = append(m.lines, jitLine{addr, rest})
	}
	slices.SortFunc(m.lines, func(x, y jitLine) int { return cmp.Compare(x.addr, y.addr) })
	return m, sc.Err()
}

// hotLines reads `perf script -F ip,sym` (with call chains) from r and
// counts each sample whose chain passes through an LB program (the
// bpf_prog_ symbols of the l4lb_ and lb_process functions): to the C line
// of its address when the sample is in the program itself, else to the
// kernel function it was in (a map lookup's bucket walk, say). It returns
// the counts, hottest first, and their total.
func hotLines(r io.Reader, jit *jitMap) ([]lineShare, int, error) {
	counts := map[string]int{}
	total := 0
	var block [][]string
	flush := func() {
		defer func() { block = block[:0] }()
		if len(block) == 0 {
			return
		}
		in := slices.IndexFunc(block, func(f []string) bool { return len(f) >= 2 && lbSymbol(f[1]) })
		if in < 0 {
			return
		}
		// The program frame must be one of the map's: another process
		// running an LB object (a second bench) has programs of its own.
		line, ok := lineOf(jit, block[in][0])
		if !ok {
			return
		}
		if in > 0 {
			line = "[kernel] " + strings.Join(block[0][1:], " ")
		}
		counts[line]++
		total++
	}
	sc := bufio.NewScanner(r)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) == 0 {
			flush()
			continue
		}
		block = append(block, f)
	}
	flush()
	out := make([]lineShare, 0, len(counts))
	for l, n := range counts {
		out = append(out, lineShare{l, n})
	}
	slices.SortFunc(out, func(x, y lineShare) int { return cmp.Or(cmp.Compare(y.n, x.n), cmp.Compare(x.line, y.line)) })
	return out, total, sc.Err()
}

// lineOf is the line of the map that the address (hex) falls in; none
// when it is in no function of the map.
func lineOf(jit *jitMap, addr string) (string, bool) {
	ip, err := strconv.ParseUint(addr, 16, 64)
	if err != nil {
		return "", false
	}
	if !slices.ContainsFunc(jit.ranges, func(r jitRange) bool { return r.start <= ip && ip < r.end }) {
		return "", false
	}
	i, found := slices.BinarySearchFunc(jit.lines, ip, func(x jitLine, ip uint64) int { return cmp.Compare(x.addr, ip) })
	if !found {
		i--
	}
	if i < 0 {
		return "", false
	}
	return jit.lines[i].line, true
}

// lbSymbol tells whether a perf symbol is one of the LB object's programs.
func lbSymbol(sym string) bool {
	return strings.HasPrefix(sym, "bpf_prog_") && (strings.Contains(sym, "_l4lb_") || strings.Contains(sym, "_lb_process"))
}

type lineShare struct {
	line string
	n    int
}

// printHotLines is -lines: the 40 hottest lines of the samples on stdin.
func printHotLines(jitPath string) error {
	jit, err := readJITLines(jitPath)
	if err != nil {
		return err
	}
	lines, total, err := hotLines(os.Stdin, jit)
	if err != nil {
		return err
	}
	if total == 0 {
		return fmt.Errorf("no sample on stdin fell in the programs of %s (was it written by the run perf recorded?)", jitPath)
	}
	fmt.Printf("%d samples in the LB programs and the kernel functions they called\n", total)
	for _, l := range lines[:min(len(lines), 40)] {
		fmt.Printf("%6d %5.1f%%  %s\n", l.n, 100*float64(l.n)/float64(total), l.line)
	}
	return nil
}

// writeJITFile writes the JIT line map of both programs of every datapath
// of the run to path.
func writeJITFile(t *testnet.Script, path string, rigs [][]*rig) {
	f, err := os.Create(path)
	if err != nil {
		t.Fatalf("-jitlines: %v", err)
	}
	w := bufio.NewWriter(f)
	for _, rs := range rigs {
		for _, r := range rs {
			for _, p := range []*ebpf.Program{r.lb.Program(), r.lb.ProgramTC()} {
				if err := writeJITLines(w, p); err != nil {
					t.Fatalf("-jitlines: %v", err)
				}
			}
		}
	}
	if err := w.Flush(); err != nil {
		t.Fatalf("-jitlines: %v", err)
	}
	if err := f.Close(); err != nil {
		t.Fatalf("-jitlines: %v", err)
	}
}
