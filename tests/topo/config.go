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
	// Services are written with their own mode and dispatch when set, and
	// with every backend's port (so port translation is explicit). A
	// backend's Weight of 0 is written as the default weight: the zero
	// value of lb.Backend should mean "a plain backend" here.
	Services []lb.Service
}

// TOML renders the config. Small map sizes keep the daemon's start fast.
func (c LBConfig) TOML() string {
	var b strings.Builder
	b.WriteString(`
[daemon]
admin_socket   = "{{socket}}"
metrics_listen = []
bpffs          = "{{bpffs}}"
log_level      = "debug"

[datapath]
interfaces    = ["eth0"]
conntrack_max = 65536
snat_max      = 65536
max_services  = 64
max_backends  = 256
`)
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
		for _, be := range s.Backends {
			fmt.Fprintf(&b, "[[service.backend]]\naddress = %q\nport = %d\n", be.Addr.Addr(), be.Addr.Port())
			if be.Weight > lb.DefaultWeight {
				fmt.Fprintf(&b, "weight = %d\n", be.Weight)
			}
		}
	}
	return b.String()
}
