// SPDX-License-Identifier: Apache-2.0

package topo

import (
	"fmt"
	"strings"

	"github.com/l4lb/l4lb/lb"
)

// LBConfig describes an l4lbd config for a box of the topology in terms of
// the service model, so a test states what it serves (mode, dispatch,
// backends) and this renders the TOML the daemon reads. The admin socket
// and bpffs are left as {{socket}} and {{bpffs}} for StartL4LBD.
type LBConfig struct {
	// Attach is "xdp" or "tc"; empty leaves the daemon's default.
	Attach string
	// Mode and Dispatch are the daemon-wide defaults; the zero values
	// leave the daemon's own.
	Mode     lb.Mode
	Dispatch lb.Dispatch
	// Seed is maglev.hash_seed, the same on every box of a test.
	Seed string
	// TableSize is maglev.table_size; 0 leaves the daemon's default.
	TableSize uint32
	// SNATPortRange is datapath.snat_port_range ("lo-hi"); empty leaves
	// the default.
	SNATPortRange string
	// Capacities (datapath.max_services, max_backends, conntrack_max,
	// snat_max); zero keeps the small sizes that make the daemon's start
	// fast: 64 services, 256 backends, 65536 flows.
	MaxServices, MaxBackends, ConntrackMax, SNATMax uint32
	// LogLevel is daemon.log_level; empty means debug.
	LogLevel string
	// Services are written with their own mode, dispatch and table size
	// when set, and with every backend's port (so port translation is
	// explicit) and state. A backend's Weight of 0 is written as the
	// default weight: the zero value of lb.Backend should mean "a plain
	// backend" here.
	Services []lb.Service
}

func orDefault(v, def uint32) uint32 {
	if v == 0 {
		return def
	}
	return v
}

// TOML renders the config.
func (c LBConfig) TOML() string {
	var b strings.Builder
	level := c.LogLevel
	if level == "" {
		level = "debug"
	}
	fmt.Fprintf(&b, `
[daemon]
admin_socket   = "{{socket}}"
metrics_listen = []
bpffs          = "{{bpffs}}"
log_level      = %q

[datapath]
interfaces    = ["eth0"]
conntrack_max = %d
snat_max      = %d
max_services  = %d
max_backends  = %d
`, level, orDefault(c.ConntrackMax, 65536), orDefault(c.SNATMax, 65536), orDefault(c.MaxServices, 64), orDefault(c.MaxBackends, 256))
	if c.Attach != "" {
		fmt.Fprintf(&b, "attach = %q\n", c.Attach)
	}
	if c.Mode != lb.ModeDefault {
		fmt.Fprintf(&b, "mode = %q\n", c.Mode)
	}
	if c.Dispatch != lb.DispatchDefault {
		fmt.Fprintf(&b, "dsr_dispatch = %q\n", c.Dispatch)
	}
	if c.SNATPortRange != "" {
		fmt.Fprintf(&b, "snat_port_range = %q\n", c.SNATPortRange)
	}
	fmt.Fprintf(&b, "\n[maglev]\nhash_seed = %q\n", c.Seed)
	if c.TableSize != 0 {
		fmt.Fprintf(&b, "table_size = %d\n", c.TableSize)
	}
	for _, s := range c.Services {
		fmt.Fprintf(&b, "\n[[service]]\nname = %q\nvip = %q\nport = %d\nprotocol = %q\n",
			s.Name, s.Frontend.Addr, s.Frontend.Port, s.Frontend.Proto)
		if s.Mode != lb.ModeDefault {
			fmt.Fprintf(&b, "mode = %q\n", s.Mode)
		}
		if s.Dispatch != lb.DispatchDefault {
			fmt.Fprintf(&b, "dsr_dispatch = %q\n", s.Dispatch)
		}
		if s.TableSize != 0 {
			fmt.Fprintf(&b, "table_size = %d\n", s.TableSize)
		}
		for _, be := range s.Backends {
			fmt.Fprintf(&b, "[[service.backend]]\naddress = %q\nport = %d\n", be.Addr.Addr(), be.Addr.Port())
			if be.Weight > lb.DefaultWeight {
				fmt.Fprintf(&b, "weight = %d\n", be.Weight)
			}
			if be.State != lb.Active {
				fmt.Fprintf(&b, "state = %q\n", be.State)
			}
		}
	}
	return b.String()
}
