// SPDX-License-Identifier: Apache-2.0

package api

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"time"
)

// Provider answers the API's questions from the daemon's live state.
type Provider interface {
	Status() Status
	Services() []Service
	// Service is one service as Services lists it; ErrNotFound when
	// there is none of that name.
	Service(name string) (Service, error)
	Conntrack() (Conntrack, error)
	// Flows lists the connection table's entries q selects.
	Flows(q FlowQuery) (FlowList, error)
	// Flush deletes the flows req selects and their SNAT bindings.
	Flush(ctx context.Context, req FlushRequest) (FlushResult, error)
	// Maglev returns the service's programmed table.
	Maglev(service string) (MaglevTable, error)
	// Lookup says where a client's flow to the service goes.
	Lookup(service string, client netip.AddrPort) (Lookup, error)
	// BGP returns the speaker's state; ErrNotFound when BGP is off.
	BGP() (BGPStatus, error)
	// Fleet returns the fleet check's view; ErrNotFound when it is off.
	Fleet() (Fleet, error)
	// Backend applies a runtime override and returns once it is
	// programmed.
	Backend(ctx context.Context, service string, backend netip.AddrPort, action BackendAction) error
	// Reload re-reads the configuration file, as SIGHUP does, and returns
	// once the result is programmed; a rejected file is an error.
	Reload(ctx context.Context) error
	// ConfigDiff says what loading the configuration in req would change,
	// without applying anything.
	ConfigDiff(ctx context.Context, req ConfigDiffRequest) (ConfigDiff, error)
	// Trace reports what the datapath does with the packets req selects,
	// calling emit for each message until the trace ends, ctx ends or emit
	// fails. An error returned before the first emit is the request's.
	Trace(ctx context.Context, req TraceRequest, emit func(TraceMessage) error) error
}

// ErrNotFound marks errors about a service or backend that does not exist;
// the server answers them with 404.
var ErrNotFound = errors.New("not found")

// ErrInvalid marks errors about a malformed request (400).
var ErrInvalid = errors.New("invalid request")

// ErrBusy marks a request that conflicts with one in progress (409).
var ErrBusy = errors.New("busy")

// Server serves the admin API on a unix socket.
type Server struct {
	p   Provider
	log *slog.Logger
	mux *http.ServeMux
}

// NewServer returns a server answering from p.
func NewServer(p Provider, log *slog.Logger) *Server {
	s := &Server{p: p, log: log, mux: http.NewServeMux()}
	s.mux.HandleFunc("GET "+Version+"/status", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, s.p.Status())
	})
	s.mux.HandleFunc("GET "+Version+"/services", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, s.p.Services())
	})
	s.mux.HandleFunc("GET "+Version+"/services/{name}", func(w http.ResponseWriter, r *http.Request) {
		svc, err := s.p.Service(r.PathValue("name"))
		if err != nil {
			writeError(w, err)
			return
		}
		writeJSON(w, http.StatusOK, svc)
	})
	s.mux.HandleFunc("GET "+Version+"/services/{name}/maglev", func(w http.ResponseWriter, r *http.Request) {
		t, err := s.p.Maglev(r.PathValue("name"))
		if err != nil {
			writeError(w, err)
			return
		}
		writeJSON(w, http.StatusOK, t)
	})
	s.mux.HandleFunc("GET "+Version+"/services/{name}/lookup", func(w http.ResponseWriter, r *http.Request) {
		client, err := netip.ParseAddrPort(r.URL.Query().Get("client"))
		if err != nil {
			writeError(w, fmt.Errorf("client must be ip:port: %v: %w", err, ErrInvalid))
			return
		}
		l, err := s.p.Lookup(r.PathValue("name"), client)
		if err != nil {
			writeError(w, err)
			return
		}
		writeJSON(w, http.StatusOK, l)
	})
	s.mux.HandleFunc("POST "+Version+"/services/{name}/backends/{backend}/{action}", func(w http.ResponseWriter, r *http.Request) {
		be, err := netip.ParseAddrPort(r.PathValue("backend"))
		if err != nil {
			writeError(w, fmt.Errorf("backend must be ip:port: %v: %w", err, ErrInvalid))
			return
		}
		action := BackendAction(r.PathValue("action"))
		switch action {
		case ActionDrain, ActionEnable, ActionDisable, ActionClear:
		default:
			writeError(w, fmt.Errorf("unknown action %q (want drain, enable, disable or clear): %w", action, ErrInvalid))
			return
		}
		if err := s.p.Backend(r.Context(), r.PathValue("name"), be, action); err != nil {
			writeError(w, err)
			return
		}
		writeJSON(w, http.StatusOK, struct{}{})
	})
	s.mux.HandleFunc("POST "+Version+"/reload", func(w http.ResponseWriter, r *http.Request) {
		if err := s.p.Reload(r.Context()); err != nil {
			writeJSON(w, http.StatusUnprocessableEntity, Error{Error: "configuration rejected, the previous one keeps serving:\n" + err.Error()})
			return
		}
		writeJSON(w, http.StatusOK, s.p.Status().LastReload)
	})
	s.mux.HandleFunc("POST "+Version+"/config/diff", func(w http.ResponseWriter, r *http.Request) {
		var req ConfigDiffRequest
		if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 32<<20)).Decode(&req); err != nil {
			writeError(w, fmt.Errorf("body must be {\"name\", \"content\"}: %v: %w", err, ErrInvalid))
			return
		}
		d, err := s.p.ConfigDiff(r.Context(), req)
		if err != nil {
			writeError(w, err)
			return
		}
		writeJSON(w, http.StatusOK, d)
	})
	s.mux.HandleFunc("GET "+Version+"/bgp", func(w http.ResponseWriter, _ *http.Request) {
		b, err := s.p.BGP()
		if err != nil {
			writeError(w, err)
			return
		}
		writeJSON(w, http.StatusOK, b)
	})
	s.mux.HandleFunc("GET "+Version+"/fleet", func(w http.ResponseWriter, _ *http.Request) {
		f, err := s.p.Fleet()
		if err != nil {
			writeError(w, err)
			return
		}
		writeJSON(w, http.StatusOK, f)
	})
	s.mux.HandleFunc("GET "+Version+"/conntrack", func(w http.ResponseWriter, _ *http.Request) {
		c, err := s.p.Conntrack()
		if err != nil {
			writeError(w, err)
			return
		}
		writeJSON(w, http.StatusOK, c)
	})
	s.mux.HandleFunc("GET "+Version+"/conntrack/flows", func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		fq := FlowQuery{Service: q.Get("service"), Backend: q.Get("backend")}
		if l := q.Get("limit"); l != "" {
			n, err := strconv.Atoi(l)
			if err != nil || n < 0 {
				writeError(w, fmt.Errorf("limit %q: want a number of flows, 0 for all: %w", l, ErrInvalid))
				return
			}
			fq.Limit = n
		}
		fl, err := s.p.Flows(fq)
		if err != nil {
			writeError(w, err)
			return
		}
		writeJSON(w, http.StatusOK, fl)
	})
	s.mux.HandleFunc("POST "+Version+"/conntrack/flush", func(w http.ResponseWriter, r *http.Request) {
		var req FlushRequest
		if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 1<<20)).Decode(&req); err != nil {
			writeError(w, fmt.Errorf("body must be {\"service\", \"backend\", \"all\"}: %v: %w", err, ErrInvalid))
			return
		}
		if req.Service == "" && req.Backend == "" && !req.All {
			writeError(w, fmt.Errorf("a flush needs a service, a backend, or all: %w", ErrInvalid))
			return
		}
		res, err := s.p.Flush(r.Context(), req)
		if err != nil {
			writeError(w, err)
			return
		}
		s.log.Info("flushed connection-table entries", "service", req.Service, "backend", req.Backend, "all", req.All, "flows", res.Flows, "bindings", res.Bindings)
		writeJSON(w, http.StatusOK, res)
	})
	s.mux.HandleFunc("GET "+Version+"/trace", s.trace)
	return s
}

// trace streams GET /v1/trace as newline-delimited JSON, one message a
// line, each flushed as it is written.
func (s *Server) trace(w http.ResponseWriter, r *http.Request) {
	req, err := traceRequest(r.URL.Query())
	if err != nil {
		writeError(w, err)
		return
	}
	started := false
	enc := json.NewEncoder(w)
	flusher, _ := w.(http.Flusher)
	err = s.p.Trace(r.Context(), req, func(m TraceMessage) error {
		if !started {
			w.Header().Set("Content-Type", "application/x-ndjson")
			w.WriteHeader(http.StatusOK)
			started = true
		}
		if err := enc.Encode(m); err != nil {
			return err
		}
		if flusher != nil {
			flusher.Flush()
		}
		return nil
	})
	switch {
	case err != nil && !started:
		writeError(w, err)
	case err != nil && r.Context().Err() == nil:
		s.log.Warn("trace ended early", "error", err)
	}
}

// traceRequest reads a TraceRequest from GET /v1/trace's query.
func traceRequest(q url.Values) (TraceRequest, error) {
	req := TraceRequest{
		Client: q.Get("client"), VIP: q.Get("vip"), Proto: q.Get("proto"),
		Service: q.Get("service"), Backend: q.Get("backend"),
	}
	num := func(name string, bits int) (uint64, error) {
		v := q.Get(name)
		if v == "" {
			return 0, nil
		}
		n, err := strconv.ParseUint(v, 10, bits)
		if err != nil {
			return 0, fmt.Errorf("%s %q: want a number below 2^%d: %w", name, v, bits, ErrInvalid)
		}
		return n, nil
	}
	port, err := num("port", 16)
	if err != nil {
		return req, err
	}
	count, err := num("count", 31)
	if err != nil {
		return req, err
	}
	rate, err := num("rate", 32)
	if err != nil {
		return req, err
	}
	req.Port, req.Count, req.Rate = uint16(port), int(count), uint32(rate)
	if v := q.Get("timeout"); v != "" {
		if req.Timeout, err = time.ParseDuration(v); err != nil || req.Timeout < 0 {
			return req, fmt.Errorf("timeout %q: want a duration such as 30s: %w", v, ErrInvalid)
		}
	}
	return req, nil
}

// Handler exposes the routes, for tests.
func (s *Server) Handler() http.Handler { return s.mux }

// Listen creates the socket at path (mode 0600, parent directory 0755),
// replacing a stale socket left by a crashed daemon.
func Listen(path string) (net.Listener, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, fmt.Errorf("admin socket: create %s: %w", filepath.Dir(path), err)
	}
	// Only a socket is ever removed: a path naming anything else is an
	// operator's mistake, never l4lbd's to delete.
	if fi, err := os.Lstat(path); err == nil {
		if fi.Mode()&os.ModeSocket == 0 {
			return nil, fmt.Errorf("admin socket: %s exists and is not a socket; refusing to replace it: point daemon.admin_socket elsewhere", path)
		}
		if err := os.Remove(path); err != nil {
			return nil, fmt.Errorf("admin socket: remove stale %s: %w", path, err)
		}
	} else if !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("admin socket: %w", err)
	}
	// The umask keeps the socket private from the moment it exists; the
	// chmod below makes that explicit whatever the process umask is.
	l, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("admin socket: listen on %s: %w", path, err)
	}
	if err := os.Chmod(path, 0o600); err != nil {
		l.Close()
		return nil, fmt.Errorf("admin socket: chmod %s: %w", path, err)
	}
	return l, nil
}

// Serve answers on l until ctx ends, then removes the socket.
func (s *Server) Serve(ctx context.Context, l net.Listener) error {
	// Requests live in ctx: a trace's stream ends with the daemon.
	hs := &http.Server{Handler: s.mux, ReadHeaderTimeout: 5 * time.Second,
		BaseContext: func(net.Listener) context.Context { return ctx }}
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = hs.Shutdown(sctx)
	}()
	err := hs.Serve(l)
	if ul, ok := l.(*net.UnixListener); ok {
		_ = os.Remove(ul.Addr().String())
	}
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return err
}

func writeError(w http.ResponseWriter, err error) {
	code := http.StatusInternalServerError
	switch {
	case errors.Is(err, ErrNotFound):
		code = http.StatusNotFound
	case errors.Is(err, ErrInvalid):
		code = http.StatusBadRequest
	case errors.Is(err, ErrBusy):
		code = http.StatusConflict
	}
	writeJSON(w, code, Error{Error: err.Error()})
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}
