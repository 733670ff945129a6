// SPDX-License-Identifier: Apache-2.0

// Package ipfix exports the connection table's flows as IPFIX (RFC 7011)
// flow records over UDP: the daemon reads the table every scan interval
// (lb/datapath's Flows), a Tracker turns what it sees into the flows'
// lifecycle (created, active timeout, ended), and an Exporter encodes the
// records and sends them to the collectors. It knows nothing of the
// kernel: everything it reads comes from the daemon.
//
// The templates are documented in docs/observability.md; a change to them
// is a change of that contract (collectors store them by ID).
package ipfix

import (
	"encoding/binary"
	"net/netip"
	"time"
)

// IANA information elements the records use (https://www.iana.org/assignments/ipfix).
const (
	ieOctetDeltaCount               = 1
	iePacketDeltaCount              = 2
	ieProtocolIdentifier            = 4
	ieSourceTransportPort           = 7
	ieSourceIPv4Address             = 8
	ieDestinationTransportPort      = 11
	ieDestinationIPv4Address        = 12
	ieSourceIPv6Address             = 27
	ieDestinationIPv6Address        = 28
	ieFlowEndReason                 = 136
	ieFlowStartMilliseconds         = 152
	ieFlowEndMilliseconds           = 153
	iePostNATSourceIPv4Address      = 225
	iePostNATDestinationIPv4Address = 226
	iePostNAPTSourceTransportPort   = 227
	iePostNAPTDestTransportPort     = 228
	iePostNATSourceIPv6Address      = 281
	iePostNATDestinationIPv6Address = 282
)

// Enterprise-specific elements, under the exporter's enterprise number.
const (
	// IEServiceName is the service's name (string).
	IEServiceName = 1
	// IEForwardingMode is "snat", "dsr/ipip", "dsr/geneve" or "dsr/opt"
	// (string).
	IEForwardingMode = 2
	// IEFlowEvent is the record's place in the flow's life (unsigned8,
	// Event).
	IEFlowEvent = 3
)

// DocumentationEnterprise is the private enterprise number RFC 5612
// reserves for documentation, the default of ipfix.enterprise_number: an
// operator with a number of their own sets it there.
const DocumentationEnterprise = 32473

// Event is why a record is sent.
type Event uint8

// Events, as IEFlowEvent carries them.
const (
	// EventCreated: the flow's entry appeared in the connection table.
	EventCreated Event = 1
	// EventActive: the flow lasted another active timeout.
	EventActive Event = 2
	// EventEnded: the flow's entry went, or stayed idle past the idle
	// timeout.
	EventEnded Event = 3
)

func (e Event) String() string {
	switch e {
	case EventCreated:
		return "created"
	case EventActive:
		return "active"
	case EventEnded:
		return "ended"
	}
	return "unknown"
}

// EndReason is the flowEndReason (IE 136) of an active or ended record.
type EndReason uint8

// flowEndReason values (RFC 5102).
const (
	EndIdleTimeout     EndReason = 1
	EndActiveTimeout   EndReason = 2
	EndOfFlowDetected  EndReason = 3
	EndForced          EndReason = 4
	EndLackOfResources EndReason = 5
)

// Record is one flow record.
type Record struct {
	Event  Event
	Reason EndReason // 0 for EventCreated
	// Client and VIP are the flow as its client sends it; Proto its
	// protocol (6 or 17).
	Client, VIP netip.AddrPort
	Proto       uint8
	// Backend is where the flow goes; SNAT the source it has towards the
	// backend (invalid: none, DSR).
	Backend, SNAT netip.AddrPort
	Start, End    time.Time
	Service, Mode string
	// Packets and Bytes are the flow's client packets and their IP
	// octets (header and payload) since its previous record, or since it
	// began for its first: packetDeltaCount and octetDeltaCount (RFC
	// 7012), sent when the exporter's Counts is set.
	Packets, Bytes uint64
}

// Final reports whether r is its flow's last record: an end that is not a
// re-balance (whose flow goes on as a new one with the same counter).
func (r *Record) Final() bool { return r.Event == EventEnded && r.Reason != EndForced }

// Template IDs: one per family, without and with flowEndReason.
const (
	templateV4Created = 256 + iota
	templateV4End
	templateV6Created
	templateV6End
)

type field struct {
	id         uint16
	length     uint16 // varLen: variable
	enterprise bool
}

const varLen = 0xffff

// templateFields is the layout of a template: IPv6 or IPv4, with
// flowEndReason (active and ended records) or without (created), with the
// counts or without.
func templateFields(v6, end, counts bool) []field {
	addr := uint16(4)
	src, dst, natSrc, natDst := uint16(ieSourceIPv4Address), uint16(ieDestinationIPv4Address), uint16(iePostNATSourceIPv4Address), uint16(iePostNATDestinationIPv4Address)
	if v6 {
		addr = 16
		src, dst, natSrc, natDst = ieSourceIPv6Address, ieDestinationIPv6Address, iePostNATSourceIPv6Address, iePostNATDestinationIPv6Address
	}
	f := []field{
		{id: src, length: addr},
		{id: dst, length: addr},
		{id: ieSourceTransportPort, length: 2},
		{id: ieDestinationTransportPort, length: 2},
		{id: ieProtocolIdentifier, length: 1},
		{id: ieFlowStartMilliseconds, length: 8},
		{id: ieFlowEndMilliseconds, length: 8},
	}
	if counts {
		f = append(f, field{id: iePacketDeltaCount, length: 8}, field{id: ieOctetDeltaCount, length: 8})
	}
	f = append(f,
		field{id: natSrc, length: addr},
		field{id: natDst, length: addr},
		field{id: iePostNAPTSourceTransportPort, length: 2},
		field{id: iePostNAPTDestTransportPort, length: 2},
		field{id: IEFlowEvent, length: 1, enterprise: true},
		field{id: IEServiceName, length: varLen, enterprise: true},
		field{id: IEForwardingMode, length: varLen, enterprise: true},
	)
	if end {
		f = append(f, field{id: ieFlowEndReason, length: 1})
	}
	return f
}

func templateOf(r *Record) uint16 {
	v6 := r.Client.Addr().Is6() && !r.Client.Addr().Is4In6()
	switch {
	case v6 && r.Event == EventCreated:
		return templateV6Created
	case v6:
		return templateV6End
	case r.Event == EventCreated:
		return templateV4Created
	}
	return templateV4End
}

// appendTemplateSet appends the template set of all four templates, with
// the count fields when counts is set.
func appendTemplateSet(b []byte, pen uint32, counts bool) []byte {
	start := len(b)
	b = binary.BigEndian.AppendUint16(b, 2) // set ID 2: templates
	b = binary.BigEndian.AppendUint16(b, 0) // length, below
	for id := uint16(templateV4Created); id <= templateV6End; id++ {
		fs := templateFields(id >= templateV6Created, id == templateV4End || id == templateV6End, counts)
		b = binary.BigEndian.AppendUint16(b, id)
		b = binary.BigEndian.AppendUint16(b, uint16(len(fs)))
		for _, f := range fs {
			if f.enterprise {
				b = binary.BigEndian.AppendUint16(b, f.id|0x8000)
				b = binary.BigEndian.AppendUint16(b, f.length)
				b = binary.BigEndian.AppendUint32(b, pen)
				continue
			}
			b = binary.BigEndian.AppendUint16(b, f.id)
			b = binary.BigEndian.AppendUint16(b, f.length)
		}
	}
	binary.BigEndian.PutUint16(b[start+2:], uint16(len(b)-start))
	return b
}

func appendAddr(b []byte, a netip.Addr, v6 bool) []byte {
	if v6 {
		s := a.As16()
		return append(b, s[:]...)
	}
	if !a.IsValid() {
		return append(b, 0, 0, 0, 0)
	}
	s := a.Unmap().As4()
	return append(b, s[:]...)
}

// appendString appends s in IPFIX's variable-length encoding (RFC 7011,
// 7.), cut to 255 bytes: names and modes are far shorter.
func appendString(b []byte, s string) []byte {
	if len(s) > 254 {
		s = s[:254]
	}
	b = append(b, byte(len(s)))
	return append(b, s...)
}

func millis(t time.Time) uint64 { return uint64(t.UnixMilli()) }

// appendRecord appends r's data record in its template's layout (with the
// counts when counts is set).
func appendRecord(b []byte, r *Record, counts bool) []byte {
	v6 := templateOf(r) >= templateV6Created
	b = appendAddr(b, r.Client.Addr(), v6)
	b = appendAddr(b, r.VIP.Addr(), v6)
	b = binary.BigEndian.AppendUint16(b, r.Client.Port())
	b = binary.BigEndian.AppendUint16(b, r.VIP.Port())
	b = append(b, r.Proto)
	b = binary.BigEndian.AppendUint64(b, millis(r.Start))
	b = binary.BigEndian.AppendUint64(b, millis(r.End))
	if counts {
		b = binary.BigEndian.AppendUint64(b, r.Packets)
		b = binary.BigEndian.AppendUint64(b, r.Bytes)
	}
	b = appendAddr(b, r.SNAT.Addr(), v6)
	b = appendAddr(b, r.Backend.Addr(), v6)
	b = binary.BigEndian.AppendUint16(b, r.SNAT.Port())
	b = binary.BigEndian.AppendUint16(b, r.Backend.Port())
	b = append(b, byte(r.Event))
	b = appendString(b, r.Service)
	b = appendString(b, r.Mode)
	if r.Event != EventCreated {
		b = append(b, byte(r.Reason))
	}
	return b
}

// headerLen is the IPFIX message header's size.
const headerLen = 16

// message builds one IPFIX message.
type message struct {
	b       []byte
	set     uint16 // template of the open data set; 0 none
	setAt   int
	records int
}

func newMessage(buf []byte) *message {
	return &message{b: append(buf[:0], make([]byte, headerLen)...)}
}

func (m *message) closeSet() {
	if m.set != 0 {
		binary.BigEndian.PutUint16(m.b[m.setAt+2:], uint16(len(m.b)-m.setAt))
		m.set = 0
	}
}

func (m *message) templates(pen uint32, counts bool) {
	m.closeSet()
	m.b = appendTemplateSet(m.b, pen, counts)
}

// fits reports whether a record of n bytes of template t fits the message.
func (m *message) fits(t uint16, n int) bool {
	if t != m.set {
		n += 4 // a new set's header
	}
	return len(m.b)+n <= maxMessage
}

// add appends rec, the encoded record of template t, opening a data set
// for t when needed.
func (m *message) add(t uint16, rec []byte) {
	if t != m.set {
		m.closeSet()
		m.set, m.setAt = t, len(m.b)
		m.b = binary.BigEndian.AppendUint16(m.b, t)
		m.b = binary.BigEndian.AppendUint16(m.b, 0)
	}
	m.b = append(m.b, rec...)
	m.records++
}

// finish fills the header: version 10, length, export time, the sequence
// number (data records sent before this message), the observation domain.
func (m *message) finish(export time.Time, seq, domain uint32) []byte {
	m.closeSet()
	binary.BigEndian.PutUint16(m.b[0:], 10)
	binary.BigEndian.PutUint16(m.b[2:], uint16(len(m.b)))
	binary.BigEndian.PutUint32(m.b[4:], uint32(export.Unix()))
	binary.BigEndian.PutUint32(m.b[8:], seq)
	binary.BigEndian.PutUint32(m.b[12:], domain)
	return m.b
}

// maxMessage keeps a message in one unfragmented UDP datagram on an
// Ethernet path (RFC 7011, 10.3.3).
const maxMessage = 1400
