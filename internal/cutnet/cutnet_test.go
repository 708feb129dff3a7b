package cutnet

import (
	"bytes"
	"errors"
	"io"
	"net"
	"testing"
)

// pair accepts one connection on l and returns its two ends.
func pair(t *testing.T, l *Listener) (server, client net.Conn) {
	t.Helper()
	client, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close() })
	server, err = l.Accept()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { server.Close() })
	return server, client
}

func listen(t *testing.T) *Listener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	return &Listener{Listener: ln}
}

// TestCutOnce: the first connection to read past CutAfter bytes is
// closed at that read; what it read before arrives whole, and a later
// connection reading as much is left alone.
func TestCutOnce(t *testing.T) {
	l := listen(t)
	l.CutAfter.Store(10)
	s, c := pair(t, l)
	if _, err := c.Write([]byte("0123456789")); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, 10)
	if _, err := io.ReadFull(s, got); err != nil || !bytes.Equal(got, []byte("0123456789")) || l.Cut() {
		t.Fatalf("10 bytes of 10 allowed: %q %v, cut %v", got, err, l.Cut())
	}
	if _, err := c.Write([]byte("x")); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Read(got); !errors.Is(err, net.ErrClosed) || !l.Cut() {
		t.Fatalf("the 11th byte: %v, cut %v; want net.ErrClosed", err, l.Cut())
	}
	s2, c2 := pair(t, l)
	if _, err := c2.Write(bytes.Repeat([]byte("y"), 20)); err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(s2, make([]byte, 20)); err != nil {
		t.Fatalf("a second connection was cut too: %v", err)
	}
}

// TestCount: with Count set, only the bytes it counts bring the cut.
func TestCount(t *testing.T) {
	l := listen(t)
	l.CutAfter.Store(2)
	l.Count = func() func([]byte) int64 {
		return func(p []byte) int64 { return int64(bytes.Count(p, []byte("!"))) }
	}
	s, c := pair(t, l)
	if _, err := c.Write(bytes.Repeat([]byte("a!"), 2)); err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(s, make([]byte, 4)); err != nil || l.Cut() {
		t.Fatalf("2 counted bytes of 2 allowed: %v, cut %v", err, l.Cut())
	}
	if _, err := c.Write([]byte("!")); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Read(make([]byte, 4)); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("the third counted byte: %v, want net.ErrClosed", err)
	}
}
