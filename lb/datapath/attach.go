// SPDX-License-Identifier: Apache-2.0

package datapath

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink/nl"
)

// XDPMode selects how the program is attached to a driver.
type XDPMode int

// XDP attach modes.
const (
	// XDPAuto tries native mode and falls back to generic with a warning.
	XDPAuto XDPMode = iota
	// XDPNative requires driver support.
	XDPNative
	// XDPGeneric runs in the stack's generic hook on any device (slower).
	XDPGeneric
)

// String returns the config name of the mode.
func (m XDPMode) String() string {
	switch m {
	case XDPNative:
		return "native"
	case XDPGeneric:
		return "generic"
	}
	return "auto"
}

func (d *LB) linkPin(iface string) string {
	return filepath.Join(d.cfg.PinPath, linkDir, "xdp-"+iface)
}

func (d *LB) tcLinkPin(iface string) string {
	return filepath.Join(d.cfg.PinPath, linkDir, "tcx-"+iface)
}

// AttachXDP attaches the LB program to iface and lets it transmit there.
// When a link pinned by an earlier l4lbd is found for the interface, its
// program is replaced in one step (no detach, no packet goes unhandled).
// The interface's IPv4/IPv6 forwarding is switched on: bpf_fib_lookup
// refuses to route for an interface that does not forward.
func (d *LB) AttachXDP(iface string, mode XDPMode) error {
	ifc, err := net.InterfaceByName(iface)
	if err != nil {
		return fmt.Errorf("attach to %s: %w", iface, err)
	}
	if err := enableForwarding(iface); err != nil {
		return err
	}
	// Before the program runs there: without its MAC it forwards nothing.
	if err := d.LearnInterface(iface); err != nil {
		return fmt.Errorf("attach to %s: %w", iface, err)
	}
	d.mu.Lock()
	defer d.mu.Unlock()

	if l, ok := d.adoptLink(iface, ifc.Index); ok {
		if err := l.Update(d.prog); err != nil {
			l.Close()
			return fmt.Errorf("replace program on %s: %w", iface, err)
		}
		d.links[iface] = l
		d.log.Info("replaced XDP program in place", "interface", iface)
	} else {
		l, err := d.attachNew(iface, ifc.Index, mode)
		if err != nil {
			return err
		}
		d.links[iface] = l
	}
	idx := uint32(ifc.Index)
	if err := d.txPorts.add(idx); err != nil {
		return fmt.Errorf("allow transmit on %s: %w", iface, err)
	}
	return nil
}

// adoptLink loads the link pinned for iface if it is an XDP link on the
// same interface index; a stale pin (interface re-created) is removed.
func (d *LB) adoptLink(iface string, index int) (link.Link, bool) {
	return d.adopt(d.linkPin(iface), iface, func(info *link.Info) bool {
		x := info.XDP()
		return info.Type == link.XDPType && x != nil && int(x.Ifindex) == index
	})
}

// adopt loads the link pinned at path if match accepts it, and removes a
// pin that no longer fits (interface re-created, other hook).
func (d *LB) adopt(path, iface string, match func(*link.Info) bool) (link.Link, bool) {
	if d.cfg.PinPath == "" {
		return nil, false
	}
	l, err := link.LoadPinnedLink(path, nil)
	if err != nil {
		return nil, false
	}
	if info, err := l.Info(); err == nil && match(info) {
		return l, true
	}
	d.log.Warn("removing a stale pinned link", "interface", iface, "pin", path)
	_ = l.Unpin()
	l.Close()
	return nil, false
}

// AttachTC attaches the LB program at tc ingress (tcx) of iface, for
// interfaces where XDP cannot attach (bonds, VLAN devices, some drivers).
// A link pinned by an earlier l4lbd gets its program replaced in place.
func (d *LB) AttachTC(iface string) error {
	ifc, err := net.InterfaceByName(iface)
	if err != nil {
		return fmt.Errorf("attach to %s: %w", iface, err)
	}
	if err := enableForwarding(iface); err != nil {
		return err
	}
	if err := d.LearnInterface(iface); err != nil {
		return fmt.Errorf("attach to %s: %w", iface, err)
	}
	return d.attachTCX("tc program", "tc:"+iface, d.tcLinkPin(iface), d.progTC, ebpf.AttachTCXIngress, iface, ifc.Index)
}

// attachTCX attaches prog to a tcx hook of an interface, or replaces the
// program of the link an earlier l4lbd pinned there (no moment without a
// program), and pins a new link.
func (d *LB) attachTCX(what, key, pin string, prog *ebpf.Program, at ebpf.AttachType, iface string, index int) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if l, ok := d.adopt(pin, iface, func(info *link.Info) bool {
		x := info.TCX()
		return info.Type == link.TCXType && x != nil && int(x.Ifindex) == index
	}); ok {
		if err := l.Update(prog); err != nil {
			l.Close()
			return fmt.Errorf("replace %s on %s: %w", what, iface, err)
		}
		d.links[key] = l
		d.log.Info("replaced "+what+" in place", "interface", iface)
		return nil
	}
	l, err := link.AttachTCX(link.TCXOptions{Program: prog, Attach: at, Interface: index})
	if err != nil {
		return fmt.Errorf("attach %s (%s) to %s: %w", what, at, iface, err)
	}
	if d.cfg.PinPath != "" {
		if err := l.Pin(pin); err != nil {
			l.Close()
			return fmt.Errorf("pin the %s link of %s: %w", what, iface, err)
		}
	}
	d.links[key] = l
	d.log.Info("attached "+what, "interface", iface)
	return nil
}

func (d *LB) hcLinkPin(iface string) string {
	return filepath.Join(d.cfg.PinPath, linkDir, "hc-"+iface)
}

// AttachHealth attaches the health-probe program at tc egress (tcx) of
// iface: probes to a VIP marked with HealthMarkFor(backend) leave
// dispatched to that backend, as clients' packets are. Attach it to every
// interface the route to the VIPs may take.
func (d *LB) AttachHealth(iface string) error {
	ifc, err := net.InterfaceByName(iface)
	if err != nil {
		return fmt.Errorf("attach health probes to %s: %w", iface, err)
	}
	return d.attachTCX("health-probe program", "hc:"+iface, d.hcLinkPin(iface), d.progHC, ebpf.AttachTCXEgress, iface, ifc.Index)
}

// DetachHealth removes the health-probe program from iface.
func (d *LB) DetachHealth(iface string) error {
	return d.detach("hc:"+iface, d.hcLinkPin(iface), iface)
}

// DetachTC removes the tc program from iface and forgets its pin.
func (d *LB) DetachTC(iface string) error {
	return errors.Join(d.detach("tc:"+iface, d.tcLinkPin(iface), iface), d.forgetUnattached(iface))
}

func (d *LB) attachNew(iface string, index int, mode XDPMode) (link.Link, error) {
	try := func(flags link.XDPAttachFlags) (link.Link, error) {
		return link.AttachXDP(link.XDPOptions{Program: d.prog, Interface: index, Flags: flags})
	}
	var (
		l   link.Link
		err error
	)
	switch mode {
	case XDPNative:
		l, err = try(link.XDPDriverMode)
	case XDPGeneric:
		l, err = try(link.XDPGenericMode)
	default:
		l, err = try(link.XDPDriverMode)
		if err != nil {
			d.log.Warn("native XDP failed, falling back to generic XDP (slower)", "interface", iface, "error", err)
			l, err = try(link.XDPGenericMode)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("attach XDP (%s) to %s: %w; another XDP program may be attached, or use attach = \"tc\"", mode, iface, err)
	}
	if d.cfg.PinPath != "" {
		if err := l.Pin(d.linkPin(iface)); err != nil {
			l.Close()
			return nil, fmt.Errorf("pin XDP link of %s: %w", iface, err)
		}
	}
	d.log.Info("attached XDP program", "interface", iface, "mode", mode)
	return l, nil
}

// DetachXDP removes the program from iface and forgets its pin.
func (d *LB) DetachXDP(iface string) error {
	err := errors.Join(d.detach(iface, d.linkPin(iface), iface), d.forgetUnattached(iface))
	if ifc, ierr := net.InterfaceByName(iface); ierr == nil {
		idx := uint32(ifc.Index)
		d.txPorts.remove(idx)
	}
	return err
}

// forgetUnattached forgets what LearnInterface recorded for iface unless
// an LB program still runs there (a switch from one hook to the other
// attaches the new before it detaches the old).
func (d *LB) forgetUnattached(iface string) error {
	d.mu.Lock()
	_, xdp := d.links[iface]
	_, tc := d.links["tc:"+iface]
	d.mu.Unlock()
	if xdp || tc {
		return nil
	}
	return d.box.forgetInterface(iface)
}

func (d *LB) detach(key, pin, iface string) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	l, ok := d.links[key]
	if !ok {
		if d.cfg.PinPath == "" {
			return nil
		}
		var err error
		if l, err = link.LoadPinnedLink(pin, nil); err != nil {
			return nil
		}
	}
	delete(d.links, key)
	var errs []error
	if d.cfg.PinPath != "" {
		if err := l.Unpin(); err != nil {
			errs = append(errs, err)
		}
	}
	errs = append(errs, l.Close())
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("detach from %s: %w", iface, err)
	}
	return nil
}

// PinnedLink is a link an earlier l4lbd pinned.
type PinnedLink struct {
	Interface string
	Hook      string // "xdp", "tc" or "hc" (health probes)
}

// PinnedLinks lists the links pinned by an earlier l4lbd, so the daemon can
// detach those no longer configured.
func (d *LB) PinnedLinks() []PinnedLink {
	if d.cfg.PinPath == "" {
		return nil
	}
	var out []PinnedLink
	for _, hook := range []struct{ prefix, name string }{{"xdp-", "xdp"}, {"tcx-", "tc"}, {"hc-", "hc"}} {
		paths, _ := filepath.Glob(filepath.Join(d.cfg.PinPath, linkDir, hook.prefix+"*"))
		for _, p := range paths {
			out = append(out, PinnedLink{Interface: strings.TrimPrefix(filepath.Base(p), hook.prefix), Hook: hook.name})
		}
	}
	return out
}

// enableForwarding switches on IPv4 and IPv6 forwarding for iface.
//
// Two consumers need it. bpf_fib_lookup refuses to route for an interface
// whose own forwarding flag is off (IPv4 and IPv6 alike). And a packet the
// program hands to the stack because the next hop's MAC is unknown
// (pass_no_neigh) is forwarded by the stack itself: IPv4 honours the
// interface's flag, but IPv6 only forwards when conf/all/forwarding is on,
// or (Linux 6.17 and later) when the receiving interface has
// force_forwarding. Turning on conf/all would make every interface of the
// box a router (no more router advertisements accepted anywhere), so only
// force_forwarding is written; on older kernels, IPv6 packets that take
// that path are dropped by the stack unless the operator enables
// conf/all/forwarding.
func enableForwarding(iface string) error {
	for _, p := range []string{
		"/proc/sys/net/ipv4/conf/" + iface + "/forwarding",
		"/proc/sys/net/ipv6/conf/" + iface + "/forwarding",
		"/proc/sys/net/ipv6/conf/" + iface + "/force_forwarding",
	} {
		cur, err := os.ReadFile(p)
		if err != nil {
			if errors.Is(err, os.ErrNotExist) {
				continue // IPv6 disabled on this interface, or a kernel before 6.17
			}
			return fmt.Errorf("read %s: %w", p, err)
		}
		if strings.TrimSpace(string(cur)) == "1" {
			continue
		}
		if err := os.WriteFile(p, []byte("1"), 0o644); err != nil {
			return fmt.Errorf("enable forwarding (%s): %w", p, err)
		}
	}
	return nil
}

// Attachment is how the kernel holds the LB program on one interface, read
// back from it rather than taken from the configuration.
type Attachment struct {
	// Hook is "xdp", "tc" (tcx ingress) or "" when the LB program is on
	// neither.
	Hook string
	// Mode is the XDP attach mode the kernel reports ("native",
	// "generic" or "offload"); "tcx" for the tc hook.
	Mode string
	// Other is the id of a program that is not l4lb's but holds the
	// interface's XDP hook; 0 when none.
	Other uint32
}

// String is "xdp generic", "tc tcx", "not attached" or "not attached
// (XDP program N holds the hook)".
func (a Attachment) String() string {
	s := "not attached"
	if a.Hook != "" {
		s = a.Hook + " " + a.Mode
	}
	if a.Other != 0 {
		s += fmt.Sprintf(" (XDP program %d holds the hook)", a.Other)
	}
	return s
}

// xdpModeName names the kernel's IFLA_XDP_ATTACHED value.
func xdpModeName(mode uint32) string {
	switch mode {
	case nl.XDP_ATTACHED_DRV:
		return "native"
	case nl.XDP_ATTACHED_SKB:
		return "generic"
	case nl.XDP_ATTACHED_HW:
		return "offload"
	case nl.XDP_ATTACHED_HW + 1: // XDP_ATTACHED_MULTI: programs in several modes
		return "multi"
	}
	return fmt.Sprintf("mode %d", mode)
}

// Attached reads from the kernel where the LB program runs on iface: the
// interface's XDP program and attach mode (netlink link info), and its tcx
// ingress programs.
func (d *LB) Attached(iface string) (Attachment, error) {
	h, err := netlinkIn(d.cfg.Netns)
	if err != nil {
		return Attachment{}, fmt.Errorf("netlink handle: %w", err)
	}
	defer h.Close()
	l, err := h.LinkByName(iface)
	if err != nil {
		return Attachment{}, fmt.Errorf("read link %s: %w", iface, err)
	}
	var a Attachment
	if x := l.Attrs().Xdp; x != nil && x.Attached {
		if id, ok := programID(d.prog); ok && x.ProgId == id {
			return Attachment{Hook: "xdp", Mode: xdpModeName(x.AttachMode)}, nil
		}
		a.Other = x.ProgId
	}
	res, err := link.QueryPrograms(link.QueryOptions{Target: l.Attrs().Index, Attach: ebpf.AttachTCXIngress})
	if err != nil && !errors.Is(err, ebpf.ErrNotSupported) {
		return a, fmt.Errorf("query tcx programs of %s: %w", iface, err)
	}
	if id, ok := programID(d.progTC); ok && res != nil {
		for _, p := range res.Programs {
			if uint32(p.ID) == id {
				a.Hook, a.Mode = "tc", "tcx"
			}
		}
	}
	return a, nil
}

func programID(p *ebpf.Program) (uint32, bool) {
	info, err := p.Info()
	if err != nil {
		return 0, false
	}
	id, ok := info.ID()
	return uint32(id), ok
}
