package freeport

import (
	"net"
	"strconv"
	"testing"
)

func port(t *testing.T, addr string) int {
	t.Helper()
	_, p, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatal(err)
	}
	n, err := strconv.Atoi(p)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// TestPortsOutsideEphemeralRange: the ports handed out and listened on
// lie in Range, outside the kernel's ephemeral range (which a freed
// 127.0.0.1:0 port is in), distinct, and free: listening on them works.
func TestPortsOutsideEphemeralRange(t *testing.T) {
	lo, hi := Range()
	if hi-lo < minSpan {
		t.Fatalf("Range [%d, %d): fewer than %d ports", lo, hi, minSpan)
	}
	for _, p := range []int{lo, hi - 1} {
		if Ephemeral(p) {
			t.Fatalf("Range [%d, %d) reaches into the ephemeral range (port %d)", lo, hi, p)
		}
	}
	addrs, err := Addrs(5)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, a := range addrs {
		if p := port(t, a); p < lo || p >= hi || seen[a] {
			t.Fatalf("Addrs gave %s: outside [%d, %d) or twice (%v)", a, lo, hi, addrs)
		}
		seen[a] = true
		l, err := net.Listen("tcp", a)
		if err != nil {
			t.Fatalf("Addrs gave %s, not free: %v", a, err)
		}
		l.Close()
	}
	l, err := Listen()
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	if p := port(t, addr); p < lo || p >= hi {
		t.Fatalf("Listen on %s: outside [%d, %d)", addr, lo, hi)
	}
	l.Close()
	if l, err = net.Listen("tcp", addr); err != nil {
		t.Fatalf("listening again on %s: %v", addr, err)
	}
	l.Close()

	// What a freed 127.0.0.1:0 port is, for contrast: the kernel's.
	l, err = net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if _, _, ok := ephemeral(); ok && !Ephemeral(port(t, l.Addr().String())) {
		t.Fatalf("a 127.0.0.1:0 listener got %s, not in the ephemeral range read", l.Addr())
	}
}
