// SPDX-License-Identifier: Apache-2.0

package main

import (
	"context"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/l4lb/l4lb/lb/api"
)

// completionTimeout bounds how long a shell waits for names from l4lbd:
// a daemon that does not answer makes completion offer nothing, not hang.
const completionTimeout = time.Second

// services asks the running l4lbd (the --socket on the line being
// completed, or its default) for its services; none when it does not
// answer.
func completionServices(cmd *cobra.Command, g *globals) []api.Service {
	ctx, cancel := context.WithTimeout(context.Background(), completionTimeout)
	defer cancel()
	svcs, err := api.NewClient(g.socket).Services(ctx)
	if err != nil {
		cobra.CompDebugln("l4lbctl: no service names: "+err.Error(), true)
		return nil
	}
	return svcs
}

// completeServiceNames completes a service name: the first argument, or a
// --service flag, from the running l4lbd.
func completeServiceNames(g *globals, atArg int) cobra.CompletionFunc {
	return func(cmd *cobra.Command, args []string, toComplete string) ([]string, cobra.ShellCompDirective) {
		if atArg >= 0 && len(args) != atArg {
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
		var out []string
		for _, s := range completionServices(cmd, g) {
			if strings.HasPrefix(s.Name, toComplete) {
				out = append(out, s.Name+"\t"+s.Frontend)
			}
		}
		return out, cobra.ShellCompDirectiveNoFileComp
	}
}

// completeServiceBackend completes `backend ACTION SERVICE ADDRESS:PORT`:
// the services, then the backends of the service named.
func completeServiceBackend(g *globals) cobra.CompletionFunc {
	names := completeServiceNames(g, 0)
	return func(cmd *cobra.Command, args []string, toComplete string) ([]string, cobra.ShellCompDirective) {
		switch len(args) {
		case 0:
			return names(cmd, args, toComplete)
		case 1:
			var out []string
			for _, s := range completionServices(cmd, g) {
				if s.Name != args[0] {
					continue
				}
				for _, b := range s.Backends {
					if strings.HasPrefix(b.Address, toComplete) {
						out = append(out, b.Address+"\t"+b.State)
					}
				}
			}
			return out, cobra.ShellCompDirectiveNoFileComp
		}
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
}
