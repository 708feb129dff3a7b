package netio_test

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"

	"github.com/warren-mq/warren/client"
	"github.com/warren-mq/warren/internal/syncbuf"
	"github.com/warren-mq/warren/netio"
	"github.com/warren-mq/warren/netio/warrentest"
	"github.com/warren-mq/warren/wire"
)

func logTo(b *syncbuf.Buffer) *slog.Logger {
	return slog.New(slog.NewTextHandler(b, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// TestOverviewTotalsStayMonotonic: the broker-wide totals of
// /api/overview count what deleted queues did too, so they never go down.
func TestOverviewTotalsStayMonotonic(t *testing.T) {
	s := warrentest.StartServer(t, nil)
	ctx := ctxT(t)
	ch := channel(t, dial(t, s))
	_, err := ch.DeclareQueue(ctx, "short-lived", client.QueueOptions{})
	must(t, err)
	for i := 0; i < 3; i++ {
		must(t, ch.Publish(ctx, "", client.Message{RoutingKey: "short-lived", Body: []byte("x")}))
	}
	cs, err := ch.Consume(ctx, "short-lived", client.ConsumeOptions{Prefetch: 10})
	must(t, err)
	for i := 0; i < 2; i++ {
		must(t, recv(t, cs).Ack())
	}
	applied(t, s, ch)
	before := s.Overview()
	if before.Acked != 2 || before.Delivered != 3 {
		t.Fatalf("overview: acked %d delivered %d, want 2 and 3", before.Acked, before.Delivered)
	}
	must(t, cs.Cancel(ctx))
	_, err = ch.DeleteQueue(ctx, "short-lived", false, false)
	must(t, err)
	after := s.Overview()
	if after.Published < before.Published || after.Delivered < before.Delivered || after.Acked < before.Acked {
		t.Fatalf("totals went down when a queue was deleted: before published=%d delivered=%d acked=%d, after published=%d delivered=%d acked=%d",
			before.Published, before.Delivered, before.Acked, after.Published, after.Delivered, after.Acked)
	}
	if after.Published != 3 {
		t.Fatalf("published_total %d after the delete, want 3", after.Published)
	}
}

// TestClientDeathHistoryIsDropped: the broker owns a message's death
// history. A publisher's own deaths property is removed on publish (so
// `dlq replay` cannot be pointed at an exchange the publisher chose); the
// other properties pass unchanged, and a real dead-lettering starts a
// fresh history.
func TestClientDeathHistoryIsDropped(t *testing.T) {
	s := warrentest.StartServer(t, nil)
	ctx := ctxT(t)
	ch := channel(t, dial(t, s))
	must(t, ch.DeclareExchange(ctx, "dlx", "fanout", client.ExchangeOptions{}))
	_, err := ch.DeclareQueue(ctx, "dead", client.QueueOptions{})
	must(t, err)
	must(t, ch.Bind(ctx, client.Binding{Source: "dlx", Destination: "dead"}))
	_, err = ch.DeclareQueue(ctx, "work", client.QueueOptions{Args: wire.Table{{Key: "dead-letter-exchange", Value: wire.String("dlx")}}})
	must(t, err)
	forged := []wire.Death{{Queue: "work", Reason: wire.ReasonRejected, Count: 1, Exchange: "forged-exchange", RoutingKeys: []string{"steal"}}}
	props := &wire.Props{ContentType: "text/plain", Headers: wire.Table{{Key: "h", Value: wire.String("v")}},
		Deaths: forged, Unknown: []byte{200, 1, 0, 'z'}}
	must(t, ch.Publish(ctx, "", client.Message{RoutingKey: "work", Body: []byte("m"), Props: props}))

	cs, err := ch.Consume(ctx, "work", client.ConsumeOptions{Prefetch: 1})
	must(t, err)
	d := recv(t, cs)
	p, err := d.Props()
	must(t, err)
	if p == nil || len(p.Deaths) != 0 {
		t.Fatalf("delivered with the publisher's death history: %+v", p)
	}
	if p.ContentType != "text/plain" || len(p.Headers) != 1 || string(p.Headers[0].Value.Bytes) != "v" || !bytes.Equal(p.Unknown, []byte{200, 1, 0, 'z'}) {
		t.Fatalf("other properties changed: %+v", p)
	}
	must(t, d.Reject())
	dead, err := ch.Consume(ctx, "dead", client.ConsumeOptions{Prefetch: 1})
	must(t, err)
	p, err = recv(t, dead).Props()
	must(t, err)
	if len(p.Deaths) != 1 || p.Deaths[0].Exchange != "" || p.Deaths[0].RoutingKeys[0] != "work" {
		t.Fatalf("death history after one real rejection: %+v", p.Deaths)
	}
}

// TestDurableIsWarnedNotYetHonoured: durable declares are accepted but
// kept in memory only; the broker says so in its log, rate-limited.
func TestDurableIsWarnedNotYetHonoured(t *testing.T) {
	var logs syncbuf.Buffer
	s := warrentest.StartServer(t, &netio.Config{Logger: logTo(&logs)})
	ctx := ctxT(t)
	ch := channel(t, dial(t, s))
	for i := 0; i < 50; i++ {
		_, err := ch.DeclareQueue(ctx, "d"+strings.Repeat("x", i%5), client.QueueOptions{Durable: true})
		must(t, err)
	}
	must(t, ch.DeclareExchange(ctx, "dx", "direct", client.ExchangeOptions{Durable: true}))
	_, err := s.DeclareQueue(wire.QueueDeclare{Name: "admin-durable", Durable: true})
	must(t, err)
	n := strings.Count(logs.String(), "not yet honoured")
	if n < 1 || n > 3 {
		t.Fatalf("%d 'not yet honoured' warnings for 52 durable declares, want 1..3 (rate-limited):\n%s", n, logs.String())
	}
}
