package netio_test

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/warren-mq/warren/broker"
	"github.com/warren-mq/warren/client"
	"github.com/warren-mq/warren/netio"
	"github.com/warren-mq/warren/netio/warrentest"
	"github.com/warren-mq/warren/wire"
)

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func dial(t *testing.T, s *netio.Server) *client.Conn {
	t.Helper()
	c, err := client.Dial(ctxT(t), warrentest.URL(s))
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func channel(t *testing.T, c *client.Conn) *client.Channel {
	t.Helper()
	ch, err := c.Channel(ctxT(t))
	if err != nil {
		t.Fatalf("channel: %v", err)
	}
	return ch
}

func recv(t *testing.T, cs *client.Consumer) *client.Delivery {
	t.Helper()
	select {
	case d, ok := <-cs.Deliveries():
		if !ok {
			t.Fatalf("consumer stopped: %v", cs.Err())
		}
		return d
	case <-time.After(10 * time.Second):
		t.Fatal("no delivery within 10s")
	}
	return nil
}

func expectNone(t *testing.T, cs *client.Consumer, wait time.Duration) {
	t.Helper()
	select {
	case d := <-cs.Deliveries():
		t.Fatalf("unexpected delivery %q", d.Body)
	case <-time.After(wait):
	}
}

func TestPublishConsumeAck(t *testing.T) {
	s := warrentest.StartServer(t, nil)
	ctx := ctxT(t)
	ch := channel(t, dial(t, s))
	if _, err := ch.DeclareQueue(ctx, "work", client.QueueOptions{}); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 10; i++ {
		if err := ch.Publish(ctx, "", client.Message{RoutingKey: "work", Body: []byte(fmt.Sprint(i))}); err != nil {
			t.Fatalf("publish %d: %v", i, err)
		}
	}
	cs, err := ch.Consume(ctx, "work", client.ConsumeOptions{Prefetch: 100})
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 10; i++ {
		d := recv(t, cs)
		if string(d.Body) != fmt.Sprint(i) || d.Redelivered || d.DeliveryCount != 1 {
			t.Fatalf("delivery %d: %+v", i, d)
		}
		if err := d.Ack(); err != nil {
			t.Fatal(err)
		}
	}
	applied(t, s, ch)
	if q := queueStats(s, "work"); q.Acked != 10 || q.Unacked != 0 || q.Ready != 0 {
		t.Fatalf("queue work: acked %d unacked %d ready %d, want 10 0 0", q.Acked, q.Unacked, q.Ready)
	}
}

func queueStats(s *netio.Server, name string) broker.QueueStats {
	for _, q := range s.Queues() {
		if q.Name == name {
			return q
		}
	}
	return broker.QueueStats{}
}

// until waits, with a deadline, for cond on the server's connection-side
// state (connections, the memory alarm), waking at each change of that
// state (Server.Changed): an event, not a poll with sleeps.
func until(t *testing.T, s *netio.Server, what string, cond func() bool) {
	t.Helper()
	deadline := time.NewTimer(10 * time.Second)
	defer deadline.Stop()
	for {
		changed := s.Changed() // before cond: a change in between is not missed
		if cond() {
			return
		}
		select {
		case <-changed:
		case <-deadline.C:
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

// applied waits until everything ch's connection sent before the call has
// been applied by the broker: a round trip on ch (the broker reads a
// connection's frames in order and hands each one's work to the shards
// before it answers a later request; the client sends its batched acks
// before any request), then the shards' barrier, twice (the second round
// applies the dead letters the first one's work sent on).
func applied(t *testing.T, s *netio.Server, ch *client.Channel) {
	t.Helper()
	ctx := ctxT(t)
	if err := ch.DeclareExchange(ctx, "amq.direct", "direct", client.ExchangeOptions{Passive: true}); err != nil {
		t.Fatalf("round trip: %v", err)
	}
	settled(t, s)
}

// polled waits, with a deadline, for a state that nothing announces: a
// client's (Conn.FlowPaused: no event says when its reader took the
// FLOW frame) or a count the broker changes per message, where an event
// would cost on the hot path. It reads the state again until it shows.
// Everything else waits on an event (until, applied, settled).
func polled(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// settled waits until the shards have applied everything submitted to
// them so far, and the dead letters that sent on.
func settled(t *testing.T, s *netio.Server) {
	t.Helper()
	ctx := ctxT(t)
	for range 2 {
		if err := s.Barrier(ctx); err != nil {
			t.Fatalf("broker barrier: %v", err)
		}
	}
}

func TestConfirmsAsyncBatched(t *testing.T) {
	s := warrentest.StartServer(t, nil)
	ctx := ctxT(t)
	ch := channel(t, dial(t, s))
	if _, err := ch.DeclareQueue(ctx, "q", client.QueueOptions{}); err != nil {
		t.Fatal(err)
	}
	confirmed := make(chan uint64, 100000)
	ch.NotifyConfirm(func(first, last uint64, err error) {
		if err != nil {
			t.Errorf("nack %d..%d: %v", first, last, err)
		}
		for s := first; s <= last; s++ {
			confirmed <- s
		}
	})
	const n = 20000
	for i := 0; i < n; i++ {
		if _, err := ch.PublishAsync(ctx, "", client.Message{RoutingKey: "q", Body: []byte("x")}); err != nil {
			t.Fatal(err)
		}
	}
	if err := ch.WaitConfirms(ctx); err != nil {
		t.Fatal(err)
	}
	seen := map[uint64]bool{}
	for len(seen) < n {
		seen[<-confirmed] = true
	}
	if q := queueStats(s, "q"); q.Ready != n {
		t.Fatalf("ready %d, want %d", q.Ready, n)
	}
}

func TestNackOnFullQueueAndUnknownExchange(t *testing.T) {
	s := warrentest.StartServer(t, nil)
	ctx := ctxT(t)
	ch := channel(t, dial(t, s))
	if _, err := ch.DeclareQueue(ctx, "small", client.QueueOptions{Args: wire.Table{
		{Key: "max-length", Value: wire.Int(1)}, {Key: "overflow", Value: wire.String("reject-publish")}}}); err != nil {
		t.Fatal(err)
	}
	if err := ch.Publish(ctx, "", client.Message{RoutingKey: "small", Body: []byte("1")}); err != nil {
		t.Fatal(err)
	}
	err := ch.Publish(ctx, "", client.Message{RoutingKey: "small", Body: []byte("2")})
	if wire.CodeOf(err) != wire.QueueFull {
		t.Fatalf("got %v, want a queue_full nack", err)
	}
	err = ch.Publish(ctx, "nope", client.Message{RoutingKey: "small", Body: []byte("3")})
	if wire.CodeOf(err) != wire.ExchangeNotFound {
		t.Fatalf("got %v, want exchange_not_found", err)
	}
	must(t, ch.DeclareExchange(ctx, "inner", "fanout", client.ExchangeOptions{Internal: true}))
	err = ch.Publish(ctx, "inner", client.Message{Body: []byte("4")})
	if wire.CodeOf(err) != wire.ExchangeInternal {
		t.Fatalf("got %v, want exchange_internal", err)
	}
}

func TestRedeliveryAfterConnectionDrop(t *testing.T) {
	s := warrentest.StartServer(t, nil)
	ctx := ctxT(t)
	pub := channel(t, dial(t, s))
	if _, err := pub.DeclareQueue(ctx, "jobs", client.QueueOptions{}); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 3; i++ {
		if err := pub.Publish(ctx, "", client.Message{RoutingKey: "jobs", Body: []byte(fmt.Sprint(i))}); err != nil {
			t.Fatal(err)
		}
	}
	c1, err := client.Dial(ctx, warrentest.URL(s))
	if err != nil {
		t.Fatal(err)
	}
	ch1 := channel(t, c1)
	cs1, err := ch1.Consume(ctx, "jobs", client.ConsumeOptions{Prefetch: 10})
	if err != nil {
		t.Fatal(err)
	}
	d0 := recv(t, cs1)
	recv(t, cs1)
	recv(t, cs1)
	if err := d0.Ack(); err != nil {
		t.Fatal(err)
	}
	applied(t, s, ch1)
	if n := queueStats(s, "jobs").Acked; n != 1 {
		t.Fatalf("queue jobs: %d acked, want 1", n)
	}
	c1.Close() // drops the connection with 1 and 2 unacked

	ch2 := channel(t, dial(t, s))
	cs2, err := ch2.Consume(ctx, "jobs", client.ConsumeOptions{Prefetch: 10})
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"1", "2"} {
		d := recv(t, cs2)
		if string(d.Body) != want || !d.Redelivered || d.DeliveryCount != 2 || d.FailedCount != 1 {
			t.Fatalf("got %q redelivered=%v dc=%d fc=%d, want %q redelivered", d.Body, d.Redelivered, d.DeliveryCount, d.FailedCount, want)
		}
		d.Ack()
	}
}

func TestPrefetchRespected(t *testing.T) {
	s := warrentest.StartServer(t, nil)
	ctx := ctxT(t)
	ch := channel(t, dial(t, s))
	ch.DeclareQueue(ctx, "pf", client.QueueOptions{})
	for i := 0; i < 10; i++ {
		ch.PublishAsync(ctx, "", client.Message{RoutingKey: "pf", Body: []byte{byte(i)}})
	}
	if err := ch.WaitConfirms(ctx); err != nil {
		t.Fatal(err)
	}
	cs, err := ch.Consume(ctx, "pf", client.ConsumeOptions{Prefetch: 3})
	if err != nil {
		t.Fatal(err)
	}
	var got []*client.Delivery
	for i := 0; i < 3; i++ {
		got = append(got, recv(t, cs))
	}
	settled(t, s) // the deliveries were made when the consumer subscribed
	if n := queueStats(s, "pf").Unacked; n != 3 {
		t.Fatalf("queue pf: %d unacked, want 3", n)
	}
	expectNone(t, cs, 100*time.Millisecond)
	if q := queueStats(s, "pf"); q.Unacked != 3 || q.Ready != 7 {
		t.Fatalf("unacked %d ready %d, want 3 and 7", q.Unacked, q.Ready)
	}
	got[0].Ack()
	if d := recv(t, cs); d.Body[0] != 3 {
		t.Fatalf("got %v, want message 3", d.Body)
	}
}

func TestPriorities(t *testing.T) {
	s := warrentest.StartServer(t, nil)
	ctx := ctxT(t)
	ch := channel(t, dial(t, s))
	ch.DeclareQueue(ctx, "prio", client.QueueOptions{Args: wire.Table{{Key: "max-priority", Value: wire.Int(9)}, {Key: "strict-priority", Value: wire.Bool(true)}}})
	for _, p := range []uint8{1, 5, 9, 5, 1} {
		ch.PublishAsync(ctx, "", client.Message{RoutingKey: "prio", Priority: p, Body: []byte{p}})
	}
	if err := ch.WaitConfirms(ctx); err != nil {
		t.Fatal(err)
	}
	cs, _ := ch.Consume(ctx, "prio", client.ConsumeOptions{Prefetch: 10})
	var order []uint8
	for i := 0; i < 5; i++ {
		d := recv(t, cs)
		order = append(order, d.Body[0])
		d.Ack()
	}
	if fmt.Sprint(order) != "[9 5 5 1 1]" {
		t.Fatalf("order %v", order)
	}
}

func TestDeadLetterOnRejectAndTTL(t *testing.T) {
	s := warrentest.StartServer(t, nil)
	ctx := ctxT(t)
	ch := channel(t, dial(t, s))
	must(t, ch.DeclareExchange(ctx, "dlx", "fanout", client.ExchangeOptions{}))
	_, err := ch.DeclareQueue(ctx, "dead", client.QueueOptions{})
	must(t, err)
	must(t, ch.Bind(ctx, client.Binding{Source: "dlx", Destination: "dead"}))
	_, err = ch.DeclareQueue(ctx, "orders", client.QueueOptions{Args: wire.Table{{Key: "dead-letter-exchange", Value: wire.String("dlx")}}})
	must(t, err)
	_, err = ch.DeclareQueue(ctx, "short", client.QueueOptions{Args: wire.Table{
		{Key: "dead-letter-exchange", Value: wire.String("dlx")}, {Key: "message-ttl", Value: wire.Int(50)}}})
	must(t, err)

	must(t, ch.Publish(ctx, "", client.Message{RoutingKey: "orders", Body: []byte("bad order")}))
	cs, err := ch.Consume(ctx, "orders", client.ConsumeOptions{Prefetch: 1})
	must(t, err)
	must(t, recv(t, cs).Reject())

	dead, err := ch.Consume(ctx, "dead", client.ConsumeOptions{Prefetch: 10})
	must(t, err)
	d := recv(t, dead)
	p, err := d.Props()
	must(t, err)
	if string(d.Body) != "bad order" || p == nil || len(p.Deaths) != 1 || p.Deaths[0].Queue != "orders" || p.Deaths[0].Reason != wire.ReasonRejected {
		t.Fatalf("dead letter %q props %+v", d.Body, p)
	}
	d.Ack()

	// TTL: nobody consumes "short"; the message expires and moves.
	must(t, ch.Publish(ctx, "", client.Message{RoutingKey: "short", Body: []byte("too late")}))
	d = recv(t, dead)
	p, _ = d.Props()
	if string(d.Body) != "too late" || p == nil || p.Deaths[0].Reason != wire.ReasonExpired || p.Deaths[0].Queue != "short" {
		t.Fatalf("expired letter %q props %+v", d.Body, p)
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func TestMandatoryReturn(t *testing.T) {
	s := warrentest.StartServer(t, nil)
	ctx := ctxT(t)
	ch := channel(t, dial(t, s))
	must(t, ch.DeclareExchange(ctx, "events", "topic", client.ExchangeOptions{}))
	returned := make(chan client.Return, 1)
	ch.NotifyReturn(func(r client.Return) { returned <- r })
	must(t, ch.Publish(ctx, "events", client.Message{RoutingKey: "nobody.listens", Mandatory: true, Body: []byte("hello?")}))
	select {
	case r := <-returned:
		if r.Code != wire.NoRoute || string(r.Message.Body) != "hello?" || r.Exchange != "events" || r.Seq != 1 {
			t.Fatalf("return %+v", r)
		}
	default:
		t.Fatal("the return must arrive before the confirm")
	}
}

func TestRoundRobinAcrossConsumers(t *testing.T) {
	s := warrentest.StartServer(t, nil)
	ctx := ctxT(t)
	ch := channel(t, dial(t, s))
	ch.DeclareQueue(ctx, "rr", client.QueueOptions{})
	a, _ := ch.Consume(ctx, "rr", client.ConsumeOptions{Prefetch: 100})
	b, _ := ch.Consume(ctx, "rr", client.ConsumeOptions{Prefetch: 100})
	for i := 0; i < 10; i++ {
		ch.PublishAsync(ctx, "", client.Message{RoutingKey: "rr", Body: []byte{byte(i)}})
	}
	must(t, ch.WaitConfirms(ctx))
	for i := 0; i < 5; i++ {
		recv(t, a).Ack()
		recv(t, b).Ack()
	}
}

func TestFlowControlBlocksAndResumes(t *testing.T) {
	s := warrentest.StartServer(t, &netio.Config{MemoryHighWater: 10_000, TickInterval: 10 * time.Millisecond})
	ctx := ctxT(t)
	c := dial(t, s)
	ch := channel(t, c)
	ch.DeclareQueue(ctx, "big", client.QueueOptions{})
	body := make([]byte, 1000)
	// 20 KB into a broker with a 10 KB watermark: at some point the broker
	// pauses this publisher (exactly when depends on its tick).
	filled := make(chan error, 1)
	go func() {
		for i := 0; i < 20; i++ {
			if err := ch.Publish(ctx, "", client.Message{RoutingKey: "big", Body: body}); err != nil {
				filled <- err
				return
			}
		}
		filled <- nil
	}()
	until(t, s, "the memory alarm", func() bool { return metricValue(s, "warren_flow_blocked") == 1 })
	// The FLOW frame went out before the alarm's change was announced; the
	// client has no event for it, so its state is read until it shows.
	polled(t, "the client paused", c.FlowPaused)
	// Paused: a publish now waits.
	published := make(chan error, 1)
	go func() { published <- ch.Publish(ctx, "", client.Message{RoutingKey: "big", Body: body}) }()
	select {
	case err := <-published:
		t.Fatalf("publish went through while paused: %v", err)
	case <-time.After(200 * time.Millisecond):
	}
	// Draining the queue resumes publishers; every message arrives.
	cons := channel(t, dial(t, s))
	cs, _ := cons.Consume(ctx, "big", client.ConsumeOptions{AutoAck: true})
	for i := 0; i < 21; i++ {
		recv(t, cs)
	}
	for _, done := range []chan error{filled, published} {
		select {
		case err := <-done:
			must(t, err)
		case <-time.After(10 * time.Second):
			t.Fatal("publisher not resumed after the queue drained")
		}
	}
	if c.FlowPaused() {
		t.Fatal("client still paused")
	}
}

func metricValue(s *netio.Server, name string) float64 {
	var b bytes.Buffer
	s.WriteMetrics(&b)
	var v float64
	for _, line := range strings.Split(b.String(), "\n") {
		if n, _ := fmt.Sscanf(line, name+" %g", &v); n == 1 {
			return v
		}
	}
	return -1
}

// TestBacklogHoldsConfirms: past a queue's soft limit, confirms wait until
// consumers drain it, so publishers slow to the consumers' pace.
func TestBacklogHoldsConfirms(t *testing.T) {
	s := warrentest.StartServer(t, &netio.Config{QueueSoftLimit: 50})
	ctx := ctxT(t)
	ch := channel(t, dial(t, s))
	ch.DeclareQueue(ctx, "slow", client.QueueOptions{})
	var confirmed atomic.Int64
	ch.NotifyConfirm(func(first, last uint64, err error) { confirmed.Add(int64(last - first + 1)) })
	for i := 0; i < 50; i++ { // up to the limit: confirmed at once
		must(t, ch.Publish(ctx, "", client.Message{RoutingKey: "slow", Body: []byte("x")}))
	}
	for i := 0; i < 150; i++ { // past it: taken, but not confirmed
		if _, err := ch.PublishAsync(ctx, "", client.Message{RoutingKey: "slow", Body: []byte("x")}); err != nil {
			t.Fatal(err)
		}
	}
	applied(t, s, ch)
	if n := queueStats(s, "slow").Ready; n != 200 {
		t.Fatalf("queue slow: %d ready, want 200", n)
	}
	if n := confirmed.Load(); n != 50 {
		t.Fatalf("%d confirmed with 200 queued and a soft limit of 50", n)
	}
	cs, err := channel(t, dial(t, s)).Consume(ctx, "slow", client.ConsumeOptions{AutoAck: true})
	must(t, err)
	for i := 0; i < 200; i++ {
		recv(t, cs)
	}
	must(t, ch.WaitConfirms(ctx))
	if confirmed.Load() != 200 {
		t.Fatalf("%d confirmed after draining", confirmed.Load())
	}
}

// TestDeadLetterToItself: a queue whose dead-letter exchange routes back to
// it (the delayed-retry pattern) takes the message back with its history.
func TestDeadLetterToItself(t *testing.T) {
	s := warrentest.StartServer(t, nil)
	ctx := ctxT(t)
	ch := channel(t, dial(t, s))
	must(t, ch.DeclareExchange(ctx, "retry", "direct", client.ExchangeOptions{}))
	_, err := ch.DeclareQueue(ctx, "loop", client.QueueOptions{Args: wire.Table{{Key: "dead-letter-exchange", Value: wire.String("retry")}}})
	must(t, err)
	must(t, ch.Bind(ctx, client.Binding{Source: "retry", Destination: "loop", RoutingKey: "loop"}))
	must(t, ch.Publish(ctx, "", client.Message{RoutingKey: "loop", Body: []byte("again")}))
	cs, err := ch.Consume(ctx, "loop", client.ConsumeOptions{Prefetch: 1})
	must(t, err)
	must(t, recv(t, cs).Reject())
	d := recv(t, cs)
	p, _ := d.Props()
	if string(d.Body) != "again" || p == nil || p.Deaths[0].Queue != "loop" || p.Deaths[0].Count != 1 {
		t.Fatalf("%q %+v", d.Body, p)
	}
	must(t, d.Reject())
	d = recv(t, cs)
	p, _ = d.Props()
	if p.Deaths[0].Count != 2 || len(p.Deaths) != 1 {
		t.Fatalf("second death: %+v", p.Deaths)
	}
	d.Ack()
}
