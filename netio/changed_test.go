package netio_test

import (
	"testing"
	"time"

	"github.com/warren-mq/warren/client"
	"github.com/warren-mq/warren/netio/warrentest"
)

// TestChangedAnnouncesConnections: Server.Changed is closed when a
// connection is accepted and when one closes, and a closed connection
// leaves the count only once its Down is with the shards: a test that saw
// it go and then passes the broker's barrier finds what it held returned,
// with no polling.
func TestChangedAnnouncesConnections(t *testing.T) {
	s := warrentest.StartServer(t, nil)
	ctx := ctxT(t)
	ch := channel(t, dial(t, s))
	_, err := ch.DeclareQueue(ctx, "held", client.QueueOptions{})
	must(t, err)
	must(t, ch.Publish(ctx, "", client.Message{RoutingKey: "held", Body: []byte("m")}))

	opened := s.Changed()
	c := dial(t, s)
	select {
	case <-opened:
	case <-time.After(10 * time.Second):
		t.Fatal("Changed was not closed when a connection was accepted")
	}
	cs, err := channel(t, c).Consume(ctx, "held", client.ConsumeOptions{Prefetch: 1})
	must(t, err)
	recv(t, cs) // held, unacked, by c
	c.Close()
	until(t, s, "the consumer's connection to close", func() bool { return s.ConnectionCount() == 1 })
	settled(t, s)
	if q := queueStats(s, "held"); q.Ready != 1 || q.Unacked != 0 || q.Consumers != 0 {
		t.Fatalf("queue held once its consumer's connection was gone: ready %d unacked %d consumers %d, want 1 0 0", q.Ready, q.Unacked, q.Consumers)
	}
}
