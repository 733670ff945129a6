// SPDX-License-Identifier: Apache-2.0

package main

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/l4lb/l4lb/lb/api"
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
	fmt.Fprintln(tw, "PEER\tAS\tSTATE\tSINCE\tGR\tADVERTISED\tUPDATES SENT\tUPDATES RECEIVED\tLAST ERROR")
	for _, p := range b.Peers {
		since := "-"
		if !p.Since.IsZero() {
			since = time.Since(p.Since).Round(time.Second).String()
		}
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\t%d\t%d\t%d\t%s\n", p.Address, p.ASN, p.State, since, yesNo(p.GracefulRestart),
			p.Advertised, p.UpdatesSent, p.UpdatesReceived, dash(p.LastError))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(out)
	return printVIPs(out, b.VIPs)
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
