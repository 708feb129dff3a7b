package netio

import (
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
	confirms []*pubBatch
	subs     []wire.Code
	cancels  []queue.ConsumerID
	gone     []queue.ConsumerID
	leases   []uint64
}

func (r *recSink) Deliver(ds []Delivery) {
	r.mu.Lock()
	r.delivers = append(r.delivers, append([]Delivery(nil), ds...))
	r.mu.Unlock()
}
func (r *recSink) Confirm(b *pubBatch) { r.mu.Lock(); r.confirms = append(r.confirms, b); r.mu.Unlock() }
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
func (r *recSink) ConsumerGone(id queue.ConsumerID) { r.mu.Lock(); r.gone = append(r.gone, id); r.mu.Unlock() }

// barrier waits until the shard has worked through everything submitted
// before it (and handed that work's effects to their sinks).
func barrier(t *testing.T, sh *shard) {
	t.Helper()
	done := make(chan struct{})
	sh.submit(func(*shard) { close(done) })
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("shard did not drain")
	}
}

// TestShardHandsEffectsToASink: a shard reaches no connection; every effect
// of its work reaches the Sink as a value, and a batch's deliveries to one
// sink arrive in one Deliver call, not one per message.
func TestShardHandsEffectsToASink(t *testing.T) {
	s, err := Start(Config{Addr: "127.0.0.1:0", Shards: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close(t.Context()) })
	if _, err := s.DeclareQueue(wire.QueueDeclare{Name: "q"}); err != nil {
		t.Fatal(err)
	}
	q := s.topo.lookupQueue("q")
	sh := q.shard
	k := &recSink{}
	const id = queue.ConsumerID(1 << 40)
	sh.submit(func(s *shard) {
		s.subscribe(q, k, queue.ConsumerSpec{ID: id, Owner: 7, Prefetch: 100}, 1)
	})
	const n = 10
	ar := &msgArena{}
	ar.refs.Store(n)
	msgs := make([]storedMsg, n)
	items := make([]enqItem, n)
	for i := range items {
		msgs[i] = storedMsg{body: []byte{byte(i)}, a: ar}
		items[i] = enqItem{q: q, msg: &msgs[i], meta: queue.Message{Size: 1}, idx: i}
	}
	batch := &pubBatch{sink: k, codes: make([]uint32, n)}
	batch.pending.Store(1)
	sh.submit(func(s *shard) { s.enqueue(items, batch) })
	barrier(t, sh)

	k.mu.Lock()
	if len(k.subs) != 1 || k.subs[0] != wire.OK {
		t.Errorf("subscribe answers = %v, want one OK", k.subs)
	}
	if len(k.confirms) != 1 || k.confirms[0] != batch {
		t.Errorf("confirms = %d, want the batch once", len(k.confirms))
	}
	if len(k.delivers) != 1 || len(k.delivers[0]) != n {
		t.Fatalf("Deliver calls = %d (sizes %v), want 1 of %d deliveries", len(k.delivers), sizes(k.delivers), n)
	}
	for i, d := range k.delivers[0] {
		if d.Consumer != id || d.Msg != &msgs[i] || d.DeliveryCount != 1 {
			t.Errorf("delivery %d = %+v", i, d)
		}
	}
	k.mu.Unlock()

	// Cancel with requeue: the queue forgets the consumer, and says so.
	sh.submit(func(s *shard) { s.cancel(q, id, true) })
	barrier(t, sh)
	k.mu.Lock()
	if len(k.gone) != 1 || k.gone[0] != id {
		t.Errorf("ConsumerGone = %v, want [%d]", k.gone, id)
	}
	k.mu.Unlock()

	// A second consumer is cancelled by the queue's deletion.
	k2 := &recSink{}
	sh.submit(func(s *shard) {
		s.subscribe(q, k2, queue.ConsumerSpec{ID: id + 1, Owner: 7, Prefetch: 1}, 2)
	})
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
