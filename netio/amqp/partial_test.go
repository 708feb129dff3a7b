package amqp_test

import (
	"encoding/binary"
	"strings"
	"testing"

	"github.com/warren-mq/warren/netio/amqp"
)

// publishHeader sends basic.publish to the default exchange and a content
// header announcing a body of size bytes on channel ch (no body).
func publishHeader(t *testing.T, nc interface{ Write([]byte) (int, error) }, ch uint16, size uint64) {
	t.Helper()
	p := binary.BigEndian.AppendUint16(nil, 60)
	p = binary.BigEndian.AppendUint16(p, 40)
	p = append(p, 0, 0, 0, 1, 'q', 0) // ticket, exchange "", key "q", flags
	writeFrame(t, nc, 1, ch, p)
	h := binary.BigEndian.AppendUint16(nil, 60)
	h = binary.BigEndian.AppendUint16(h, 0)
	h = binary.BigEndian.AppendUint64(h, size)
	h = binary.BigEndian.AppendUint16(h, 0) // no properties
	writeFrame(t, nc, 2, ch, h)
}

// TestPartialContentBound: the content headers of a connection's
// publishes whose bodies have not come may announce at most 4 times the
// max message size together (each one's buffer is made that size at its
// header); past it the header is refused with 406 naming the bound, on
// its channel only, and a body that completes a message makes room again.
// Before, a client announcing 16 MiB on each of its 2,047 channels and
// sending no body made the broker allocate 32 GiB.
func TestPartialContentBound(t *testing.T) {
	const max = 1000
	_, l, _ := start(t, amqp.Config{MaxMessageSize: max})
	nc := rawConn(t, l.Addr().String())
	for ch := uint16(1); ch <= 6; ch++ {
		writeFrame(t, nc, 1, ch, []byte{0, 20, 0, 10, 0}) // channel.open
		if cm := readMethod(t, nc); cm != [2]uint16{20, 11} {
			t.Fatalf("channel.open-ok, got %v", cm)
		}
	}
	for ch := uint16(1); ch <= 4; ch++ { // 4 × max: at the bound
		publishHeader(t, nc, ch, max)
	}
	publishHeader(t, nc, 5, 1)
	cm, p := readMethodPayload(t, nc)
	if cm != [2]uint16{20, 40} {
		t.Fatalf("a fifth header past 4 × the max message size: want channel.close, got %v", cm)
	}
	code := binary.BigEndian.Uint16(p)
	text := string(p[3 : 3+int(p[2])])
	if code != 406 || !strings.Contains(text, "at most 4000") {
		t.Fatalf("channel.close %d %q, want 406 naming the bound", code, text)
	}
	writeFrame(t, nc, 1, 5, []byte{0, 20, 0, 41}) // close-ok
	// Channel 1's body completes its message: room for channel 6's, whose
	// message completes and whose channel.close is then answered (a refused
	// header would have closed the channel from the broker's side first).
	writeFrame(t, nc, 3, 1, make([]byte, max))
	publishHeader(t, nc, 6, max)
	writeFrame(t, nc, 3, 6, make([]byte, max))
	writeFrame(t, nc, 1, 6, []byte{0, 20, 0, 40, 0, 200, 0, 0, 0, 0}) // channel.close
	if cm := readMethod(t, nc); cm != [2]uint16{20, 41} {
		t.Fatalf("channel 6 after a body made room: want close-ok, got %v", cm)
	}
}
