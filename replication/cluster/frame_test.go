package cluster

import (
	"bytes"
	"encoding/binary"
	"strings"
	"testing"
)

// TestFrameChecks: a frame over the size limit, an empty one and one of
// an unknown kind are refused before anything is read into memory.
func TestFrameChecks(t *testing.T) {
	var buf []byte
	big := make([]byte, 5)
	binary.BigEndian.PutUint32(big, 1<<30)
	big[4] = kindRaft
	if _, _, err := readFrame(bytes.NewReader(big), &buf, 1<<20); err == nil || !strings.Contains(err.Error(), "limit") {
		t.Fatalf("oversized frame: %v", err)
	}
	if cap(buf) > 1<<20 {
		t.Fatalf("an oversized frame made the reader allocate %d bytes", cap(buf))
	}
	if _, _, err := readFrame(bytes.NewReader([]byte{0, 0, 0, 0}), &buf, 1<<20); err == nil {
		t.Fatal("empty frame accepted")
	}
	if _, _, err := readFrame(bytes.NewReader([]byte{0, 0, 0, 1, 99}), &buf, 1<<20); err == nil || !strings.Contains(err.Error(), "kind") {
		t.Fatalf("unknown kind: %v", err)
	}
	// A hello of another version is refused with a clear error.
	h := appendHello(nil, hello{version: version + 1, from: 1, to: 2})
	if _, err := parseHello(h[5:]); err == nil || !strings.Contains(err.Error(), "version") {
		t.Fatalf("hello of another version: %v", err)
	}
	// A raft batch whose entry runs past the frame is refused.
	b := binary.BigEndian.AppendUint64(nil, 7)
	b = binary.BigEndian.AppendUint32(b, 100)
	if err := eachMessage(b, func(uint64, []byte) error { return nil }); err == nil {
		t.Fatal("truncated batch accepted")
	}
}
