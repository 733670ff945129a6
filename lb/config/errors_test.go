// SPDX-License-Identifier: Apache-2.0

package config

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"unicode/utf8"
)

func TestErrorFormat(t *testing.T) {
	tests := []struct {
		err  Error
		want string
	}{
		{Error{File: "l4lb.toml", Line: 12, Service: "web", Backend: "10.1.0.11:30080", Msg: "address family differs from VIP 2001:db8::10"},
			`l4lb.toml:12: service "web": backend 10.1.0.11:30080: address family differs from VIP 2001:db8::10`},
		{Error{File: "l4lb.toml", Line: 3, Msg: "datapath.mode: unknown mode"},
			`l4lb.toml:3: datapath.mode: unknown mode`},
		{Error{File: "l4lb.toml", Service: "web", Msg: "m"},
			`l4lb.toml: service "web": m`},
		{Error{File: "consul KV l4lb/services/web", Line: 2, Service: "web", Msg: "m"},
			`consul KV l4lb/services/web:2: service "web": m`},
		{Error{Line: 7, Backend: "#2", Msg: "m"},
			`line 7: backend #2: m`},
		{Error{Msg: "m"}, `m`},
	}
	for _, tt := range tests {
		if got := tt.err.Error(); got != tt.want {
			t.Errorf("Error() = %q, want %q", got, tt.want)
		}
	}
}

func TestErrorList(t *testing.T) {
	list := ErrorList{
		{File: "f", Line: 9, Msg: "b"},
		{File: "f", Line: 2, Msg: "a"},
		{File: "f", Line: 9, Msg: "c"},
	}
	list.sortByLine()
	if got, want := list.Error(), "f:2: a\nf:9: b\nf:9: c"; got != want {
		t.Errorf("sorted list = %q, want %q (stable within a line)", got, want)
	}

	wrapped := fmt.Errorf("reload: %w", list)
	var back ErrorList
	if !errors.As(wrapped, &back) || len(back) != 3 {
		t.Fatalf("errors.As(ErrorList) failed on %v", wrapped)
	}
	var first *Error
	if !errors.As(wrapped, &first) || first.Msg != "a" {
		t.Errorf("errors.As(*Error) = %v, want the first error", first)
	}
}

// TestLongValuesClipped: an error repeats at most a few hundred bytes of
// an operator's value, whoever quoted it (this package, or a parser of
// another one), so a megabyte-long value cannot make a megabyte-long error
// or log line.
func TestLongValuesClipped(t *testing.T) {
	long := strings.Repeat("x", 1<<20)
	for _, tt := range []struct {
		name, key, value string
	}{
		{"enum of lb", "protocol", long},                      // lb.ParseProtocol quotes it
		{"enum of config", "algorithm", long},                 // this package's message
		{"escaped", "protocol", strings.Repeat(`"\é`, 1<<18)}, // quotes, backslashes and UTF-8 cut safely
	} {
		t.Run(tt.name, func(t *testing.T) {
			doc := fmt.Sprintf("[datapath]\ninterfaces = [\"eth0\"]\n[maglev]\nhash_seed = \"5f1c0ffee0ddba11deadbeef00c0ffee\"\n"+
				"[[service]]\nname = \"web\"\nvip = \"10.0.0.10\"\nport = 80\nprotocol = \"tcp\"\n%s = %q\n[[service.backend]]\naddress = \"10.1.0.11\"\n",
				tt.key, tt.value)
			doc = strings.Replace(doc, "protocol = \"tcp\"\nprotocol", "protocol", 1)
			_, err := Parse("f.toml", []byte(doc), Options{})
			if err == nil {
				t.Fatal("accepted")
			}
			msg := err.Error()
			if len(msg) > 1024 || !strings.Contains(msg, " bytes)") || !utf8.ValidString(msg) {
				t.Errorf("error of %d bytes (valid UTF-8: %v): %.600s", len(msg), utf8.ValidString(msg), msg)
			}
			t.Logf("%s", msg)
		})
	}
	// Short values and messages stay whole.
	short := `service "web": protocol: unknown protocol "sctp" (want tcp or udp)`
	if got := clipQuoted(short + strings.Repeat(" hint", 100)); got != short+strings.Repeat(" hint", 100) {
		t.Errorf("clipQuoted changed a message without a long value: %q", got)
	}
}
