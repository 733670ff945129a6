// SPDX-License-Identifier: Apache-2.0

package api

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"os"
	"strconv"
	"time"
)

// DefaultSocket is where l4lbd listens unless daemon.admin_socket says
// otherwise.
const DefaultSocket = "/run/l4lb/l4lb.sock"

// Client talks to l4lbd's admin socket.
type Client struct {
	socket string
	hc     *http.Client
}

// NewClient returns a client for the socket at path.
func NewClient(path string) *Client {
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", path)
		},
	}
	return &Client{socket: path, hc: &http.Client{Transport: tr, Timeout: 10 * time.Second}}
}

func (c *Client) get(ctx context.Context, path string, out any) error {
	return c.do(ctx, http.MethodGet, path, out)
}

func (c *Client) do(ctx context.Context, method, path string, out any) error {
	return c.doBody(ctx, method, path, nil, out)
}

func (c *Client) doBody(ctx context.Context, method, path string, in, out any) error {
	var reqBody io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return err
		}
		reqBody = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, "http://l4lbd"+Version+path, reqBody)
	if err != nil {
		return err
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return c.dialError(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		return answerError(resp)
	}
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return fmt.Errorf("read answer: %w", err)
	}
	if err := json.Unmarshal(body, out); err != nil {
		return fmt.Errorf("decode answer: %w", err)
	}
	return nil
}

// dialError says why the socket could not be used.
func (c *Client) dialError(err error) error {
	if errors.Is(err, os.ErrPermission) {
		return fmt.Errorf("admin socket %s: permission denied (it is mode 0600: run as root)", c.socket)
	}
	return fmt.Errorf("admin socket %s: %w (is l4lbd running?)", c.socket, err)
}

// answerError is the error a non-2xx answer carries.
func answerError(resp *http.Response) error {
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return fmt.Errorf("l4lbd answered %s; read answer: %w", resp.Status, err)
	}
	var e Error
	if json.Unmarshal(body, &e) == nil && e.Error != "" {
		return errors.New(e.Error)
	}
	return fmt.Errorf("l4lbd answered %s", resp.Status)
}

// Status returns the daemon's status.
func (c *Client) Status(ctx context.Context) (Status, error) {
	var s Status
	return s, c.get(ctx, "/status", &s)
}

// Services lists the programmed services.
func (c *Client) Services(ctx context.Context) ([]Service, error) {
	var s []Service
	return s, c.get(ctx, "/services", &s)
}

// Service returns one service by name.
func (c *Client) Service(ctx context.Context, name string) (Service, error) {
	var s Service
	return s, c.get(ctx, "/services/"+url.PathEscape(name), &s)
}

// Conntrack returns the connection table's occupancy.
func (c *Client) Conntrack(ctx context.Context) (Conntrack, error) {
	var ct Conntrack
	return ct, c.get(ctx, "/conntrack", &ct)
}

// Maglev returns a service's live Maglev table.
func (c *Client) Maglev(ctx context.Context, service string) (MaglevTable, error) {
	var t MaglevTable
	return t, c.get(ctx, "/services/"+url.PathEscape(service)+"/maglev", &t)
}

// Lookup asks where a client's flow to a service goes.
func (c *Client) Lookup(ctx context.Context, service string, client netip.AddrPort) (Lookup, error) {
	var l Lookup
	return l, c.get(ctx, "/services/"+url.PathEscape(service)+"/lookup?client="+url.QueryEscape(client.String()), &l)
}

// Reload asks the daemon to re-read its configuration file and waits for
// the outcome: a rejected file is an error with every problem in it. It
// takes as long as the reload does (the context bounds it).
func (c *Client) Reload(ctx context.Context) (Reload, error) {
	var rl Reload
	hc := *c.hc
	hc.Timeout = 0
	return rl, (&Client{socket: c.socket, hc: &hc}).do(ctx, http.MethodPost, "/reload", &rl)
}

// ConfigDiff asks what loading the file content would change against what
// the daemon runs.
func (c *Client) ConfigDiff(ctx context.Context, name string, content []byte) (ConfigDiff, error) {
	var d ConfigDiff
	return d, c.doBody(ctx, http.MethodPost, "/config/diff", ConfigDiffRequest{Name: name, Content: string(content)}, &d)
}

// Backend applies a runtime override to a backend of a service.
func (c *Client) Backend(ctx context.Context, service string, backend netip.AddrPort, action BackendAction) error {
	var out struct{}
	return c.do(ctx, http.MethodPost, "/services/"+url.PathEscape(service)+"/backends/"+url.PathEscape(backend.String())+"/"+string(action), &out)
}

// BGP returns the BGP speaker's state.
func (c *Client) BGP(ctx context.Context) (BGPStatus, error) {
	var b BGPStatus
	return b, c.get(ctx, "/bgp", &b)
}

// Fleet returns the fleet check's view.
func (c *Client) Fleet(ctx context.Context) (Fleet, error) {
	var f Fleet
	return f, c.get(ctx, "/fleet", &f)
}

// Flows lists the connection table's entries fq selects.
func (c *Client) Flows(ctx context.Context, fq FlowQuery) (FlowList, error) {
	q := url.Values{}
	if fq.Service != "" {
		q.Set("service", fq.Service)
	}
	if fq.Backend != "" {
		q.Set("backend", fq.Backend)
	}
	if fq.Limit > 0 {
		q.Set("limit", strconv.Itoa(fq.Limit))
	}
	var fl FlowList
	return fl, c.get(ctx, "/conntrack/flows?"+q.Encode(), &fl)
}

// Trace streams GET /v1/trace: fn gets each message until the trace ends
// (its count, timeout, or ctx), or fn returns an error, which Trace
// returns.
func (c *Client) Trace(ctx context.Context, req TraceRequest, fn func(TraceMessage) error) error {
	q := url.Values{}
	for k, v := range map[string]string{"client": req.Client, "vip": req.VIP, "proto": req.Proto, "service": req.Service, "backend": req.Backend} {
		if v != "" {
			q.Set(k, v)
		}
	}
	if req.Port != 0 {
		q.Set("port", strconv.Itoa(int(req.Port)))
	}
	if req.Count != 0 {
		q.Set("count", strconv.Itoa(req.Count))
	}
	if req.Rate != 0 {
		q.Set("rate", strconv.FormatUint(uint64(req.Rate), 10))
	}
	if req.Timeout != 0 {
		q.Set("timeout", req.Timeout.String())
	}
	hreq, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://l4lbd"+Version+"/trace?"+q.Encode(), nil)
	if err != nil {
		return err
	}
	// A stream lasts as long as the trace: no client-wide timeout.
	hc := &http.Client{Transport: c.hc.Transport}
	resp, err := hc.Do(hreq)
	if err != nil {
		return c.dialError(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		return answerError(resp)
	}
	dec := json.NewDecoder(resp.Body)
	for {
		var m TraceMessage
		if err := dec.Decode(&m); err != nil {
			if errors.Is(err, io.EOF) || ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("read trace: %w", err)
		}
		if err := fn(m); err != nil {
			return err
		}
	}
}

// Flush deletes the flows req selects, and their SNAT bindings.
func (c *Client) Flush(ctx context.Context, req FlushRequest) (FlushResult, error) {
	var res FlushResult
	return res, c.doBody(ctx, http.MethodPost, "/conntrack/flush", req, &res)
}
