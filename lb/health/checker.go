// SPDX-License-Identifier: Apache-2.0

package health

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"syscall"
	"time"

	"github.com/l4lb/l4lb/lb"
)

// Checker runs one probe against a backend.
type Checker interface {
	// Check probes target once and returns nil when the backend is healthy,
	// or an error saying what failed. It must return soon after ctx ends:
	// the Manager bounds every probe by the check's timeout through ctx and
	// cancels it when the prober stops.
	Check(ctx context.Context, target Target) error
}

// NewChecker returns the Checker for a service's health check settings.
func NewChecker(hc lb.HealthCheck) (Checker, error) {
	switch hc.Type {
	case lb.HealthNone:
		return None{}, nil
	case lb.HealthTCP:
		return TCP{}, nil
	case lb.HealthHTTP:
		return HTTP{Path: hc.Path, ExpectStatus: hc.ExpectStatus}, nil
	case lb.HealthUDP:
		return UDP{Send: hc.Send, Expect: hc.Expect}, nil
	}
	return nil, fmt.Errorf("health check type %s is not known to this l4lbd: use tcp, http, udp or none", hc.Type)
}

// None is the check of a service that is not checked: it always succeeds.
type None struct{}

// Check succeeds without touching the network.
func (None) Check(context.Context, Target) error { return nil }

// TCP checks that the target accepts a TCP connection, then closes it.
type TCP struct{}

// Check connects to target and closes the connection.
func (TCP) Check(ctx context.Context, t Target) error {
	c, err := dial(ctx, "tcp", t)
	if err != nil {
		return fmt.Errorf("tcp check: %w", err)
	}
	_ = c.Close()
	return nil
}

// HTTP checks that a GET of Path on the target answers ExpectStatus.
// Redirects are not followed (a 301 is the answer compared), and every probe
// uses a connection of its own, so that an idle kept-alive connection cannot
// hide a backend that stopped accepting new ones.
type HTTP struct {
	// Path is the request target, with its query if any ("" means "/").
	Path string
	// ExpectStatus is the status a healthy backend answers (0 means 200).
	ExpectStatus int
}

// httpBodyLimit bounds how much of a response body a probe reads, so that a
// backend answering a large page cannot make probes expensive. Reading some
// of it lets a small answer end cleanly instead of in a reset.
const httpBodyLimit = 64 << 10

// Check sends one GET with the Host header of target (the service's VIP:port
// when the Manager built it) and compares the status.
func (h HTTP) Check(ctx context.Context, t Target) error {
	path := h.Path
	if path == "" {
		path = "/"
	}
	want := h.ExpectStatus
	if want == 0 {
		want = http.StatusOK
	}
	host := t.Host
	if host == "" {
		host = t.Addr.String()
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+host+path, nil)
	if err != nil {
		return fmt.Errorf("http check: cannot build GET %s for host %q: %w; fix health.path", path, host, err)
	}
	req.Header.Set("User-Agent", "l4lb-health-check")
	req.Close = true

	c, err := dial(ctx, "tcp", t)
	if err != nil {
		return fmt.Errorf("http check: %w", err)
	}
	defer c.Close()
	stop := bound(ctx, c, time.Time{})
	defer stop()

	if err := req.Write(c); err != nil {
		return fmt.Errorf("http check: send GET %s to %s: %w", path, t.Addr, ctxErr(ctx, err))
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), req)
	if err != nil {
		return fmt.Errorf("http check: read the answer to GET %s from %s: %w", path, t.Addr, ctxErr(ctx, err))
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, httpBodyLimit))
	_ = resp.Body.Close()
	if resp.StatusCode != want {
		return fmt.Errorf("http check: GET %s on %s answered %q, want status %d", path, t.Addr, resp.Status, want)
	}
	return nil
}

// UDP checks a UDP service from a connected socket. It sends Send (possibly
// an empty datagram) and then:
//
//   - With Expect set, the backend is healthy only if its reply arrives
//     within the timeout and contains Expect. This is the only UDP check that
//     proves the application answers.
//   - With Expect empty, a reply of any content is a success, an ICMP port
//     unreachable (seen as "connection refused" on the connected socket) is a
//     failure, and silence until the timeout is a success. Such a check can
//     tell that nothing listens on a reachable host's port, and nothing more:
//     it cannot tell a hung application, a dead host, a lost probe, or a
//     firewall that drops ICMP from a healthy backend, and it always lasts the
//     whole timeout on a silent backend. Set Send and Expect to a request and
//     reply of the backend's protocol wherever it has one.
type UDP struct {
	// Send is the payload of the probe datagram (empty: a zero-length one).
	Send string
	// Expect, when not empty, must occur in the reply.
	Expect string
}

// udpDefaultWait bounds a UDP probe whose ctx has no deadline, since a check
// that accepts silence would otherwise never end.
const udpDefaultWait = time.Second

// Check sends one datagram and judges the answer, or its absence, as the
// type's documentation says.
func (u UDP) Check(ctx context.Context, t Target) error {
	c, err := dial(ctx, "udp", t)
	if err != nil {
		return fmt.Errorf("udp check: %w", err)
	}
	defer c.Close()
	stop := bound(ctx, c, time.Now().Add(udpDefaultWait))
	defer stop()

	if _, err := c.Write([]byte(u.Send)); err != nil {
		return udpError(t, err)
	}
	buf := make([]byte, 64<<10)
	n, err := c.Read(buf)
	switch {
	case err == nil:
		if u.Expect == "" || bytes.Contains(buf[:n], []byte(u.Expect)) {
			return nil
		}
		return fmt.Errorf("udp check: the reply from %s (%q) does not contain %q", t.Addr, clip(buf[:n], 64), u.Expect)
	case errors.Is(err, context.Canceled) || errors.Is(ctx.Err(), context.Canceled):
		return fmt.Errorf("udp check of %s: %w", t.Addr, context.Canceled)
	case isTimeout(err):
		if u.Expect == "" {
			// Silence is all a check with nothing to expect can get.
			return nil
		}
		return fmt.Errorf("udp check: no reply from %s within the timeout (want one containing %q): %w", t.Addr, u.Expect, ctxErr(ctx, err))
	}
	return udpError(t, err)
}

func udpError(t Target, err error) error {
	if errors.Is(err, syscall.ECONNREFUSED) {
		return fmt.Errorf("udp check: %s answered ICMP port unreachable: nothing listens on that port", t.Addr)
	}
	return fmt.Errorf("udp check of %s: %w", t.Addr, err)
}

// bound makes c's I/O end at ctx's deadline (or fallback when ctx has none
// and fallback is not zero) and as soon as ctx is cancelled. The returned
// function releases the cancellation hook.
func bound(ctx context.Context, c net.Conn, fallback time.Time) func() bool {
	if d, ok := ctx.Deadline(); ok {
		_ = c.SetDeadline(d)
	} else if !fallback.IsZero() {
		_ = c.SetDeadline(fallback)
	}
	return context.AfterFunc(ctx, func() { _ = c.SetDeadline(time.Now()) })
}

// ctxErr puts the context's reason in front of an I/O error caused by it, so
// that "i/o timeout" reads as the probe timeout it is.
func ctxErr(ctx context.Context, err error) error {
	if !isTimeout(err) {
		return err
	}
	if cerr := ctx.Err(); cerr != nil {
		return fmt.Errorf("%w (%w)", cerr, err)
	}
	// The socket deadline is the context's, and its timer may fire a little
	// before the context's own.
	if _, ok := ctx.Deadline(); ok {
		return fmt.Errorf("%w (%w)", context.DeadlineExceeded, err)
	}
	return err
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

func clip(b []byte, n int) []byte {
	if len(b) > n {
		return b[:n]
	}
	return b
}
