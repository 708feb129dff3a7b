package broker

import (
	"testing"

	"github.com/warren-mq/warren/queue"
	"github.com/warren-mq/warren/wire"
)

// pendingLen reads the shard's pending map on the shard goroutine.
func pendingLen(t *testing.T, sh *shard) int {
	t.Helper()
	n := make(chan int, 1)
	sh.submit(Command{Kind: cmdPost, post: func() { n <- len(sh.pending) }})
	return <-n
}

// A connection that consumed and went leaves nothing in its shard: the
// batch the shard kept for its sink (and the delivered messages the
// batch's array still pointed at) goes once the sink has not been
// flushed for a while. Before, every sink that ever got a delivery stayed
// in the shard's pending map for good: a client connecting, consuming
// and disconnecting in a loop grew the broker without bound.
func TestPendingSinksDoNotAccumulate(t *testing.T) {
	b := startBroker(t, Config{Shards: 1})
	if _, err := b.DeclareQueue(wire.QueueDeclare{Name: "q"}); err != nil {
		t.Fatal(err)
	}
	q := b.LookupQueue("q")
	sh := q.shard
	const conns = 50
	for i := range conns {
		owner := uint64(100 + i)
		k := &recSink{}
		b.Submit(Command{Kind: CmdSubscribe, Queue: q, Sink: k, Spec: queue.ConsumerSpec{ID: b.NewConsumerID(), Owner: queue.OwnerID(owner), Prefetch: 10}})
		publishTo(b, q, "m")
		barrier(t, sh)
		if len(k.delivers) == 0 { // the earlier ones' messages come back too (never acked)
			t.Fatalf("connection %d: no delivery", i)
		}
		b.Submit(Command{Kind: CmdDown, Owner: owner})
		barrier(t, sh)
	}
	if n := pendingLen(t, sh); n < conns/2 {
		t.Fatalf("only %d sinks pending before any sweep: the test does not exercise the sweep", n)
	}
	for range 2 * pendingSweepEvery {
		barrier(t, sh) // a flush each
	}
	if n := pendingLen(t, sh); n != 0 {
		t.Fatalf("%d sinks of closed connections still pending in the shard", n)
	}
	// A batch keeps no delivered message alive between flushes.
	live := &recSink{}
	b.Submit(Command{Kind: CmdSubscribe, Queue: q, Sink: live, Spec: queue.ConsumerSpec{ID: b.NewConsumerID(), Owner: 1, Prefetch: 100}})
	publishTo(b, q, "a", "b", "c")
	barrier(t, sh)
	held := make(chan int, 1)
	sh.submit(Command{Kind: cmdPost, post: func() {
		pb := sh.pending[live]
		n := 0
		for _, d := range pb.ds[:cap(pb.ds)] {
			if d.Msg != nil {
				n++
			}
		}
		held <- n
	}})
	if n := <-held; n != 0 {
		t.Fatalf("the sink's batch still points at %d delivered messages after the flush", n)
	}
}
