package amqp

import (
	"context"
	"testing"
	"time"

	amqp091 "github.com/rabbitmq/amqp091-go"
	"github.com/warren-mq/warren/netio"
)

// A connection that has opened 2^24 channels still gets its confirms: the
// channel generation carried in a publish's sequence wraps, and is
// compared wrapped.
func TestConfirmAfterManyChannelGenerations(t *testing.T) {
	srv, err := netio.Start(netio.Config{Addr: "127.0.0.1:0", Shards: 1, EventLoops: 1})
	if err != nil {
		t.Fatal(err)
	}
	l, err := Listen(srv, Config{Addr: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = l.Close()
		_ = srv.Close(ctx)
	}()
	conn, err := amqp091.Dial("amqp://guest:guest@" + l.Addr().String() + "/")
	if err != nil {
		t.Fatal(err)
	}
	defer conn.CloseDeadline(time.Now().Add(10 * time.Second))
	l.mu.Lock()
	for c := range l.conns {
		c.mu.Lock()
		c.chanGen = 1<<24 - 1 // the next channel is generation 2^24
		c.mu.Unlock()
	}
	l.mu.Unlock()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	dc, err := ch.PublishWithDeferredConfirmWithContext(context.Background(), "", "nowhere", false, false, amqp091.Publishing{Body: []byte("x")})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if ok, err := dc.WaitContext(ctx); !ok || err != nil {
		t.Fatalf("no confirm on a channel of generation 2^24: %v", err)
	}
}
