// SPDX-License-Identifier: Apache-2.0

package datapath

import (
	"runtime"
	"slices"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/l4lb/l4lb/internal/testnet"
)

func TestMissingCaps(t *testing.T) {
	all := uint64(1<<capBPF | 1<<capNetAdmin)
	for _, tt := range []struct {
		eff  uint64
		want []string
	}{
		{all, nil},
		{1<<capSysAdmin | 1<<capNetAdmin, nil},
		{1 << capNetAdmin, []string{"CAP_BPF"}},
		{1 << capBPF, []string{"CAP_NET_ADMIN"}},
		{0, []string{"CAP_BPF", "CAP_NET_ADMIN"}},
	} {
		if got := missingCaps(tt.eff); !slices.Equal(got, tt.want) {
			t.Errorf("missingCaps(%#x) = %v, want %v", tt.eff, got, tt.want)
		}
	}
}

// TestCheckCapabilitiesDropped: a thread that dropped CAP_BPF,
// CAP_SYS_ADMIN and CAP_NET_ADMIN is told so by name, not by the EPERM of
// the first map it would create.
func TestCheckCapabilitiesDropped(t *testing.T) {
	testnet.RequireRoot(t)
	if err := CheckCapabilities("l4lbd"); err != nil {
		t.Fatalf("as root: %v", err)
	}
	errc := make(chan error, 1)
	go func() {
		// The thread keeps its reduced set and is discarded with
		// the goroutine (never unlocked).
		runtime.LockOSThread()
		hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
		var data [2]unix.CapUserData
		if err := unix.Capget(&hdr, &data[0]); err != nil {
			errc <- err
			return
		}
		for _, c := range []uint{capBPF, capSysAdmin, capNetAdmin} {
			data[c/32].Effective &^= 1 << (c % 32)
		}
		if err := unix.Capset(&hdr, &data[0]); err != nil {
			errc <- err
			return
		}
		errc <- CheckCapabilities("l4lbd")
	}()
	err := <-errc
	if err == nil || !strings.Contains(err.Error(), "l4lbd lacks CAP_BPF and CAP_NET_ADMIN") || strings.Contains(err.Error(), "MEMLOCK") {
		t.Fatalf("without the capabilities: %v", err)
	}
}
