package broker

import (
	"testing"

	"github.com/warren-mq/warren/queue"
	"github.com/warren-mq/warren/segment"
	"github.com/warren-mq/warren/wire"
)

// inlineQueue declares an in-memory queue on a one-shard broker with a
// consumer whose deliveries k records, and returns it.
func inlineQueue(t *testing.T, b *Broker, k *recSink) *Queue {
	t.Helper()
	if _, err := b.DeclareQueue(wire.QueueDeclare{Name: "q"}); err != nil {
		t.Fatal(err)
	}
	q := b.LookupQueue("q")
	b.Submit(Command{Kind: CmdSubscribe, Queue: q, Sink: k, Spec: queue.ConsumerSpec{ID: b.NewConsumerID(), Owner: 1, Prefetch: 10}})
	barrier(t, q.shard)
	// The barrier is answered within the shard's batch: wait for the
	// shard's goroutine to let go of it, so that the shard is idle.
	q.shard.own.Lock()
	q.shard.own.Unlock()
	return q
}

// publishInline is publishTo through SubmitInline, confirmed to k.
func publishInline(b *Broker, q *Queue, k Sink, body string) *PublishBatch {
	ar := &Arena{}
	ar.Refs.Store(1)
	m := ar.add([]byte{}, []byte(q.Name()), nil, []byte(body), 0, 0)
	batch := &PublishBatch{Sink: k, Codes: make([]uint32, 1)}
	batch.Pending.Store(1)
	b.SubmitInline(Command{Kind: CmdPublish, Items: []EnqItem{{Q: q, Msg: m, Meta: queue.Message{Size: uint32(len(body))}}}, Batch: batch})
	return batch
}

func (r *recSink) counts() (delivered, confirmed int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, ds := range r.delivers {
		delivered += len(ds)
	}
	return delivered, len(r.confirms)
}

// TestSubmitInlineRunsOnTheCaller: an idle shard holding only in-memory
// queues runs a publish and a settlement submitted with SubmitInline on
// the caller's goroutine: the delivery and the confirm have reached their
// sinks, and the ack has settled, when SubmitInline returns.
func TestSubmitInlineRunsOnTheCaller(t *testing.T) {
	b := startBroker(t, Config{Shards: 1})
	k := &recSink{}
	q := inlineQueue(t, b, k)
	publishInline(b, q, k, "one")
	if d, c := k.counts(); d != 1 || c != 1 {
		t.Fatalf("after SubmitInline: %d deliveries and %d confirms, want 1 and 1 (run on the caller)", d, c)
	}
	if n := q.unacked.Load(); n != 1 {
		t.Fatalf("unacked = %d, want 1", n)
	}
	k.mu.Lock()
	dv := k.delivers[0][0]
	k.mu.Unlock()
	b.SubmitInline(Command{Kind: CmdSettle, Settles: []SettleItem{{Q: q, Consumer: dv.Consumer, Op: wire.SettleAck, QTag: dv.QTag}}})
	if n := q.unacked.Load(); n != 0 {
		t.Fatalf("unacked = %d after an inline ack, want 0", n)
	}
}

// TestSubmitInlineBusyShard: while something else runs the shard's work
// (here the test holds it), SubmitInline only queues: the shard's
// goroutine runs the command once it is free.
func TestSubmitInlineBusyShard(t *testing.T) {
	b := startBroker(t, Config{Shards: 1})
	k := &recSink{}
	q := inlineQueue(t, b, k)
	sh := q.shard
	sh.own.Lock()
	publishInline(b, q, k, "one")
	if d, c := k.counts(); d != 0 || c != 0 {
		sh.own.Unlock()
		t.Fatalf("SubmitInline ran the work of a shard someone else held (%d deliveries, %d confirms)", d, c)
	}
	sh.own.Unlock()
	barrier(t, sh)
	if d, c := k.counts(); d != 1 || c != 1 {
		t.Fatalf("after the shard ran: %d deliveries and %d confirms, want 1 and 1", d, c)
	}
}

// TestSubmitInlineOff: NoInlineShards, and a shard holding a durable queue
// (whose paths wait on the raft worker), keep the work on the shard's
// goroutine.
func TestSubmitInlineOff(t *testing.T) {
	b := startBroker(t, Config{Shards: 1, NoInlineShards: true})
	k := &recSink{}
	q := inlineQueue(t, b, k)
	if q.shard.inline.Load() {
		t.Fatal("NoInlineShards: the shard runs inline")
	}

	n := openDurNode(t, segment.NewMemFS())
	defer n.close(t)
	mem := declareDurable(t, n.b, "mem", false)
	if !mem.shard.inline.Load() {
		t.Fatal("a shard with only in-memory queues does not run inline")
	}
	var dq *Queue
	for i := 0; dq == nil || dq.shard != mem.shard; i++ { // a durable queue on the same shard
		dq = declareDurable(t, n.b, "d"+string(rune('a'+i)), true)
	}
	barrier(t, dq.shard)
	dq.shard.own.Lock() // (the batch that answered the barrier has ended)
	inline := dq.shard.inline.Load()
	dq.shard.own.Unlock()
	if inline {
		t.Fatal("a shard holding a durable queue runs inline")
	}
}

// TestSubmitInlineLeavesControlToTheShard: a loop runs a shard's batch
// only if it holds publishes and settlements; a control command queued
// before them (a create may open a durable queue, a delete takes the
// topology's lock) leaves the whole batch to the shard's goroutine.
func TestSubmitInlineLeavesControlToTheShard(t *testing.T) {
	b := startBroker(t, Config{Shards: 1})
	k := &recSink{}
	q := inlineQueue(t, b, k)
	sh := q.shard
	sh.own.Lock() // as submitInline holds it; the goroutine waits
	sh.mu.Lock()
	sh.inbox = append(sh.inbox, Command{Kind: CmdBarrier, Queue: q, Sink: k})
	sh.mu.Unlock()
	publishInline(b, q, k, "one") // TryLock fails: queued
	if sh.drainOnce(true) {
		t.Fatal("an inline run took a batch holding a control command")
	}
	sh.mu.Lock()
	n := len(sh.inbox)
	sh.mu.Unlock()
	if d, _ := k.counts(); d != 0 || n != 2 {
		t.Fatalf("after the refused inline run: %d deliveries, %d commands queued; want 0 and 2", d, n)
	}
	sh.own.Unlock()
	barrier(t, sh)
	if d, c := k.counts(); d != 1 || c != 1 {
		t.Fatalf("after the shard ran: %d deliveries and %d confirms, want 1 and 1", d, c)
	}
}
