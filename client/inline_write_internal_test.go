package client

import (
	"bytes"
	"context"
	"encoding/binary"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/warren-mq/warren/wire"
)

// tcpPair is a connected loopback pair: the client's end and the peer's.
func tcpPair(t *testing.T) (*net.TCPConn, *net.TCPConn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	nc, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	peer, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nc.Close(); peer.Close() })
	return nc.(*net.TCPConn), peer.(*net.TCPConn)
}

// inlineConn is a Conn over nc, past its handshake, whose writer
// goroutine is not started (the test starts it when it wants one).
func inlineConn(nc *net.TCPConn) *Conn {
	c := &Conn{nc: nc, channels: map[uint16]*Channel{}, done: make(chan struct{}), flowOn: true, settles: map[*Channel]struct{}{}, maxFrame: wire.DefaultMaxFrame}
	c.opts.ConfirmWindow = 1 << 20
	c.wcond = sync.NewCond(&c.wmu)
	c.flowCond = sync.NewCond(&c.mu)
	c.raw, _ = nc.SyscallConn()
	return c
}

// publishedSeqs reads PUBLISH frames from b and returns, in wire order,
// the sequence number each message's body carries (its first 8 bytes).
func publishedSeqs(t *testing.T, b []byte) []uint64 {
	t.Helper()
	var seqs []uint64
	for len(b) > 0 {
		f, n, err := wire.Split(b, wire.HardMaxFrame)
		if err != nil || n == 0 {
			t.Fatalf("stream: %v (n %d, %d bytes left)", err, n, len(b))
		}
		if f.Type != wire.TypePublish {
			t.Fatalf("frame type %v, want PUBLISH", f.Type)
		}
		var d wire.Decompressor
		var batch wire.PublishBatch
		if err := wire.DecodePublish(f, wire.HardMaxFrame, &d, &batch); err != nil {
			t.Fatal(err)
		}
		var m wire.Message
		for it := batch.Messages(); it.Next(&m); {
			seqs = append(seqs, binary.BigEndian.Uint64(m.Body))
		}
		b = b[n:]
	}
	return seqs
}

// A publish on a quiet plain-TCP socket writes itself, with no writer
// goroutine involved; when the socket takes only part of it (full), the
// rest goes first with the writer, and the stream stays in order.
func TestPublishWritesInlineWhenQuiet(t *testing.T) {
	nc, peer := tcpPair(t)
	_ = nc.SetWriteBuffer(4096) // fills after a few messages while the peer does not read
	_ = peer.SetReadBuffer(4096)
	c := inlineConn(nc)
	ch := newChannel(c, 1)
	body := make([]byte, 1000)
	publish := func(seq uint64) {
		t.Helper()
		binary.BigEndian.PutUint64(body, seq)
		ch.release(int(ch.unconfirmed)) // as if every earlier one were confirmed
		if _, err := ch.PublishAsync(context.Background(), "", Message{RoutingKey: "q", Body: body}); err != nil {
			t.Fatal(err)
		}
	}

	// No writer goroutine: the bytes reach the peer only if the publish
	// wrote them itself.
	publish(1)
	_ = peer.SetReadDeadline(time.Now().Add(10 * time.Second)) // a safety net, not the wait
	hdr := make([]byte, wire.HeaderSize)
	if _, err := io.ReadFull(peer, hdr); err != nil {
		t.Fatalf("nothing reached the peer without the writer goroutine: %v", err)
	}
	n := int(binary.LittleEndian.Uint32(hdr)) // the frame length, header excluded
	rest := make([]byte, n)
	if _, err := io.ReadFull(peer, rest); err != nil {
		t.Fatal(err)
	}
	first := append(hdr, rest...)

	// Fill the socket: publishes go on writing inline until one is cut
	// short, and the rest waits in whead for the writer.
	seq := uint64(1)
	for {
		seq++
		publish(seq)
		c.wmu.Lock()
		held := len(c.whead) > 0
		c.wmu.Unlock()
		if held {
			break
		}
		if seq > 100_000 {
			t.Fatal("the socket never filled")
		}
	}
	// Two more behind it, then the writer sends everything in order.
	publish(seq + 1)
	publish(seq + 2)
	last := seq + 2
	go c.writer()
	var got bytes.Buffer
	got.Write(first)
	buf := make([]byte, 64<<10)
	for {
		seqs := publishedSeqsPrefix(got.Bytes())
		if len(seqs) > 0 && seqs[len(seqs)-1] == last {
			break
		}
		m, err := peer.Read(buf)
		if err != nil {
			t.Fatalf("after %d bytes: %v", got.Len(), err)
		}
		got.Write(buf[:m])
	}
	seqs := publishedSeqs(t, got.Bytes())
	for i, s := range seqs {
		if s != uint64(i+1) {
			t.Fatalf("message %d on the wire carries seq %d: out of order or lost (%d messages)", i, s, len(seqs))
		}
	}
	if uint64(len(seqs)) != last {
		t.Fatalf("%d messages on the wire, want %d", len(seqs), last)
	}
	c.shutdown(ErrClosed)
}

// publishedSeqsPrefix is publishedSeqs over the whole frames at the start
// of b (the last may be incomplete).
func publishedSeqsPrefix(b []byte) []uint64 {
	var seqs []uint64
	for {
		f, n, err := wire.Split(b, wire.HardMaxFrame)
		if err != nil || n == 0 {
			return seqs
		}
		var d wire.Decompressor
		var batch wire.PublishBatch
		if wire.DecodePublish(f, wire.HardMaxFrame, &d, &batch) == nil {
			var m wire.Message
			for it := batch.Messages(); it.Next(&m); {
				seqs = append(seqs, binary.BigEndian.Uint64(m.Body))
			}
		}
		b = b[n:]
	}
}

// A publish behind more than inlineUnconfirmed unconfirmed ones (a
// publisher at a high rate) leaves its bytes to the writer goroutine,
// batched with what follows, as do PublishBatch's messages and any
// publish on a TLS connection (no raw socket).
func TestPublishLeavesBusySocketToWriter(t *testing.T) {
	nc, _ := tcpPair(t)
	c := inlineConn(nc)
	ch := newChannel(c, 1)
	ch.unconfirmed = inlineUnconfirmed // these many publishes await confirms
	if _, err := ch.PublishAsync(context.Background(), "", Message{RoutingKey: "q", Body: []byte("x")}); err != nil {
		t.Fatal(err)
	}
	c.wmu.Lock()
	queued := len(c.wbuf)
	c.wmu.Unlock()
	if queued == 0 {
		t.Fatal("a publish right after a write was sent inline; want it queued for the writer")
	}
	// PublishBatch's messages go to the writer, to be sent as one batch.
	ch.release(int(ch.unconfirmed))
	c.wmu.Lock()
	queued = len(c.wbuf)
	c.wmu.Unlock()
	if _, err := ch.publish(context.Background(), "", &Message{RoutingKey: "q", Body: []byte("b")}, nil, false); err != nil {
		t.Fatal(err)
	}
	c.wmu.Lock()
	batched := len(c.wbuf) > queued
	c.wmu.Unlock()
	if !batched {
		t.Fatal("a PublishBatch message was sent inline; want it queued for the writer")
	}
	c.raw = nil
	ch.release(int(ch.unconfirmed))
	c.wmu.Lock()
	queued = len(c.wbuf)
	c.wmu.Unlock()
	if _, err := ch.PublishAsync(context.Background(), "", Message{RoutingKey: "q", Body: []byte("y")}); err != nil {
		t.Fatal(err)
	}
	c.wmu.Lock()
	grown := len(c.wbuf) > queued
	c.wmu.Unlock()
	if !grown {
		t.Fatal("a publish with no raw socket (TLS) was not queued for the writer")
	}
}
