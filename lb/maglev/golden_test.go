// SPDX-License-Identifier: Apache-2.0

package maglev

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"flag"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

var update = flag.Bool("update", false, "rewrite testdata/golden.json from the current code (review the diff: any change moves flows on every box)")

const goldenFile = "testdata/golden.json"

// golden is the content of testdata/golden.json: tables and flow hashes
// that must never change, because every LB box and the C datapath have to
// agree on them.
type golden struct {
	Comment string        `json:"comment"`
	Tables  []goldenTable `json:"tables"`
	Flows   []goldenFlow  `json:"flows"`
}

type goldenTable struct {
	Name     string   `json:"name"`
	Seed     string   `json:"seed"`
	Size     uint32   `json:"size"`
	Backends []string `json:"backends"` // "addr:port@weight", in caller order
	// Table lists slot owners as indexes into Backends, space separated;
	// big tables store only TableSHA256 (of the slots as little-endian
	// int32s) and Counts.
	Table       string `json:"table,omitempty"`
	TableSHA256 string `json:"table_sha256,omitempty"`
	Counts      []int  `json:"counts"`
	Fingerprint string `json:"fingerprint"`
}

type goldenFlow struct {
	Name  string `json:"name"`
	Seed  string `json:"seed"`
	Src   string `json:"src"`
	Dst   string `json:"dst"`
	Sport uint16 `json:"sport"`
	Dport uint16 `json:"dport"`
	Proto uint8  `json:"proto"`
	Key   string `json:"key"`  // FlowKey, hex
	Hash  string `json:"hash"` // FlowHash, hex (JSON numbers lose 64-bit precision)
	Slot  uint32 `json:"slot_65521"`
}

// goldenInputs are the cases the golden file covers: IPv4 and IPv6,
// equal, uneven and zero weights, input not in canonical order, and sizes
// from tiny to large.
func goldenInputs() []goldenTable {
	seedA := "00112233445566778899aabbccddeeff"
	seedB := "f0e1d2c3b4a5968778695a4b3c2d1e0f"
	// many spells out its backends rather than reusing makeBackends, so
	// that editing test helpers cannot change the golden inputs.
	many := func(n int, weight func(int) int) []string {
		var bs []string
		for i := range n {
			addr := fmt.Sprintf("10.%d.%d.%d:%d", i>>16&0xff, i>>8&0xff, i&0xff, 8000+i%7)
			if i%2 == 1 {
				addr = fmt.Sprintf("[2001:db8::%x]:%d", i, 8000+i%7)
			}
			bs = append(bs, fmt.Sprintf("%s@%d", addr, weight(i)))
		}
		return bs
	}
	one := func(int) int { return 1 }
	return []goldenTable{
		{Name: "three IPv4 backends, M=7", Seed: seedA, Size: 7,
			Backends: []string{"10.0.0.3:80@1", "10.0.0.1:80@1", "10.0.0.2:80@1"}},
		{Name: "five IPv4 backends, M=251", Seed: seedA, Size: 251,
			Backends: []string{"10.1.0.5:8080@1", "10.1.0.1:8080@1", "10.1.0.4:8080@1", "10.1.0.2:8080@1", "10.1.0.3:8080@1"}},
		{Name: "same backends, other seed", Seed: seedB, Size: 251,
			Backends: []string{"10.1.0.5:8080@1", "10.1.0.1:8080@1", "10.1.0.4:8080@1", "10.1.0.2:8080@1", "10.1.0.3:8080@1"}},
		{Name: "IPv6 weights 1,2,3,10 and a zero", Seed: seedA, Size: 251,
			Backends: []string{"[2001:db8::10]:443@10", "[2001:db8::1]:443@1", "[2001:db8::3]:443@3", "[2001:db8::2]:443@2", "[2001:db8::99]:443@0"}},
		{Name: "mixed families and ports, M=509", Seed: seedB, Size: 509,
			Backends: []string{"192.0.2.1:80@1", "192.0.2.1:81@1", "[2001:db8::1]:80@2", "198.51.100.7:80@1", "[::ffff:203.0.113.9]:80@1"}},
		{Name: "100 backends, M=65521", Seed: seedA, Size: 65521, Backends: many(100, one)},
		{Name: "1000 backends weights 1..8, M=65521", Seed: seedB, Size: 65521,
			Backends: many(1000, func(i int) int { return 1 + i%8 })},
		{Name: "uneven weights (sorted schedule), M=4093", Seed: seedA, Size: 4093,
			Backends: many(50, func(i int) int {
				if i == 0 {
					return 1000
				}
				return 1 + i%3
			})},
	}
}

func goldenFlowInputs() []goldenFlow {
	return []goldenFlow{
		{Name: "IPv4 TCP", Seed: "00112233445566778899aabbccddeeff", Src: "192.0.2.10", Dst: "198.51.100.1", Sport: 40000, Dport: 443, Proto: 6},
		{Name: "IPv4 UDP", Seed: "00112233445566778899aabbccddeeff", Src: "203.0.113.77", Dst: "198.51.100.1", Sport: 5353, Dport: 53, Proto: 17},
		{Name: "IPv4 other seed", Seed: "f0e1d2c3b4a5968778695a4b3c2d1e0f", Src: "192.0.2.10", Dst: "198.51.100.1", Sport: 40000, Dport: 443, Proto: 6},
		{Name: "IPv4 zero seed, zero ports", Seed: "00000000000000000000000000000000", Src: "0.0.0.0", Dst: "255.255.255.255", Sport: 0, Dport: 0, Proto: 6},
		{Name: "IPv6 TCP", Seed: "00112233445566778899aabbccddeeff", Src: "2001:db8::10", Dst: "2001:db8:1::1", Sport: 40000, Dport: 443, Proto: 6},
		{Name: "IPv6 UDP", Seed: "00112233445566778899aabbccddeeff", Src: "2001:db8:ffff::1234", Dst: "2001:db8:1::1", Sport: 65535, Dport: 1, Proto: 17},
		{Name: "IPv6 other seed", Seed: "f0e1d2c3b4a5968778695a4b3c2d1e0f", Src: "2001:db8::10", Dst: "2001:db8:1::1", Sport: 40000, Dport: 443, Proto: 6},
	}
}

func parseGoldenBackend(t *testing.T, s string) Backend {
	t.Helper()
	addr, w, ok := strings.Cut(s, "@")
	if !ok {
		t.Fatalf("golden backend %q: want addr:port@weight", s)
	}
	weight, err := strconv.ParseUint(w, 10, 32)
	if err != nil {
		t.Fatalf("golden backend %q: weight: %v", s, err)
	}
	return Backend{Addr: netip.MustParseAddrPort(addr), Weight: uint32(weight)}
}

func mustSeed(t *testing.T, s string) Seed {
	t.Helper()
	seed, err := ParseSeed(s)
	if err != nil {
		t.Fatal(err)
	}
	return seed
}

// computeGolden fills in the outputs of the golden inputs from the code.
func computeGolden(t *testing.T) golden {
	g := golden{Comment: "Maglev tables and flow hashes that every l4lb box and the C datapath must reproduce. " +
		"Regenerate with `go test ./lb/maglev -update` only for a deliberate, versioned algorithm change."}
	for _, gt := range goldenInputs() {
		seed := mustSeed(t, gt.Seed)
		var bs []Backend
		for _, s := range gt.Backends {
			bs = append(bs, parseGoldenBackend(t, s))
		}
		table, err := Build(seed, gt.Size, bs)
		if err != nil {
			t.Fatalf("%s: %v", gt.Name, err)
		}
		gt.Counts = counts(table, len(bs))
		gt.Fingerprint = Fingerprint(seed, gt.Size, bs)
		if gt.Size <= 509 {
			var sb strings.Builder
			for i, idx := range table {
				if i > 0 {
					sb.WriteByte(' ')
				}
				sb.WriteString(strconv.Itoa(int(idx)))
			}
			gt.Table = sb.String()
		} else {
			h := sha256.New()
			for _, idx := range table {
				h.Write(binary.LittleEndian.AppendUint32(nil, uint32(idx)))
			}
			gt.TableSHA256 = hex.EncodeToString(h.Sum(nil))
		}
		g.Tables = append(g.Tables, gt)
	}
	for _, gf := range goldenFlowInputs() {
		f := Flow{
			Src: netip.MustParseAddr(gf.Src), Dst: netip.MustParseAddr(gf.Dst),
			SrcPort: gf.Sport, DstPort: gf.Dport, Proto: gf.Proto,
		}
		k := FlowKey(f)
		h := FlowHash(mustSeed(t, gf.Seed), f)
		gf.Key = hex.EncodeToString(k[:])
		gf.Hash = fmt.Sprintf("%016x", h)
		gf.Slot = Slot(h, 65521)
		g.Flows = append(g.Flows, gf)
	}
	return g
}

func TestGolden(t *testing.T) {
	got := computeGolden(t)
	if *update {
		out, err := marshalGolden(got)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.MkdirAll(filepath.Dir(goldenFile), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(goldenFile, out, 0o644); err != nil {
			t.Fatal(err)
		}
		t.Logf("rewrote %s", goldenFile)
		return
	}
	raw, err := os.ReadFile(goldenFile)
	if err != nil {
		t.Fatalf("%v (create it with `go test ./lb/maglev -run TestGolden -update`)", err)
	}
	var want golden
	if err := json.Unmarshal(raw, &want); err != nil {
		t.Fatalf("%s: %v", goldenFile, err)
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("output differs from %s; this would move flows on every LB box (-golden +now):\n%s", goldenFile, diff)
	}
}

// marshalGolden writes one case per line, so that a diff of the file shows
// which cases changed rather than thousands of one-number lines.
func marshalGolden(g golden) ([]byte, error) {
	var sb strings.Builder
	comment, err := json.Marshal(g.Comment)
	if err != nil {
		return nil, err
	}
	fmt.Fprintf(&sb, "{\n  \"comment\": %s,\n  \"tables\": [\n", comment)
	for i, tc := range g.Tables {
		line, err := json.Marshal(tc)
		if err != nil {
			return nil, err
		}
		sb.WriteString("    ")
		sb.Write(line)
		if i < len(g.Tables)-1 {
			sb.WriteByte(',')
		}
		sb.WriteByte('\n')
	}
	sb.WriteString("  ],\n  \"flows\": [\n")
	for i, f := range g.Flows {
		line, err := json.Marshal(f)
		if err != nil {
			return nil, err
		}
		sb.WriteString("    ")
		sb.Write(line)
		if i < len(g.Flows)-1 {
			sb.WriteByte(',')
		}
		sb.WriteByte('\n')
	}
	sb.WriteString("  ]\n}\n")
	return []byte(sb.String()), nil
}
