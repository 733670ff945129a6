// SPDX-License-Identifier: Apache-2.0

package maglev

import (
	"net/netip"
	"strings"
	"testing"
)

func TestParseSeed(t *testing.T) {
	want := Seed{0x00, 0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77, 0x88, 0x99, 0xaa, 0xbb, 0xcc, 0xdd, 0xee, 0xff}
	tests := []struct {
		in      string
		wantErr string
	}{
		{in: "00112233445566778899aabbccddeeff"},
		{in: "00112233445566778899AABBCCDDEEFF"},
		{in: "00112233445566778899aAbBcCdDeEfF"},
		{in: "", wantErr: "hash seed is empty: want 32 hex digits (16 bytes), e.g. from `openssl rand -hex 16`"},
		{in: "00112233445566778899aabbccddee", wantErr: "hash seed has 30 hex digits, want exactly 32 (16 bytes), e.g. from `openssl rand -hex 16`"},
		{in: "00112233445566778899aabbccddeeff00", wantErr: "hash seed has 34 hex digits, want exactly 32 (16 bytes), e.g. from `openssl rand -hex 16`"},
		{in: "0x112233445566778899aabbccddeeff", wantErr: "hash seed has invalid character 'x' at position 2: want exactly 32 hex digits (0-9, a-f), without prefix or separators"},
		{in: "00112233-44556677-8899aabb-ccddeeff", wantErr: "hash seed has invalid character '-' at position 9: want exactly 32 hex digits (0-9, a-f), without prefix or separators"},
		{in: "00112233445566778899aabbccddeefg", wantErr: "hash seed has invalid character 'g' at position 32: want exactly 32 hex digits (0-9, a-f), without prefix or separators"},
		{in: " 00112233445566778899aabbccddeeff", wantErr: "hash seed has invalid character ' ' at position 1: want exactly 32 hex digits (0-9, a-f), without prefix or separators"},
	}
	for _, tt := range tests {
		got, err := ParseSeed(tt.in)
		switch {
		case tt.wantErr == "" && err != nil:
			t.Errorf("ParseSeed(%q): %v", tt.in, err)
		case tt.wantErr == "" && got != want:
			t.Errorf("ParseSeed(%q) = %x, want %x", tt.in, got, want)
		case tt.wantErr != "" && err == nil:
			t.Errorf("ParseSeed(%q) = %v, want error %q", tt.in, got, tt.wantErr)
		case tt.wantErr != "" && err.Error() != tt.wantErr:
			t.Errorf("ParseSeed(%q) error:\n got %q\nwant %q", tt.in, err, tt.wantErr)
		}
	}
}

func TestSeedString(t *testing.T) {
	s, err := ParseSeed("00112233445566778899AABBCCDDEEFF")
	if err != nil {
		t.Fatal(err)
	}
	if got, want := s.String(), "00112233445566778899aabbccddeeff"; got != want {
		t.Errorf("String() = %q, want %q", got, want)
	}
	back, err := ParseSeed(s.String())
	if err != nil || back != s {
		t.Errorf("ParseSeed(String()) = %x, %v; want %x", back, err, s)
	}
	if s.IsZero() || !(Seed{}).IsZero() {
		t.Errorf("IsZero: got %v for a set seed and %v for the zero seed", s.IsZero(), (Seed{}).IsZero())
	}
}

func TestFingerprint(t *testing.T) {
	ap := netip.MustParseAddrPort
	base := []Backend{{ap("10.0.0.1:80"), 1}, {ap("10.0.0.2:80"), 2}, {ap("[2001:db8::1]:80"), 1}}
	fp := Fingerprint(testSeed, 251, base)
	if len(fp) != 16 || strings.Trim(fp, "0123456789abcdef") != "" {
		t.Fatalf("Fingerprint = %q, want 16 lower-case hex digits", fp)
	}
	if strings.Contains(testSeed.String(), fp) || strings.Contains(fp, testSeed.String()[:8]) {
		t.Errorf("Fingerprint %q shows part of the seed %s", fp, testSeed)
	}

	otherSeed := testSeed
	otherSeed[0] ^= 1
	same := map[string][]Backend{
		"reordered":          {base[2], base[0], base[1]},
		"zero weight listed": append([]Backend{{ap("10.0.0.9:80"), 0}}, base...),
	}
	for name, bs := range same {
		if got := Fingerprint(testSeed, 251, bs); got != fp {
			t.Errorf("%s: fingerprint %s, want %s (same table)", name, got, fp)
		}
	}
	differ := map[string]string{
		"seed":    Fingerprint(otherSeed, 251, base),
		"size":    Fingerprint(testSeed, 509, base),
		"weight":  Fingerprint(testSeed, 251, []Backend{base[0], {base[1].Addr, 3}, base[2]}),
		"backend": Fingerprint(testSeed, 251, base[:2]),
		"port":    Fingerprint(testSeed, 251, []Backend{base[0], base[1], {ap("[2001:db8::1]:81"), 1}}),
	}
	for name, got := range differ {
		if got == fp {
			t.Errorf("changing the %s left the fingerprint at %s", name, fp)
		}
	}
}
