package amqp

import (
	"context"
	"testing"
	"time"

	amqp091 "github.com/rabbitmq/amqp091-go"
)

// TestCloseReadAtUnconfirmedBound: a connection held at its bound of
// unconfirmed publishes (their queue past its soft limit holds the
// confirms back) still reads a channel.close and a connection.close sent
// behind the held publishes: the publishes before the close are read past
// the bound (what the connection has buffered already), then the close,
// which is answered at once, not once the confirms come back (here:
// never, the queue is not drained).
func TestCloseReadAtUnconfirmedBound(t *testing.T) {
	t.Parallel() // its own broker
	const soft, bound, total = 10, 20, 40
	l, atBound := boundListener(t, soft, bound)
	pc, pch := heldPublisher(t, l, time.Second)
	other, err := pc.Channel()
	if err != nil {
		t.Fatal(err)
	}
	third, err := pc.Channel() // opened now: at the bound, a channel.open waits as a publish does
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < total; i++ { // buffered by the client's socket: the last ones wait behind the bound
		if err := pch.PublishWithContext(context.Background(), "", "held", false, false, amqp091.Publishing{Body: []byte("m")}); err != nil {
			t.Fatal(err)
		}
	}
	select {
	case <-atBound:
	case <-time.After(10 * time.Second):
		t.Fatal("the publisher never reached the unconfirmed bound")
	}
	closed := func(what string, close func() error) {
		t.Helper()
		done := make(chan error, 1)
		go func() { done <- close() }()
		select {
		case err := <-done:
			if err != nil {
				t.Fatalf("%s: %v", what, err)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("%s not answered within 5 s at the unconfirmed bound (its confirms held back)", what)
		}
	}
	// A queue.declare and the close behind it go off the loop in one run.
	if _, err := other.QueueDeclare("x", false, false, false, true, nil); err != nil {
		t.Fatal(err)
	}
	closed("channel.close of another channel", other.Close)
	// The close reached, a publish waits at the bound again.
	for len(atBound) > 0 {
		<-atBound
	}
	if err := third.PublishWithContext(context.Background(), "", "held", false, false, amqp091.Publishing{Body: []byte("m")}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-atBound:
	case <-time.After(10 * time.Second):
		t.Fatal("a publish after the close was not held at the unconfirmed bound")
	}
	closed("channel.close of the publishing channel", pch.Close)
	closed("connection.close", pc.Close)
}

// TestClosesDoNotLiftUnconfirmedBound: a client that follows every few
// publishes with a channel.close (channels opened beforehand) is read past
// its unconfirmed bound for those closes only up to closeScanBytes over
// the whole hold, not again for each close: the bound still bounds it.
func TestClosesDoNotLiftUnconfirmedBound(t *testing.T) {
	t.Parallel() // its own broker
	// per × body is under closeScanBytes: each round's close is found.
	const soft, bound, rounds, per = 10, 20, 30, 10
	body := make([]byte, 4096)
	l, atBound := boundListener(t, soft, bound)
	pc, pch := heldPublisher(t, l, time.Second)
	spares := make([]*amqp091.Channel, rounds)
	for i := range spares {
		var err error
		if spares[i], err = pc.Channel(); err != nil {
			t.Fatal(err)
		}
	}
	// The abuser: publishes, a close (waiting for its close-ok, so the
	// close follows its round's publishes), publishes, a close... It
	// blocks once the broker stops reading; the connection's close ends
	// it.
	go func() {
		for i := range rounds {
			for range per {
				if pch.PublishWithContext(context.Background(), "", "held", false, false, amqp091.Publishing{Body: body}) != nil {
					return
				}
			}
			if spares[i].Close() != nil {
				return
			}
		}
	}()
	// Each publish read past the bound raises the unconfirmed count a
	// held publish reports. Without the whole-hold budget it climbs to
	// about rounds × per; with it, at most what closeScanBytes holds.
	limit := int64(bound + closeScanBytes/len(body) + 2)
	var most int64
	quiet := time.NewTimer(3 * time.Second) // no new hold reported for this long: done
	defer quiet.Stop()
	for {
		select {
		case n := <-atBound:
			most = max(most, n)
			if n > limit {
				t.Fatalf("a publisher closing channel after channel was read to %d unconfirmed publishes; the bound is %d, plus at most %d for closes", n, bound, limit-bound)
			}
			quiet.Reset(3 * time.Second)
			continue
		case <-quiet.C:
		}
		break
	}
	t.Logf("most unconfirmed when held: %d (limit %d)", most, limit)
	if most < bound {
		t.Fatalf("the publisher never reached its unconfirmed bound (most %d)", most)
	}
}
