package netio

import (
	"net"
	"strings"
	"testing"
	"time"

	"github.com/warren-mq/warren/wire"
)

// TestPipelinedControlBurstIsAnswered: a client that writes 50,000
// declares (about 12 MB) in one burst, reading the answers as they come,
// gets every answer: while a run of its control requests is handled off
// the loop, the broker stops reading it (TCP holds the rest back) instead
// of buffering the burst or closing the connection as if it had ignored
// the memory alarm, and what it buffers stays bounded.
func TestPipelinedControlBurstIsAnswered(t *testing.T) {
	s, err := Start(Config{Addr: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close(t.Context()) })
	nc, err := net.Dial("tcp", s.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	// Redeclares of one queue with a long name: each costs the broker
	// little but an equivalence check, and the burst is large in bytes.
	const burst = 50000
	name := "pipelined." + strings.Repeat("x", 200)
	var b []byte
	b = append(b, wire.Preamble[:]...)
	b = wire.AppendFrame(b, 0, &wire.Auth{Mechanism: "PLAIN", Response: wire.PlainResponse("guest", "guest"), MaxFrame: wire.MinMaxFrame})
	b = wire.AppendFrame(b, 1, &wire.ChannelOpen{Req: 1})
	for i := 0; i < burst; i++ {
		b = wire.AppendFrame(b, 1, &wire.QueueDeclare{Req: uint32(2 + i), Name: name})
	}
	wrote := make(chan error, 1)
	go func() { _, err := nc.Write(b); wrote <- err }()
	var buf []byte
	tmp := make([]byte, 64<<10)
	_ = nc.SetReadDeadline(time.Now().Add(60 * time.Second))
	for answered := 0; answered < burst; {
		f, n, err := wire.Split(buf, wire.HardMaxFrame)
		if err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			m, err := nc.Read(tmp)
			if err != nil {
				t.Fatalf("after %d of %d answers (%d bytes written): %v", answered, burst, len(b), err)
			}
			buf = append(buf, tmp[:m]...)
			continue
		}
		buf = buf[n:]
		switch f.Type {
		case wire.TypeQueueDeclareOK:
			answered++
		case wire.TypeError, wire.TypeClose:
			body, _ := wire.Decode(f, wire.HardMaxFrame, nil)
			t.Fatalf("after %d of %d answers: %v %+v", answered, burst, f.Type, body)
		}
	}
	if err := <-wrote; err != nil {
		t.Fatal(err)
	}
	// What the broker buffered for it stayed bounded: the pause threshold,
	// plus the reads gnet makes when it re-arms the socket by itself
	// (256 KiB each) and a frame.
	var peak int64
	s.connsMu.Lock()
	for _, c := range s.conns {
		peak = max(peak, c.ctlPeak.Load())
	}
	s.connsMu.Unlock()
	t.Logf("%d bytes pipelined; at most %d buffered behind a control run", len(b), peak)
	if bound := int64(ctlPauseBytes + 1<<20); peak > bound {
		t.Fatalf("%d bytes buffered behind a control run, over %d", peak, bound)
	}
}
