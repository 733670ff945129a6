// SPDX-License-Identifier: Apache-2.0

package datapath_test

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/l4lb/l4lb/bpf"
	"github.com/l4lb/l4lb/lb"
	"github.com/l4lb/l4lb/lb/datapath"
)

func prefixes(ss ...string) []netip.Prefix {
	out := make([]netip.Prefix, len(ss))
	for i, s := range ss {
		out[i] = netip.MustParsePrefix(s)
	}
	return out
}

// rangeKeys reads the source-range trie: the prefixes it holds for each
// service id, as raw keys.
func (e *env) rangeKeys(t testing.TB) map[uint32][]bpf.LbSrcRangeKey {
	t.Helper()
	out := map[uint32][]bpf.LbSrcRangeKey{}
	var (
		k bpf.LbSrcRangeKey
		v uint8
	)
	it := e.lb.Maps()[bpf.LbMapSrcRanges].Iterate()
	for it.Next(&k, &v) {
		out[k.SvcId] = append(out[k.SvcId], k)
	}
	if err := it.Err(); err != nil {
		t.Fatalf("read the source-range trie: %v", err)
	}
	return out
}

// sourceCase is one client packet and whether its service lets it in.
type sourceCase struct {
	svc     lb.Service
	client  string
	allowed bool
}

// expectSources sends one UDP datagram per case through hook k: an allowed
// client's is forwarded, any other is dropped and counted.
func (e *env) expectSources(t *testing.T, k hook, cases []sourceCase) {
	t.Helper()
	for i, c := range cases {
		f := flowTo(c.svc.Frontend, netip.MustParseAddr(c.client), uint16(52000+i))
		before := e.reasons(t)
		r := e.runOn(t, k, e.frame(t, packet(f, false, false, []byte("data"))))
		want := map[string]uint64{}
		if c.allowed {
			if r.verdict != k.tx() {
				t.Errorf("%s from %s (allowed by %v): verdict %s, want %s", c.svc.Name, c.client, c.svc.SourceRanges, k.verdictName(r.verdict), k.verdictName(k.tx()))
			} else if got, want := checkEncap(t, e.frame(t, packet(f, false, false, []byte("data"))), r.out), mustPick(t, c.svc, f); got != want {
				t.Errorf("%s from %s went to %s, want %s", c.svc.Name, c.client, got, want)
			}
		} else {
			want["drop_source_range"] = 1
			if r.verdict != k.drop() {
				t.Errorf("%s from %s (outside %v): verdict %s, want %s", c.svc.Name, c.client, c.svc.SourceRanges, k.verdictName(r.verdict), k.verdictName(k.drop()))
			}
		}
		e.expectReasons(t, before, want)
	}
}

// TestSourceRanges runs several services with different allow-lists, IPv4
// and IPv6, at both hooks; then changes the lists (a prefix replaced,
// added, the list cleared, a service removed) and checks traffic and the
// trie after each change: no stale prefix survives, every service's
// prefixes sit under its own id.
func TestSourceRanges(t *testing.T) {
	for _, k := range hooks {
		t.Run(k.String(), func(t *testing.T) {
			e := newEnv(t)
			mk := func(name string, vip netip.Addr, port uint16, backends []netip.Addr, ranges ...string) lb.Service {
				s := dsrService(name, vip, port, lb.UDP, backends[:3]...)
				s.SourceRanges = prefixes(ranges...)
				return s
			}
			a := mk("a", vip4, 53, backends4, "198.51.100.0/24")
			b := mk("b", vip4, 54, backends4, "203.0.113.0/25", "192.0.2.77/32")
			c := mk("c", vip6, 53, backends6, "2001:db8:1::/48", "2001:db8:2:3::/64")
			open4 := mk("open4", vip4, 55, backends4)
			open6 := mk("open6", vip6, 55, backends6)
			e.reconcile(t, a, b, c, open4, open6)
			e.expectSources(t, k, []sourceCase{
				{a, "198.51.100.7", true},
				{a, "198.51.101.7", false},
				{a, "203.0.113.5", false},
				{b, "203.0.113.5", true},
				{b, "203.0.113.200", false},
				{b, "192.0.2.77", true},
				{b, "192.0.2.78", false},
				{b, "198.51.100.7", false},
				{c, "2001:db8:1:ffff::9", true},
				{c, "2001:db8:2:3::9", true},
				{c, "2001:db8:2:4::9", false},
				{c, "2001:db9::1", false},
				{open4, "10.9.9.9", true},
				{open6, "2001:db9::1", true},
			})

			// Replace a's prefix, add one to c.
			a.SourceRanges = prefixes("203.0.113.0/24")
			c.SourceRanges = append(c.SourceRanges, netip.MustParsePrefix("2001:db9::/32"))
			e.reconcile(t, a, b, c, open4, open6)
			e.expectSources(t, k, []sourceCase{
				{a, "198.51.100.7", false},
				{a, "203.0.113.200", true},
				{b, "203.0.113.200", false},
				{c, "2001:db9::1", true},
				{c, "2001:db8:1::1", true},
			})
			e.expectRanges(t, map[lb.Frontend][]netip.Prefix{
				a.Frontend: a.SourceRanges, b.Frontend: b.SourceRanges, c.Frontend: c.SourceRanges,
			})

			// Clear a's list: everyone is let in, and its prefixes go.
			a.SourceRanges = nil
			e.reconcile(t, a, b, c, open4, open6)
			e.expectSources(t, k, []sourceCase{{a, "198.51.100.7", true}, {a, "10.1.2.3", true}, {b, "10.1.2.3", false}})
			e.expectRanges(t, map[lb.Frontend][]netip.Prefix{b.Frontend: b.SourceRanges, c.Frontend: c.SourceRanges})

			// Remove b: its prefixes go with it.
			e.reconcile(t, a, c, open4, open6)
			e.expectRanges(t, map[lb.Frontend][]netip.Prefix{c.Frontend: c.SourceRanges})

			// An ICMP error about a flow of a client the service refuses
			// is dropped: that flow cannot exist.
			f := flowTo(c.Frontend, netip.MustParseAddr("2001:db8:5::1"), 52100)
			kind := errKinds(families[1])[1]
			in := e.icmpErr(t, routerOf(families[1]), f.Dst, kind, quoteOf(t, replyPkt(f, netip.AddrPortFrom(f.Dst, f.DstPort)), kind))
			before := e.reasons(t)
			if r := e.runOn(t, k, in); r.verdict != k.drop() {
				t.Errorf("ICMP error about a refused client's flow: verdict %s, want %s", k.verdictName(r.verdict), k.verdictName(k.drop()))
			}
			e.expectReasons(t, before, map[string]uint64{"drop_source_range": 1})
		})
	}
}

// expectRanges checks that the trie holds exactly want: each service's
// prefixes under its id, nothing else; and that State reads them back.
func (e *env) expectRanges(t testing.TB, want map[lb.Frontend][]netip.Prefix) {
	t.Helper()
	keys := e.rangeKeys(t)
	n := 0
	for fe, ps := range want {
		id := uint32(e.state(t, fe).ID)
		if got := len(keys[id]); got != len(ps) {
			t.Errorf("%s (id %d): the trie holds %d prefixes, want %d (%v)", fe, id, got, len(ps), ps)
		}
		n += len(ps)
	}
	total := 0
	for _, ks := range keys {
		total += len(ks)
	}
	if total != n {
		t.Errorf("the trie holds %d prefixes in all, want %d: %v", total, n, keys)
	}
	st, err := e.lb.State()
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range st.Services {
		w := slices.Clone(want[s.Service.Frontend])
		slices.SortFunc(w, netip.Prefix.Compare)
		if !slices.Equal(s.Service.SourceRanges, w) {
			t.Errorf("State: %s has source ranges %v, want %v", s.Service.Frontend, s.Service.SourceRanges, w)
		}
	}
}

// TestSourceRangesSupported checks what Supported accepts: affinity and
// source ranges of the VIP's family; a prefix of the other family is
// refused with an error saying it could never match.
func TestSourceRangesSupported(t *testing.T) {
	base := dsrService("s", vip4, 80, lb.TCP, backends4[0])
	base.Mode, base.Dispatch = lb.ModeDSR, lb.DispatchIPIP
	for _, tt := range []struct {
		name string
		edit func(s *lb.Service)
		err  string
	}{
		{"affinity", func(s *lb.Service) { s.Affinity = lb.Affinity{ClientIP: true, Timeout: 1} }, ""},
		{"IPv4 ranges", func(s *lb.Service) { s.SourceRanges = prefixes("192.0.2.0/24", "0.0.0.0/0") }, ""},
		{"IPv6 range on an IPv4 VIP", func(s *lb.Service) { s.SourceRanges = prefixes("2001:db8::/32") }, "could never match"},
		{"affinity without a timeout", func(s *lb.Service) { s.Affinity = lb.Affinity{ClientIP: true} }, "positive affinity_timeout"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			s := base.Clone()
			tt.edit(&s)
			err := datapath.Supported(s)
			if got := fmt.Sprint(err); (tt.err == "") != (err == nil) || tt.err != "" && !strings.Contains(got, tt.err) {
				t.Errorf("Supported = %v, want %q", err, tt.err)
			}
		})
	}
}
