// SPDX-License-Identifier: Apache-2.0

package metrics

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Path is where metrics are served.
const Path = "/metrics"

// ShutdownTimeout bounds how long Serve waits for scrapes in flight once
// its context ends; scrapes still running then are cut off.
const ShutdownTimeout = 5 * time.Second

// Server serves a registry on /metrics on one or more bound addresses.
type Server struct {
	lns []net.Listener
	srv *http.Server
	log *slog.Logger
}

// Listen binds every address of addrs (daemon.metrics_listen, host:port)
// before serving anything, so that a bad address fails l4lbd's start with
// the address named rather than leaving it half-served. On error nothing
// stays bound. An empty addrs gives a Server that serves nothing.
func Listen(addrs []string, reg *prometheus.Registry, log *slog.Logger) (*Server, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if reg == nil && len(addrs) > 0 {
		return nil, errors.New("metrics: Listen needs a registry (see NewRegistry)")
	}
	s := &Server{log: log}
	seen := map[string]bool{}
	for _, addr := range addrs {
		if seen[addr] {
			s.closeListeners()
			return nil, fmt.Errorf("metrics: address %q is listed twice in daemon.metrics_listen: remove one", addr)
		}
		seen[addr] = true
		ln, err := listen(addr)
		if err != nil {
			s.closeListeners()
			return nil, err
		}
		s.lns = append(s.lns, ln)
	}
	mux := http.NewServeMux()
	mux.Handle(Path, promhttp.HandlerFor(reg, promhttp.HandlerOpts{
		ErrorLog: errorLog{log},
		// A map that cannot be read must not hide every other series.
		ErrorHandling: promhttp.ContinueOnError,
		// Counts scrape errors in promhttp_metric_handler_errors_total.
		Registry: reg,
		// Scrapes walk BPF maps; a handful at once is plenty.
		MaxRequestsInFlight: 4,
	}))
	s.srv = &http.Server{
		Handler:           mux,
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       2 * time.Minute,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
	return s, nil
}

// listen binds one address and turns the usual failures into advice.
func listen(addr string) (net.Listener, error) {
	if _, _, err := net.SplitHostPort(addr); err != nil {
		return nil, fmt.Errorf("metrics: daemon.metrics_listen entry %q is not host:port (for example 127.0.0.1:9842 or [::1]:9842): %v", addr, err)
	}
	ln, err := net.Listen("tcp", addr)
	if err == nil {
		return ln, nil
	}
	hint := "check daemon.metrics_listen"
	switch {
	case errors.Is(err, syscall.EADDRINUSE):
		hint = "another process uses this port (see `ss -ltnp`); stop it or pick another port in daemon.metrics_listen"
	case errors.Is(err, syscall.EADDRNOTAVAIL):
		hint = "the address is not configured on any interface of this host; use one that is, or 0.0.0.0 / [::]"
	case errors.Is(err, syscall.EACCES):
		hint = "ports below 1024 need CAP_NET_BIND_SERVICE; use a higher port"
	}
	return nil, fmt.Errorf("metrics: cannot listen on %s: %w; %s", addr, err, hint)
}

// Addrs returns the bound addresses, with the ports the kernel chose for
// ":0".
func (s *Server) Addrs() []net.Addr {
	out := make([]net.Addr, len(s.lns))
	for i, ln := range s.lns {
		out[i] = ln.Addr()
	}
	return out
}

// Serve answers scrapes until ctx ends, then stops accepting, lets scrapes
// in flight finish (up to ShutdownTimeout) and returns nil. It returns an
// error if a listener fails; the other listeners are shut down then too.
// With no addresses it returns nil at once.
func (s *Server) Serve(ctx context.Context) error {
	if len(s.lns) == 0 {
		s.log.Info("metrics disabled: daemon.metrics_listen is empty")
		return nil
	}
	errc := make(chan error, len(s.lns))
	for _, ln := range s.lns {
		s.log.Info("serving metrics", "address", ln.Addr().String(), "path", Path)
		go func() { errc <- s.srv.Serve(ln) }()
	}
	var failed error
	select {
	case <-ctx.Done():
	case err := <-errc:
		failed = fmt.Errorf("metrics: serving stopped: %w", err)
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), ShutdownTimeout)
	defer cancel()
	if err := s.srv.Shutdown(sctx); err != nil {
		s.log.Warn("metrics: scrapes still running at shutdown were cut off", "error", err)
		_ = s.srv.Close()
	}
	return failed
}

func (s *Server) closeListeners() {
	for _, ln := range s.lns {
		_ = ln.Close()
	}
	s.lns = nil
}

// Serve binds addrs and serves reg on /metrics until ctx ends: Listen, then
// Server.Serve. A daemon that wants a bad address to fail its start calls
// the two separately.
func Serve(ctx context.Context, addrs []string, reg *prometheus.Registry, log *slog.Logger) error {
	s, err := Listen(addrs, reg, log)
	if err != nil {
		return err
	}
	return s.Serve(ctx)
}

// errorLog hands promhttp's errors (a map that could not be read during a
// scrape) to slog.
type errorLog struct{ log *slog.Logger }

func (l errorLog) Println(v ...any) {
	l.log.Error("metrics scrape", "error", fmt.Sprint(v...))
}
