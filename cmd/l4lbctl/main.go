// SPDX-License-Identifier: Apache-2.0

// Command l4lbctl is the operator's tool for l4lb: it asks a running l4lbd
// through its admin socket (status, services, reload) and computes, offline
// and exactly as l4lbd does, Maglev tables, which backend a flow gets, what
// a configuration change would move, and whether a file is valid.
package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/spf13/cobra"

	"github.com/l4lb/l4lb/internal/clidoc"
	"github.com/l4lb/l4lb/lb/daemon"
)

func main() {
	cmd := root()
	err := cmd.Execute()
	if err == nil {
		return
	}
	report(cmd, os.Stdout, os.Stderr, err)
	os.Exit(exitCode(err))
}

// report prints a failure: as {"error": …} on stdout with -o json (unless
// the command already printed its own JSON answer), else on stderr.
func report(cmd *cobra.Command, stdout, stderr io.Writer, err error) {
	var e *exitError
	if errors.As(err, &e) && e.reported {
		return
	}
	if f := cmd.PersistentFlags().Lookup("output"); f != nil && f.Value.String() == "json" {
		_ = writeJSON(stdout, map[string]string{"error": err.Error()})
		return
	}
	fmt.Fprintln(stderr, "l4lbctl:", err)
}

// exitError carries a process exit code: 1 for a failure (an invalid
// file, a daemon that answered with an error), 2 for a usage problem.
// reported means the command already printed it.
type exitError struct {
	code     int
	err      error
	reported bool
}

func (e *exitError) Error() string { return e.err.Error() }
func (e *exitError) Unwrap() error { return e.err }

func exitCode(err error) int {
	var e *exitError
	if errors.As(err, &e) {
		return e.code
	}
	if isUsage(err) {
		return 2
	}
	return 1
}

// isUsage recognises cobra's own argument and flag errors, which it
// returns as plain errors.
func isUsage(err error) bool {
	msg := err.Error()
	for _, p := range []string{"unknown command", "unknown flag", "unknown shorthand flag", "accepts ", "requires ", "invalid argument", "flag needs an argument", "required flag"} {
		if strings.HasPrefix(msg, p) || strings.Contains(msg, " "+p) {
			return true
		}
	}
	return false
}

func usageError(format string, args ...any) error {
	return &exitError{code: 2, err: fmt.Errorf(format, args...)}
}

type globals struct {
	output string
	socket string
	// offline reads the pinned datapath instead of asking l4lbd; config
	// names its bpffs directory and services.
	offline bool
	config  string
}

func root() *cobra.Command {
	g := &globals{}
	cmd := &cobra.Command{
		Use:           "l4lbctl",
		Short:         "control and inspect the l4lb load balancer",
		Version:       daemon.Version,
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	cmd.PersistentFlags().StringVarP(&g.output, "output", "o", "table", "output format: table or json")
	cmd.PersistentFlags().StringVar(&g.socket, "socket", "/run/l4lb/l4lb.sock", "l4lbd admin socket")
	cmd.PersistentFlags().BoolVar(&g.offline, "offline", false, "service list|get and conntrack stats|list: read the datapath pinned under daemon.bpffs of --config instead of asking l4lbd (they do so by themselves when no l4lbd answers)")
	cmd.PersistentFlags().StringVar(&g.config, "config", "/etc/l4lb/l4lb.toml", "with --offline (or no l4lbd answering): the config whose daemon.bpffs to read and whose services name the pinned ones")
	cmd.PersistentPreRunE = func(*cobra.Command, []string) error {
		if g.output != "table" && g.output != "json" {
			return usageError("--output %q: want table or json", g.output)
		}
		return nil
	}
	cmd.AddCommand(maglevCmd(g), configCmd(g), statusCmd(g), serviceCmd(g), backendCmd(g), conntrackCmd(g),
		bgpCmd(g), fleetCmd(g), seedCmd(g), reloadCmd(g), traceCmd(g), clidoc.Command(cmd))
	requireSubcommands(cmd)
	return cmd
}

// requireSubcommands makes every command that only groups others fail
// with a usage error (exit 2) when called bare or with an unknown
// subcommand; cobra would print help and exit 0.
func requireSubcommands(cmd *cobra.Command) {
	for _, c := range cmd.Commands() {
		requireSubcommands(c)
	}
	if !cmd.HasAvailableSubCommands() || cmd.Run != nil || cmd.RunE != nil {
		return
	}
	cmd.Args = cobra.ArbitraryArgs
	cmd.RunE = func(c *cobra.Command, args []string) error {
		var names []string
		for _, sub := range c.Commands() {
			if sub.IsAvailableCommand() {
				names = append(names, sub.Name())
			}
		}
		if len(args) > 0 {
			return usageError("unknown command %q for %q (want one of: %s)", args[0], c.CommandPath(), strings.Join(names, ", "))
		}
		return usageError("%q needs a subcommand: %s", c.CommandPath(), strings.Join(names, ", "))
	}
}
