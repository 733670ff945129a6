// SPDX-License-Identifier: Apache-2.0

package main

import (
	"errors"
	"fmt"
	"strings"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/l4lb/l4lb/lb/api"
	"github.com/l4lb/l4lb/lb/config"
	"github.com/l4lb/l4lb/lb/daemon"
)

// ask runs online against the l4lbd on --socket; with --offline, or when
// no l4lbd answers there (no socket, connection refused), it runs offline
// on the datapath pinned under the config's daemon.bpffs instead, after a
// note on stderr saying so and what the pins cannot tell.
func (g *globals) ask(cmd *cobra.Command, online func(*api.Client) error, offline func(*daemon.Pinned) error) error {
	if !g.offline {
		err := online(api.NewClient(g.socket))
		if err == nil || !notRunning(err) {
			return err
		}
		fmt.Fprintf(cmd.ErrOrStderr(), "l4lbctl: no l4lbd answers on %s (%v);\n", g.socket, errors.Unwrap(err))
	}
	cfg, err := config.Load(g.config, config.Options{Dev: true})
	names := "service names from " + g.config
	if err != nil {
		cfg = config.Default()
		first, _, _ := strings.Cut(err.Error(), "\n")
		names = fmt.Sprintf("no service names (%s cannot be read: %s)", g.config, first)
	}
	p, err := daemon.OpenPinned(cfg)
	if err != nil {
		return err
	}
	defer p.Close()
	fmt.Fprintf(cmd.ErrOrStderr(), "l4lbctl: reading the datapath pinned under %s: what the kernel forwards now; %s; no health, weights or overrides\n", p.Dir, names)
	return offline(p)
}

// notRunning reports whether err says that no l4lbd listens on the socket.
func notRunning(err error) bool {
	return errors.Is(err, syscall.ENOENT) || errors.Is(err, syscall.ECONNREFUSED)
}
