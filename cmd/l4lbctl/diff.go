// SPDX-License-Identifier: Apache-2.0

package main

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/l4lb/l4lb/lb/api"
	"github.com/l4lb/l4lb/lb/change"
	"github.com/l4lb/l4lb/lb/config"
	"github.com/l4lb/l4lb/lb/daemon"
)

func diffCmd(g *globals) *cobra.Command {
	var dev bool
	cmd := &cobra.Command{
		Use:   "diff FILE | diff OLD NEW",
		Short: "show per service what a configuration change would do, and the share of flows it would move",
		Long: `With one file, asks the running l4lbd what loading FILE would change: per
service the backends added, removed, reweighted or put in another state,
and the share of its flows that would go to another backend (Maglev slots
changing owner, computed as l4lbd builds its tables, with its other
discovery sources, runtime overrides and health checks as they are now).
Nothing is applied. Exits 1 when daemon.max_flow_move in FILE would make
the reload fail.

With two files, compares them offline as l4lbd would program them on a box
with no other source, override or failing health check, each with its own
seed.`,
		Args: cobra.RangeArgs(1, 2),
		RunE: func(cmd *cobra.Command, args []string) error {
			var (
				d   api.ConfigDiff
				err error
			)
			if len(args) == 1 {
				content, rerr := config.ReadFile(args[0])
				if rerr != nil {
					return rerr
				}
				d, err = api.NewClient(g.socket).ConfigDiff(cmd.Context(), args[0], content)
			} else {
				d, err = offlineDiff(args[0], args[1], config.Options{Dev: dev})
			}
			if err != nil {
				return err
			}
			if g.output == "json" {
				err = writeJSON(cmd.OutOrStdout(), d)
			} else {
				err = printDiff(cmd.OutOrStdout(), d)
			}
			if err == nil && len(d.Refused) > 0 {
				return &exitError{code: 1, err: fmt.Errorf("daemon.max_flow_move = %g would refuse this change", d.MaxFlowMove), reported: g.output == "json"}
			}
			return err
		},
	}
	cmd.Flags().BoolVar(&dev, "dev", false, "accept files without maglev.hash_seed (two-file form)")
	return cmd
}

func offlineDiff(oldPath, newPath string, opts config.Options) (api.ConfigDiff, error) {
	old, err := config.Load(oldPath, opts)
	if err != nil {
		return api.ConfigDiff{}, err
	}
	cur, err := config.Load(newPath, opts)
	if err != nil {
		return api.ConfigDiff{}, err
	}
	changes, err := daemon.OfflineChanges(old, cur)
	if err != nil {
		return api.ConfigDiff{}, err
	}
	return api.ConfigDiff{Old: oldPath, New: newPath, MaxFlowMove: cur.Daemon.MaxFlowMove,
		Refused: daemon.OverGuard(changes, cur.Daemon.MaxFlowMove), Services: daemon.APIChanges(changes)}, nil
}

func printDiff(out io.Writer, d api.ConfigDiff) error {
	fmt.Fprintf(out, "%s -> %s\n", d.Old, d.New)
	if len(d.PendingRestart) > 0 {
		fmt.Fprintf(out, "pending restart (not applied by a reload): %s\n", strings.Join(d.PendingRestart, ", "))
	}
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SERVICE\tSTATUS\tMOVED FLOWS\tCHANGES")
	for _, s := range d.Services {
		var ch []string
		for _, a := range s.Added {
			ch = append(ch, "+"+a)
		}
		for _, a := range s.Removed {
			ch = append(ch, "-"+a)
		}
		for _, r := range s.Reweighted {
			ch = append(ch, fmt.Sprintf("%s weight %s→%s", r.Backend, r.Old, r.New))
		}
		for _, r := range s.Restated {
			ch = append(ch, fmt.Sprintf("%s %s→%s", r.Backend, r.Old, r.New))
		}
		if len(s.Other) > 0 {
			ch = append(ch, strings.Join(s.Other, ", "))
		}
		moved := change.Percent(s.MovedFlows)
		if s.Status == "added" || s.Status == "removed" {
			moved = "-"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", s.Name, s.Status, moved, strings.Join(ch, " "))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, r := range d.Refused {
		fmt.Fprintf(out, "REFUSED by daemon.max_flow_move = %g: %s\n", d.MaxFlowMove, r)
	}
	return nil
}
