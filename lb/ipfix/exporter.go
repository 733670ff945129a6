// SPDX-License-Identifier: Apache-2.0

package ipfix

import (
	"errors"
	"fmt"
	"net"
	"sync/atomic"
	"time"
)

// ExporterConfig says where and how records are sent.
type ExporterConfig struct {
	// Collectors are host:port UDP addresses; each gets every record.
	Collectors []string
	// TemplateRefresh is how often the templates are sent again: over
	// UDP a collector that starts (or restarts) later learns them only
	// then (RFC 7011, 8.4).
	TemplateRefresh time.Duration
	// ObservationDomain is the messages' observation domain ID.
	ObservationDomain uint32
	// Enterprise is the private enterprise number of the l4lb elements.
	Enterprise uint32
	// Counts puts packetDeltaCount and octetDeltaCount (Record.Packets,
	// Record.Bytes) into every template; without it the records carry
	// none (the datapath does not count).
	Counts bool
}

// DefaultTemplateRefresh is ipfix.template_refresh's default.
const DefaultTemplateRefresh = time.Minute

type collector struct {
	addr      string
	conn      net.Conn
	seq       uint32
	templates time.Time // when the templates were last sent
	sent      atomic.Uint64
	dropped   atomic.Uint64
}

// Exporter sends records to the collectors. Export is called from one
// goroutine; Stats from any.
type Exporter struct {
	cfg        ExporterConfig
	collectors []*collector
	buf        []byte
}

// CollectorStats counts one collector's records: Sent were written to its
// socket, Dropped were not (the kernel refused the datagram, e.g. the
// collector's port answered ICMP unreachable to an earlier one).
type CollectorStats struct {
	Collector     string
	Sent, Dropped uint64
}

// NewExporter opens a UDP socket to each collector.
func NewExporter(cfg ExporterConfig) (*Exporter, error) {
	if len(cfg.Collectors) == 0 {
		return nil, errors.New("ipfix: no collector")
	}
	e := &Exporter{cfg: cfg, buf: make([]byte, 0, maxMessage)}
	if e.cfg.TemplateRefresh <= 0 {
		e.cfg.TemplateRefresh = DefaultTemplateRefresh
	}
	for _, a := range cfg.Collectors {
		conn, err := net.Dial("udp", a)
		if err != nil {
			e.Close()
			return nil, fmt.Errorf("ipfix: collector %s: %w", a, err)
		}
		e.collectors = append(e.collectors, &collector{addr: a, conn: conn})
	}
	return e, nil
}

// Close closes the sockets.
func (e *Exporter) Close() {
	for _, c := range e.collectors {
		c.conn.Close()
	}
}

// Stats returns each collector's counts.
func (e *Exporter) Stats() []CollectorStats {
	out := make([]CollectorStats, len(e.collectors))
	for i, c := range e.collectors {
		out[i] = CollectorStats{Collector: c.addr, Sent: c.sent.Load(), Dropped: c.dropped.Load()}
	}
	return out
}

// Export sends recs to every collector, in messages of at most 1400
// bytes, with the templates first when they are due. It returns the first
// send error of each collector; the records are counted either way.
func (e *Exporter) Export(now time.Time, recs []Record) error {
	var errs []error
	for _, c := range e.collectors {
		if err := e.exportTo(c, now, recs); err != nil {
			errs = append(errs, fmt.Errorf("ipfix: collector %s: %w", c.addr, err))
		}
	}
	return errors.Join(errs...)
}

func (e *Exporter) exportTo(c *collector, now time.Time, recs []Record) error {
	var first error
	m := newMessage(e.buf)
	if c.templates.IsZero() || now.Sub(c.templates) >= e.cfg.TemplateRefresh {
		m.templates(e.cfg.Enterprise, e.cfg.Counts)
		c.templates = now
	}
	send := func() {
		b := m.finish(now, c.seq, e.cfg.ObservationDomain)
		n := uint64(m.records)
		// The sequence counts records sent, lost ones included: a
		// collector sees the gap.
		c.seq += uint32(m.records)
		if _, err := c.conn.Write(b); err != nil {
			c.dropped.Add(n)
			if first == nil {
				first = err
			}
		} else {
			c.sent.Add(n)
		}
		m = newMessage(e.buf)
	}
	var rec []byte
	for i := range recs {
		t := templateOf(&recs[i])
		rec = appendRecord(rec[:0], &recs[i], e.cfg.Counts)
		if !m.fits(t, len(rec)) {
			send()
		}
		m.add(t, rec)
	}
	if m.records > 0 || len(m.b) > headerLen {
		send()
	}
	return first
}
