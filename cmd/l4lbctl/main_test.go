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
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/promhttp"
	"golang.org/x/sys/unix"

	"github.com/l4lb/l4lb/internal/testnet"
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
	// The shipped config serves nothing and has no seed: refused as is,
	// valid with --dev.
	if _, stderr, err := run(t, "config", "check", "--no-host-checks", "../../etc/l4lb.toml"); err == nil || !strings.Contains(stderr, "maglev.hash_seed is missing") {
		t.Fatalf("default config without --dev: %v %s", err, stderr)
	}
	out, _, err := run(t, "config", "check", "--dev", "--no-host-checks", "../../etc/l4lb.toml")
	if err != nil || !strings.Contains(out, "valid (0 services)") {
		t.Fatalf("default config: %v %s", err, out)
	}
	bad := filepath.Join(t.TempDir(), "bad.toml")
	if err := os.WriteFile(bad, []byte("[datapath]\ninterfaces = [\"eth0\"]\nmode = \"fast\"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, stderr, err := run(t, "config", "check", "--dev", "--no-host-checks", bad)
	var ee *exitError
	if !errors.As(err, &ee) || ee.code != 1 {
		t.Fatalf("invalid config: error %v, want exit code 1", err)
	}
	if !strings.Contains(stderr, bad+":3:") || !strings.Contains(stderr, `"fast"`) {
		t.Fatalf("stderr lacks file:line and the bad value:\n%s", stderr)
	}
	out, _, err = run(t, "config", "check", "--dev", "--no-host-checks", "-o", "json", bad)
	if err == nil || !errors.As(err, &ee) || !ee.reported {
		t.Fatalf("json output of an invalid config must fail, reported: %v", err)
	}
	var res struct {
		Valid  bool `json:"valid"`
		Errors []struct {
			File    string `json:"file"`
			Line    int    `json:"line"`
			Key     string `json:"key"`
			Message string `json:"message"`
		} `json:"errors"`
	}
	if jerr := json.Unmarshal([]byte(out), &res); jerr != nil || res.Valid || len(res.Errors) != 1 {
		t.Fatalf("json: %v %+v", jerr, res)
	}
	if e := res.Errors[0]; e.File != bad || e.Line != 3 || e.Key != "datapath.mode" || !strings.Contains(e.Message, `"fast"`) {
		t.Errorf("json error %+v, want file, line 3, key datapath.mode and the message", e)
	}
}

// TestConfigCheckHost: on this box, config check prints the kernel memory
// the maps need, computed from the datapath's map specs, and warns about
// SNAT ports inside the kernel's ephemeral range.
func TestConfigCheckHost(t *testing.T) {
	testnet.SkipShort(t, "checks this host's bpffs")
	path := filepath.Join(t.TempDir(), "l4lb.toml")
	doc := "[daemon]\nbpffs = \"/sys/fs/bpf/l4lb-check-test\"\nadmin_socket = \"" + filepath.Join(t.TempDir(), "s.sock") + "\"\n" +
		"[datapath]\ninterfaces = [\"eth0\"]\nsnat_port_range = \"1024-65535\"\n[maglev]\nhash_seed = \"" + seedHex[2:] + "11\"\n"
	if err := os.WriteFile(path, []byte(doc), 0o600); err != nil {
		t.Fatal(err)
	}
	out, stderr, err := run(t, "config", "check", path)
	if err != nil {
		t.Fatalf("%v\n%s%s", err, out, stderr)
	}
	if !regexp.MustCompile(`maps: ≈ \d+ MiB of kernel memory`).MatchString(out) {
		t.Errorf("no memory estimate:\n%s", out)
	}
	if !strings.Contains(out, "warning: "+path+":6: datapath.snat_port_range 1024-65535 overlaps the kernel's ephemeral ports") {
		t.Errorf("no ephemeral-range warning:\n%s", out)
	}
}

// TestConfigCheckBPFFSMountRoot: daemon.bpffs naming the root of a bpffs
// mount (here a private one, which the file-only check cannot know) is
// refused with its file:line and the directory to use instead: l4lbd's
// directory is its own, and --cleanup empties it.
func TestConfigCheckBPFFSMountRoot(t *testing.T) {
	testnet.RequireRoot(t)
	mnt := t.TempDir()
	if err := unix.Mount("bpf", mnt, "bpf", 0, ""); err != nil {
		t.Fatalf("mount a bpffs at %s: %v", mnt, err)
	}
	t.Cleanup(func() { _ = unix.Unmount(mnt, unix.MNT_DETACH) })
	path := filepath.Join(t.TempDir(), "l4lb.toml")
	doc := "[daemon]\nbpffs = \"" + mnt + "\"\nadmin_socket = \"" + filepath.Join(t.TempDir(), "s.sock") + "\"\n" +
		"[datapath]\ninterfaces = [\"eth0\"]\n[maglev]\nhash_seed = \"" + seedHex[2:] + "11\"\n"
	if err := os.WriteFile(path, []byte(doc), 0o600); err != nil {
		t.Fatal(err)
	}
	out, stderr, err := run(t, "config", "check", path)
	want := path + ":2: daemon.bpffs: bpffs directory " + mnt + " is the root of a bpffs mount"
	if err == nil || !strings.Contains(out+stderr, want) || !strings.Contains(out+stderr, filepath.Join(mnt, "l4lb")) {
		t.Errorf("config check with bpffs at a mount root: %v\n%s%s\nwant %q and the directory to use", err, out, stderr, want)
	}
}

// TestUsageErrors: a bare group command and an unknown subcommand fail
// with exit code 2; --version answers; -o json errors are JSON.
func TestUsageErrors(t *testing.T) {
	for _, args := range [][]string{{"service"}, {"service", "frobnicate"}, {"frobnicate"}, {}, {"config"}, {"backend", "x"}} {
		_, _, err := run(t, args...)
		if err == nil || exitCode(err) != 2 {
			t.Errorf("l4lbctl %v: error %v (exit %d), want a usage error, exit 2", args, err, exitCode(err))
		}
	}
	if _, _, err := run(t, "status", "extra"); err == nil || exitCode(err) != 2 {
		t.Errorf("status with an argument: %v, want exit 2", err)
	}
	out, _, err := run(t, "--version")
	if err != nil || !strings.Contains(out, "l4lbctl version") {
		t.Errorf("--version: %v %q", err, out)
	}
	cmd := root()
	var stdout, stderr bytes.Buffer
	cmd.SetArgs([]string{"-o", "json", "--socket", filepath.Join(t.TempDir(), "none.sock"), "status"})
	cmd.SetOut(&stdout)
	err = cmd.Execute()
	if err == nil {
		t.Fatal("status without a daemon succeeded")
	}
	report(cmd, &stdout, &stderr, err)
	var e struct {
		Error string `json:"error"`
	}
	if jerr := json.Unmarshal(stdout.Bytes(), &e); jerr != nil || !strings.Contains(e.Error, "is l4lbd running?") || stderr.Len() != 0 {
		t.Errorf("-o json error: %q (%v), stderr %q", stdout.String(), jerr, stderr.String())
	}
}

func TestSeedNew(t *testing.T) {
	a, _, err := run(t, "seed", "new")
	if err != nil {
		t.Fatal(err)
	}
	b, _, _ := run(t, "seed", "new")
	s, err := maglev.ParseSeed(strings.TrimSpace(a))
	if err != nil || s.IsZero() || a == b {
		t.Fatalf("seed new: %q then %q (%v)", a, b, err)
	}
	// What it prints is accepted as maglev.hash_seed.
	path := filepath.Join(t.TempDir(), "l4lb.toml")
	if err := os.WriteFile(path, []byte("[datapath]\ninterfaces = [\"eth0\"]\n[maglev]\nhash_seed = \""+strings.TrimSpace(a)+"\"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, stderr, err := run(t, "config", "check", "--no-host-checks", path); err != nil {
		t.Fatalf("a new seed is refused: %v\n%s", err, stderr)
	}
}

// TestConfigDiffOffline: `config diff OLD NEW` names what changes per
// service, and the share of flows it gives is the share of slots whose
// owner differs between the tables `maglev table` prints for both sides;
// max_flow_move in NEW makes it exit 1, naming the service.
func TestConfigDiffOffline(t *testing.T) {
	const seed = "5f1c0ffee0ddba11deadbeef00c0ffee"
	doc := func(guard string, backends ...string) string {
		var b strings.Builder
		b.WriteString("[daemon]\n" + guard + "\n[datapath]\ninterfaces = [\"eth0\"]\n[maglev]\nhash_seed = \"" + seed + "\"\ntable_size = 1021\n")
		b.WriteString("[[service]]\nname = \"web\"\nvip = \"10.0.0.10\"\nport = 80\nprotocol = \"tcp\"\n")
		for _, be := range backends {
			addr, weight, _ := strings.Cut(be, "@")
			if weight == "" {
				weight = "1"
			}
			b.WriteString("[[service.backend]]\naddress = \"" + strings.TrimSuffix(addr, ":80") + "\"\nport = 80\nweight = " + weight + "\n")
		}
		b.WriteString("[[service]]\nname = \"dns\"\nvip = \"10.0.0.10\"\nport = 53\nprotocol = \"udp\"\n[[service.backend]]\naddress = \"10.1.0.11\"\n")
		return b.String()
	}
	dir := t.TempDir()
	oldPath, newPath := filepath.Join(dir, "old.toml"), filepath.Join(dir, "new.toml")
	oldBackends := []string{"10.1.0.11:80", "10.1.0.12:80", "10.1.0.13:80", "10.1.0.14:80"}
	newBackends := []string{"10.1.0.11:80", "10.1.0.12:80@3", "10.1.0.14:80", "10.1.0.15:80"}
	if err := os.WriteFile(oldPath, []byte(doc("", oldBackends...)), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(newPath, []byte(doc("max_flow_move = 0.25", newBackends...)), 0o600); err != nil {
		t.Fatal(err)
	}

	out, _, err := run(t, "config", "diff", "-o", "json", oldPath, newPath)
	var ee *exitError
	if !errors.As(err, &ee) || ee.code != 1 {
		t.Fatalf("a change over max_flow_move: error %v, want exit 1", err)
	}
	var d struct {
		Refused  []string `json:"refused"`
		Services []struct {
			Name       string   `json:"name"`
			Status     string   `json:"status"`
			Added      []string `json:"added"`
			Removed    []string `json:"removed"`
			Reweighted []struct {
				Backend, Old, New string
			} `json:"reweighted"`
			MovedFlows float64 `json:"moved_flows"`
		} `json:"services"`
	}
	if err := json.Unmarshal([]byte(out), &d); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if len(d.Services) != 2 || d.Services[0].Name != "dns" || d.Services[0].Status != "unchanged" || d.Services[0].MovedFlows != 0 {
		t.Fatalf("services %+v, want dns unchanged first", d.Services)
	}
	web := d.Services[1]
	if web.Status != "changed" || !slices.Equal(web.Added, []string{"10.1.0.15:80"}) || !slices.Equal(web.Removed, []string{"10.1.0.13:80"}) ||
		len(web.Reweighted) != 1 || web.Reweighted[0].Backend != "10.1.0.12:80" || web.Reweighted[0].Old != "1" || web.Reweighted[0].New != "3" {
		t.Errorf("web: %+v", web)
	}

	// The oracle: the two tables as `maglev table` prints them.
	table := func(backends []string) []string {
		out, _, err := run(t, append([]string{"maglev", "table", "--seed", seed, "--size", "1021", "-o", "json"}, backends...)...)
		if err != nil {
			t.Fatal(err)
		}
		var tb struct {
			Backends []string `json:"backends"`
			Table    []int    `json:"table"`
		}
		if err := json.Unmarshal([]byte(out), &tb); err != nil {
			t.Fatal(err)
		}
		owners := make([]string, len(tb.Table))
		for i, j := range tb.Table {
			owners[i] = tb.Backends[j]
		}
		return owners
	}
	before, after := table(oldBackends), table(newBackends)
	moved := 0
	for i := range before {
		if before[i] != after[i] {
			moved++
		}
	}
	want := float64(moved) / float64(len(before))
	t.Logf("web: %d of %d slots change owner (%.2f%%); config diff says %.2f%%", moved, len(before), 100*want, 100*web.MovedFlows)
	if web.MovedFlows != want {
		t.Errorf("moved_flows %v, want %v", web.MovedFlows, want)
	}
	if want <= 0.25 || len(d.Refused) != 1 || !strings.Contains(d.Refused[0], `service "web" would move`) {
		t.Errorf("refused %q for a share of %v over max_flow_move = 0.25", d.Refused, want)
	}

	// The table form says the same.
	text, _, _ := run(t, "config", "diff", oldPath, newPath)
	for _, w := range []string{"+10.1.0.15:80", "-10.1.0.13:80", "10.1.0.12:80 weight 1→3", "REFUSED by daemon.max_flow_move = 0.25"} {
		if !strings.Contains(text, w) {
			t.Errorf("table output lacks %q:\n%s", w, text)
		}
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
