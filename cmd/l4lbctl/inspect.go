// SPDX-License-Identifier: Apache-2.0

package main

import (
	"errors"
	"fmt"
	"io"
	"net/netip"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/l4lb/l4lb/lb/api"
	"github.com/l4lb/l4lb/lb/daemon"
)

// interfaceLine is one interface in `l4lbctl status`: what the kernel
// holds, and what the configuration asked for when that differs.
func interfaceLine(ifc api.Interface) string {
	asked := ifc.Attach
	if ifc.Attach == "xdp" && ifc.Mode != "" {
		asked += " " + ifc.Mode
	}
	s := ifc.Name + ": " + ifc.Attached
	if ifc.AttachedError != "" {
		s += " (" + ifc.AttachedError + ")"
	}
	return s + " (configured " + asked + ")"
}

func serviceCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{Use: "service", Short: "inspect services"}
	var (
		withBackends, withRate bool
		interval               time.Duration
	)
	list := &cobra.Command{
		Use:   "list",
		Short: "list the services; --backends: every backend too, with state, health, connections and counters (like ipvsadm -Ln --stats)",
		Long: `Lists the services with their connection counts (ACTIVE, INACT: the
backends' flows in the connection table, counted at most a few seconds
ago) and counters. --backends prints each service's backends under it:
state, health, weight, connections, packets and bytes. -o json prints the
same services, backends included, either way.

Active connections are TCP flows that are established (for SNAT, the
binding is past the handshake and saw no FIN or RST) and were seen within
datapath.snat_timeouts.tcp; inactive are UDP flows and closing or
reopening TCP flows, each until its state's timeout (udp, tcp_closing)
runs out, as ipvsadm's InActConn decays. Idle entries waiting for the
table to evict them count in neither. See docs/operations.md.

--rate lists, like ipvsadm --rate, each service's and backend's new flows,
packets and bytes per second over --interval (two listings that far
apart): what the datapath forwarded towards the backends, and for SNAT
services the replies it sent back to clients (per service).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			list := func() (svcs []api.Service, err error) {
				err = g.ask(cmd, func(c *api.Client) (err error) {
					svcs, err = c.Services(cmd.Context())
					return err
				}, func(p *daemon.Pinned) error {
					svcs = p.Services()
					return nil
				})
				return svcs, err
			}
			svcs, err := list()
			if err != nil {
				return err
			}
			if withRate {
				if interval <= 0 {
					return usageError("--interval %s: want a positive duration", interval)
				}
				start := time.Now()
				select {
				case <-time.After(interval):
				case <-cmd.Context().Done():
					return cmd.Context().Err()
				}
				after, err := list()
				if err != nil {
					return err
				}
				rates := serviceRates(svcs, after, time.Since(start))
				if g.output == "json" {
					return writeJSON(cmd.OutOrStdout(), rates)
				}
				return printServiceRates(cmd.OutOrStdout(), after, rates)
			}
			if g.output == "json" {
				return writeJSON(cmd.OutOrStdout(), svcs)
			}
			if withBackends {
				return printServiceTree(cmd.OutOrStdout(), svcs)
			}
			return printServiceList(cmd.OutOrStdout(), svcs)
		},
	}
	list.Flags().BoolVar(&withBackends, "backends", false, "list every service's backends under it")
	list.Flags().BoolVar(&withRate, "rate", false, "new flows, packets and bytes per second of every service and backend over --interval (like ipvsadm --rate)")
	list.Flags().DurationVar(&interval, "interval", time.Second, "with --rate: the interval the rates are measured over")
	cmd.AddCommand(list)
	cmd.AddCommand(&cobra.Command{
		Use:               "get NAME",
		Short:             "show one service and its backends",
		Args:              cobra.ExactArgs(1),
		ValidArgsFunction: completeServiceNames(g, 0),
		RunE: func(cmd *cobra.Command, args []string) error {
			var s api.Service
			err := g.ask(cmd, func(c *api.Client) (err error) {
				s, err = c.Service(cmd.Context(), args[0])
				return err
			}, func(p *daemon.Pinned) (err error) {
				s, err = p.Service(args[0])
				return err
			})
			if err != nil {
				return err
			}
			if g.output == "json" {
				return writeJSON(cmd.OutOrStdout(), s)
			}
			return printService(cmd.OutOrStdout(), s)
		},
	})
	return cmd
}

func modeOf(s api.Service) string {
	if s.Dispatch != "" {
		return s.Mode + "/" + s.Dispatch
	}
	return s.Mode
}

// conns sums the connection counts of a service's backends.
func conns(s api.Service) (active, inactive uint64) {
	for _, b := range s.Backends {
		active += b.ActiveConns
		inactive += b.InactiveConns
	}
	return active, inactive
}

func printServiceList(out io.Writer, svcs []api.Service) error {
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tFRONTEND\tMODE\tBACKENDS\tACTIVE\tINACT\tPACKETS\tNEW FLOWS\tSOURCE")
	for _, s := range svcs {
		a, i := conns(s)
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\t%d\t%d\t%d\t%s\n", s.Name, s.Frontend, modeOf(s), len(s.Backends), a, i, s.Counters.Packets, s.Counters.NewFlows, s.Source)
	}
	return tw.Flush()
}

// printServiceTree is the one-table view of everything: each service, then
// its backends indented under it.
func printServiceTree(out io.Writer, svcs []api.Service) error {
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SERVICE / BACKEND\tFRONTEND\tMODE\tSTATE\tHEALTH\tWEIGHT\tACTIVE\tINACT\tPACKETS\tBYTES")
	for _, s := range svcs {
		a, i := conns(s)
		fmt.Fprintf(tw, "%s\t%s\t%s\t\t\t\t%d\t%d\t%d\t%d\n", s.Name, s.Frontend, modeOf(s), a, i, s.Counters.Packets, s.Counters.Bytes)
		for _, b := range s.Backends {
			state := b.State
			if b.Override {
				state += " (override)"
			}
			fmt.Fprintf(tw, "  -> %s\t\t\t%s\t%s\t%d\t%d\t%d\t%d\t%d\n", b.Address, state, b.Health, b.Weight, b.ActiveConns, b.InactiveConns, b.Counters.Packets, b.Counters.Bytes)
		}
	}
	return tw.Flush()
}

func printService(out io.Writer, s api.Service) error {
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	a, i := conns(s)
	fmt.Fprintf(tw, "name\t%s\nfrontend\t%s\nmode\t%s %s\ntable size\t%d\nfingerprint\t%s\nsource\t%s\ncounters\t%d packets, %d bytes, %d new flows\nconnections\t%d active, %d inactive\n",
		s.Name, s.Frontend, s.Mode, s.Dispatch, s.TableSize, s.Fingerprint, s.Source, s.Counters.Packets, s.Counters.Bytes, s.Counters.NewFlows, a, i)
	if s.Mode == "snat" {
		fmt.Fprintf(tw, "replies\t%d packets, %d bytes (backends to clients)\n", s.Counters.ReplyPackets, s.Counters.ReplyBytes)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(out)
	tw = tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "BACKEND\tSTATE\tHEALTH\tWEIGHT\tSLOTS\tACTIVE\tINACT\tPACKETS\tBYTES\tNEW FLOWS")
	for _, b := range s.Backends {
		state := b.State
		if b.Override {
			state += " (override; configured " + b.ConfigState + ")"
		}
		health := b.Health
		if b.HealthError != "" {
			health += ": " + b.HealthError
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\t%d\t%d\t%d\t%d\t%d\n", b.Address, state, health, b.Weight, b.Slots, b.ActiveConns, b.InactiveConns, b.Counters.Packets, b.Counters.Bytes, b.Counters.NewFlows)
	}
	return tw.Flush()
}

func conntrackCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{Use: "conntrack", Short: "inspect and flush the connection table"}
	cmd.AddCommand(&cobra.Command{
		Use:   "stats",
		Short: "entries, capacity and insert failures of the connection table",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var ct api.Conntrack
			err := g.ask(cmd, func(c *api.Client) (err error) {
				ct, err = c.Conntrack(cmd.Context())
				return err
			}, func(p *daemon.Pinned) (err error) {
				ct, err = p.Conntrack()
				return err
			})
			if err != nil {
				return err
			}
			if g.output == "json" {
				return writeJSON(cmd.OutOrStdout(), ct)
			}
			fill := 0.0
			if ct.Capacity > 0 {
				fill = 100 * float64(ct.Entries) / float64(ct.Capacity)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "entries %d of %d (%.1f%%), insert failures %d\n", ct.Entries, ct.Capacity, fill, ct.InsertFailures)
			return nil
		},
	})
	var q api.FlowQuery
	list := &cobra.Command{
		Use:   "list",
		Short: "list the connection table's flows: client, VIP, backend, protocol, state, age (like ipvsadm -Lnc)",
		Long: `Lists the flows of the connection table, of one service and/or backend
(ip:port) when given. STATE is established (the only active state),
syn_sent or closing (SNAT flows, from their binding; closing also for a
DSR flow whose client sent a FIN or RST), idle (TCP not seen
within datapath.snat_timeouts.tcp) or udp. AGE is the time since the
flow's latest client packet; EXPIRE how long until, without another
packet, it is idle (its state's timeout of datapath.snat_timeouts less its
age, as ipvsadm -Lnc's expire; the entry stays until the table evicts
it). SNAT is the source the flow's binding uses towards the backend.

At most --limit flows are listed (0: all); the daemon counts the rest, and a
line on stderr says how many matched (-o json: field "matched"). A full table of a million flows is a
few hundred MB of text.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if q.Backend != "" {
				if _, err := netip.ParseAddrPort(q.Backend); err != nil {
					return &exitError{code: 2, err: fmt.Errorf("--backend %q: want ip:port (IPv6 as [addr]:port)", q.Backend)}
				}
			}
			if q.Limit < 0 {
				return &exitError{code: 2, err: fmt.Errorf("--limit %d: want a number of flows, 0 for all", q.Limit)}
			}
			var fl api.FlowList
			err := g.ask(cmd, func(c *api.Client) (err error) {
				fl, err = c.Flows(cmd.Context(), q)
				return err
			}, func(p *daemon.Pinned) (err error) {
				fl, err = p.Flows(q)
				return err
			})
			if err != nil {
				return err
			}
			if g.output == "json" {
				return writeJSON(cmd.OutOrStdout(), fl) // "matched" says it
			}
			if len(fl.Flows) < fl.Matched {
				fmt.Fprintf(cmd.ErrOrStderr(), "listed %d of %d matching flows; --limit 0 lists all\n", len(fl.Flows), fl.Matched)
			}
			return printFlows(cmd.OutOrStdout(), fl.Flows)
		},
	}
	list.Flags().StringVar(&q.Service, "service", "", "only this service's flows")
	_ = list.RegisterFlagCompletionFunc("service", completeServiceNames(g, -1))
	list.Flags().StringVar(&q.Backend, "backend", "", "only this backend's flows (ip:port; of every service that has it)")
	list.Flags().IntVar(&q.Limit, "limit", 1000, "list at most this many flows (0: all)")
	cmd.AddCommand(list, flushCmd(g))
	return cmd
}

func printFlows(out io.Writer, flows []api.Flow) error {
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "PROTO\tCLIENT\tVIP\tSERVICE\tBACKEND\tSTATE\tAGE\tEXPIRE\tSNAT")
	for _, f := range flows {
		svc, snat := f.Service, f.SNAT
		if svc == "" {
			svc = "-"
		}
		if snat == "" {
			snat = "-"
		}
		age := (time.Duration(f.AgeSeconds * float64(time.Second))).Round(time.Second)
		expire := (time.Duration(f.ExpiresSeconds * float64(time.Second))).Round(time.Second)
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", f.Proto, f.Client, f.VIP, svc, f.Backend, f.State, age, expire, snat)
	}
	return tw.Flush()
}

func flushCmd(g *globals) *cobra.Command {
	var req api.FlushRequest
	cmd := &cobra.Command{
		Use:   "flush (--backend ADDR:PORT [--service S] | --service S | --all)",
		Short: "delete flows from the connection table (and their SNAT bindings): they are balanced again by their next packet",
		Long: `Deletes the connection-table entries of a backend (of every service that
has it, or of --service only), of a service, or with --all of every
service, and the SNAT bindings of those flows.

What that does to the flows: each one's next packet is balanced again, as
a new flow, by the Maglev table in force. A flow whose backend is still the
table's choice lands there again (a SNAT flow most often gets its source
port back, as its new binding starts probing at the same hashed port, and
continues). A flow that stayed on its backend only through its entry (the
backend is draining, disabled or no longer in the table) moves to the
table's choice: a TCP connection is reset by its new backend, a UDP flow's
next datagrams go there. So drain a backend first, flush it to move what
is left, and wait for ACTIVE to reach 0 if you want no flow cut.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if req.Service == "" && req.Backend == "" && !req.All {
				return &exitError{code: 2, err: errors.New("conntrack flush: say what to flush: --backend ADDR:PORT, --service NAME, or --all for every flow")}
			}
			if req.All && (req.Service != "" || req.Backend != "") {
				return &exitError{code: 2, err: errors.New("conntrack flush: --all flushes every flow; it takes no --service or --backend")}
			}
			if req.Backend != "" {
				if _, err := netip.ParseAddrPort(req.Backend); err != nil {
					return &exitError{code: 2, err: fmt.Errorf("--backend %q: want ip:port (IPv6 as [addr]:port)", req.Backend)}
				}
			}
			res, err := api.NewClient(g.socket).Flush(cmd.Context(), req)
			if err != nil {
				return err
			}
			if g.output == "json" {
				return writeJSON(cmd.OutOrStdout(), res)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "flushed %d flows and %d SNAT bindings\n", res.Flows, res.Bindings)
			return nil
		},
	}
	cmd.Flags().StringVar(&req.Backend, "backend", "", "flush this backend's flows (ip:port)")
	cmd.Flags().StringVar(&req.Service, "service", "", "flush this service's flows (with --backend: only that backend's of this service)")
	_ = cmd.RegisterFlagCompletionFunc("service", completeServiceNames(g, -1))
	cmd.Flags().BoolVar(&req.All, "all", false, "flush every flow of every service")
	return cmd
}
