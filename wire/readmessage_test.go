package wire

import (
	"bytes"
	"math/rand/v2"
	"testing"
)

// TestReadMessageRoundTrip: ReadMessage reads back, as views, what
// AppendMessage wrote, one message after another, and refuses every
// truncation of it (ok false, never a panic); it allocates nothing.
func TestReadMessageRoundTrip(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	var buf []byte
	var want []Message
	for range 50 {
		m := Message{Flags: MessageFlags(r.IntN(4)), Priority: uint8(r.IntN(10)),
			RoutingKey: bytes.Repeat([]byte{'k'}, r.IntN(256)), Properties: bytes.Repeat([]byte{1}, r.IntN(300)), Body: bytes.Repeat([]byte{'b'}, r.IntN(5000))}
		want = append(want, m)
		buf = AppendMessage(buf, &m)
	}
	rest := buf
	for i, w := range want {
		var m Message
		var ok bool
		rest, ok = ReadMessage(rest, &m)
		if !ok || m.Flags != w.Flags || m.Priority != w.Priority || !bytes.Equal(m.RoutingKey, w.RoutingKey) ||
			!bytes.Equal(m.Properties, w.Properties) || !bytes.Equal(m.Body, w.Body) {
			t.Fatalf("message %d: read %+v ok %v", i, m, ok)
		}
	}
	if len(rest) != 0 {
		t.Fatalf("%d bytes left", len(rest))
	}
	one := AppendMessage(nil, &want[3])
	for n := range len(one) {
		var m Message
		if _, ok := ReadMessage(one[:n], &m); ok {
			t.Fatalf("read a message from %d of its %d bytes", n, len(one))
		}
	}
	var m Message
	if a := testing.AllocsPerRun(100, func() { ReadMessage(one, &m) }); a != 0 {
		t.Fatalf("%v allocations", a)
	}
}
