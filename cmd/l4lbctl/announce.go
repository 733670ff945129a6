// SPDX-License-Identifier: Apache-2.0

package main

import (
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/l4lb/l4lb/lb/api"
	"github.com/l4lb/l4lb/lb/fleet"
)

func bgpCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{Use: "bgp", Short: "inspect VIP announcement over BGP"}
	cmd.AddCommand(&cobra.Command{
		Use:   "status",
		Short: "BGP sessions and the VIPs announced or withheld",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			b, err := api.NewClient(g.socket).BGP(cmd.Context())
			if err != nil {
				return err
			}
			if g.output == "json" {
				return writeJSON(cmd.OutOrStdout(), b)
			}
			return printBGP(cmd.OutOrStdout(), b)
		},
	})
	return cmd
}

func printBGP(out io.Writer, b api.BGPStatus) error {
	gr := "off"
	if b.GracefulRestart {
		gr = "on"
	}
	fmt.Fprintf(out, "AS %d, router id %s, graceful restart %s, on stop: %s\n\n", b.ASN, b.RouterID, gr, b.OnStop)
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "PEER\tAS\tSTATE\tSINCE\tGR\tBFD\tADVERTISED\tUPDATES SENT\tUPDATES RECEIVED\tLAST ERROR")
	for _, p := range b.Peers {
		since := "-"
		if !p.Since.IsZero() {
			since = time.Since(p.Since).Round(time.Second).String()
		}
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\t%s\t%d\t%d\t%d\t%s\n", p.Address, p.ASN, p.State, since, yesNo(p.GracefulRestart),
			bfdSummary(p.BFD), p.Advertised, p.UpdatesSent, p.UpdatesReceived, dash(p.LastError))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(out)
	return printVIPs(out, b.VIPs)
}

// bfdSummary is a peer's BFD session in one cell: its state, the timers
// (multiplier × receive interval is the detection time) and the failures
// seen since l4lbd started, e.g. "up 3x300ms, 1 down".
func bfdSummary(b *api.BFDSession) string {
	if b == nil {
		return "off"
	}
	s := fmt.Sprintf("%s %dx%s", b.State, b.DetectMultiplier, b.MinRxInterval)
	if n := b.Transitions["down"]; n > 0 {
		s += fmt.Sprintf(", %d down", n)
	}
	return s
}

func printVIPs(out io.Writer, vips []api.AnnouncedVIP) error {
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "VIP\tANNOUNCED\tSERVICES\tWHY NOT")
	for _, v := range vips {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", v.VIP, yesNo(v.Announced), strings.Join(v.Services, ","), dash(v.Reason))
	}
	return tw.Flush()
}

// announceSummary is the status lines of the announcers.
func announceSummary(tw io.Writer, st api.Status) {
	count := func(vips []api.AnnouncedVIP) (n int) {
		for _, v := range vips {
			if v.Announced {
				n++
			}
		}
		return n
	}
	if b := st.BGP; b != nil {
		up := 0
		for _, p := range b.Peers {
			if p.Up {
				up++
			}
		}
		fmt.Fprintf(tw, "bgp\tAS %d: %d of %d peers established, %d of %d VIPs announced (l4lbctl bgp status)\n", b.ASN, up, len(b.Peers), count(b.VIPs), len(b.VIPs))
		for _, v := range b.VIPs {
			if !v.Announced {
				fmt.Fprintf(tw, "\t  %s withheld: %s\n", v.VIP, v.Reason)
			}
		}
	}
	if l := st.L2; l != nil {
		var names []string
		for _, i := range l.Interfaces {
			names = append(names, fmt.Sprintf("%s (%d ARP, %d ND replies, %d gratuitous)", i.Name, i.ARPReplies, i.NDReplies, i.GratuitousSent))
		}
		fmt.Fprintf(tw, "l2\t%d of %d VIPs answered on %s\n", count(l.VIPs), len(l.VIPs), strings.Join(names, ", "))
		if f := l.Failover; f != nil {
			fmt.Fprintf(tw, "\t  failover: %s since %s (%s, group %d, priority %d, %d × %s)\n", f.Role, f.Since.Format(time.RFC3339), f.Name, f.Group, f.Priority, f.DetectMultiplier, f.Interval)
			for _, p := range f.Peers {
				fmt.Fprintf(tw, "\t  peer %s %s: %s, priority %d%s, heard %s ago on %s\n", p.Name, p.MAC, p.Role, p.Priority, notReady(p.Ready), time.Since(p.LastSeen).Round(time.Millisecond), p.Interface)
			}
			if len(f.Peers) == 0 {
				fmt.Fprintf(tw, "\t  no other box of group %d heard: no standby\n", f.Group)
			}
		}
		for _, v := range l.VIPs {
			if !v.Announced {
				fmt.Fprintf(tw, "\t  %s withheld: %s\n", v.VIP, v.Reason)
			}
		}
	}
	for _, w := range st.FleetWarnings {
		fmt.Fprintf(tw, "fleet\t%s\n", w)
	}
}

func notReady(ready bool) string {
	if ready {
		return ""
	}
	return " (still probing its backends)"
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func fleetCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "fleet",
		Short: "every LB box's fingerprints side by side, as the fleet check (Consul) sees them",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			f, err := api.NewClient(g.socket).Fleet(cmd.Context())
			if err != nil {
				return err
			}
			if g.output == "json" {
				return writeJSON(cmd.OutOrStdout(), f)
			}
			return printFleet(cmd.OutOrStdout(), f)
		},
	}
	cmd.AddCommand(&cobra.Command{
		Use:   "compare TARGET...",
		Short: "compare boxes now, without Consul: TARGET is a metrics URL (http://HOST:9842) or an admin socket (unix:PATH); exits 1 when they disagree",
		Args:  cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			var boxes []fleet.Box
			for _, target := range args {
				b, err := fleet.Fetch(cmd.Context(), target)
				if err != nil {
					return err
				}
				boxes = append(boxes, b)
			}
			rep := fleet.Compare(boxes)
			f := rep.API("")
			if g.output == "json" {
				if err := writeJSON(cmd.OutOrStdout(), f); err != nil {
					return err
				}
			} else if err := printFleet(cmd.OutOrStdout(), f); err != nil {
				return err
			}
			if len(rep.Warnings()) > 0 {
				return &exitError{code: 1, err: fmt.Errorf("the boxes disagree (%d findings)", len(rep.Warnings()))}
			}
			return nil
		},
	})
	return cmd
}

func printFleet(out io.Writer, f api.Fleet) error {
	if f.Self != "" {
		sync := "never"
		if !f.LastSync.IsZero() {
			sync = time.Since(f.LastSync).Round(time.Second).String() + " ago"
		}
		fmt.Fprintf(out, "this box: %s; Consul last answered %s\n", f.Self, sync)
		if f.Error != "" {
			fmt.Fprintf(out, "FAILING: %s\n", f.Error)
		}
	}
	if len(f.Warnings) == 0 {
		fmt.Fprintf(out, "the %d boxes agree on every service they share\n", len(f.Boxes))
	}
	for _, w := range f.Warnings {
		fmt.Fprintf(out, "MISMATCH %s\n", w)
	}
	for _, fe := range sortedKeys(f.Missing) {
		fmt.Fprintf(out, "note: %s is not served by %s\n", fe, strings.Join(f.Missing[fe], ", "))
	}
	fmt.Fprintln(out)
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "BOX\tSEED\tVERSION\tSERVICES\tCHANGED\tLAST SEEN")
	for _, b := range f.Boxes {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\t%s\n", b.Name, b.SeedFingerprint, dash(b.Version), len(b.Services), ago(b.Updated), ago(b.LastSeen))
	}
	for _, g := range f.Gone {
		fmt.Fprintf(tw, "%s\t(gone: its record went with its session)\t\t\t\t%s\n", g.Name, ago(g.LastSeen))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(out)
	// One row per frontend, one column per box.
	tw = tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprint(tw, "SERVICE\tFRONTEND")
	for _, b := range f.Boxes {
		fmt.Fprintf(tw, "\t%s", strings.ToUpper(b.Name))
	}
	fmt.Fprintln(tw, "\t")
	for _, fe := range f.Frontends {
		fmt.Fprintf(tw, "%s\t%s", strings.Join(fe.Services, "/"), fe.Frontend)
		for _, b := range f.Boxes {
			fp, ok := fe.Fingerprints[b.Name]
			switch {
			case !ok:
				fp = "-"
			case fe.Differ:
				fp += " !"
			}
			fmt.Fprintf(tw, "\t%s", fp)
		}
		fmt.Fprintln(tw, "\t")
	}
	return tw.Flush()
}

// ago says how long ago t was, to the second; "-" for never.
func ago(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return time.Since(t).Round(time.Second).String() + " ago"
}

func sortedKeys[V any](m map[string]V) []string {
	return slices.Sorted(maps.Keys(m))
}
