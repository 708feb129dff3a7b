package amqp

import (
	"context"
	"testing"
	"time"

	amqp091 "github.com/rabbitmq/amqp091-go"
	"github.com/warren-mq/warren/netio"
)

// The unconfirmed-publish bound: a connection whose publishes are not taken
// by their queues (their confirms held back by a queue past its soft limit)
// is not read past MaxUnconfirmed of them, so the queue holds no more than
// the soft limit plus the bound whatever the client sends; once the queue
// drains, the rest goes through and everything is confirmed.
func TestUnconfirmedBound(t *testing.T) {
	t.Parallel() // its own broker; the 0.5 s each spends stopping it overlaps
	const soft, bound, total = 10, 20, 40
	l, atBound := boundListener(t, soft, bound)
	url := "amqp://guest:guest@" + l.Addr().String() + "/"
	_, pch := heldPublisher(t, l, 5*time.Second)
	confirms := pch.NotifyPublish(make(chan amqp091.Confirmation, total))
	go func() {
		for i := 0; i < total; i++ {
			if pch.PublishWithContext(context.Background(), "", "held", false, false, amqp091.Publishing{Body: []byte("m")}) != nil {
				return
			}
		}
	}()
	// Exact counts from another connection (a passive declare is answered
	// after everything submitted before it on the queue's shard).
	oc, err := amqp091.Dial(url)
	if err != nil {
		t.Fatal(err)
	}
	defer oc.CloseDeadline(time.Now().Add(5 * time.Second))
	och, err := oc.Channel()
	if err != nil {
		t.Fatal(err)
	}
	// The reader stops each time it reaches the bound; while the first
	// ten confirms lag (a loaded machine), a stop can be brief. The queue
	// never holds more than the soft limit plus the bound, and once the
	// held confirms are all that is out, exactly that.
	timeout := time.After(10 * time.Second)
	for held := false; !held; {
		select {
		case n := <-atBound:
			if n != bound {
				t.Fatalf("the reader stopped with %d publishes in flight, want %d", n, bound)
			}
		case <-timeout:
			t.Fatal("the publisher was never held at the unconfirmed bound with the queue at the soft limit plus the bound")
		}
		q, err := och.QueueDeclarePassive("held", false, false, false, false, nil)
		if err != nil {
			t.Fatal(err)
		}
		if q.Messages > soft+bound {
			t.Fatalf("the queue holds %d, over the soft limit plus the bound, %d", q.Messages, soft+bound)
		}
		held = q.Messages == soft+bound
	}
	if _, err := och.QueuePurge("held", false); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < total; i++ {
		select {
		case c := <-confirms:
			if !c.Ack {
				t.Fatalf("publish %d nacked", c.DeliveryTag)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("%d of %d confirmed after the queue drained", i, total)
		}
	}
}

// boundListener starts a broker whose queues hold confirms back past soft
// messages and an AMQP listener with MaxUnconfirmed bound; the channel
// hears the unconfirmed count each time a publish is held at the bound.
// Both stop when the test ends.
func boundListener(t *testing.T, soft int64, bound int) (*Listener, chan int64) {
	t.Helper()
	srv, err := netio.Start(netio.Config{Addr: "127.0.0.1:0", Shards: 1, EventLoops: 1, QueueSoftLimit: soft})
	if err != nil {
		t.Fatal(err)
	}
	l, err := Listen(srv, Config{Addr: "127.0.0.1:0", MaxUnconfirmed: bound})
	if err != nil {
		t.Fatal(err)
	}
	atBound := make(chan int64, 1024)
	hook := func(n int64) {
		select {
		case atBound <- n:
		default:
		}
	}
	l.hookAtBound.Store(&hook)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = l.Close()
		_ = srv.Close(ctx)
	})
	return l, atBound
}

// heldPublisher dials l and opens a channel in confirm mode, with the
// queue "held" declared; the connection is closed when the test ends
// (waiting for its close-ok closeWithin at most).
func heldPublisher(t *testing.T, l *Listener, closeWithin time.Duration) (*amqp091.Connection, *amqp091.Channel) {
	t.Helper()
	pc, err := amqp091.Dial("amqp://guest:guest@" + l.Addr().String() + "/")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pc.CloseDeadline(time.Now().Add(closeWithin)) })
	pch, err := pc.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pch.QueueDeclare("held", false, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	if err := pch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	return pc, pch
}
