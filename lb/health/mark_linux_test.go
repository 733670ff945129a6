// SPDX-License-Identifier: Apache-2.0

package health

import (
	"net"
	"net/netip"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"testing"
)

// withoutNetAdmin marks the copy of the test binary that runs without
// CAP_NET_ADMIN.
const withoutNetAdmin = "L4LB_TEST_WITHOUT_NET_ADMIN"

// TestMark checks that every kind of probe socket carries the target's mark
// from before it connects. Setting SO_MARK needs CAP_NET_ADMIN.
func TestMark(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("setting SO_MARK needs CAP_NET_ADMIN: run as root to check probe marks")
	}
	tcp := newTCPServer(t)
	web := newHTTPServer(t)
	echo := newUDPServer(t, "", false)

	var mu sync.Mutex
	var marks []int
	probeConn = func(network string, c net.Conn) {
		sc, ok := c.(syscall.Conn)
		if !ok {
			t.Errorf("%s probe connection %T has no socket", network, c)
			return
		}
		raw, err := sc.SyscallConn()
		if err != nil {
			t.Error(err)
			return
		}
		var mark int
		var serr error
		if err := raw.Control(func(fd uintptr) {
			mark, serr = syscall.GetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_MARK)
		}); err != nil || serr != nil {
			t.Errorf("read SO_MARK of the %s probe: %v %v", network, err, serr)
			return
		}
		mu.Lock()
		marks = append(marks, mark)
		mu.Unlock()
	}
	t.Cleanup(func() { probeConn = nil })

	tests := []struct {
		name    string
		checker Checker
		addr    netip.AddrPort
	}{
		{"tcp", TCP{}, tcp.addr},
		{"http", HTTP{}, web.addr},
		{"udp", UDP{Send: "x", Expect: "x"}, echo.addr},
	}
	for _, tt := range tests {
		for _, mark := range []uint32{0, 0x4c420007, 0xffffffff} {
			mu.Lock()
			marks = nil
			mu.Unlock()
			if err := tt.checker.Check(probeCtx(t, patience), Target{Addr: tt.addr, Mark: mark}); err != nil {
				t.Fatalf("%s probe with mark %#x: %v", tt.name, mark, err)
			}
			mu.Lock()
			got := marks
			mu.Unlock()
			if len(got) != 1 || uint32(got[0]) != mark {
				t.Errorf("%s probe with mark %#x: sockets carried marks %#x", tt.name, mark, got)
			}
		}
	}
}

// TestMarkNeedsPrivilege checks the error of an unprivileged l4lbd that is
// asked to mark its probes.
func TestMarkNeedsPrivilege(t *testing.T) {
	if os.Geteuid() == 0 && os.Getenv(withoutNetAdmin) == "" {
		// As root the check runs in a copy of this test binary whose
		// capabilities lack CAP_NET_ADMIN and CAP_NET_RAW, either of which lets
		// a socket set SO_MARK.
		cmd := exec.Command("setpriv", "--inh-caps=-net_admin,-net_raw", "--bounding-set=-net_admin,-net_raw", "--",
			os.Args[0], "-test.run=^TestMarkNeedsPrivilege$", "-test.count=1")
		cmd.Env = append(os.Environ(), withoutNetAdmin+"=1")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("without CAP_NET_ADMIN: %v\n%s", err, out)
		}
		return
	}
	srv := newTCPServer(t)
	err := TCP{}.Check(probeCtx(t, patience), Target{Addr: srv.addr, Mark: 7})
	checkErr(t, err, "needs CAP_NET_ADMIN")
}
