// SPDX-License-Identifier: Apache-2.0

// Command l4lbctl is the operator's tool for l4lb: it asks a running l4lbd
// through its admin socket (status, services) and computes, offline and
// exactly as l4lbd does, Maglev tables and which backend a flow gets.
package main

import (
	"fmt"
	"os"

	"github.com/spf13/cobra"
)

func main() {
	if err := root().Execute(); err != nil {
		fmt.Fprintln(os.Stderr, "l4lbctl:", err)
		os.Exit(exitCode(err))
	}
}

// exitError carries a process exit code (config check uses 1 for an
// invalid file, 2 for usage problems is cobra's default path).
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string { return e.err.Error() }
func (e *exitError) Unwrap() error { return e.err }

func exitCode(err error) int {
	if e, ok := err.(*exitError); ok {
		return e.code
	}
	return 1
}

type globals struct {
	output string
	socket string
}

func root() *cobra.Command {
	g := &globals{}
	cmd := &cobra.Command{
		Use:           "l4lbctl",
		Short:         "control and inspect the l4lb load balancer",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	cmd.PersistentFlags().StringVarP(&g.output, "output", "o", "table", "output format: table or json")
	cmd.PersistentFlags().StringVar(&g.socket, "socket", "/run/l4lb/l4lb.sock", "l4lbd admin socket")
	cmd.PersistentPreRunE = func(*cobra.Command, []string) error {
		if g.output != "table" && g.output != "json" {
			return fmt.Errorf("--output %q: want table or json", g.output)
		}
		return nil
	}
	cmd.AddCommand(maglevCmd(g), configCmd(g), statusCmd(g), serviceCmd(g), backendCmd(g), conntrackCmd(g), bgpCmd(g), fleetCmd(g))
	return cmd
}
