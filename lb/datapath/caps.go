// SPDX-License-Identifier: Apache-2.0

package datapath

import (
	"bufio"
	"fmt"
	"os"
	"strconv"
	"strings"
)

// Capabilities the datapath needs (linux/capability.h numbers).
const (
	capNetAdmin = 12
	capSysAdmin = 21
	capBPF      = 39
)

// CheckCapabilities says which capabilities the calling thread lacks to
// load the datapath (CAP_BPF, or CAP_SYS_ADMIN which includes it) and to
// attach it to interfaces (CAP_NET_ADMIN), before anything is tried: the
// kernel answers a missing one with EPERM, which the BPF library reports
// as "MEMLOCK may be too low", a limit l4lb does not hit on kernels that
// charge maps to the memory cgroup.
func CheckCapabilities(what string) error {
	eff, err := effectiveCaps()
	if err != nil {
		return nil // unknown: let the kernel answer
	}
	if missing := missingCaps(eff); len(missing) > 0 {
		return fmt.Errorf("%s lacks %s (effective capabilities %#x): it loads BPF programs and maps (CAP_BPF) and attaches them to interfaces (CAP_NET_ADMIN); run it as root, or as systemd/l4lb.service does (AmbientCapabilities=CAP_BPF CAP_NET_ADMIN CAP_PERFMON)",
			what, strings.Join(missing, " and "), eff)
	}
	return nil
}

// missingCaps names the capabilities the effective set eff lacks.
func missingCaps(eff uint64) []string {
	has := func(c uint) bool { return eff&(1<<c) != 0 }
	var out []string
	if !has(capBPF) && !has(capSysAdmin) {
		out = append(out, "CAP_BPF")
	}
	if !has(capNetAdmin) {
		out = append(out, "CAP_NET_ADMIN")
	}
	return out
}

// effectiveCaps reads the calling thread's effective capability set
// (CapEff of /proc/thread-self/status: capabilities are per thread).
func effectiveCaps() (uint64, error) {
	f, err := os.Open("/proc/thread-self/status")
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "CapEff:"); ok {
			return strconv.ParseUint(strings.TrimSpace(v), 16, 64)
		}
	}
	return 0, fmt.Errorf("no CapEff in /proc/thread-self/status")
}
