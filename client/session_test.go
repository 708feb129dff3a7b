package client_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/warren-mq/warren/client"
	"github.com/warren-mq/warren/netio/warrentest"
)

func TestSessionRestoresTopologyAndConsumers(t *testing.T) {
	s := warrentest.StartServer(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	sess, err := client.Connect(ctx, warrentest.URL(s))
	if err != nil {
		t.Fatal(err)
	}
	defer sess.Close()
	reconnected := make(chan int, 4)
	sess.OnReconnect = func(n int) { reconnected <- n }
	must(t, sess.DeclareExchange(ctx, "events", "topic", client.ExchangeOptions{}))
	q, err := sess.DeclareQueue(ctx, "", client.QueueOptions{Exclusive: true})
	must(t, err)
	must(t, sess.Bind(ctx, client.Binding{Source: "events", Destination: q.Name, RoutingKey: "order.*"}))
	got := make(chan string, 10)
	must(t, sess.Consume(ctx, q.Name, client.ConsumeOptions{Prefetch: 10}, func(d *client.Delivery) {
		got <- string(d.Body)
		d.Ack()
	}))
	must(t, sess.Publish(ctx, "events", client.Message{RoutingKey: "order.created", Body: []byte("before")}))
	expect(t, got, "before")

	// An operator kills every connection: the exclusive queue and its
	// binding die with it.
	for _, c := range s.Connections() {
		s.CloseConnection(c.ID, "test")
	}
	select {
	case <-reconnected:
	case <-ctx.Done():
		t.Fatal("no reconnect")
	}
	must(t, sess.Publish(ctx, "events", client.Message{RoutingKey: "order.paid", Body: []byte("after")}))
	expect(t, got, "after")
	if sess.Reconnects() != 1 {
		t.Fatalf("reconnects %d", sess.Reconnects())
	}
}

func expect(t *testing.T, ch chan string, want string) {
	t.Helper()
	select {
	case g := <-ch:
		if g != want {
			t.Fatalf("got %q, want %q", g, want)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("no %q", want)
	}
}

// wait receives from ch, failing the test when ctx ends first.
func wait[T any](t *testing.T, ctx context.Context, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-ctx.Done():
		t.Fatalf("no %s: %v", what, ctx.Err())
		var zero T
		return zero
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// TestUnconfirmedPublishesAreReported: every published sequence number is
// either confirmed or reported lost when the connection drops mid-stream.
func TestUnconfirmedPublishesAreReported(t *testing.T) {
	s := warrentest.StartServer(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := client.Dial(ctx, warrentest.URL(s))
	must(t, err)
	ch, err := c.Channel(ctx)
	must(t, err)
	_, err = ch.DeclareQueue(ctx, "q", client.QueueOptions{})
	must(t, err)
	var mu sync.Mutex
	seen := map[uint64]error{}
	ch.NotifyConfirm(func(first, last uint64, err error) {
		mu.Lock()
		defer mu.Unlock()
		for s := first; s <= last; s++ {
			if _, dup := seen[s]; dup {
				t.Errorf("seq %d reported twice", s)
			}
			seen[s] = err
		}
	})
	var published uint64
	for i := 0; i < 50000; i++ {
		seq, err := ch.PublishAsync(ctx, "", client.Message{RoutingKey: "q", Body: []byte("x")})
		if err != nil {
			break
		}
		published = seq
		if i == 20000 {
			for _, ci := range s.Connections() {
				s.CloseConnection(ci.ID, "test")
			}
		}
	}
	<-c.Done()
	mu.Lock()
	defer mu.Unlock()
	lost := 0
	for s := uint64(1); s <= published; s++ {
		err, ok := seen[s]
		if !ok {
			t.Fatalf("seq %d of %d neither confirmed nor reported lost", s, published)
		}
		if err != nil {
			if !errors.Is(err, client.ErrConnectionLost) {
				t.Fatalf("seq %d: %v", s, err)
			}
			lost++
		}
	}
	t.Logf("%d published, %d reported lost", published, lost)
}
