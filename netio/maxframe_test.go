package netio_test

import (
	"bytes"
	"errors"
	"fmt"
	"testing"

	"github.com/warren-mq/warren/client"
	"github.com/warren-mq/warren/netio"
	"github.com/warren-mq/warren/netio/warrentest"
	"github.com/warren-mq/warren/wire"
)

// TestDeliverWithinMaxFrame: a backlog of messages each well under the
// consumer's max_frame (ten of 1 MiB, 4 MiB frames) is delivered in
// several DELIVER frames, each within it. It went out as one frame of 10
// MiB, which the client refused (frame_too_large), ending the connection;
// the messages went back to the queue and did it again at the next
// consumer.
func TestDeliverWithinMaxFrame(t *testing.T) {
	s := warrentest.StartServer(t, nil)
	ctx := ctxT(t)
	ch := channel(t, dial(t, s))
	if _, err := ch.DeclareQueue(ctx, "mid", client.QueueOptions{}); err != nil {
		t.Fatal(err)
	}
	for i := range 10 {
		if err := ch.Publish(ctx, "", client.Message{RoutingKey: "mid", Body: bytes.Repeat([]byte{byte('a' + i)}, 1<<20)}); err != nil {
			t.Fatal(err)
		}
	}
	c := dial(t, s)
	cs, err := channel(t, c).Consume(ctx, "mid", client.ConsumeOptions{Prefetch: 100})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 10 {
		if d := recv(t, cs); len(d.Body) != 1<<20 || d.Body[0] != byte('a'+i) {
			t.Fatalf("delivery %d: %d bytes of %q", i, len(d.Body), d.Body[:1])
		}
	}
	if err := c.Err(); err != nil {
		t.Fatalf("the consumer's connection: %v", err)
	}
}

// TestDeliverOverMaxFrameCancels: a message whose delivery alone would
// pass a consumer's max_frame (3 MiB to a client that negotiated 1 MiB;
// an AMQP publisher's message to a native consumer does the same) is not
// sent: the consumer is cancelled (CANCELLED, frame_too_large) and the
// message stays in the queue, in its place, for a consumer that can take
// it; the connection goes on. It was sent, and the client ended its
// connection on it (frame_too_large), again at each reconnect.
func TestDeliverOverMaxFrameCancels(t *testing.T) {
	s := warrentest.StartServer(t, nil)
	ctx := ctxT(t)
	ch := channel(t, dial(t, s))
	if _, err := ch.DeclareQueue(ctx, "big", client.QueueOptions{}); err != nil {
		t.Fatal(err)
	}
	bodies := [][]byte{[]byte("small"), bytes.Repeat([]byte("b"), 3<<20), []byte("after")}
	for _, b := range bodies {
		if err := ch.Publish(ctx, "", client.Message{RoutingKey: "big", Body: b}); err != nil {
			t.Fatal(err)
		}
	}
	small, err := client.Dial(ctx, warrentest.URL(s), client.Options{MaxFrame: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	defer small.Close()
	sch := channel(t, small)
	cs, err := sch.Consume(ctx, "big", client.ConsumeOptions{Prefetch: 10})
	if err != nil {
		t.Fatal(err)
	}
	if d := recv(t, cs); string(d.Body) != "small" {
		t.Fatalf("first delivery %q", d.Body[:min(len(d.Body), 8)])
	} else if err := d.Ack(); err != nil {
		t.Fatal(err)
	}
	for range cs.Deliveries() {
		t.Fatal("a delivery after the message too large for the consumer")
	}
	var we *wire.Error
	if err := cs.Err(); !errors.As(err, &we) || we.Code != wire.FrameTooLarge {
		t.Fatalf("the consumer ended with %v, want CANCELLED frame_too_large", err)
	}
	// The connection goes on.
	if _, err := sch.DeclareQueue(ctx, "big", client.QueueOptions{Passive: true}); err != nil || small.Err() != nil {
		t.Fatalf("the small-frame connection after the cancel: %v, %v", err, small.Err())
	}
	// A consumer with room takes the rest, in order.
	cs2, err := channel(t, dial(t, s)).Consume(ctx, "big", client.ConsumeOptions{Prefetch: 10})
	if err != nil {
		t.Fatal(err)
	}
	for i, want := range bodies[1:] {
		d := recv(t, cs2)
		if !bytes.Equal(d.Body, want) {
			t.Fatalf("delivery %d: %d bytes, want %d", i, len(d.Body), len(want))
		}
		if i == 0 && !d.Redelivered {
			t.Fatalf("the message handed back is not flagged redelivered (delivery count %d)", d.DeliveryCount)
		}
	}
}

// TestReturnWithinMaxFrame: the RETURN of a publish frame's unroutable
// mandatory messages goes out in frames within the publisher's max_frame.
// Each returned message carries its sequence number, code and exchange
// (11 bytes more than in the PUBLISH frame), so the returns of a PUBLISH
// frame filled to max_frame with small messages made one RETURN frame over
// it, and the client ended its connection on it (frame_too_large).
func TestReturnWithinMaxFrame(t *testing.T) {
	s := warrentest.StartServer(t, nil)
	r := rawDial(t, s, 0) // max_frame 64 KiB (wire.MinMaxFrame)
	r.write(wire.AppendFrame(nil, 1, &wire.ChannelOpen{Req: 1}))
	r.read()
	b, mark := wire.BeginPublish(nil, 1, 1, nil)
	n := 0
	m := wire.Message{Flags: wire.Mandatory, RoutingKey: []byte("nowhere"), Body: bytes.Repeat([]byte("r"), 40)}
	for len(wire.AppendMessage(b, &m)) <= wire.MinMaxFrame {
		b = wire.AppendMessage(b, &m)
		n++
	}
	r.write(mark.End(b, uint32(n)))
	// One message filling a PUBLISH frame: its RETURN would be 2 bytes
	// over max_frame, so it is nacked no_route instead.
	b, mark = wire.BeginPublish(nil, 1, uint64(n+1), nil)
	one := m
	one.Body = nil // the body fills what the frame has left
	one.Body = make([]byte, wire.MinMaxFrame-len(wire.AppendMessage(b, &one)))
	b = wire.AppendMessage(b, &one)
	r.write(mark.End(b, 1))
	returned := 0
	var nacked []wire.ConfirmRange
	for confirmed := uint64(0); confirmed < uint64(n+1); {
		switch body := nextWithin(t, r, wire.MinMaxFrame).(type) {
		case *wire.Return:
			for _, rm := range body.Returns {
				if rm.Seq != uint64(returned+1) {
					t.Fatalf("return %d carries seq %d", returned, rm.Seq)
				}
				returned++
			}
		case *wire.Confirm:
			for _, cr := range body.Ranges {
				if cr.Code != wire.OK {
					nacked = append(nacked, cr)
				}
				confirmed = max(confirmed, cr.Last)
			}
		default:
			t.Fatalf("unexpected %T", body)
		}
	}
	if returned != n {
		t.Fatalf("%d of %d unroutable mandatory messages returned before the confirm", returned, n)
	}
	if len(nacked) != 1 || nacked[0].First != uint64(n+1) || nacked[0].Last != uint64(n+1) || nacked[0].Code != wire.NoRoute {
		t.Fatalf("nacks %+v, want the frame-filling message's alone, no_route", nacked)
	}
}

// nextWithin reads r's next frame, failing the test if it passes limit
// bytes (as a client with that max_frame refuses it) or none comes within
// 10 s.
func nextWithin(t *testing.T, r *rawConn, limit int) wire.Body {
	t.Helper()
	_, body, err := r.nextWithin(uint32(limit))
	if err != nil {
		t.Fatal(err)
	}
	return body
}

// TestConfirmWithinMaxFrame: the CONFIRM of a publish frame whose
// messages' outcomes alternate (a reject-publish queue that is full, and
// one that is not) goes out in frames within the publisher's max_frame
// and of at most 65,535 ranges each. It went out as one frame with a range
// per message: over a small max_frame the client ended its connection
// (frame_too_large), and past 65,535 ranges (one PUBLISH of 65,536 such
// messages, from any client allowed to publish) the broker panicked and
// exited.
func TestConfirmWithinMaxFrame(t *testing.T) {
	s := warrentest.StartServer(t, &netio.Config{QueueSoftLimit: -1}) // no confirm held back by a backlog
	for k, c := range []struct{ maxFrame, msgs int }{{wire.MinMaxFrame, 5_000}, {2 << 20, 70_000}} {
		ok, full := fmt.Sprint("ok", k), fmt.Sprint("full", k)
		r := rawHello(t, s)
		r.write(wire.AppendFrame(nil, 0, &wire.Auth{Mechanism: "PLAIN", Response: wire.PlainResponse("guest", "guest"), MaxFrame: uint32(c.maxFrame)}))
		if _, ok := r.read().(*wire.OpenOK); !ok {
			t.Fatal("no OPEN_OK")
		}
		r.write(wire.AppendFrame(nil, 1, &wire.ChannelOpen{Req: 1}))
		r.write(wire.AppendFrame(nil, 1, &wire.QueueDeclare{Req: 2, Name: ok}))
		r.write(wire.AppendFrame(nil, 1, &wire.QueueDeclare{Req: 3, Name: full,
			Args: wire.Table{{Key: "max-length", Value: wire.Int(1)}, {Key: "overflow", Value: wire.String("reject-publish")}}}))
		for range 3 {
			nextWithin(t, r, c.maxFrame)
		}
		b, mark := wire.BeginPublish(nil, 1, 1, nil)
		for i := range c.msgs {
			rk := ok
			if i%2 == 1 {
				rk = full
			}
			b = wire.AppendMessage(b, &wire.Message{RoutingKey: []byte(rk)})
		}
		if len(b) > c.maxFrame {
			t.Fatalf("the test's PUBLISH is %d bytes, over max_frame %d", len(b), c.maxFrame)
		}
		r.write(mark.End(b, uint32(c.msgs)))
		// The first to full fills it (max-length 1): every later one is
		// refused, so outcomes alternate from message 3 on.
		codes := make([]wire.Code, 0, c.msgs)
		for frames := 0; len(codes) < c.msgs; {
			cf, ok := nextWithin(t, r, c.maxFrame).(*wire.Confirm)
			if !ok {
				continue
			}
			frames++
			for _, cr := range cf.Ranges {
				if cr.First != uint64(len(codes)+1) || cr.Last < cr.First {
					t.Fatalf("max_frame %d: range %+v after %d confirmed", c.maxFrame, cr, len(codes))
				}
				for range cr.Last - cr.First + 1 {
					codes = append(codes, cr.Code)
				}
			}
			if len(codes) == c.msgs && frames < 2 {
				t.Fatalf("max_frame %d: %d confirms in one frame", c.maxFrame, c.msgs)
			}
		}
		for i, code := range codes {
			want := wire.OK
			if i%2 == 1 && i > 1 {
				want = wire.QueueFull
			}
			if code != want {
				t.Fatalf("max_frame %d: message %d confirmed %v", c.maxFrame, i+1, code)
			}
		}
	}
}
