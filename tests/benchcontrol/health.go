// SPDX-License-Identifier: Apache-2.0

package main

import (
	"bufio"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"time"

	"github.com/l4lb/l4lb/internal/testnet"
	"github.com/l4lb/l4lb/tests/topo"
)

// The health-checked service: one service, "hc", besides the n of the
// file, whose backends are TCP listeners of the bench process in the
// topology's backend host. Only it is checked: the others have no
// [service.health], as a file's services without checks.
const (
	hcName  = "hc"
	hcPort0 = 7001
)

var hcVIP = netip.MustParseAddr("10.199.0.1")

// hcConfig is the hc service's block: a TCP check every 200 ms, one probe
// to go down or up (rise = fall = 1), so that a flip costs the bench
// little wall time. The interval does not enter the timed figure, which
// starts at the health manager's own state change.
func hcConfig(be netip.Addr, b int) string {
	var s strings.Builder
	fmt.Fprintf(&s, "\n[[service]]\nname = %q\nvip = %q\nport = %d\nprotocol = \"tcp\"\n[service.health]\ntype = \"tcp\"\ninterval = \"200ms\"\ntimeout = \"100ms\"\nrise = 1\nfall = 1\n",
		hcName, hcVIP, servicePort)
	for j := range b {
		fmt.Fprintf(&s, "[[service.backend]]\naddress = %q\nport = %d\n", be, hcPort0+j)
	}
	return s.String()
}

// hcBackends are the listeners behind hc's backends, opened in host h's
// namespace by the bench process.
type hcBackends struct {
	t     testnet.TB
	h     *topo.Host
	addrs []netip.AddrPort
	ls    []net.Listener // nil while the backend is down
}

func listenBackends(t testnet.TB, h *topo.Host, b int) *hcBackends {
	hb := &hcBackends{t: t, h: h, ls: make([]net.Listener, b)}
	for j := range b {
		hb.addrs = append(hb.addrs, netip.AddrPortFrom(h.Addr4, uint16(hcPort0+j)))
		hb.open(j)
	}
	t.Cleanup(func() {
		for j := range hb.ls {
			hb.close(j)
		}
	})
	return hb
}

func (hb *hcBackends) open(j int) {
	err := hb.h.NS.Do(func() error {
		l, err := net.Listen("tcp4", hb.addrs[j].String())
		hb.ls[j] = l
		return err
	})
	if err != nil {
		hb.t.Fatalf("listen on %s: %v", hb.addrs[j], err)
	}
	go func(l net.Listener) {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}(hb.ls[j])
}

func (hb *hcBackends) close(j int) {
	if hb.ls[j] != nil {
		hb.ls[j].Close()
		hb.ls[j] = nil
	}
}

// up lists the backends whose listeners are open.
func (hb *hcBackends) up() []netip.AddrPort {
	var out []netip.AddrPort
	for j, l := range hb.ls {
		if l != nil {
			out = append(out, hb.addrs[j])
		}
	}
	return out
}

// logTimeLayout is log/slog's TextHandler time format (milliseconds).
const logTimeLayout = "2006-01-02T15:04:05.000Z07:00"

// stateChangeAt finds, in l4lbd's log after offset from, the health
// manager's line saying that backend went down or came up ("backend down"
// / "backend up"), and returns its time. The time has millisecond
// resolution and is truncated, so an interval from it is at most 1 ms too
// long.
func stateChangeAt(log string, from int, backend netip.AddrPort, down bool) (time.Time, bool) {
	msg := `msg="backend up"`
	if down {
		msg = `msg="backend down"`
	}
	sc := bufio.NewScanner(strings.NewReader(log[from:]))
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.Contains(line, msg) || !strings.Contains(line, " backend="+backend.String()+" ") {
			continue
		}
		v, ok := strings.CutPrefix(line, "time=")
		if !ok {
			continue
		}
		v, _, _ = strings.Cut(v, " ")
		at, err := time.Parse(logTimeLayout, v)
		if err != nil {
			continue
		}
		return at, true
	}
	return time.Time{}, false
}
