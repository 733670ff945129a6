// SPDX-License-Identifier: Apache-2.0

package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/l4lb/l4lb/tests/topo"
)

// The client's connections come from a child process started inside the
// client's namespace (this same program, re-executed with loadgenEnv set),
// so that every socket it opens is the client's without switching threads
// between namespaces on the way.
const loadgenEnv = "L4LB_COMPARE_LOADGEN"

// loadSpec is what a load generator does: Count new TCP connections to
// Target, at Rate per second (0: one after another), each reading the
// backend's greeting and closing.
type loadSpec struct {
	Target  string        `json:"target"`
	Rate    int           `json:"rate"`
	Count   int           `json:"count"`
	Timeout time.Duration `json:"timeout"`
	// Abort closes with a reset (no TIME_WAIT anywhere); otherwise the
	// client closes normally, as short-lived clients do.
	Abort bool `json:"abort"`
}

// Outcomes of a connection.
const (
	resOK      = "ok"
	resRefused = "refused"
	resReset   = "reset"
	// resNoAnswer: the connect timed out (a SYN or its answer lost);
	// resNoGreeting: connected, but no greeting came in time.
	resNoAnswer   = "no answer"
	resNoGreeting = "no greeting"
	resOther      = "other"
)

// loadResult is what a load generator reports.
type loadResult struct {
	Start time.Time  `json:"start"`
	Conns []connStat `json:"conns"`
	// Late is how far behind its schedule the generator fell at most:
	// on a busy machine, a generator that did not get the CPU opens its
	// connections late and sees its own delay as slow connections.
	Late time.Duration `json:"late"`
	// Errors holds one message per outcome other than ok, as an example.
	Errors map[string]string `json:"errors,omitempty"`
}

// connStat is one connection: when it started (after Start), how long the
// connect and greeting took, the outcome and the backend that greeted.
type connStat struct {
	At      time.Duration `json:"at"`
	Took    time.Duration `json:"took"`
	Result  string        `json:"result"`
	Backend string        `json:"backend,omitempty"`
	Port    int           `json:"port,omitempty"`
}

// loadgenMain runs a load generator from its spec and writes the result as
// JSON on stdout.
func loadgenMain(spec string) int {
	var s loadSpec
	if err := json.Unmarshal([]byte(spec), &s); err != nil {
		fmt.Fprintln(os.Stderr, "loadgen: bad spec:", err)
		return 2
	}
	res := generate(s)
	if err := json.NewEncoder(os.Stdout).Encode(res); err != nil {
		fmt.Fprintln(os.Stderr, "loadgen:", err)
		return 1
	}
	return 0
}

func generate(s loadSpec) loadResult {
	res := loadResult{Start: time.Now(), Conns: make([]connStat, s.Count), Errors: map[string]string{}}
	var mu sync.Mutex
	var wg sync.WaitGroup
	one := func(i int) {
		defer wg.Done()
		c := dialOnce(s, res.Start)
		if c.err != nil {
			mu.Lock()
			if _, ok := res.Errors[c.Result]; !ok {
				res.Errors[c.Result] = c.err.Error()
			}
			mu.Unlock()
		}
		res.Conns[i] = c.connStat
	}
	for i := range s.Count {
		wg.Add(1)
		if s.Rate == 0 {
			one(i)
			continue
		}
		// Paced against the start, not the previous connection, so the
		// rate holds whatever each connection takes.
		if d := time.Until(res.Start.Add(time.Duration(i) * time.Second / time.Duration(s.Rate))); d > 0 {
			time.Sleep(d)
		} else {
			res.Late = max(res.Late, -d)
		}
		go one(i)
	}
	wg.Wait()
	return res
}

type dialed struct {
	connStat
	err error
}

func dialOnce(s loadSpec, start time.Time) dialed {
	begin := time.Now()
	d := dialed{connStat: connStat{At: begin.Sub(start)}}
	deadline := begin.Add(s.Timeout)
	c, err := (&net.Dialer{Deadline: deadline}).Dial("tcp4", s.Target)
	connected := err == nil
	if connected {
		d.Port = c.LocalAddr().(*net.TCPAddr).Port
		_ = c.SetDeadline(deadline)
		var line string
		line, err = bufio.NewReader(c).ReadString('\n')
		d.Backend = strings.TrimSpace(line)
		if s.Abort {
			_ = c.(*net.TCPConn).SetLinger(0)
		}
		c.Close()
	}
	d.Took = time.Since(begin)
	d.Result, d.err = outcome(err, connected), err
	return d
}

func outcome(err error, connected bool) string {
	var ne net.Error
	switch {
	case err == nil:
		return resOK
	case errors.Is(err, syscall.ECONNREFUSED):
		return resRefused
	case errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.EPIPE):
		return resReset
	case errors.As(err, &ne) && ne.Timeout() && connected:
		return resNoGreeting
	case errors.As(err, &ne) && ne.Timeout():
		return resNoAnswer
	}
	return resOther
}

// runLoad runs a load generator on the client and returns what it saw.
func runLoad(ctx context.Context, client *topo.Host, s loadSpec) (loadResult, error) {
	exe, err := os.Executable()
	if err != nil {
		return loadResult{}, err
	}
	spec, _ := json.Marshal(s)
	cmd := commandContext(ctx, "nsenter", "--net="+client.NS.Path(), "--", exe)
	cmd.Env = append(os.Environ(), loadgenEnv+"="+string(spec))
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		return loadResult{}, fmt.Errorf("load generator on %s: %v\n%s", client.Name, err, errb.String())
	}
	var res loadResult
	if err := json.Unmarshal(out.Bytes(), &res); err != nil {
		return loadResult{}, fmt.Errorf("load generator on %s: bad output: %v", client.Name, err)
	}
	return res, nil
}

// Outcome is what the client saw of one run of connections.
type Outcome struct {
	Connections  int            `json:"connections"`
	Failed       int            `json:"failed"`
	FailedByKind map[string]int `json:"failed_by_kind,omitempty"`
	// Errors has one example message per kind of failure.
	Errors map[string]string `json:"errors,omitempty"`
	// LongestWindow is the longest stretch from a failed connection's
	// start to the end of the last failure after it with no gap of
	// windowGap between failures.
	LongestWindow time.Duration `json:"longest_failure_window_ns"`
	// OpenAtEnd is true when connections still failed at the end of the
	// load (the window is then a lower bound).
	OpenAtEnd bool `json:"failing_at_end"`
	// ClientLate is loadResult.Late.
	ClientLate time.Duration `json:"client_late_ns"`
	// FailedPerSecond counts failed connections by the second of the load
	// they were started in: what -plot draws.
	FailedPerSecond []int `json:"failed_per_second"`
}

func outcomeOf(lr loadResult) Outcome {
	o := Outcome{Connections: len(lr.Conns), FailedByKind: map[string]int{}, Errors: lr.Errors, ClientLate: lr.Late}
	for _, c := range lr.Conns {
		if c.Result != resOK {
			o.Failed++
			o.FailedByKind[c.Result]++
		}
	}
	o.LongestWindow, o.OpenAtEnd = failureWindows(lr)
	o.FailedPerSecond = perSecond(lr.Conns)
	return o
}

// perSecond counts the failed connections of each second of a load, one
// count per second in which a connection started.
func perSecond(conns []connStat) []int {
	var out []int
	for _, c := range conns {
		sec := int(c.At / time.Second)
		for len(out) <= sec {
			out = append(out, 0)
		}
		if c.Result != resOK {
			out[sec]++
		}
	}
	return out
}

// windowGap separates two failure windows: at the rates used, failures
// within one window are milliseconds apart.
const windowGap = 250 * time.Millisecond

// failureWindows returns the longest failure window of a run, and whether
// the last one was still open when the load ended.
func failureWindows(lr loadResult) (longest time.Duration, open bool) {
	var fails []connStat
	var end time.Duration
	for _, c := range lr.Conns {
		end = max(end, c.At)
		if c.Result != resOK {
			fails = append(fails, c)
		}
	}
	slices.SortFunc(fails, func(a, b connStat) int { return int(a.At - b.At) })
	var from, to time.Duration
	for i, c := range fails {
		if i == 0 || c.At-to > windowGap {
			from = c.At
		}
		to = max(to, c.At+c.Took)
		longest = max(longest, to-from)
	}
	return longest, len(fails) > 0 && end-fails[len(fails)-1].At < windowGap
}
