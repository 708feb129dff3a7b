package broker

import (
	"testing"

	"github.com/warren-mq/warren/queue"
	"github.com/warren-mq/warren/wire"
)

// TestSettleRunSettlesTheConsumersDeliveriesInRange: a SettleItem with a
// Last settles every delivery its consumer holds with a queue tag in
// QTag..Last, in one command, and none of another consumer's in between
// (round-robin interleaves them); a delivery in the range settled before
// is skipped, not settled twice; a requeue run puts back exactly the run's.
func TestSettleRunSettlesTheConsumersDeliveriesInRange(t *testing.T) {
	b, q, sh := oneQueue(t)
	ka, kb := &recSink{}, &recSink{}
	ca, cb := b.NewConsumerID(), b.NewConsumerID()
	b.Submit(Command{Kind: CmdSubscribe, Queue: q, Sink: ka, Spec: queue.ConsumerSpec{ID: ca, Owner: 1, Prefetch: 10}})
	b.Submit(Command{Kind: CmdSubscribe, Queue: q, Sink: kb, Spec: queue.ConsumerSpec{ID: cb, Owner: 2, Prefetch: 10}})
	publishTo(b, q, "1", "2", "3", "4", "5", "6", "7", "8")
	barrier(t, sh)
	tags := func(k *recSink) (ts []uint64) {
		k.mu.Lock()
		defer k.mu.Unlock()
		for _, ds := range k.delivers {
			for _, d := range ds {
				ts = append(ts, d.QTag)
			}
		}
		return ts
	}
	ta, tb := tags(ka), tags(kb)
	if len(ta) != 4 || len(tb) != 4 || ta[1] == ta[0]+1 {
		t.Fatalf("deliveries: a %v, b %v; want 4 each, interleaved", ta, tb)
	}
	// a's second delivery acked alone, then a run over all four of a's.
	b.Submit(Command{Kind: CmdSettle, Settles: []SettleItem{{Q: q, Consumer: ca, Op: wire.SettleAck, QTag: ta[1]}}})
	b.Submit(Command{Kind: CmdSettle, Settles: []SettleItem{{Q: q, Consumer: ca, Op: wire.SettleAck, QTag: ta[0], Last: ta[3]}}})
	barrier(t, sh)
	if n, acked := q.unacked.Load(), q.m.Stats.Acked; n != 4 || acked != 4 {
		t.Fatalf("after a's run: %d unacked, %d acked; want b's 4 unacked and a's 4 acked", n, acked)
	}
	// b's first three requeued as a run: they are redelivered, the fourth stays out.
	b.Submit(Command{Kind: CmdCancel, Queue: q, Consumer: ca})
	b.Submit(Command{Kind: CmdSettle, Settles: []SettleItem{{Q: q, Consumer: cb, Op: wire.SettleRequeue, QTag: tb[0], Last: tb[2]}}})
	barrier(t, sh)
	if tb2 := tags(kb); len(tb2) != 7 || tb2[4] <= tb[3] {
		t.Fatalf("b's deliveries after requeueing a run of 3: %v, want 3 more after %v", tb2, tb)
	}
	if n := q.unacked.Load(); n != 4 {
		t.Errorf("%d unacked after the requeue, want 4 (1 kept, 3 redelivered)", n)
	}
}

// TestSettleJoinsAdjacentRuns: runs and single tags of one consumer with
// consecutive queue tags, joined into one machine command, settle what the
// tags one by one would.
func TestSettleJoinsAdjacentRuns(t *testing.T) {
	b, q, sh := oneQueue(t)
	k := &recSink{}
	c := b.NewConsumerID()
	b.Submit(Command{Kind: CmdSubscribe, Queue: q, Sink: k, Spec: queue.ConsumerSpec{ID: c, Owner: 1, Prefetch: 10}})
	publishTo(b, q, "1", "2", "3", "4", "5", "6")
	barrier(t, sh)
	k.mu.Lock()
	first := k.delivers[0][0].QTag
	k.mu.Unlock()
	b.Submit(Command{Kind: CmdSettle, Settles: []SettleItem{
		{Q: q, Consumer: c, Op: wire.SettleAck, QTag: first, Last: first + 1},
		{Q: q, Consumer: c, Op: wire.SettleAck, QTag: first + 2},
		{Q: q, Consumer: c, Op: wire.SettleAck, QTag: first + 3, Last: first + 4},
	}})
	barrier(t, sh)
	if n := q.unacked.Load(); n != 1 || q.m.Stats.Acked != 5 {
		t.Errorf("%d unacked, %d acked; want 1 and 5", n, q.m.Stats.Acked)
	}
}

// oneQueue starts a broker with one shard and declares queue "q" on it.
func oneQueue(t *testing.T) (*Broker, *Queue, *shard) {
	t.Helper()
	b := startBroker(t, Config{Shards: 1})
	_, err := b.DeclareQueue(wire.QueueDeclare{Name: "q"})
	mustFunc(t)(err)
	return b, b.LookupQueue("q"), b.shards[0]
}
