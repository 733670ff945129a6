// SPDX-License-Identifier: Apache-2.0

package main

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/l4lb/l4lb/lb/api"
	"github.com/l4lb/l4lb/lb/config"
	"github.com/l4lb/l4lb/lb/daemon"
	"github.com/l4lb/l4lb/lb/maglev"
)

func configCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{Use: "config", Short: "work with configuration files"}
	var dev, noHost bool
	check := &cobra.Command{
		Use:   "check FILE",
		Short: "validate a configuration file as l4lbd would on this box; exits non-zero and prints every error",
		Long: `Validates FILE exactly as l4lbd does at start and on reload: the file
itself, across its services (a backend at another service's VIP, weights
that leave a backend no Maglev slot, a service without backends: a
warning), and what it means on this box (VIPs or backends that are the
box's own addresses, interfaces it does not have, SNAT addresses it does
not hold, an admin socket path holding another file, bpffs, the kernel
memory the datapath maps need against the memory available, SNAT ports
overlapping the kernel's ephemeral range). Prints the memory estimate
("maps: ≈ N MiB") and any warning. --no-host-checks checks a file written
for another box.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			opts := config.Options{Dev: dev}
			if !noHost {
				opts.Host = daemon.HostFacts()
			}
			cfg, err := config.Load(args[0], opts)
			return printCheck(cmd.OutOrStdout(), cmd.ErrOrStderr(), g.output == "json", args[0], opts.Host, cfg, err)
		},
	}
	check.Flags().BoolVar(&dev, "dev", false, "accept a missing maglev.hash_seed, as l4lbd --dev does")
	check.Flags().BoolVar(&noHost, "no-host-checks", false, "check the file alone, not against this box (a config for another box)")
	cmd.AddCommand(check, diffCmd(g))
	return cmd
}

// checkIssue is one error or warning of `config check -o json`.
type checkIssue struct {
	File    string `json:"file"`
	Line    int    `json:"line,omitempty"`
	Service string `json:"service,omitempty"`
	Backend string `json:"backend,omitempty"`
	Key     string `json:"key,omitempty"`
	Message string `json:"message"`
}

func issues(list config.ErrorList) []checkIssue {
	out := []checkIssue{}
	for _, e := range list {
		out = append(out, checkIssue{File: e.File, Line: e.Line, Service: e.Service, Backend: e.Backend, Key: e.Key, Message: e.Msg})
	}
	return out
}

func printCheck(out, errOut io.Writer, asJSON bool, file string, host *config.Host, cfg *config.Config, err error) error {
	var list config.ErrorList
	if err != nil && !errors.As(err, &list) {
		// Not a validation error: the file could not be read.
		list = config.ErrorList{{File: file, Msg: err.Error()}}
	}
	if asJSON {
		res := struct {
			File     string       `json:"file"`
			Valid    bool         `json:"valid"`
			Services int          `json:"services,omitempty"`
			MapBytes uint64       `json:"map_memory_bytes,omitempty"`
			NewBytes uint64       `json:"map_memory_new_bytes,omitempty"`
			Memory   uint64       `json:"memory_available_bytes,omitempty"`
			Errors   []checkIssue `json:"errors,omitempty"`
			Warnings []checkIssue `json:"warnings,omitempty"`
		}{File: file, Valid: err == nil}
		if host != nil {
			res.Memory = host.MemoryAvailable
		}
		if err != nil {
			res.Errors = issues(list)
		} else {
			res.Services, res.MapBytes, res.NewBytes = len(cfg.Services), cfg.MapMemory.Total, cfg.MapMemory.New
			if len(cfg.Warnings) > 0 {
				res.Warnings = issues(cfg.Warnings)
			}
		}
		if werr := writeJSON(out, res); werr != nil {
			return werr
		}
		if err != nil {
			return &exitError{code: 1, err: errors.New("configuration is invalid"), reported: true}
		}
		return nil
	}
	if err != nil {
		fmt.Fprintln(errOut, list.Error())
		n := fmt.Sprintf("%d errors", len(list))
		if len(list) == 1 {
			n = "1 error"
		}
		return &exitError{code: 1, err: fmt.Errorf("%s: configuration is invalid (%s)", file, n)}
	}
	fmt.Fprintf(out, "%s: valid (%d services)\n", file, len(cfg.Services))
	if mem := cfg.MapMemory; mem.Total > 0 {
		pinned := ""
		if mem.New < mem.Total {
			pinned = fmt.Sprintf(", %s of it new (the rest is pinned under %s already)", config.MiB(mem.New), cfg.Daemon.BPFFS)
		}
		avail := ""
		if host != nil && host.MemoryAvailable > 0 {
			avail = fmt.Sprintf(" (%s available)", config.MiB(host.MemoryAvailable))
		}
		fmt.Fprintf(out, "maps: ≈ %s of kernel memory%s%s\n", config.MiB(mem.Total), pinned, avail)
	}
	for _, w := range cfg.Warnings {
		fmt.Fprintln(out, "warning:", w.Error())
	}
	return nil
}

func seedCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{Use: "seed", Short: "make Maglev hash seeds"}
	cmd.AddCommand(&cobra.Command{
		Use:   "new",
		Short: "print a new random maglev.hash_seed (put the same one on every LB box)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var s maglev.Seed
			if _, err := rand.Read(s[:]); err != nil {
				return fmt.Errorf("read random bytes: %w", err)
			}
			if g.output == "json" {
				return writeJSON(cmd.OutOrStdout(), map[string]string{"hash_seed": s.String()})
			}
			fmt.Fprintln(cmd.OutOrStdout(), s.String())
			return nil
		},
	})
	return cmd
}

func reloadCmd(g *globals) *cobra.Command {
	var timeout time.Duration
	cmd := &cobra.Command{
		Use:   "reload",
		Short: "make l4lbd re-read its configuration file and wait for the outcome; exits non-zero when it is rejected",
		Long: `Asks the running l4lbd to re-read its configuration file, as SIGHUP does,
and waits until the result is programmed. A rejected file prints every
error and exits 1 while the previous configuration keeps serving, so
` + "`systemctl reload l4lb`" + ` (whose ExecReload runs this) reports it too.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, cancel := context.WithTimeout(cmd.Context(), timeout)
			defer cancel()
			rl, err := api.NewClient(g.socket).Reload(ctx)
			if err != nil {
				return err
			}
			st, err := api.NewClient(g.socket).Status(ctx)
			if err != nil {
				return err
			}
			if g.output == "json" {
				return writeJSON(cmd.OutOrStdout(), struct {
					api.Reload
					PendingRestart []string `json:"pending_restart,omitempty"`
				}{rl, st.PendingRestart})
			}
			fmt.Fprintf(cmd.OutOrStdout(), "reloaded %s: %d services\n", st.ConfigFile, st.Services)
			if len(st.PendingRestart) > 0 {
				fmt.Fprintf(cmd.OutOrStdout(), "pending restart: %s\n", strings.Join(st.PendingRestart, ", "))
			}
			return nil
		},
	}
	cmd.Flags().DurationVar(&timeout, "timeout", 5*time.Minute, "how long to wait for the reload")
	return cmd
}

func statusCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "status",
		Short: "show the daemon's state",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			st, err := api.NewClient(g.socket).Status(cmd.Context())
			if err != nil {
				return err
			}
			if g.output == "json" {
				return writeJSON(cmd.OutOrStdout(), st)
			}
			return printStatus(cmd.OutOrStdout(), st)
		},
	}
}

func printStatus(out io.Writer, st api.Status) error {
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "version\t%s (pid %d, up %s)\n", st.Version, st.PID, time.Since(st.StartedAt).Round(time.Second))
	fmt.Fprintf(tw, "config\t%s\n", st.ConfigFile)
	reload := "ok"
	if !st.LastReload.OK {
		reload = "REJECTED: " + st.LastReload.Error
	}
	fmt.Fprintf(tw, "last reload\t%s (%d reloads) %s\n", reload, st.LastReload.Count, st.LastReload.Time.Format(time.RFC3339))
	if len(st.PendingRestart) > 0 {
		fmt.Fprintf(tw, "pending restart\t%s (changed in the file; they apply when l4lbd restarts)\n", strings.Join(st.PendingRestart, ", "))
	}
	seed := st.SeedFingerprint
	if st.DevSeed {
		seed += " (PUBLIC DEV SEED: boxes will not agree)"
	}
	fmt.Fprintf(tw, "hash seed\tfingerprint %s\n", seed)
	for i, ifc := range st.Interfaces {
		label := ""
		if i == 0 {
			label = "interfaces"
		}
		fmt.Fprintf(tw, "%s\t%s\n", label, interfaceLine(ifc))
	}
	fmt.Fprintf(tw, "services\t%d (%d backends)\n", st.Services, st.Backends)
	if st.ReconcileError != "" {
		fmt.Fprintf(tw, "reconcile\tFAILING: %s\n", st.ReconcileError)
	}
	if sc := st.SelfCheck; sc != nil {
		fmt.Fprintf(tw, "self-check\t%s\n", selfCheckLine(sc))
		if sc.LastDrift != "" {
			fmt.Fprintf(tw, "\t  last drift %s: %s\n", sc.LastDriftAt.Format(time.RFC3339), sc.LastDrift)
		}
	}
	for _, c := range st.Conflicts {
		fmt.Fprintf(tw, "conflict\t%s\n", c)
	}
	for _, r := range st.Rejected {
		fmt.Fprintf(tw, "refused\t%s\n", r)
	}
	for _, w := range st.HealthWarnings {
		fmt.Fprintf(tw, "health\t%s\n", w)
	}
	for _, src := range st.Discovery {
		state := "ok, last sync " + src.LastSync.Format(time.RFC3339)
		if src.Stale {
			state = fmt.Sprintf("STALE for %.0fs", src.StaleSeconds)
		}
		if src.Error != "" {
			state += ": " + src.Error
		}
		if src.StatusWriter {
			state += " (this box writes Service status)"
		}
		fmt.Fprintf(tw, "discovery\t%s: %s\n", src.Name, state)
		for _, e := range src.Errors {
			fmt.Fprintf(tw, "\t  %s\n", e)
		}
	}
	announceSummary(tw, st)
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(out, "\ndatapath counters")
	tw = tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "REASON\tPACKETS\tBYTES")
	for _, r := range st.Reasons {
		fmt.Fprintf(tw, "%s\t%d\t%d\n", r.Name, r.Packets, r.Bytes)
	}
	return tw.Flush()
}

// selfCheckLine sums up the datapath self-check: when it last passed, and
// the differences between the maps and what l4lbd programmed it found.
func selfCheckLine(sc *api.SelfCheckStatus) string {
	if sc.Passes == 0 {
		return fmt.Sprintf("no pass yet (every %s)", time.Duration(sc.IntervalSeconds*float64(time.Second)))
	}
	line := fmt.Sprintf("last pass %s (%.2fs, every %s): ", sc.LastPass.Format(time.RFC3339), sc.LastPassSeconds, time.Duration(sc.IntervalSeconds*float64(time.Second)))
	switch {
	case sc.LastPassUnrepaired > 0:
		line += fmt.Sprintf("DRIFT NOT REPAIRED: %d of %d differences could not be written back", sc.LastPassUnrepaired, sc.LastPassDrifts)
	case sc.LastPassDrifts > 0:
		line += fmt.Sprintf("DRIFT: %d differences found and repaired", sc.LastPassDrifts)
	default:
		line += "maps match what l4lbd programmed"
	}
	var total uint64
	var byMap []string
	for _, m := range slices.Sorted(maps.Keys(sc.Drifts)) {
		total += sc.Drifts[m]
		byMap = append(byMap, fmt.Sprintf("%s %d", m, sc.Drifts[m]))
	}
	if total > 0 {
		line += fmt.Sprintf("; %d since start (%s)", total, strings.Join(byMap, ", "))
	}
	if sc.LastPassError != "" {
		line += "; read failed: " + sc.LastPassError
	}
	return line
}

func backendCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "backend",
		Short: "override a backend's state at runtime (shown as an override; cleared when the backend leaves its service)",
	}
	for _, a := range []struct {
		action api.BackendAction
		short  string
	}{
		{api.ActionDrain, "no new flows; established flows continue"},
		{api.ActionEnable, "force the backend active"},
		{api.ActionDisable, "no traffic at all; its flows move to other backends"},
		{api.ActionClear, "drop the override: back to the configured state"},
	} {
		cmd.AddCommand(&cobra.Command{
			Use:               string(a.action) + " SERVICE ADDRESS:PORT",
			Short:             a.short,
			Args:              cobra.ExactArgs(2),
			ValidArgsFunction: completeServiceBackend(g),
			RunE: func(cmd *cobra.Command, args []string) error {
				be, err := netip.ParseAddrPort(args[1])
				if err != nil {
					return fmt.Errorf("backend %q: want ip:port (IPv6 as [addr]:port)", args[1])
				}
				if err := api.NewClient(g.socket).Backend(cmd.Context(), args[0], be, a.action); err != nil {
					return err
				}
				if g.output == "json" {
					return writeJSON(cmd.OutOrStdout(), map[string]string{"service": args[0], "backend": be.String(), "action": string(a.action)})
				}
				fmt.Fprintf(cmd.OutOrStdout(), "%s %s: %s\n", args[0], be, a.action)
				return nil
			},
		})
	}
	return cmd
}
