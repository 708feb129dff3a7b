package netio_test

import (
	"bytes"
	"errors"
	"testing"

	"github.com/warren-mq/warren/client"
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
