// SPDX-License-Identifier: Apache-2.0

package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net/netip"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/l4lb/l4lb/lb"
	"github.com/l4lb/l4lb/lb/api"
	"github.com/l4lb/l4lb/lb/maglev"
)

// The JSON of `l4lbctl maglev table` and `maglev lookup` is the admin
// API's, whether computed here or read from l4lbd: one contract.
type (
	tableJSON  = api.MaglevTable
	lookupJSON = api.Lookup
)

type maglevArgs struct {
	seed    string
	size    uint32
	service string
}

func maglevCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "maglev",
		Short: "compute Maglev tables and flow placement exactly as l4lbd does",
	}
	cmd.AddCommand(maglevTableCmd(g), maglevLookupCmd(g))
	return cmd
}

func (a *maglevArgs) flags(cmd *cobra.Command, g *globals) {
	cmd.Flags().StringVar(&a.seed, "seed", "", "maglev.hash_seed (32 hex digits), to compute offline")
	cmd.Flags().Uint32Var(&a.size, "size", 16381, "table size (a prime), to compute offline")
	cmd.Flags().StringVar(&a.service, "service", "", "ask the running l4lbd about this service's live table instead")
	_ = cmd.RegisterFlagCompletionFunc("service", completeServiceNames(g, -1))
	cmd.MarkFlagsMutuallyExclusive("seed", "service")
	cmd.MarkFlagsOneRequired("seed", "service")
}

// live is true when the command asks the daemon rather than computing.
func (a *maglevArgs) live(args []string) (bool, error) {
	if a.service == "" {
		if len(args) == 0 {
			return false, fmt.Errorf("give the backends (ip:port[@weight]) to compute a table offline, or --service NAME")
		}
		return false, nil
	}
	if len(args) > 0 {
		return true, fmt.Errorf("--service reads the live table: do not list backends")
	}
	return true, nil
}

// build parses the arguments and builds the table over the backends in
// canonical order, so the output is identical whatever order they are given.
func (a *maglevArgs) build(args []string) (maglev.Seed, []maglev.Backend, []int32, error) {
	seed, err := maglev.ParseSeed(a.seed)
	if err != nil {
		return seed, nil, nil, fmt.Errorf("--seed: %w", err)
	}
	if err := maglev.ValidateSize(a.size); err != nil {
		return seed, nil, nil, fmt.Errorf("--size: %w", err)
	}
	var bs []maglev.Backend
	for _, arg := range args {
		b, err := parseBackend(arg)
		if err != nil {
			return seed, nil, nil, err
		}
		bs = append(bs, b)
	}
	maglev.SortBackends(bs)
	table, err := maglev.Build(seed, a.size, bs)
	return seed, bs, table, err
}

// parseBackend parses ip:port[@weight]; IPv6 as [2001:db8::1]:80@2.
func parseBackend(s string) (maglev.Backend, error) {
	addr, weight := s, uint64(lb.DefaultWeight)
	if i := strings.LastIndexByte(s, '@'); i >= 0 {
		addr = s[:i]
		w, err := strconv.ParseUint(s[i+1:], 10, 32)
		if err != nil {
			return maglev.Backend{}, fmt.Errorf("backend %q: weight must be a non-negative integer", s)
		}
		weight = w
	}
	ap, err := netip.ParseAddrPort(addr)
	if err != nil {
		return maglev.Backend{}, fmt.Errorf("backend %q: want ip:port[@weight] (IPv6 as [addr]:port): %v", s, err)
	}
	return maglev.Backend{Addr: netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port()), Weight: uint32(weight)}, nil
}

func maglevTableCmd(g *globals) *cobra.Command {
	var a maglevArgs
	cmd := &cobra.Command{
		Use:   "table (--seed HEX --size M BACKEND... | --service NAME)",
		Short: "print the Maglev table l4lbd builds for these backends (BACKEND = ip:port[@weight]), or a service's live one",
		RunE: func(cmd *cobra.Command, args []string) error {
			if live, err := a.live(args); err != nil {
				return err
			} else if live {
				t, err := api.NewClient(g.socket).Maglev(cmd.Context(), a.service)
				if err != nil {
					return err
				}
				if g.output == "json" {
					return writeJSON(cmd.OutOrStdout(), t)
				}
				return printLiveTable(cmd.OutOrStdout(), a.service, t)
			}
			seed, bs, table, err := a.build(args)
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			if g.output == "json" {
				j := tableJSON{Size: a.size, Backends: make([]string, len(bs)), Table: table}
				for i, b := range bs {
					j.Backends[i] = b.Addr.String()
				}
				if j.Table == nil {
					j.Table = []int32{}
				}
				return writeJSON(out, j)
			}
			return printTable(out, seed, a.size, bs, table)
		},
	}
	a.flags(cmd, g)
	return cmd
}

func printTable(out io.Writer, seed maglev.Seed, m uint32, bs []maglev.Backend, table []int32) error {
	counts := make([]int, len(bs))
	for _, i := range table {
		counts[i]++
	}
	fmt.Fprintf(out, "size %d, %d backends, fingerprint %s\n\n", m, len(bs), maglev.Fingerprint(seed, m, bs))
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "INDEX\tBACKEND\tWEIGHT\tSLOTS\tSHARE")
	for i, b := range bs {
		fmt.Fprintf(tw, "%d\t%s\t%d\t%d\t%.2f%%\n", i, b.Addr, b.Weight, counts[i], 100*float64(counts[i])/float64(m))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(table) == 0 {
		fmt.Fprintln(out, "\nno eligible backend: the table is empty and the service drops new flows")
		return nil
	}
	fmt.Fprintln(out, "\nslot: backend index")
	const perLine = 20
	for i := 0; i < len(table); i += perLine {
		fmt.Fprintf(out, "%7d:", i)
		for _, v := range table[i:min(i+perLine, len(table))] {
			fmt.Fprintf(out, " %d", v)
		}
		fmt.Fprintln(out)
	}
	return nil
}

func printLiveTable(out io.Writer, service string, t api.MaglevTable) error {
	counts := make([]int, len(t.Backends))
	for _, i := range t.Table {
		counts[i]++
	}
	fmt.Fprintf(out, "service %s: size %d, %d backends in the table\n\n", service, t.Size, len(t.Backends))
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "INDEX\tBACKEND\tSLOTS\tSHARE")
	for i, b := range t.Backends {
		fmt.Fprintf(tw, "%d\t%s\t%d\t%.2f%%\n", i, b, counts[i], 100*float64(counts[i])/float64(max(t.Size, 1)))
	}
	return tw.Flush()
}

func maglevLookupCmd(g *globals) *cobra.Command {
	var (
		a                  maglevArgs
		src, dst, protoArg string
		sport, dport       uint16
	)
	cmd := &cobra.Command{
		Use:   "lookup (--seed HEX --size M --dst VIP --dport P [--proto tcp|udp] BACKEND... | --service NAME) --src IP --sport P",
		Short: "print the backend a flow gets (BACKEND = ip:port[@weight]), offline or from a service's live state",
		RunE: func(cmd *cobra.Command, args []string) error {
			if live, err := a.live(args); err != nil {
				return err
			} else if live {
				s, err := netip.ParseAddr(src)
				if err != nil {
					return fmt.Errorf("--src: %w", err)
				}
				l, err := api.NewClient(g.socket).Lookup(cmd.Context(), a.service, netip.AddrPortFrom(s, sport))
				if err != nil {
					return err
				}
				if g.output == "json" {
					return writeJSON(cmd.OutOrStdout(), l)
				}
				fmt.Fprintf(cmd.OutOrStdout(), "%s\n  flow %s to service %s: hash %s, slot %d\n", l.Backend, netip.AddrPortFrom(s, sport), a.service, l.Hash, l.Slot)
				if l.Conntrack != "" && l.Conntrack != l.Backend {
					fmt.Fprintf(cmd.OutOrStdout(), "  the flow is established on %s (connection table), where its packets keep going\n", l.Conntrack)
				} else if l.Conntrack != "" {
					fmt.Fprintln(cmd.OutOrStdout(), "  the flow is in the connection table")
				}
				return nil
			}
			seed, bs, table, err := a.build(args)
			if err != nil {
				return err
			}
			s, err := netip.ParseAddr(src)
			if err != nil {
				return fmt.Errorf("--src: %w", err)
			}
			if dst == "" || dport == 0 {
				return fmt.Errorf("offline lookups need --dst and --dport (or use --service)")
			}
			d, err := netip.ParseAddr(dst)
			if err != nil {
				return fmt.Errorf("--dst: %w", err)
			}
			if s.Unmap().Is4() != d.Unmap().Is4() {
				return fmt.Errorf("--src %s and --dst %s are of different address families", s, d)
			}
			proto, err := lb.ParseProtocol(protoArg)
			if err != nil {
				return fmt.Errorf("--proto: %w", err)
			}
			if len(table) == 0 {
				return fmt.Errorf("no backend with weight > 0: the flow would be dropped")
			}
			f := maglev.Flow{Src: s.Unmap(), Dst: d.Unmap(), SrcPort: sport, DstPort: dport, Proto: uint8(proto)}
			h := maglev.FlowHash(seed, f)
			slot := maglev.Slot(h, a.size)
			idx := table[slot]
			res := lookupJSON{Backend: bs[idx].Addr.String(), Index: idx, Slot: slot, Hash: fmt.Sprintf("%016x", h)}
			if g.output == "json" {
				return writeJSON(cmd.OutOrStdout(), res)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%s\n  flow %s:%d -> %s:%d/%s, hash %s, slot %d of %d\n",
				res.Backend, s, sport, d, dport, proto, res.Hash, slot, a.size)
			return nil
		},
	}
	a.flags(cmd, g)
	cmd.Flags().StringVar(&src, "src", "", "client address")
	cmd.Flags().StringVar(&dst, "dst", "", "VIP")
	cmd.Flags().Uint16Var(&sport, "sport", 0, "client port")
	cmd.Flags().Uint16Var(&dport, "dport", 0, "VIP port")
	cmd.Flags().StringVar(&protoArg, "proto", "tcp", "tcp or udp")
	for _, f := range []string{"src", "sport"} {
		_ = cmd.MarkFlagRequired(f)
	}
	return cmd
}

func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}
