// SPDX-License-Identifier: Apache-2.0

package config

import (
	"fmt"
	"strings"
	"testing"
)

// bigConfig builds a file with n services of m backends each, the size of
// a large appliance, to keep parse and reload cost in view.
func bigConfig(n, m int) []byte {
	var b strings.Builder
	b.WriteString(head)
	for i := 0; i < n; i++ {
		fmt.Fprintf(&b, "\n[[service]]\nname = \"svc-%d\"\nvip = \"10.%d.%d.1\"\nport = 80\nprotocol = \"tcp\"\n", i, i/256, i%256)
		fmt.Fprintf(&b, "[service.health]\ntype = \"tcp\"\n")
		for j := 0; j < m; j++ {
			fmt.Fprintf(&b, "[[service.backend]]\naddress = \"172.16.%d.%d\"\nweight = %d\n", j/256, j%256+1, j%3+1)
		}
	}
	return []byte(b.String())
}

func BenchmarkParse(b *testing.B) {
	for _, size := range []struct{ services, backends int }{{10, 10}, {1000, 16}, {4096, 16}} {
		data := bigConfig(size.services, size.backends)
		b.Run(fmt.Sprintf("services=%d/backends=%d", size.services, size.backends), func(b *testing.B) {
			b.SetBytes(int64(len(data)))
			b.ReportAllocs()
			for b.Loop() {
				if _, err := Parse("big.toml", data, Options{}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkParserReload is a reload of a large file that changed one
// backend: the Parser decodes one block and runs the rules across the
// whole file's services.
func BenchmarkParserReload(b *testing.B) {
	data := bigConfig(4096, 16)
	edited := []byte(strings.Replace(string(data), "weight = 2\n", "weight = 3\n", 1))
	p := NewParser()
	if _, err := p.Parse("big.toml", data, Options{}); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		in := data
		if i%2 == 0 {
			in = edited
		}
		if _, err := p.Parse("big.toml", in, Options{}); err != nil {
			b.Fatal(err)
		}
	}
}
