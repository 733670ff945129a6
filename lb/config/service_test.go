// SPDX-License-Identifier: Apache-2.0

package config

import (
	"errors"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/l4lb/l4lb/lb"
)

const kvWhere = "consul KV l4lb/services/web"

func TestParseServiceValid(t *testing.T) {
	want := lb.Service{
		Name:     "web",
		Frontend: fe("10.0.0.10", 80, lb.TCP),
		Mode:     lb.ModeDSR,
		Affinity: lb.Affinity{ClientIP: true, Timeout: time.Hour},
		SourceRanges: []netip.Prefix{
			prefix("192.0.2.0/24"),
		},
		Health: lb.HealthCheck{Type: lb.HealthHTTP, Interval: 5 * time.Second, Timeout: 2 * time.Second,
			Rise: 2, Fall: 3, Path: "/healthz", ExpectStatus: 200},
		Backends: []lb.Backend{
			{Addr: ap("10.1.0.11:80"), Weight: 1},
			{Addr: ap("10.1.0.12:80"), Weight: 0, State: lb.Draining},
		},
	}
	docs := map[string]string{
		"toml": `
name = "web"
vip = "10.0.0.10"
port = 80
protocol = "tcp"
mode = "dsr"
affinity = "client-ip"
affinity_timeout = "1h"
source_ranges = ["192.0.2.0/24"]

[health]
type = "http"
path = "/healthz"

[[backend]]
address = "10.1.0.11"

[[backend]]
address = "10.1.0.12"
weight = 0
state = "draining"
`,
		"json": `  {
  "name": "web",
  "vip": "10.0.0.10",
  "port": 80,
  "protocol": "tcp",
  "mode": "dsr",
  "affinity": "client-ip",
  "affinity_timeout": "1h",
  "source_ranges": ["192.0.2.0/24"],
  "health": {"type": "http", "path": "/healthz"},
  "backend": [
    {"address": "10.1.0.11"},
    {"address": "10.1.0.12", "weight": 0, "state": "draining"}
  ]
}
`,
	}
	for format, doc := range docs {
		t.Run(format, func(t *testing.T) {
			got, err := ParseService(kvWhere, []byte(doc), lb.Defaults{})
			if err != nil {
				t.Fatalf("ParseService:\n%v", err)
			}
			if diff := cmp.Diff(want, got, netipComparers); diff != "" {
				t.Errorf("mismatch (-want +got):\n%s", diff)
			}
		})
	}
}

func TestParseServiceInvalid(t *testing.T) {
	tests := []struct {
		name     string
		defaults lb.Defaults
		doc      string
		want     []string // each "LINE: substring", in line order
	}{
		{
			name: "toml unknown keys at every level",
			doc: `name = "web"
vip = "10.0.0.10"
port = 80
protocol = "tcp"
colour = "red"
[health]
type = "tcp"
intervall = "5s"
[[backend]]
address = "10.1.0.11"
wieght = 1
`,
			want: []string{
				`5: service "web": unknown key "colour" at the top level`,
				`8: service "web": unknown key "intervall" in [health]: did you mean "interval"?`,
				`11: service "web": backend 10.1.0.11:80: unknown key "wieght" in [[backend]]: did you mean "weight"?`,
			},
		},
		{
			name: "toml semantic errors",
			doc: `name = "web"
vip = "2001:db8::10"
port = 80
protocol = "tcp"

[[backend]]
address = "10.1.0.11"
port = 30080

[[backend]]
address = "2001:db8::11"
weight = -1
`,
			want: []string{
				`7: service "web": backend 10.1.0.11:30080: address family differs from VIP 2001:db8::10`,
				`12: service "web": backend [2001:db8::11]:80: weight = -1 is negative`,
			},
		},
		{
			name: "toml missing required keys",
			doc:  "# nothing but a comment\n",
			want: []string{
				`0: service "#1": name is missing`,
				`0: service "#1": vip is missing`,
				`0: service "#1": port is missing`,
				`0: service "#1": protocol is missing`,
			},
		},
		{
			name: "toml syntax error",
			doc:  "name = \"web\"\nvip = 10.0.0.10\n",
			want: []string{`2: invalid TOML`},
		},
		{
			name: "toml backend as a plain table",
			doc:  "name = \"web\"\nvip = \"10.0.0.10\"\nport = 80\nprotocol = \"tcp\"\n[backend]\naddress = \"10.1.0.11\"\n",
			want: []string{`5: [backend] must be written [[backend]]`},
		},
		{
			name:     "toml DSR over IPIP from the daemon defaults",
			defaults: lb.Defaults{Mode: lb.ModeDSR},
			doc:      "name = \"web\"\nvip = \"10.0.0.10\"\nport = 80\nprotocol = \"tcp\"\n[[backend]]\naddress = \"10.1.0.11\"\nport = 8080\n",
			want:     []string{`7: service "web": backend 10.1.0.11:8080: port 8080 differs from the service port 80, but with mode "dsr" and dsr_dispatch "ipip"`},
		},
		{
			name:     "toml backends beyond the daemon table size",
			defaults: lb.Defaults{TableSize: 3},
			doc: "name = \"web\"\nvip = \"10.0.0.10\"\nport = 80\nprotocol = \"tcp\"\n" +
				strings.Repeat("[[backend]]\naddress = \"10.1.0.1\"\n", 1) +
				"[[backend]]\naddress = \"10.1.0.2\"\n[[backend]]\naddress = \"10.1.0.3\"\n[[backend]]\naddress = \"10.1.0.4\"\n",
			want: []string{`0: service "web": 4 backends have weight > 0 but the Maglev table has only 3 slots`},
		},
		{
			name: "json unknown and duplicate keys",
			doc: `{
  "name": "web",
  "vip": "10.0.0.10",
  "port": 80,
  "protocol": "tcp",
  "protocl": "udp",
  "health": {"type": "tcp", "intervall": "5s"},
  "backend": [
    {"address": "10.1.0.11"},
    {"address": "10.1.0.12",
     "wieght": 2},
    {"address": "10.1.0.13", "state": "active", "state": "draining"}
  ]
}`,
			want: []string{
				`6: service "web": unknown key "protocl" at the top level: did you mean "protocol"?`,
				`7: service "web": unknown key "intervall" in health: did you mean "interval"?`,
				`11: service "web": backend 10.1.0.12:80: unknown key "wieght" in backend[1]: did you mean "weight"?`,
				`12: service "web": backend 10.1.0.13:80: duplicate key "state"`,
			},
		},
		{
			name: "json semantic and type errors",
			doc: `{
  "name": "web",
  "vip": "10.0.0.10",
  "port": 70000,
  "protocol": "sctp",
  "backend": [
    {"address": "10.1.0.11", "port": "80"},
    {"address": "10.1.0.12", "weight": 1.5}
  ]
}`,
			want: []string{
				`4: service "web": port = 70000 is out of range`,
				`5: service "web": protocol: unknown protocol "sctp"`,
				`7: service "web": backend 10.1.0.11: port must be an integer, not string "80"`,
				`8: service "web": backend 10.1.0.12: weight must be an integer, not number 1.5`,
			},
		},
		{
			name: "json syntax error",
			doc:  "{\n  \"name\": \"web\",\n  \"vip\": 10.0.0.10\n}\n",
			want: []string{`3: JSON syntax error`},
		},
		{
			name: "json truncated",
			doc:  "{\n  \"name\": \"web\",\n",
			want: []string{`3: JSON document ends early`},
		},
		{
			name: "json trailing data",
			doc:  "{\"name\": \"web\", \"vip\": \"10.0.0.10\", \"port\": 80, \"protocol\": \"tcp\"}\n{}\n",
			want: []string{`2: unexpected data after the service object`},
		},
		{
			name: "json object where an array of backends belongs",
			doc:  "{\n\"name\": \"web\",\n\"backend\": {\"address\": \"10.1.0.11\"}\n}",
			want: []string{`3: backend must be an array of objects, not object`},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := ParseService(kvWhere, []byte(tt.doc), tt.defaults)
			var list ErrorList
			if !errors.As(err, &list) {
				t.Fatalf("ParseService error = %v (%T), want an ErrorList", err, err)
			}
			if len(list) != len(tt.want) {
				t.Errorf("got %d errors, want %d:\n%v", len(list), len(tt.want), err)
			}
			for i, w := range tt.want {
				line, sub, _ := strings.Cut(w, ": ")
				prefix := kvWhere + ":" + line + ": "
				if line == "0" {
					prefix = kvWhere + ": "
				}
				if i >= len(list) {
					t.Errorf("missing error %q", w)
					continue
				}
				if got := list[i].Error(); !strings.HasPrefix(got, prefix) || !strings.Contains(got, sub) {
					t.Errorf("error %d = %q, want prefix %q and %q", i, got, prefix, sub)
				}
			}
		})
	}
}

func TestParseServiceSameChecksAsFile(t *testing.T) {
	// A service body that is invalid in the file must be invalid on its
	// own too, with the same message.
	body := "name = \"web\"\nvip = \"10.0.0.10\"\nport = 80\nprotocol = \"tcp\"\ntable_size = 4096\n"
	_, fileErr := Parse("f.toml", []byte(head+"[[service]]\n"+body), Options{})
	_, kvErr := ParseService("kv", []byte(body), lb.Defaults{})
	if fileErr == nil || kvErr == nil {
		t.Fatalf("file error %v, KV error %v; want both to fail", fileErr, kvErr)
	}
	var fl, kl ErrorList
	errors.As(fileErr, &fl)
	errors.As(kvErr, &kl)
	if len(fl) != 1 || len(kl) != 1 || fl[0].Msg != kl[0].Msg || fl[0].Service != kl[0].Service {
		t.Errorf("file and KV disagree:\n%v\n%v", fileErr, kvErr)
	}
}
