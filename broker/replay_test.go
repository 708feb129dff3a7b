package broker

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/warren-mq/warren/queue"
	"github.com/warren-mq/warren/wire"
)

// publishTo puts messages with the given bodies into q through the default
// exchange, as a publish part would.
func publishTo(b *Broker, q *Queue, bodies ...string) {
	ar := &Arena{}
	ar.Refs.Store(int64(len(bodies)))
	props := wire.AppendProperties(nil, &wire.Properties{})[2:]
	items := make([]EnqItem, len(bodies))
	for i, body := range bodies {
		m := ar.add([]byte{}, []byte(q.Name()), props, []byte(body), 0, 0)
		items[i] = EnqItem{Q: q, Msg: m, Meta: queue.Message{Size: uint32(len(body))}}
	}
	b.Submit(Command{Kind: CmdPublish, Items: items})
}

// rejectAll takes n messages from q and rejects them (into its dead-letter
// exchange).
func rejectAll(t *testing.T, b *Broker, q *Queue, n int) {
	t.Helper()
	k := &recSink{}
	id := b.NewConsumerID()
	b.Submit(Command{Kind: CmdSubscribe, Queue: q, Sink: k, Spec: queue.ConsumerSpec{ID: id, Owner: 1, Prefetch: uint32(n)}})
	barrier(t, q.shard)
	k.mu.Lock()
	var items []SettleItem
	for _, ds := range k.delivers {
		for _, d := range ds {
			items = append(items, SettleItem{Q: q, Consumer: id, Op: wire.SettleReject, QTag: d.QTag})
		}
	}
	k.mu.Unlock()
	if len(items) != n {
		t.Fatalf("took %d messages from %s, want %d", len(items), q.Name(), n)
	}
	b.Submit(Command{Kind: CmdSettle, Settles: items})
	b.Submit(Command{Kind: CmdCancel, Queue: q, Consumer: id})
	if err := b.Barrier(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := b.Barrier(context.Background()); err != nil { // the dead letters' own commands
		t.Fatal(err)
	}
}

// TestReplayThroughTheBroker: a dead-letter replay runs in process on a
// broker with no listener (no client, no internal user); the messages go
// back where they died from, death history kept; a republish a target
// refuses leaves its message in the dead-letter queue.
func TestReplayThroughTheBroker(t *testing.T) {
	b := startBroker(t, Config{Shards: 4})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	must := mustFunc(t)
	orders, dlq := declareOrders(t, b)
	publishTo(b, orders, "a", "b", "c")
	rejectAll(t, b, orders, 3)
	if got := dlq.ReadyCount(); got != 3 {
		t.Fatalf("dlq holds %d, want 3", got)
	}

	res, err := b.Replay(ctx, "dlq", 0, 0)
	must(err)
	must(b.Barrier(ctx))
	if res.Moved != 3 || res.Skipped != 0 || dlq.ReadyCount() != 0 {
		t.Fatalf("replay %+v, dlq ready %d; want 3 moved and an empty dlq", res, dlq.ReadyCount())
	}
	msgs, err := b.PeekQueue(ctx, "orders", 10)
	must(err)
	if len(msgs) != 3 || string(msgs[0].Body) != "a" || string(msgs[2].Body) != "c" ||
		msgs[0].Properties == nil || len(msgs[0].Properties.Deaths) != 1 || msgs[0].Properties.Deaths[0].Queue != "orders" {
		t.Fatalf("orders holds %+v, want a, b, c with their death", msgs)
	}

	// Back into the dlq, and the origin now refuses what it cannot hold:
	// nothing leaves the dlq.
	rejectAll(t, b, orders, 3)
	_, err = b.DeleteQueue(ctx, "orders", false, false)
	must(err)
	_, err = b.DeclareQueue(wire.QueueDeclare{Name: "orders", Args: wire.Table{
		{Key: "max-length", Value: wire.Int(1)}, {Key: "overflow", Value: wire.String("reject-publish")}}})
	must(err)
	publishTo(b, b.LookupQueue("orders"), "x")
	must(b.Barrier(ctx))
	_, err = b.Replay(ctx, "dlq", 0, 0)
	var we *wire.Error
	if !errors.As(err, &we) || we.Code != wire.QueueFull {
		t.Fatalf("replay into a full queue: %v, want queue_full", err)
	}
	must(b.Barrier(ctx))
	must(b.Barrier(ctx))
	if got, un := dlq.ReadyCount(), dlq.unacked.Load(); got != 3 || un != 0 {
		t.Fatalf("dlq: ready %d unacked %d after a refused replay, want 3 and 0", got, un)
	}

	// An origin that routes nowhere: ErrUnroutable, nothing moved.
	_, err = b.DeleteQueue(ctx, "orders", false, false)
	must(err)
	_, err = b.Replay(ctx, "dlq", 0, 0)
	if !errors.Is(err, ErrUnroutable) {
		t.Fatalf("replay to a deleted origin: %v, want ErrUnroutable", err)
	}
	must(b.Barrier(ctx))
	if got := dlq.ReadyCount(); got != 3 {
		t.Fatalf("dlq holds %d after an unroutable replay, want 3", got)
	}
}

// mustFunc returns a helper that fails t on a non-nil error.
func mustFunc(t *testing.T) func(error) {
	return func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
}

// declareDeadLetterQueue declares the fanout exchange "dlx" bound to the
// queue "dlq", the dead-letter target the broker tests share.
func declareDeadLetterQueue(t *testing.T, b *Broker) {
	t.Helper()
	must := mustFunc(t)
	must(b.DeclareExchange(wire.ExchangeDeclare{Name: "dlx", Kind: wire.ExchangeFanout}))
	_, err := b.DeclareQueue(wire.QueueDeclare{Name: "dlq"})
	must(err)
	must(b.Bind(wire.Bind{Source: "dlx", Destination: "dlq"}))
}

// declareOrders declares the dead-letter target (declareDeadLetterQueue)
// and the queue "orders" whose dead letters go to it, and returns both.
func declareOrders(t *testing.T, b *Broker) (orders, dlq *Queue) {
	t.Helper()
	declareDeadLetterQueue(t, b)
	_, err := b.DeclareQueue(wire.QueueDeclare{Name: "orders", Args: wire.Table{{Key: "dead-letter-exchange", Value: wire.String("dlx")}}})
	mustFunc(t)(err)
	return b.LookupQueue("orders"), b.LookupQueue("dlq")
}

// TestReplaySelected: a replay of chosen messages (by the ids a peek
// shows) moves those and only those, wherever they are in the queue; the
// others stay, in their order; an id the queue no longer holds is counted
// as missing; too many ids are refused.
func TestReplaySelected(t *testing.T) {
	b := startBroker(t, Config{Shards: 2})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	must := mustFunc(t)
	orders, dlq := declareOrders(t, b)
	publishTo(b, orders, "a", "b", "c", "d", "e")
	rejectAll(t, b, orders, 5)
	peeked, err := b.PeekQueue(ctx, "dlq", 10)
	must(err)
	if len(peeked) != 5 {
		t.Fatalf("dlq peek shows %d messages, want 5", len(peeked))
	}
	ids := map[uint64]bool{}
	for _, m := range peeked {
		ids[m.ID] = true
	}
	if len(ids) != 5 {
		t.Fatalf("peek ids %v: want 5 distinct", peeked)
	}
	// b and d, and an id that is not there.
	res, err := b.ReplaySelected(ctx, "dlq", []uint64{peeked[3].ID, peeked[1].ID, 1 << 60}, 0)
	must(err)
	must(b.Barrier(ctx))
	must(b.Barrier(ctx))
	if res.Moved != 2 || res.Missing != 1 {
		t.Fatalf("replay of b, d and a missing id: %+v, want 2 moved and 1 missing", res)
	}
	bodies := func(name string) string {
		t.Helper()
		ms, err := b.PeekQueue(ctx, name, 10)
		must(err)
		s := ""
		for _, m := range ms {
			s += string(m.Body)
		}
		return s
	}
	if got := bodies("orders"); got != "bd" {
		t.Fatalf("orders holds %q after the replay, want \"bd\"", got)
	}
	if got := bodies("dlq"); got != "ace" || dlq.unacked.Load() != 0 {
		t.Fatalf("dlq holds %q (unacked %d) after the replay, want \"ace\" and none unacked", got, dlq.unacked.Load())
	}
	if _, err := b.ReplaySelected(ctx, "dlq", make([]uint64, MaxReplayIDs+1), 0); err == nil {
		t.Fatalf("a replay of %d ids was accepted, want it refused (at most %d)", MaxReplayIDs+1, MaxReplayIDs)
	}
}
