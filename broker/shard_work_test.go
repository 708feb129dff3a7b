package broker

import (
	"cmp"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/warren-mq/warren/queue"
	"github.com/warren-mq/warren/wire"
)

// idleQueues gives shard sh n queues that no connection uses and that
// have no timer, created as the topology would (a CmdCreate each) but
// without routing: they only make the shard big.
func idleQueues(t *testing.T, sh *shard, n int) {
	t.Helper()
	for i := range n {
		sh.submit(Command{Kind: CmdCreate, Queue: &Queue{name: fmt.Sprintf("idle-%d", i), shard: sh}})
	}
	barrier(t, sh)
}

// signalSink is a recSink that says when a delivery arrives.
type signalSink struct {
	recSink
	got chan struct{}
}

func (s *signalSink) Deliver(ds []Delivery) {
	s.recSink.Deliver(ds)
	select {
	case s.got <- struct{}{}:
	default:
	}
}

// TestTickVisitsOnlyDueQueues: a shard with many idle queues and one whose
// message expires does the expiry when its timer fires, and looks at the
// due queue only, not at every queue it owns.
func TestTickVisitsOnlyDueQueues(t *testing.T) {
	b := startBroker(t, Config{Shards: 1})
	must := mustFunc(t)
	declareDeadLetterQueue(t, b)
	_, err := b.DeclareQueue(wire.QueueDeclare{Name: "ttl", Args: wire.Table{
		{Key: "message-ttl", Value: wire.Int(5)}, {Key: "dead-letter-exchange", Value: wire.String("dlx")}}})
	must(err)
	sh := b.shards[0]
	const idle = 2000
	idleQueues(t, sh, idle)

	k := &signalSink{got: make(chan struct{}, 1)}
	dlq := b.LookupQueue("dlq")
	b.Submit(Command{Kind: CmdSubscribe, Queue: dlq, Sink: k, Spec: queue.ConsumerSpec{ID: b.NewConsumerID(), Owner: 1, Prefetch: 10}})
	barrier(t, sh)
	before := sh.visited.Load()
	publishTo(b, b.LookupQueue("ttl"), "expires")
	select {
	case <-k.got: // the message expired on the shard's timer and was dead-lettered
	case <-time.After(10 * time.Second):
		t.Fatal("the expired message never reached the dead-letter queue")
	}
	barrier(t, sh)
	if n := sh.visited.Load() - before; n < 1 || n > 3 {
		t.Errorf("the timer looked at %d queues to expire one message, want 1 (the due queue; %d idle queues)", n, idle)
	}
}

// TestDownVisitsOnlyTheConnectionsQueues: a closed connection's Down looks
// at the queues where it has consumers and the exclusive queues it owns,
// and at no other; what it held still goes back, its exclusive queue is
// still deleted, and a consumer it cancelled or lost to a deleted queue no
// longer counts.
func TestDownVisitsOnlyTheConnectionsQueues(t *testing.T) {
	b := startBroker(t, Config{Shards: 1})
	must := mustFunc(t)
	sh := b.shards[0]
	for _, name := range []string{"used", "cancelled", "deleted"} {
		_, err := b.DeclareQueue(wire.QueueDeclare{Name: name})
		must(err)
	}
	_, err := b.DeclareQueueAs(&wire.QueueDeclare{Name: "excl", Exclusive: true}, 8, "")
	must(err)
	const idle = 2000
	idleQueues(t, sh, idle)

	used, cancelled, deleted := b.LookupQueue("used"), b.LookupQueue("cancelled"), b.LookupQueue("deleted")
	k := &recSink{}
	sub := func(q *Queue) queue.ConsumerID {
		id := b.NewConsumerID()
		b.Submit(Command{Kind: CmdSubscribe, Queue: q, Sink: k, Spec: queue.ConsumerSpec{ID: id, Owner: 7, Prefetch: 10}})
		return id
	}
	sub(used)
	c2 := sub(cancelled)
	sub(deleted)
	publishTo(b, used, "held")
	b.Submit(Command{Kind: CmdCancel, Queue: cancelled, Consumer: c2, Requeue: true})
	barrier(t, sh)
	if _, err := b.DeleteQueue(t.Context(), "deleted", false, false); err != nil {
		t.Fatal(err)
	}
	barrier(t, sh)
	if used.unacked.Load() != 1 {
		t.Fatalf("queue used: %d unacked, want the 1 message out with connection 7", used.unacked.Load())
	}

	down := func(conn uint64) int64 {
		t.Helper()
		before := sh.visited.Load()
		b.Submit(Command{Kind: CmdDown, Owner: conn})
		barrier(t, sh)
		return sh.visited.Load() - before
	}
	if n := down(9); n != 0 {
		t.Errorf("Down of a connection that used no queue looked at %d queues, want 0", n)
	}
	if n := down(7); n != 1 {
		t.Errorf("Down of connection 7 looked at %d queues, want 1 (its consumer's; not the cancelled or deleted ones, nor %d idle)", n, idle)
	}
	if used.ready.Load() != 1 || used.unacked.Load() != 0 || used.consumers.Load() != 0 {
		t.Errorf("queue used after Down: ready %d unacked %d consumers %d, want the message back (1 0 0)", used.ready.Load(), used.unacked.Load(), used.consumers.Load())
	}
	if n := down(7); n != 0 {
		t.Errorf("a second Down of connection 7 looked at %d queues, want 0", n)
	}
	if n := down(8); n != 1 {
		t.Errorf("Down of connection 8 looked at %d queues, want 1 (its exclusive queue)", n)
	}
	if b.LookupQueue("excl") != nil {
		t.Error("the exclusive queue outlived its owner")
	}

	// A consumer cancelled without requeue still holds its delivery: its
	// connection still uses the queue until it settles it.
	_, err = b.DeclareQueue(wire.QueueDeclare{Name: "draining"})
	must(err)
	draining := b.LookupQueue("draining")
	k6 := &recSink{}
	c6 := b.NewConsumerID()
	b.Submit(Command{Kind: CmdSubscribe, Queue: draining, Sink: k6, Spec: queue.ConsumerSpec{ID: c6, Owner: 6, Prefetch: 10}})
	publishTo(b, draining, "one", "two")
	b.Submit(Command{Kind: CmdCancel, Queue: draining, Consumer: c6})
	barrier(t, sh)
	k6.mu.Lock()
	first := k6.delivers[0][0].QTag
	k6.mu.Unlock()
	b.Submit(Command{Kind: CmdSettle, Settles: []SettleItem{{Q: draining, Consumer: c6, Op: wire.SettleAck, QTag: first}}})
	barrier(t, sh)
	if n := down(6); n != 1 {
		t.Errorf("Down of connection 6 looked at %d queues, want 1 (its cancelled consumer still held a delivery)", n)
	}
	if draining.ready.Load() != 1 || draining.unacked.Load() != 0 {
		t.Errorf("queue draining after Down: ready %d unacked %d, want the held delivery back (1 0)", draining.ready.Load(), draining.unacked.Load())
	}
}

// TestTimerHeapAgainstAModel: random sets, removals and pops agree with a
// map of wake times; due queues come out earliest first, ties by name.
func TestTimerHeapAgainstAModel(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	qs := make([]*Queue, 50)
	for i := range qs {
		qs[i] = &Queue{name: fmt.Sprintf("q%02d", i)}
	}
	var h timerHeap
	model := map[*Queue]int64{}
	now := int64(0)
	for step := 0; step < 20000; step++ {
		q := qs[rng.IntN(len(qs))]
		switch r := rng.IntN(10); {
		case r < 6:
			at := now + int64(rng.IntN(100))
			h.set(q, at)
			model[q] = at
		case r < 7:
			h.remove(q)
			delete(model, q)
		default:
			now += int64(rng.IntN(20))
			got := h.popDue(now, nil)
			var want []*Queue
			for mq, at := range model {
				if at <= now {
					want = append(want, mq)
				}
			}
			slices.SortFunc(want, func(a, b *Queue) int {
				if c := cmp.Compare(model[a], model[b]); c != 0 {
					return c
				}
				return strings.Compare(a.name, b.name)
			})
			for _, mq := range want {
				delete(model, mq)
			}
			if !slices.Equal(got, want) {
				t.Fatalf("step %d: popDue(%d) = %v, want %v", step, now, names(got), names(want))
			}
			for _, q := range got {
				if q.timerIdx != 0 || q.wakeAt != 0 {
					t.Fatalf("step %d: popped queue %s still marked (idx %d, wake %d)", step, q.name, q.timerIdx, q.wakeAt)
				}
			}
		}
		if len(h) != len(model) {
			t.Fatalf("step %d: heap holds %d queues, model %d", step, len(h), len(model))
		}
		for i, q := range h {
			if q.timerIdx != i+1 || model[q] != q.wakeAt {
				t.Fatalf("step %d: queue %s at %d has index %d, wake %d (model %d)", step, q.name, i, q.timerIdx, q.wakeAt, model[q])
			}
			if i > 0 && h.less(i, (i-1)/2) {
				t.Fatalf("step %d: heap order broken at %d", step, i)
			}
		}
	}
}

func names(qs []*Queue) []string {
	var out []string
	for _, q := range qs {
		out = append(out, q.name)
	}
	return out
}

// TestLeaseExpiryForgetsADrainedConsumer: a consumer cancelled without
// requeue whose last delivery its lease takes back is drained: the shard
// forgets it (ConsumerGone, after the lease notice) and its connection no
// longer uses the queue, as when it settles its last delivery.
func TestLeaseExpiryForgetsADrainedConsumer(t *testing.T) {
	var now atomic.Int64
	now.Store(1_000_000)
	b := startBroker(t, Config{Shards: 1, Clock: now.Load, ManualTicks: true})
	sh := b.shards[0]
	_, err := b.DeclareQueue(wire.QueueDeclare{Name: "leased"})
	mustFunc(t)(err)
	q := b.LookupQueue("leased")
	k := &recSink{}
	id := b.NewConsumerID()
	b.Submit(Command{Kind: CmdSubscribe, Queue: q, Sink: k, Spec: queue.ConsumerSpec{ID: id, Owner: 5, Prefetch: 10, TimeoutMs: 100}})
	publishTo(b, q, "m")
	b.Submit(Command{Kind: CmdCancel, Queue: q, Consumer: id})
	barrier(t, sh)
	now.Add(200)
	b.FireTimers()
	barrier(t, sh)
	k.mu.Lock()
	leases, gone := len(k.leases), slices.Clone(k.gone)
	k.mu.Unlock()
	if leases != 1 || !slices.Equal(gone, []queue.ConsumerID{id}) {
		t.Errorf("after the lease expired: %d lease notices, ConsumerGone %v; want 1 and [%d]", leases, gone, id)
	}
	before := sh.visited.Load()
	b.Submit(Command{Kind: CmdDown, Owner: 5})
	barrier(t, sh)
	if n := sh.visited.Load() - before; n != 0 {
		t.Errorf("Down of the drained consumer's connection looked at %d queues, want 0", n)
	}
}

// TestSubmitSettleCopiesItems: Submit of a CmdSettle copies the items it
// keeps (netio reuses its slice for the next SETTLE frame as soon as
// Submit returns), with one shard and with several; overwriting the slice
// after Submit changes nothing (and under -race, a kept slice is a race).
func TestSubmitSettleCopiesItems(t *testing.T) {
	for _, shards := range []int{1, 3} {
		t.Run(fmt.Sprintf("shards=%d", shards), func(t *testing.T) {
			b := startBroker(t, Config{Shards: shards})
			must := mustFunc(t)
			k := &recSink{}
			var items []SettleItem
			var qs []*Queue
			for i := range 6 {
				name := fmt.Sprintf("q%d", i)
				_, err := b.DeclareQueue(wire.QueueDeclare{Name: name})
				must(err)
				q := b.LookupQueue(name)
				qs = append(qs, q)
				c := b.NewConsumerID()
				b.Submit(Command{Kind: CmdSubscribe, Queue: q, Sink: k, Spec: queue.ConsumerSpec{ID: c, Owner: 1, Prefetch: 10}})
				publishTo(b, q, "a", "b")
				items = append(items, SettleItem{Q: q, Consumer: c, Op: wire.SettleAck})
			}
			for _, sh := range b.shards {
				barrier(t, sh)
			}
			k.mu.Lock()
			for _, ds := range k.delivers {
				for _, d := range ds {
					for i := range items {
						if items[i].Consumer == d.Consumer && items[i].QTag == 0 {
							items[i].QTag = d.QTag // the first of each queue's two
							break
						}
					}
				}
			}
			k.mu.Unlock()
			b.Submit(Command{Kind: CmdSettle, Settles: items})
			for i := range items {
				items[i] = SettleItem{Q: qs[0], Op: wire.SettleAck, QTag: 1 << 40} // no such tag
			}
			for _, sh := range b.shards {
				barrier(t, sh)
			}
			for _, q := range qs {
				if n := q.unacked.Load(); n != 1 {
					t.Errorf("%s: %d unacked after acking one of two, want 1", q.Name(), n)
				}
			}
		})
	}
}
