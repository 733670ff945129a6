// SPDX-License-Identifier: Apache-2.0

// Command l4lbd is the l4lb load-balancer daemon. It runs in the foreground
// (systemd, tests and the demo alike):
//
//	l4lbd --config /etc/l4lb/l4lb.toml       run; SIGHUP reloads, SIGTERM stops
//	l4lbd --config FILE --cleanup            detach and remove l4lbd's pins (by name), then exit
//	l4lbd --cleanup --bpffs DIR              the same for state named on the command line
//	l4lbd backend --interface IF --vip ADDR  run the DSR backend companion
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/l4lb/l4lb/internal/clidoc"
	"github.com/l4lb/l4lb/internal/runlock"
	"github.com/l4lb/l4lb/lb/config"
	"github.com/l4lb/l4lb/lb/daemon"
	"github.com/l4lb/l4lb/lb/datapath"
)

func main() {
	if err := root().Execute(); err != nil {
		fmt.Fprintln(os.Stderr, "l4lbd:", err)
		os.Exit(1)
	}
}

func root() *cobra.Command {
	var (
		path    string
		dev     bool
		cleanup bool
		force   bool
		state   cleanupState
	)
	cmd := &cobra.Command{
		Use:           "l4lbd",
		Short:         "l4lb load-balancer daemon",
		Version:       daemon.Version,
		SilenceUsage:  true,
		SilenceErrors: true,
		Args:          cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			opts := config.Options{Dev: dev}
			if cleanup {
				state.config = path
				state.configSet = cmd.Flags().Changed("config")
				return runCleanup(cmd.OutOrStdout(), cmd.ErrOrStderr(), state, force)
			}
			if force {
				return errors.New("--force only applies to --cleanup")
			}
			if state.bpffs != "" || state.socket != "" {
				return errors.New("--bpffs and --admin-socket only apply to --cleanup; l4lbd takes them from daemon.bpffs and daemon.admin_socket in --config")
			}
			opts.Host = daemon.HostFacts()
			parser := config.NewParser()
			cfg, err := parser.Load(path, opts)
			if err != nil {
				return err
			}
			log := newLogger(cfg.Daemon.LogLevel)
			d, err := daemon.New(daemon.Options{ConfigPath: path, Config: opts, Log: log, Initial: cfg, Parser: parser})
			if err != nil {
				return err
			}
			ctx := stopOnSignal(log, "l4lbd stopping; the datapath stays attached and keeps forwarding (pinned under "+cfg.Daemon.BPFFS+")")
			go reloadOnHUP(ctx, d)
			err = d.Run(ctx)
			if err == nil {
				log.Info("l4lbd stopped")
			}
			return err
		},
	}
	cmd.Flags().StringVarP(&path, "config", "c", "/etc/l4lb/l4lb.toml", "configuration file")
	cmd.Flags().BoolVar(&dev, "dev", false, "allow a config without maglev.hash_seed (demos and tests on one box only)")
	cmd.Flags().BoolVar(&cleanup, "cleanup", false, "detach the datapath, remove the pins l4lbd made (by name; nothing else under daemon.bpffs), managed neighbours, the admin socket and the runtime overrides, print what was and was not removed, then exit; refused while l4lbd runs or when --config cannot be read")
	cmd.Flags().BoolVar(&force, "force", false, "with --cleanup: remove the datapath even while an l4lbd runs; it stops forwarding but keeps its admin socket, and says so")
	cmd.Flags().StringVar(&state.bpffs, "bpffs", "", "with --cleanup: the bpffs directory to clean instead of daemon.bpffs (needed when --config cannot be read)")
	cmd.Flags().StringVar(&state.socket, "admin-socket", "", "with --cleanup: the admin socket whose runtime files to remove instead of daemon.admin_socket (default with --bpffs and an unreadable config: /run/l4lb/l4lb.sock)")
	cmd.AddCommand(backendCmd(), clidoc.Command(cmd))
	return cmd
}

// cleanupState is where `l4lbd --cleanup` finds the state to remove: the
// config file, or locations the operator names on the command line.
type cleanupState struct {
	config    string
	configSet bool
	bpffs     string
	socket    string
}

// runCleanup is `l4lbd --cleanup`. It cleans exactly the state the config
// names, or the state named by --bpffs / --admin-socket: with a config that
// cannot be read it refuses rather than guess, since the default location
// may belong to another l4lbd (or to nothing). It prints what it removed,
// what it could not remove and what it left because it is not l4lbd's.
func runCleanup(out, errOut io.Writer, st cleanupState, force bool) error {
	// The seed plays no part in a cleanup: a config without one (the
	// shipped one) still names the state.
	cfg, err := config.Load(st.config, config.Options{Dev: true})
	switch {
	case err != nil && st.bpffs == "":
		return fmt.Errorf("refusing to clean up: cannot read %s to find l4lbd's state: %w; "+
			"fix the file, or name the state to remove: l4lbd --cleanup --bpffs DIR [--admin-socket PATH] (l4lb's defaults: --bpffs %s --admin-socket %s)",
			st.config, err, config.Default().Daemon.BPFFS, config.Default().Daemon.AdminSocket)
	case err != nil:
		if st.configSet {
			fmt.Fprintf(errOut, "l4lbd: %s cannot be read (%v); cleaning the state named on the command line\n", st.config, err)
		}
		cfg = config.Default()
	}
	for _, f := range []struct{ flag, v string }{{"--bpffs", st.bpffs}, {"--admin-socket", st.socket}} {
		if f.v != "" && !filepath.IsAbs(f.v) {
			return fmt.Errorf("%s %q is not an absolute path", f.flag, f.v)
		}
	}
	if st.bpffs != "" {
		cfg.Daemon.BPFFS = filepath.Clean(st.bpffs)
	}
	if st.socket != "" {
		cfg.Daemon.AdminSocket = filepath.Clean(st.socket)
	}
	c, err := daemon.Cleanup(cfg, force)
	dir := cfg.Daemon.BPFFS
	for _, l := range c.Links {
		fmt.Fprintf(out, "detached %s program from %s\n", l.Hook, l.Interface)
	}
	if len(c.Pins) > 0 {
		fmt.Fprintf(out, "removed %d pinned maps under %s: %s\n", len(c.Pins), dir, strings.Join(c.Pins, " "))
	}
	if c.Tables > 0 {
		fmt.Fprintf(out, "removed %d pinned Maglev tables under %s\n", c.Tables, filepath.Join(dir, "maglev_tables"))
	}
	for _, n := range c.Neighbours {
		fmt.Fprintf(out, "deleted managed neighbour %s\n", n)
	}
	for _, f := range c.Files {
		fmt.Fprintf(out, "removed %s\n", f)
	}
	if c.DirRemoved && !c.Empty() {
		fmt.Fprintf(out, "removed directory %s\n", dir)
	}
	if c.Empty() && len(c.Files) == 0 && err == nil {
		fmt.Fprintf(out, "nothing to clean up under %s\n", dir)
	}
	for _, f := range c.Failed {
		fmt.Fprintf(out, "NOT removed: %s\n", f)
	}
	if len(c.Foreign) > 0 {
		fmt.Fprintf(out, "left under %s, not made by l4lbd: %s\n", dir, strings.Join(c.Foreign, " "))
	}
	for _, l := range c.Left {
		if len(c.Links) == 0 {
			break // nothing was attached, so nothing was turned on
		}
		fmt.Fprintf(out, "left: %s\n", l)
	}
	if c.Forced != nil {
		fmt.Fprintf(errOut, "WARNING: %v and now has no datapath: it forwards nothing. "+
			"Its admin socket and runtime files were kept (%s) so that l4lbctl still reaches it; "+
			"stop it (systemctl stop l4lb) or restart it (systemctl restart l4lb) to attach a datapath again\n",
			c.Forced, strings.Join(c.Kept, ", "))
	}
	return err
}

func newLogger(level slog.Level) *slog.Logger {
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
}

func reloadOnHUP(ctx context.Context, d *daemon.Daemon) {
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	for {
		select {
		case <-ctx.Done():
			return
		case <-hup:
			// A rejection is logged once, by the reload itself.
			_ = d.Reload(ctx)
		}
	}
}

// stopOnSignal returns a context that ends at the first SIGTERM or SIGINT,
// having logged which signal came and what stopping means (msg): a stop is
// in the log, whoever sent it. A second signal stops the process at once,
// as Go does without a handler.
func stopOnSignal(log *slog.Logger, msg string) context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	go func() {
		s := <-sig
		log.Info(msg, "signal", s.String())
		signal.Reset(syscall.SIGTERM, syscall.SIGINT)
		cancel()
	}()
	return ctx
}

func backendCmd() *cobra.Command {
	var (
		iface    string
		vips     []string
		pin      string
		maxFlows uint32
	)
	cmd := &cobra.Command{
		Use:   "backend",
		Short: "run the DSR backend companion on a backend host",
		Long: `Attaches the backend companion at tc ingress and egress of --interface.
For DSR dispatch ipip and geneve it removes the IPIP / IPv6-in-IPv6 or Geneve
headers of packets whose inner destination is one of the --vip addresses, so
the host needs no tunnel module; bind the VIPs on lo. For dispatch opt it
records the VIP:port named by the option of a flow's SYN (TCP) or datagrams
(UDP), up to --max-flows flows, and gives the replies that VIP:port as their
source; no VIP on lo is needed, and the replies must leave through
--interface. Runs in the foreground; SIGTERM detaches it.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			log := newLogger(slog.LevelInfo)
			var addrs []netip.Addr
			for _, v := range vips {
				a, err := netip.ParseAddr(v)
				if err != nil {
					return fmt.Errorf("--vip %q: %w", v, err)
				}
				addrs = append(addrs, a)
			}
			if len(addrs) == 0 {
				return errors.New("at least one --vip is needed")
			}
			if maxFlows == 0 {
				return errors.New("--max-flows must be at least 1")
			}
			if err := datapath.CheckCapabilities("l4lbd backend"); err != nil {
				return err
			}
			// Nothing is loaded or pinned before the locks are held.
			lock, err := runlock.LockCompanion(pin)
			if err != nil {
				return err
			}
			defer lock.Release()
			c, err := datapath.LoadCompanion(datapath.CompanionConfig{PinPath: pin, MaxFlows: maxFlows, Log: log})
			if err != nil {
				return err
			}
			defer c.Close()
			if err := c.SetVIPs(addrs); err != nil {
				return err
			}
			if err := c.Attach(iface); err != nil {
				return err
			}
			ctx := stopOnSignal(log, "backend companion stopping; it detaches and removes its pins")
			log.Info("backend companion running", "interface", iface, "vips", vips)
			<-ctx.Done()
			return nil
		},
	}
	cmd.Flags().StringVarP(&iface, "interface", "i", "", "interface that receives DSR traffic (required)")
	cmd.Flags().StringArrayVar(&vips, "vip", nil, "a VIP served on this host (repeatable)")
	cmd.Flags().StringVar(&pin, "bpffs", "/sys/fs/bpf/l4lb-backend", "bpffs directory for the companion's maps")
	cmd.Flags().Uint32Var(&maxFlows, "max-flows", datapath.DefaultCompanionMaxFlows,
		"capacity of the opt flow table (LRU): a TCP connection whose entry is evicted loses its reply path")
	_ = cmd.MarkFlagRequired("interface")
	return cmd
}
