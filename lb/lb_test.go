// SPDX-License-Identifier: Apache-2.0

package lb

import (
	"net/netip"
	"reflect"
	"testing"
	"time"
)

// TestServiceEqualCoversEveryField changes each field of a service in
// turn, by reflection so that a field added later is covered too, and
// checks that Equal notices.
func TestServiceEqualCoversEveryField(t *testing.T) {
	base := Service{
		Name: "web", Frontend: Frontend{Addr: netip.MustParseAddr("192.0.2.1"), Port: 80, Proto: TCP},
		SourceRanges: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")},
		Backends:     []Backend{{Addr: netip.MustParseAddrPort("10.1.0.1:80"), Weight: 1}},
		DrainTimeout: time.Second, Source: "file:x",
	}
	if !base.Equal(base.Clone()) {
		t.Fatal("a service differs from its clone")
	}
	typ := reflect.TypeOf(base)
	for i := range typ.NumField() {
		f := typ.Field(i)
		changed := base.Clone()
		v := reflect.ValueOf(&changed).Elem().Field(i)
		switch v.Kind() {
		case reflect.Slice:
			v.Set(reflect.Append(v, reflect.New(f.Type.Elem()).Elem()))
		default:
			mutate(t, f.Name, v)
		}
		if base.Equal(changed) {
			t.Errorf("Equal misses a change of field %s", f.Name)
		}
	}
}

// mutate changes v, a field of a comparable type, to another value.
func mutate(t *testing.T, name string, v reflect.Value) {
	t.Helper()
	switch v.Kind() {
	case reflect.String:
		v.SetString(v.String() + "x")
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		v.SetInt(v.Int() + 1)
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		v.SetUint(v.Uint() + 1)
	case reflect.Bool:
		v.SetBool(!v.Bool())
	case reflect.Struct:
		if v.Type() == reflect.TypeOf(netip.Addr{}) {
			v.Set(reflect.ValueOf(netip.MustParseAddr("192.0.2.99")))
			return
		}
		for i := range v.NumField() {
			if v.Field(i).CanSet() {
				mutate(t, name+"."+v.Type().Field(i).Name, v.Field(i))
				return
			}
		}
		t.Fatalf("field %s: no settable field to change", name)
	default:
		t.Fatalf("field %s: kind %s not handled by the test", name, v.Kind())
	}
}
