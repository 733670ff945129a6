// SPDX-License-Identifier: Apache-2.0

package config

import (
	"errors"
	"fmt"
	"testing"
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
