package broker

import (
	"sync/atomic"
	"testing"

	"github.com/warren-mq/warren/queue"
	"github.com/warren-mq/warren/wire"
)

// TestEndedChannelReleasesHeldConfirms: a queue over its soft limit holds
// back its publishers' confirms (backpressure), but not those of a batch
// whose channel has ended (PublishBatch.Ended): its publisher's channel
// end waits for them. CmdReleaseEnded and a Down release the held ones,
// a batch held after its channel ended is confirmed at once, and the
// others stay held until the queue drains.
func TestEndedChannelReleasesHeldConfirms(t *testing.T) {
	b := startBroker(t, Config{Shards: 2, QueueSoftLimit: 2})
	if _, err := b.DeclareQueue(wire.QueueDeclare{Name: "q"}); err != nil {
		t.Fatal(err)
	}
	q := b.topo.lookupQueue("q")
	sh := q.shard
	k := &recSink{}
	publish := func(n int, ended *atomic.Bool) *PublishBatch {
		t.Helper()
		ar := &Arena{}
		ar.Refs.Store(int64(n))
		items := make([]EnqItem, n)
		for i := range items {
			items[i] = EnqItem{Q: q, Msg: ar.add(nil, nil, nil, []byte{byte(i)}, 0, 0), Meta: queue.Message{Size: 1}, Idx: i}
		}
		batch := &PublishBatch{Sink: k, Codes: make([]uint32, n), Ended: ended}
		batch.Pending.Store(1)
		b.Submit(Command{Kind: CmdPublish, Items: items, Batch: batch})
		barrier(t, sh)
		return batch
	}
	confirmed := func(want ...*PublishBatch) {
		t.Helper()
		k.mu.Lock()
		defer k.mu.Unlock()
		if len(k.confirms) != len(want) {
			t.Fatalf("%d confirms, want %d", len(k.confirms), len(want))
		}
		for i, c := range k.confirms {
			if c != want[i] {
				t.Fatalf("confirm %d is not of the batch expected", i)
			}
		}
	}

	var endA, endB, endC atomic.Bool
	a := publish(5, &endA) // over the limit: held
	bb := publish(1, &endB)
	c := publish(1, &endC)
	d := publish(1, nil) // a publisher that never ends its batches' channel
	confirmed()

	endA.Store(true)
	b.Submit(Command{Kind: CmdReleaseEnded}) // to every shard
	barrier(t, sh)
	confirmed(a)

	endB.Store(true)
	b.Submit(Command{Kind: CmdDown, Owner: 99}) // a connection's Down releases its ended ones too
	barrier(t, sh)
	confirmed(a, bb)

	// Held after its channel ended (in flight when the release ran): not held.
	e := publish(1, &endA)
	confirmed(a, bb, e)

	// The others wait for the queue to drain.
	if _, err := ask(t.Context(), sh, Command{Kind: CmdPurge, Queue: q}); err != nil {
		t.Fatal(err)
	}
	barrier(t, sh)
	confirmed(a, bb, e, c, d)
	barrier(t, sh)
	if n := len(sh.holding); n != 0 {
		t.Errorf("shard lists %d queues holding confirms after the drain, want 0", n)
	}
}
