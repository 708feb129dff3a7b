package netio

import (
	"net/netip"
	"testing"
)

// Every header, cut at every byte, asks for more until it is whole, then
// parses to the same length and source.
func TestParseProxyHeaderSplit(t *testing.T) {
	v2tlv := []byte("\r\n\r\n\x00\r\nQUIT\n\x21\x11\x00\x13" + // 12 address bytes + a 7-byte TLV
		"\xc0\x00\x02\x01\x7f\x00\x00\x01\x1f\x40\x16\x30" + "\x04\x00\x04abcd")
	cases := []struct {
		in   string
		src  string // "" for none
		tail string
	}{
		{"PROXY TCP4 192.0.2.1 127.0.0.1 8000 5680\r\n", "192.0.2.1:8000", "WARREN"},
		{"PROXY TCP6 2001:db8::7 ::1 65535 5680\r\n", "[2001:db8::7]:65535", "W"},
		{"PROXY UNKNOWN\r\n", "", "WARREN"},
		{"PROXY UNKNOWN ffff::1 ffff::2 1 2\r\n", "", ""},
		{string(v2tlv), "192.0.2.1:8000", "WARREN"},
	}
	for _, tc := range cases {
		full := []byte(tc.in + tc.tail)
		for cut := 0; cut < len(tc.in); cut++ {
			if n, _, err := parseProxyHeader(full[:cut]); n != 0 || err != nil {
				t.Fatalf("%q cut at %d: n=%d err=%v, want a request for more", tc.in, cut, n, err)
			}
		}
		n, src, err := parseProxyHeader(full)
		if err != nil || n != len(tc.in) {
			t.Fatalf("%q: n=%d err=%v, want %d", tc.in, n, err, len(tc.in))
		}
		want := netip.AddrPort{}
		if tc.src != "" {
			want = netip.MustParseAddrPort(tc.src)
		}
		if src != want {
			t.Fatalf("%q: source %v, want %v", tc.in, src, want)
		}
	}
}
