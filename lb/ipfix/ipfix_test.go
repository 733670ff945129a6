// SPDX-License-Identifier: Apache-2.0

package ipfix

import (
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"testing"
	"time"
)

// decoded is one data record as a collector reads it: the field values by
// (enterprise, element id).
type decoded map[[2]uint32][]byte

// decodeMessage parses an IPFIX message the way RFC 7011 lays it out,
// learning templates from template sets into templates (kept across
// messages, as a collector keeps them per session). It shares nothing
// with the encoder.
func decodeMessage(t *testing.T, b []byte, templates map[uint16][][3]uint32) (seq uint32, recs []decoded) {
	t.Helper()
	if len(b) < 16 || binary.BigEndian.Uint16(b) != 10 || int(binary.BigEndian.Uint16(b[2:])) != len(b) {
		t.Fatalf("message header %x: want version 10 and the message's length %d", b[:min(16, len(b))], len(b))
	}
	seq = binary.BigEndian.Uint32(b[8:])
	for off := 16; off < len(b); {
		id, n := binary.BigEndian.Uint16(b[off:]), int(binary.BigEndian.Uint16(b[off+2:]))
		if n < 4 || off+n > len(b) {
			t.Fatalf("set at %d: length %d overruns the message", off, n)
		}
		body := b[off+4 : off+n]
		off += n
		if id == 2 {
			for len(body) > 0 {
				tid, count := binary.BigEndian.Uint16(body), int(binary.BigEndian.Uint16(body[2:]))
				body = body[4:]
				var fields [][3]uint32
				for range count {
					ie, l := binary.BigEndian.Uint16(body), binary.BigEndian.Uint16(body[2:])
					body = body[4:]
					var pen uint32
					if ie&0x8000 != 0 {
						pen, body = binary.BigEndian.Uint32(body), body[4:]
					}
					fields = append(fields, [3]uint32{pen, uint32(ie &^ 0x8000), uint32(l)})
				}
				templates[tid] = fields
			}
			continue
		}
		fields, ok := templates[id]
		if !ok {
			t.Fatalf("data set %d before its template", id)
		}
		for len(body) > 0 {
			r := decoded{}
			for _, f := range fields {
				l := int(f[2])
				if l == 0xffff {
					l, body = int(body[0]), body[1:]
				}
				r[[2]uint32{f[0], f[1]}], body = body[:l], body[l:]
			}
			recs = append(recs, r)
		}
	}
	return seq, recs
}

func (r decoded) addr(pen, ie uint32) netip.Addr {
	a, _ := netip.AddrFromSlice(r[[2]uint32{pen, ie}])
	return a
}

func (r decoded) uint(pen, ie uint32) uint64 {
	var v uint64
	for _, c := range r[[2]uint32{pen, ie}] {
		v = v<<8 | uint64(c)
	}
	return v
}

// TestExport sends records of both families and events to a UDP socket
// and decodes them: every field where its element says, templates first,
// sequence numbers counting records, messages within 1400 bytes; the
// packet and octet counts only when the exporter has them.
func TestExport(t *testing.T) {
	for _, counts := range []bool{false, true} {
		t.Run(fmt.Sprintf("counts=%t", counts), func(t *testing.T) { testExport(t, counts) })
	}
}

func testExport(t *testing.T, counts bool) {
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	e, err := NewExporter(ExporterConfig{Collectors: []string{pc.LocalAddr().String()}, ObservationDomain: 7, Enterprise: DocumentationEnterprise, Counts: counts})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	at := time.UnixMilli(1796316852944)
	var recs []Record
	for i := range 60 {
		r := Record{
			Event: EventCreated, Client: netip.AddrPortFrom(netip.MustParseAddr("198.51.100.7"), uint16(40000+i)),
			VIP: netip.MustParseAddrPort("192.0.2.10:80"), Proto: 6,
			Backend: netip.MustParseAddrPort("10.1.0.11:8080"), SNAT: netip.MustParseAddrPort("10.0.0.1:33000"),
			Start: at, End: at.Add(time.Second), Service: "web", Mode: "snat",
			// Past 32 bits: the fields are 8 bytes.
			Packets: uint64(i) * 3, Bytes: uint64(i)*1500 + 1<<33,
		}
		if i%2 == 1 {
			r.Event, r.Reason, r.Mode, r.SNAT = EventEnded, EndOfFlowDetected, "dsr/ipip", netip.AddrPort{}
			r.Client = netip.AddrPortFrom(netip.MustParseAddr("2001:db8:1::7"), r.Client.Port())
			r.VIP, r.Backend = netip.MustParseAddrPort("[2001:db8::10]:80"), netip.MustParseAddrPort("[fd00::11]:80")
		}
		recs = append(recs, r)
	}
	if err := e.Export(at, recs); err != nil {
		t.Fatal(err)
	}
	templates := map[uint16][][3]uint32{}
	var got []decoded
	buf := make([]byte, 65536)
	for len(got) < len(recs) {
		pc.SetReadDeadline(time.Now().Add(5 * time.Second))
		n, _, err := pc.ReadFrom(buf)
		if err != nil {
			t.Fatalf("after %d of %d records: %v", len(got), len(recs), err)
		}
		if n > maxMessage {
			t.Errorf("message of %d bytes, more than %d", n, maxMessage)
		}
		// Records keep slices of the message: a copy of its own.
		seq, rs := decodeMessage(t, append([]byte(nil), buf[:n]...), templates)
		if int(seq) != len(got) {
			t.Errorf("sequence number %d, want %d (records sent before)", seq, len(got))
		}
		if domain := binary.BigEndian.Uint32(buf[12:]); domain != 7 {
			t.Errorf("observation domain %d, want 7", domain)
		}
		got = append(got, rs...)
	}
	const pen = DocumentationEnterprise
	for i, r := range got {
		w := recs[i]
		v4 := w.Client.Addr().Is4()
		src, dst, nsrc, ndst := uint32(8), uint32(12), uint32(225), uint32(226)
		if !v4 {
			src, dst, nsrc, ndst = 27, 28, 281, 282
		}
		snat := w.SNAT.Addr()
		if !snat.IsValid() {
			snat = netip.IPv4Unspecified()
			if !v4 {
				snat = netip.IPv6Unspecified()
			}
		}
		checks := []struct {
			what      string
			got, want any
		}{
			{"client", r.addr(0, src), w.Client.Addr()},
			{"vip", r.addr(0, dst), w.VIP.Addr()},
			{"client port", r.uint(0, 7), uint64(w.Client.Port())},
			{"vip port", r.uint(0, 11), uint64(w.VIP.Port())},
			{"protocol", r.uint(0, 4), uint64(6)},
			{"start", r.uint(0, 152), uint64(w.Start.UnixMilli())},
			{"end", r.uint(0, 153), uint64(w.End.UnixMilli())},
			{"snat", r.addr(0, nsrc), snat},
			{"backend", r.addr(0, ndst), w.Backend.Addr()},
			{"snat port", r.uint(0, 227), uint64(w.SNAT.Port())},
			{"backend port", r.uint(0, 228), uint64(w.Backend.Port())},
			{"event", r.uint(pen, IEFlowEvent), uint64(w.Event)},
			{"service", string(r[[2]uint32{pen, IEServiceName}]), w.Service},
			{"mode", string(r[[2]uint32{pen, IEForwardingMode}]), w.Mode},
			{"end reason", r.uint(0, 136), uint64(w.Reason)},
		}
		if counts {
			checks = append(checks, []struct {
				what      string
				got, want any
			}{
				{"packetDeltaCount", r.uint(0, 2), w.Packets},
				{"octetDeltaCount", r.uint(0, 1), w.Bytes},
			}...)
		} else {
			for _, ie := range []uint32{1, 2} {
				if _, ok := r[[2]uint32{0, ie}]; ok {
					t.Errorf("record %d: element %d sent by an exporter without counts", i, ie)
				}
			}
		}
		for _, c := range checks {
			if fmt.Sprint(c.got) != fmt.Sprint(c.want) {
				t.Errorf("record %d: %s %v, want %v", i, c.what, c.got, c.want)
			}
		}
	}
	if st := e.Stats(); len(st) != 1 || st[0].Sent != uint64(len(recs)) || st[0].Dropped != 0 {
		t.Errorf("stats %+v, want %d sent, none dropped", st, len(recs))
	}
}
