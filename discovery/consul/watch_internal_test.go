// SPDX-License-Identifier: Apache-2.0

package consul

import (
	"testing"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/l4lb/l4lb/lb/config"
)

// TestServiceWait: the services' own watches wait Options.Wait while few,
// longer as they grow (20 timed-out answers a second in all), never past
// Consul's 10 minutes; a configured wait above that is kept.
func TestServiceWait(t *testing.T) {
	for _, tt := range []struct {
		wait    time.Duration
		watches int64
		want    time.Duration
	}{
		{time.Minute, 0, time.Minute},
		{time.Minute, 1000, time.Minute},
		{time.Minute, 2000, 100 * time.Second},
		{time.Minute, 10000, 500 * time.Second},
		{time.Minute, 100000, 10 * time.Minute},
		{200 * time.Millisecond, 2, 200 * time.Millisecond},
		{200 * time.Millisecond, 10, 500 * time.Millisecond},
		{15 * time.Minute, 10000, 15 * time.Minute},
	} {
		s := &Source{opts: Options{Wait: tt.wait}}
		s.serviceWatches.Store(tt.watches)
		if got := s.serviceWait(); got != tt.want {
			t.Errorf("wait %v, %d watches: %v, want %v", tt.wait, tt.watches, got, tt.want)
		}
	}
}

// TestSetKVUnchanged: an answer of the KV watch that holds the same keys at
// the same modify indexes (Consul moves a prefix's index with writes
// anywhere in the store, such as the fleet records) changes nothing and
// wakes nobody; a changed, added or removed key is taken.
func TestSetKVUnchanged(t *testing.T) {
	s := &Source{changed: make(chan struct{}, 1)}
	pair := func(key string, modify uint64) *api.KVPair {
		return &api.KVPair{Key: key, ModifyIndex: modify, Value: []byte(`{"vip":"192.0.2.1","port":80,"backends":["10.0.0.1:8080"]}`)}
	}
	woke := func() bool {
		select {
		case <-s.changed:
			return true
		default:
			return false
		}
	}
	for _, step := range []struct {
		name  string
		pairs api.KVPairs
		taken bool
	}{
		{"first answer, empty", nil, true},
		{"still empty", nil, false},
		{"a key", api.KVPairs{pair("l4lb/services/a", 5)}, true},
		{"the same key, same index", api.KVPairs{pair("l4lb/services/a", 5)}, false},
		{"the key changed", api.KVPairs{pair("l4lb/services/a", 7)}, true},
		{"a key added", api.KVPairs{pair("l4lb/services/a", 7), pair("l4lb/services/b", 9)}, true},
		{"a key removed", api.KVPairs{pair("l4lb/services/b", 9)}, true},
		{"nothing new", api.KVPairs{pair("l4lb/services/b", 9)}, false},
	} {
		s.reshaped = false
		s.setKV(step.pairs)
		if got := woke(); got != step.taken || s.reshaped != step.taken {
			t.Errorf("%s: woke %v, reshaped %v; want %v", step.name, got, s.reshaped, step.taken)
		}
		if s.kv == nil {
			t.Fatalf("%s: no KV view after an answer", step.name)
		}
	}
}

// TestLocalAgentUncompressed: answers from an agent on this box are not
// gzipped (CPU on both ends for nothing); from another host they may be.
func TestLocalAgentUncompressed(t *testing.T) {
	for _, tt := range []struct {
		address string
		local   bool
	}{
		{"127.0.0.1:8500", true},
		{"localhost:8500", true},
		{"[::1]:8500", true},
		{"unix:///run/consul/http.sock", true},
		{"127.0.0.1", true},
		{"10.0.0.5:8500", false},
		{"consul.service.example:8500", false},
	} {
		ac, err := clientConfig(&config.Consul{Address: tt.address})
		if err != nil {
			t.Fatal(err)
		}
		uncompressed := ac.Transport != nil && ac.Transport.DisableCompression
		if uncompressed != tt.local {
			t.Errorf("%s: compression disabled %v, want %v", tt.address, uncompressed, tt.local)
		}
	}
}
