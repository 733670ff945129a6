// SPDX-License-Identifier: Apache-2.0

package datapath

import (
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/l4lb/l4lb/bpf"
)

// TestSNATVars checks the SNAT load-time constants made from a Config, and
// that settings the datapath cannot hold are refused with a pointer to the
// config key.
func TestSNATVars(t *testing.T) {
	base := withSNATDefaults(Config{ConntrackMax: 4096, SNATAddresses: []netip.Addr{
		netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("fd00::1"),
		netip.MustParseAddr("::ffff:10.0.0.2"), netip.MustParseAddr("10.0.0.1"),
	}})
	vars, err := snatVars(base)
	if err != nil {
		t.Fatal(err)
	}
	a4 := vars[bpf.LbVarCfgSnatAddr4].([MaxSNATAddresses]uint32)
	a6 := vars[bpf.LbVarCfgSnatAddr6].([MaxSNATAddresses * 16]byte)
	checks := []struct {
		name      string
		got, want any
	}{
		{"IPv4 count (mapped address unmapped, duplicate dropped)", vars[bpf.LbVarCfgSnatAddr4Count], uint32(2)},
		{"IPv6 count", vars[bpf.LbVarCfgSnatAddr6Count], uint32(1)},
		{"first IPv4 address, network order in memory", fmt.Sprintf("%x", a4[0]), "100000a"},
		{"second IPv4 address", fmt.Sprintf("%x", a4[1]), "200000a"},
		{"IPv6 address", netip.AddrFrom16([16]byte(a6[:16])), netip.MustParseAddr("fd00::1")},
		{"port range", [2]uint16{vars[bpf.LbVarCfgSnatPortMin].(uint16), vars[bpf.LbVarCfgSnatPortMax].(uint16)}, [2]uint16{DefaultSNATPortMin, DefaultSNATPortMax}},
		{"tcp timeout", vars[bpf.LbVarCfgSnatTcpNs], uint64(6 * time.Hour)},
		{"tcp_closing timeout", vars[bpf.LbVarCfgSnatTcpClosingNs], uint64(10 * time.Second)},
		{"udp timeout", vars[bpf.LbVarCfgSnatUdpNs], uint64(time.Minute)},
		{"SNATMax follows ConntrackMax", base.SNATMax, uint32(4096)},
	}
	for _, c := range checks {
		if c.got != c.want {
			t.Errorf("%s: %v, want %v", c.name, c.got, c.want)
		}
	}

	many := base
	many.SNATAddresses = nil
	for i := range MaxSNATAddresses + 1 {
		many.SNATAddresses = append(many.SNATAddresses, netip.AddrFrom4([4]byte{10, 1, 0, byte(i + 1)}))
	}
	bad := []struct {
		name string
		edit func(c *Config)
		want string
	}{
		{"17 IPv4 addresses", func(c *Config) { *c = many }, "snat_addresses"},
		{"unspecified address", func(c *Config) { c.SNATAddresses = []netip.Addr{netip.IPv6Unspecified()} }, "snat_addresses"},
		{"empty range", func(c *Config) { c.SNATPortMin, c.SNATPortMax = 5000, 4000 }, "snat_port_range"},
		{"short timeout", func(c *Config) { c.SNATTimeouts.UDP = time.Millisecond }, "at least 1s"},
	}
	for _, tt := range bad {
		c := base
		tt.edit(&c)
		if _, err := snatVars(c); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: err %v, want one mentioning %q", tt.name, err, tt.want)
		}
	}

	spec, err := bpf.LoadLb()
	if err != nil {
		t.Fatal(err)
	}
	for name, v := range vars {
		vs, ok := spec.Variables[name]
		if !ok {
			t.Errorf("LB object lacks variable %s", name)
			continue
		}
		if err := vs.Set(v); err != nil {
			t.Errorf("set %s: %v (the Go value does not fit the C variable)", name, err)
		}
	}
}

func TestSNATMapSize(t *testing.T) {
	for _, tt := range []struct {
		n    uint32
		cpus int
		want uint32
	}{{1024, 1, 1024}, {1024, 2, 1024}, {1024, 3, 1026}, {1 << 20, 12, 1048584}, {5, 0, 5}} {
		if got := perCPURound(tt.n, tt.cpus); got != tt.want {
			t.Errorf("perCPURound(%d, %d) = %d, want %d", tt.n, tt.cpus, got, tt.want)
		}
	}
}
