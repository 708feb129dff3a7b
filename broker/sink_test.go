package broker

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/warren-mq/warren/queue"
	"github.com/warren-mq/warren/wire"
)

// recSink records the effects a shard hands it, as values.
type recSink struct {
	mu       sync.Mutex
	delivers [][]Delivery // one entry per Deliver call
	confirms []*PublishBatch
	subs     []wire.Code
	cancels  []queue.ConsumerID
	gone     []queue.ConsumerID
	leases   []uint64
	answers  []Result
}

func (r *recSink) Deliver(ds []Delivery) {
	r.mu.Lock()
	r.delivers = append(r.delivers, append([]Delivery(nil), ds...))
	r.mu.Unlock()
}
func (r *recSink) Confirm(b *PublishBatch) {
	r.mu.Lock()
	r.confirms = append(r.confirms, b)
	r.mu.Unlock()
}
func (r *recSink) Subscribed(_ queue.ConsumerID, _ uint32, code wire.Code, _ string) {
	r.mu.Lock()
	r.subs = append(r.subs, code)
	r.mu.Unlock()
}
func (r *recSink) Cancelled(id queue.ConsumerID, _ wire.Code, _ string) {
	r.mu.Lock()
	r.cancels = append(r.cancels, id)
	r.mu.Unlock()
}
func (r *recSink) LeaseExpired(_ queue.ConsumerID, qtag uint64) {
	r.mu.Lock()
	r.leases = append(r.leases, qtag)
	r.mu.Unlock()
}
func (r *recSink) ConsumerGone(id queue.ConsumerID) {
	r.mu.Lock()
	r.gone = append(r.gone, id)
	r.mu.Unlock()
}
func (r *recSink) Answer(_ uint64, res Result) {
	r.mu.Lock()
	r.answers = append(r.answers, res)
	r.mu.Unlock()
}

// barrier waits until the shard has worked through everything submitted
// before it (and handed that work's effects to their sinks).
func barrier(t *testing.T, sh *shard) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	if _, err := ask(ctx, sh, Command{Kind: CmdBarrier}); err != nil {
		t.Fatal("shard did not drain: ", err)
	}
}

// TestShardHandsEffectsToASink: a shard reaches no connection; every effect
// of its work reaches the Sink as a value, and a batch's deliveries to one
// sink arrive in one Deliver call, not one per message.
func TestShardHandsEffectsToASink(t *testing.T) {
	s := startBroker(t, Config{Shards: 1})
	if _, err := s.DeclareQueue(wire.QueueDeclare{Name: "q"}); err != nil {
		t.Fatal(err)
	}
	q := s.topo.lookupQueue("q")
	sh := q.shard
	k := &recSink{}
	const id = queue.ConsumerID(1 << 40)
	sh.submit(Command{Kind: CmdSubscribe, Queue: q, Sink: k, Spec: queue.ConsumerSpec{ID: id, Owner: 7, Prefetch: 100}, Req: 1})
	const n = 10
	ar := &Arena{}
	ar.Refs.Store(n)
	msgs := make([]StoredMsg, n)
	items := make([]EnqItem, n)
	for i := range items {
		msgs[i] = *ar.add(nil, nil, nil, []byte{byte(i)}, 0, 0)
		items[i] = EnqItem{Q: q, Msg: &msgs[i], Meta: queue.Message{Size: 1}, Idx: i}
	}
	batch := &PublishBatch{Sink: k, Codes: make([]uint32, n)}
	batch.Pending.Store(1)
	sh.submit(Command{Kind: CmdPublish, Items: items, Batch: batch})
	barrier(t, sh)

	k.mu.Lock()
	if len(k.subs) != 1 || k.subs[0] != wire.OK {
		t.Errorf("subscribe answers = %v, want one OK", k.subs)
	}
	if len(k.confirms) != 1 || k.confirms[0] != batch {
		t.Errorf("confirms = %d, want the batch once", len(k.confirms))
	}
	if len(k.delivers) != 1 || len(k.delivers[0]) != n {
		k.mu.Unlock()
		t.Fatalf("Deliver calls = %d (sizes %v), want 1 of %d deliveries", len(k.delivers), sizes(k.delivers), n)
	}
	for i, d := range k.delivers[0] {
		if d.Consumer != id || d.Msg != &msgs[i] || d.DeliveryCount != 1 {
			t.Errorf("delivery %d = %+v", i, d)
		}
	}
	k.mu.Unlock()

	// Cancel with requeue: the queue forgets the consumer, and says so.
	sh.submit(Command{Kind: CmdCancel, Queue: q, Consumer: id, Requeue: true})
	barrier(t, sh)
	k.mu.Lock()
	if len(k.gone) != 1 || k.gone[0] != id {
		t.Errorf("ConsumerGone = %v, want [%d]", k.gone, id)
	}
	k.mu.Unlock()

	// A second consumer is cancelled by the queue's deletion.
	k2 := &recSink{}
	sh.submit(Command{Kind: CmdSubscribe, Queue: q, Sink: k2, Spec: queue.ConsumerSpec{ID: id + 1, Owner: 7, Prefetch: 1}, Req: 2})
	barrier(t, sh)
	if _, err := s.DeleteQueue(t.Context(), "q", false, false); err != nil {
		t.Fatal(err)
	}
	barrier(t, sh)
	k2.mu.Lock()
	defer k2.mu.Unlock()
	if len(k2.cancels) != 1 || len(k2.gone) != 1 || len(k2.delivers) != 1 || len(k2.delivers[0]) != 1 {
		t.Errorf("second consumer: cancels %v, gone %v, delivers %v; want one each (and one delivery)", k2.cancels, k2.gone, sizes(k2.delivers))
	}
}

func sizes(ds [][]Delivery) []int {
	var out []int
	for _, d := range ds {
		out = append(out, len(d))
	}
	return out
}

// TestRequestCommandsAnswerTheSink: purge, peek and a conditional delete
// are command values, answered to the submitting sink under its reference.
func TestRequestCommandsAnswerTheSink(t *testing.T) {
	s := startBroker(t, Config{Shards: 1})
	if _, err := s.DeclareQueue(wire.QueueDeclare{Name: "q"}); err != nil {
		t.Fatal(err)
	}
	q := s.topo.lookupQueue("q")
	sh := q.shard
	const n = 3
	ar := &Arena{}
	ar.Refs.Store(n)
	msgs := make([]StoredMsg, n)
	items := make([]EnqItem, n)
	for i := range items {
		msgs[i] = *ar.add(nil, nil, nil, []byte{byte('a' + i)}, 0, 0)
		items[i] = EnqItem{Q: q, Msg: &msgs[i], Meta: queue.Message{Size: 1}}
	}
	k := &recSink{}
	sh.submit(Command{Kind: CmdPublish, Items: items})
	sh.submit(Command{Kind: CmdPeek, Queue: q, N: 2, Sink: k, Req: 10})
	sh.submit(Command{Kind: CmdDelete, Queue: q, IfEmpty: true, Sink: k, Req: 11})
	sh.submit(Command{Kind: CmdPurge, Queue: q, Sink: k, Req: 12})
	sh.submit(Command{Kind: CmdDelete, Queue: q, IfEmpty: true, Sink: k, Req: 13, Reason: "gone"})
	sh.submit(Command{Kind: CmdPurge, Queue: q, Sink: k, Req: 14})
	barrier(t, sh)
	k.mu.Lock()
	defer k.mu.Unlock()
	if len(k.answers) != 5 {
		t.Fatalf("answers = %+v, want 5", k.answers)
	}
	if a := k.answers[0]; a.Code != wire.OK || len(a.Msgs) != 2 || string(a.Msgs[0].Body) != "a" || string(a.Msgs[1].Body) != "b" {
		t.Errorf("peek answered %+v, want messages a, b", a)
	}
	if a := k.answers[1]; a.Code != wire.PreconditionFailed {
		t.Errorf("delete if-empty of a full queue answered %+v, want precondition_failed", a)
	}
	if a := k.answers[2]; a.Code != wire.OK || a.N != n {
		t.Errorf("purge answered %+v, want %d removed", a, n)
	}
	if a := k.answers[3]; a.Code != wire.OK || a.N != 0 {
		t.Errorf("delete if-empty of an empty queue answered %+v, want ok", a)
	}
	if a := k.answers[4]; a.Code != wire.NotFound {
		t.Errorf("purge of a deleted queue answered %+v, want not_found", a)
	}
	if _, ok := s.Queue("q"); ok {
		t.Error("the queue is still listed after its delete")
	}
}

// startBroker runs a broker for one test.
func startBroker(t *testing.T, cfg Config) *Broker {
	t.Helper()
	b := New(cfg)
	b.Start()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := b.Stop(ctx); err != nil {
			t.Errorf("broker did not stop: %v", err)
		}
	})
	return b
}
