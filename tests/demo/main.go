// SPDX-License-Identifier: Apache-2.0

// Command demo is `make demo`: it builds a client, an LB box and three
// backends in network namespaces, starts l4lbd on the LB box with the given
// config and the backend companion on each backend, drives a burst of TCP
// and UDP flows at the VIPs, prints how l4lbd spread them (from its own
// counters), and tears everything down. It needs root.
package main

import (
	"context"
	"flag"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"sort"
	"text/tabwriter"

	"github.com/l4lb/l4lb/internal/testnet"
	"github.com/l4lb/l4lb/tests/topo"
)

func main() {
	bin := flag.String("l4lbd", "bin/l4lbd", "l4lbd binary")
	cfgPath := flag.String("config", "etc/examples/demo.toml", "l4lbd config for the LB box")
	flows := flag.Int("flows", 300, "TCP and UDP flows per service family")
	flag.Parse()
	if os.Geteuid() != 0 {
		fmt.Fprintln(os.Stderr, "demo: needs root (network namespaces, BPF); run: sudo make demo")
		os.Exit(1)
	}
	abs, err := filepath.Abs(*bin)
	if err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(1)
	}
	t := &testnet.Script{}
	code := 0
	err = t.Run(func() { run(t, abs, *cfgPath, *flows) })
	fmt.Println("\ntore down the namespaces and the datapath")
	if err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		code = 1
	}
	os.Exit(code)
}

var (
	vip4 = netip.MustParseAddr("10.200.0.10")
	vip6 = netip.MustParseAddr("2001:db8:200::10")
)

func run(t *testnet.Script, bin, cfgPath string, flows int) {
	cfg, err := os.ReadFile(cfgPath)
	if err != nil {
		t.Fatalf("%v", err)
	}
	fmt.Println("building the topology: client, lb1, be1..be3 on one segment (10.100.0.0/24, fd10::/64)")
	tp := topo.New(t, topo.Options{LBs: 1, Backends: 3})
	for _, be := range tp.Backends {
		be.HoldVIPs(vip4, vip6)
		be.StartCompanion(bin, vip4.String(), vip6.String())
		be.Serve(netip.AddrPortFrom(vip4, 80), netip.AddrPortFrom(vip4, 53), netip.AddrPortFrom(vip6, 80))
	}
	fmt.Printf("starting l4lbd on lb1 with %s\n", cfgPath)
	d := tp.LBs[0].StartL4LBD(bin, string(cfg))
	tp.RouteVIPs(tp.LBs[0], vip4, vip6)

	fmt.Printf("driving %d TCP flows to %s:80, %d UDP flows to %s:53, %d TCP flows to [%s]:80\n",
		flows, vip4, flows, vip4, flows, vip6)
	failed := 0
	for range flows {
		for _, dst := range []netip.AddrPort{netip.AddrPortFrom(vip4, 80), netip.AddrPortFrom(vip6, 80)} {
			c, err := tp.Client.DialTCP(0, dst)
			if err == nil {
				err = c.Echo("hello")
				c.Abort()
			}
			if err != nil {
				failed++
			}
		}
		u, err := tp.Client.DialUDP(0, netip.AddrPortFrom(vip4, 53))
		if err == nil {
			_, err = u.Ask("hello")
			u.Close()
		}
		if err != nil {
			failed++
		}
	}
	fmt.Printf("%d flows, %d failed\n\n", 3*flows, failed)

	svcs, err := d.API().Services(context.Background())
	if err != nil {
		t.Fatalf("ask l4lbd: %v", err)
	}
	sort.Slice(svcs, func(i, j int) bool { return svcs[i].Name < svcs[j].Name })
	fmt.Println("how l4lbd spread the flows (its own per-backend counters):")
	tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SERVICE\tFRONTEND\tBACKEND\tTABLE SLOTS\tNEW FLOWS\tSHARE\tPACKETS")
	for _, s := range svcs {
		for _, b := range s.Backends {
			share := 0.0
			if s.Counters.NewFlows > 0 {
				share = 100 * float64(b.Counters.NewFlows) / float64(s.Counters.NewFlows)
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\t%.1f%%\t%d\n", s.Name, s.Frontend, b.Address, b.Slots, b.Counters.NewFlows, share, b.Counters.Packets)
		}
	}
	_ = tw.Flush()
	if failed > 0 {
		t.Fatalf("%d flows failed", failed)
	}
}
