// SPDX-License-Identifier: Apache-2.0

package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/l4lb/l4lb/lb"
	"github.com/l4lb/l4lb/lb/api"
	"github.com/l4lb/l4lb/lb/maglev"
	"github.com/l4lb/l4lb/lb/metrics"
)

// run executes l4lbctl with args and returns stdout, stderr and the error.
func run(t *testing.T, args ...string) (string, string, error) {
	t.Helper()
	cmd := root()
	var out, errb bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&errb)
	cmd.SetArgs(args)
	err := cmd.Execute()
	return out.String(), errb.String(), err
}

const seedHex = "00112233445566778899aabbccddeeff"

func TestMaglevTableJSONContract(t *testing.T) {
	args := []string{"maglev", "table", "--seed", seedHex, "--size", "251", "-o", "json",
		"10.1.0.12:80", "[2001:db8::1]:80@2", "10.1.0.11:80"}
	out, _, err := run(t, args...)
	if err != nil {
		t.Fatal(err)
	}
	// The shape is a contract: exactly these keys.
	var raw map[string]json.RawMessage
	if err := json.Unmarshal([]byte(out), &raw); err != nil {
		t.Fatalf("not JSON: %v\n%s", err, out)
	}
	var keys []string
	for k := range raw {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	if want := []string{"backends", "size", "table"}; !slices.Equal(keys, want) {
		t.Fatalf("keys %v, want %v", keys, want)
	}
	var got struct {
		Size     uint32   `json:"size"`
		Backends []string `json:"backends"`
		Table    []int32  `json:"table"`
	}
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatal(err)
	}
	wantBackends := []string{"10.1.0.11:80", "10.1.0.12:80", "[2001:db8::1]:80"}
	if got.Size != 251 || !slices.Equal(got.Backends, wantBackends) || len(got.Table) != 251 {
		t.Fatalf("size %d backends %v table len %d", got.Size, got.Backends, len(got.Table))
	}
	// The same table as lb/maglev builds over the canonical order.
	seed, _ := maglev.ParseSeed(seedHex)
	bs := []maglev.Backend{
		{Addr: netip.MustParseAddrPort("10.1.0.11:80"), Weight: 1},
		{Addr: netip.MustParseAddrPort("10.1.0.12:80"), Weight: 1},
		{Addr: netip.MustParseAddrPort("[2001:db8::1]:80"), Weight: 2},
	}
	want, err := maglev.Build(seed, 251, bs)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got.Table, want) {
		t.Fatal("table differs from lb/maglev's")
	}
	// Whatever order the backends are given in, the output is identical.
	slices.Reverse(args[8:])
	out2, _, err := run(t, args...)
	if err != nil {
		t.Fatal(err)
	}
	if out2 != out {
		t.Fatal("output depends on the order of the backends")
	}
}

func TestMaglevLookupAgreesWithTable(t *testing.T) {
	backends := []string{"10.1.0.11:80", "10.1.0.12:80", "10.1.0.13:80"}
	tableOut, _, err := run(t, append([]string{"maglev", "table", "--seed", seedHex, "--size", "509", "-o", "json"}, backends...)...)
	if err != nil {
		t.Fatal(err)
	}
	var table tableJSON
	if err := json.Unmarshal([]byte(tableOut), &table); err != nil {
		t.Fatal(err)
	}
	seed, _ := maglev.ParseSeed(seedHex)
	for sport := uint16(1000); sport < 1050; sport++ {
		out, _, err := run(t, append([]string{"maglev", "lookup", "--seed", seedHex, "--size", "509", "-o", "json",
			"--src", "198.51.100.7", "--dst", "192.0.2.10", "--sport", itoa(sport), "--dport", "80", "--proto", "tcp"}, backends...)...)
		if err != nil {
			t.Fatal(err)
		}
		var res lookupJSON
		if err := json.Unmarshal([]byte(out), &res); err != nil {
			t.Fatal(err)
		}
		h := maglev.FlowHash(seed, maglev.Flow{Src: netip.MustParseAddr("198.51.100.7"), Dst: netip.MustParseAddr("192.0.2.10"), SrcPort: sport, DstPort: 80, Proto: 6})
		slot := maglev.Slot(h, 509)
		if res.Slot != slot || res.Backend != table.Backends[table.Table[slot]] {
			t.Fatalf("sport %d: lookup says %+v; table slot %d holds %s", sport, res, slot, table.Backends[table.Table[slot]])
		}
	}
}

func itoa(v uint16) string {
	b, _ := json.Marshal(v)
	return string(b)
}

func TestMaglevErrors(t *testing.T) {
	tests := []struct {
		args []string
		want string
	}{
		{[]string{"maglev", "table", "--seed", "abc", "10.0.0.1:80"}, "--seed"},
		{[]string{"maglev", "table", "--seed", seedHex, "--size", "1000", "10.0.0.1:80"}, "not prime"},
		{[]string{"maglev", "table", "--seed", seedHex, "10.0.0.1"}, `backend "10.0.0.1"`},
		{[]string{"maglev", "table", "--seed", seedHex, "10.0.0.1:80@x"}, "weight"},
		{[]string{"maglev", "table", "--seed", seedHex, "10.0.0.1:80", "10.0.0.1:80"}, "10.0.0.1:80"},
		{[]string{"maglev", "lookup", "--seed", seedHex, "--src", "::1", "--dst", "10.0.0.1", "--sport", "1", "--dport", "2", "10.0.0.1:80"}, "different address families"},
		{[]string{"maglev", "table", "--seed", seedHex, "-o", "yaml", "10.0.0.1:80"}, "--output"},
	}
	for _, tt := range tests {
		_, _, err := run(t, tt.args...)
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%v: error %v, want it to mention %q", tt.args, err, tt.want)
		}
	}
}

func TestConfigCheck(t *testing.T) {
	out, _, err := run(t, "config", "check", "../../etc/l4lb.toml")
	if err != nil || !strings.Contains(out, "valid") {
		t.Fatalf("default config: %v %s", err, out)
	}
	bad := filepath.Join(t.TempDir(), "bad.toml")
	if err := os.WriteFile(bad, []byte("[datapath]\ninterfaces = [\"eth0\"]\nmode = \"fast\"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, stderr, err := run(t, "config", "check", "--dev", bad)
	var ee *exitError
	if !errors.As(err, &ee) || ee.code != 1 {
		t.Fatalf("invalid config: error %v, want exit code 1", err)
	}
	if !strings.Contains(stderr, bad+":3:") || !strings.Contains(stderr, `"fast"`) {
		t.Fatalf("stderr lacks file:line and the bad value:\n%s", stderr)
	}
	out, _, err = run(t, "config", "check", "--dev", "-o", "json", bad)
	if err == nil {
		t.Fatal("json output of an invalid config must still fail")
	}
	var res struct {
		Valid  bool     `json:"valid"`
		Errors []string `json:"errors"`
	}
	if jerr := json.Unmarshal([]byte(out), &res); jerr != nil || res.Valid || len(res.Errors) == 0 {
		t.Fatalf("json: %v %+v", jerr, res)
	}
}

// metricsServer serves an l4lbd-like exposition with one service.
func metricsServer(t *testing.T, seed, fingerprint string) string {
	t.Helper()
	snap := metrics.Snapshot{SeedFingerprint: seed, Services: []metrics.Service{{
		Name: "web", Frontend: lb.Frontend{Addr: netip.MustParseAddr("10.0.0.10"), Port: 80, Proto: lb.TCP}, Mode: lb.ModeDSR, Fingerprint: fingerprint,
	}}}
	reg := metrics.NewRegistry(metrics.SourceFunc(func() metrics.Snapshot { return snap }), nil, "test")
	srv := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	t.Cleanup(srv.Close)
	return srv.URL
}

func TestFleetCompare(t *testing.T) {
	a := metricsServer(t, "seed1", "fp1")
	b := metricsServer(t, "seed1", "fp1")
	c := metricsServer(t, "seed1", "fp2")
	out, _, err := run(t, "fleet", "compare", a, b)
	if err != nil || !strings.Contains(out, "agree") {
		t.Fatalf("identical boxes: %v\n%s", err, out)
	}
	out, _, err = run(t, "fleet", "compare", a, c)
	var ee *exitError
	if !errors.As(err, &ee) || ee.code != 1 || !strings.Contains(out, "MISMATCH service web (10.0.0.10:80/tcp)") || !strings.Contains(out, "fp2 !") {
		t.Fatalf("different boxes: %v\n%s", err, out)
	}
	out, _, _ = run(t, "fleet", "compare", "-o", "json", a, c)
	var f api.Fleet
	if err := json.Unmarshal([]byte(out), &f); err != nil || len(f.Mismatches) != 1 || f.Mismatches[0].Fingerprints[strings.TrimPrefix(c, "http://")] != "fp2" {
		t.Fatalf("JSON: %v %+v\n%s", err, f, out)
	}
	if _, _, err := run(t, "fleet", "compare", "ftp://x"); err == nil {
		t.Error("a target that is neither a URL nor a socket was accepted")
	}
}
