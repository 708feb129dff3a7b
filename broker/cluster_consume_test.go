package broker

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/warren-mq/warren/queue"
	"github.com/warren-mq/warren/wire"
)

// fwdClient is a client's side of consumers on one node, as a Sink: what
// it was handed, per consumer, and what the broker told it.
type fwdClient struct {
	mu      sync.Mutex
	got     []fwdGot
	subs    []wire.Code
	reasons []string // the subscribes' reasons
	cancels []queue.ConsumerID
	gone    []queue.ConsumerID
	answers []Result
	changed chan struct{}
}

type fwdGot struct {
	id    queue.ConsumerID
	body  string
	tag   uint64
	count uint32
}

func newFwdClient() *fwdClient { return &fwdClient{changed: make(chan struct{}, 1)} }

func (k *fwdClient) poke() {
	select {
	case k.changed <- struct{}{}:
	default:
	}
}

func (k *fwdClient) Deliver(ds []Delivery) {
	k.mu.Lock()
	for _, d := range ds {
		k.got = append(k.got, fwdGot{id: d.Consumer, body: string(d.Msg.Body()), tag: d.QTag, count: d.DeliveryCount})
	}
	k.mu.Unlock()
	k.poke()
}
func (k *fwdClient) Confirm(*PublishBatch) { k.poke() }
func (k *fwdClient) Subscribed(_ queue.ConsumerID, _ uint32, code wire.Code, reason string) {
	k.mu.Lock()
	k.subs = append(k.subs, code)
	k.reasons = append(k.reasons, reason)
	k.mu.Unlock()
	k.poke()
}
func (k *fwdClient) Cancelled(id queue.ConsumerID, _ wire.Code, _ string) {
	k.mu.Lock()
	k.cancels = append(k.cancels, id)
	k.mu.Unlock()
	k.poke()
}
func (*fwdClient) LeaseExpired(queue.ConsumerID, uint64) {}
func (k *fwdClient) ConsumerGone(id queue.ConsumerID) {
	k.mu.Lock()
	k.gone = append(k.gone, id)
	k.mu.Unlock()
	k.poke()
}
func (k *fwdClient) Answer(_ uint64, r Result) {
	k.mu.Lock()
	k.answers = append(k.answers, r)
	k.mu.Unlock()
	k.poke()
}

// snap copies what k recorded.
func (k *fwdClient) snap() fwdClient {
	k.mu.Lock()
	defer k.mu.Unlock()
	return fwdClient{got: slices.Clone(k.got), subs: slices.Clone(k.subs), reasons: slices.Clone(k.reasons), cancels: slices.Clone(k.cancels),
		gone: slices.Clone(k.gone), answers: slices.Clone(k.answers)}
}

// waitFor waits (20 s at most) until cond holds under k's lock.
func (k *fwdClient) waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.NewTimer(20 * time.Second)
	defer deadline.Stop()
	for {
		k.mu.Lock()
		ok := cond()
		k.mu.Unlock()
		if ok {
			return
		}
		select {
		case <-k.changed:
		case <-deadline.C:
			k.mu.Lock()
			defer k.mu.Unlock()
			t.Fatalf("timed out waiting for %s (got %d deliveries, subs %v)", what, len(k.got), k.subs)
		}
	}
}

// settle settles a delivery of a consumer of q on node b, as a
// connection there does.
func settleOn(b *Broker, q *Queue, id queue.ConsumerID, op wire.SettleOp, tags ...uint64) {
	items := make([]SettleItem, len(tags))
	for i, tag := range tags {
		items[i] = SettleItem{Q: q, Consumer: id, Op: op, QTag: tag}
	}
	b.Submit(Command{Kind: CmdSettle, Settles: items})
}

// rqCluster starts three nodes with a replicated queue rq holding n
// persistent messages m0.. confirmed, and returns the cluster, its
// leader and a node that does not lead it.
func rqCluster(t *testing.T, n int) (*testCluster, *clusterNode, *clusterNode) {
	return rqClusterFwd(t, n, 2*time.Second)
}

// rqClusterFwd: with this forward timeout.
func rqClusterFwd(t *testing.T, n int, fwdTimeout time.Duration) (*testCluster, *clusterNode, *clusterNode) {
	c := newTestClusterFwd(t, 3, 0, fwdTimeout)
	c.leader()
	c.declareSeen(wire.QueueDeclare{Name: "rq", Durable: true})
	lead := c.queueLeader("rq")
	var bodies []string
	for i := range n {
		bodies = append(bodies, fmt.Sprintf("m%d", i))
	}
	lb := lead.b.Load()
	k := newDurSink()
	batch := publish(lb, lb.topo.lookupQueue("rq"), k, true, bodies...)
	k.waitFor(t, "the confirm", func() bool { return k.confirmed(batch) })
	for i, code := range batch.Codes {
		if code != 0 {
			t.Fatalf("message %d nacked: %d", i, code)
		}
	}
	other := c.nodes[lead.id%3]
	return c, lead, other
}

// queueCounts is a node's view of rq once it has applied what its leader
// did (ready, unacked, consumers).
func queueCounts(nd *clusterNode) (int64, int, int) {
	info, _ := nd.b.Load().Queue("rq")
	return info.Ready, int(info.Unacked), int(info.Consumers)
}

// TestClusterForwardedConsume: a consumer on a node that does not lead
// the queue gets its messages through the leader: never more out than
// its prefetch (the leader's count says so), acks, requeues and rejects
// reach the leader, the requeued message comes back redelivered, and
// every message is consumed once acked. Its cancel with requeue returns
// what it held, and a closed connection's consumer (Down) too.
func TestClusterForwardedConsume(t *testing.T) {
	c, lead, other := rqCluster(t, 30)
	ob := other.b.Load()
	oq := ob.topo.lookupQueue("rq")
	k := newFwdClient()
	ob.Submit(Command{Kind: CmdSubscribe, Queue: oq, Sink: k, Spec: queue.ConsumerSpec{ID: 1, Owner: 7, Prefetch: 5}, Req: 1})
	k.waitFor(t, "five deliveries through the leader", func() bool { return len(k.got) == 5 })
	if subs := k.snap().subs; subs[0] != wire.OK {
		t.Fatalf("the forwarded subscribe answered %v", subs)
	}
	// The leader has exactly the prefetch out: it pushes no more.
	c.waitFor("the leader's count", func() bool { r, u, n := queueCounts(lead); return r == 25 && u == 5 && n == 1 })
	k.mu.Lock()
	first := slices.Clone(k.got)
	k.mu.Unlock()
	// Ack two, requeue one, reject one: four more come.
	settleOn(ob, oq, 1, wire.SettleAck, first[0].tag, first[1].tag)
	settleOn(ob, oq, 1, wire.SettleRequeue, first[2].tag)
	settleOn(ob, oq, 1, wire.SettleReject, first[3].tag)
	k.waitFor(t, "four more", func() bool { return len(k.got) == 9 })
	c.waitFor("the leader's count after the settles", func() bool { r, u, _ := queueCounts(lead); return r == 22 && u == 5 })
	// Ack everything as it comes, until the queue is empty.
	acked := map[string]int{}
	for _, g := range first[:2] {
		acked[g.body]++
	}
	seen := 4
	for {
		k.mu.Lock()
		todo := slices.Clone(k.got[seen:])
		k.mu.Unlock()
		seen += len(todo)
		for _, g := range todo {
			if g.body == first[2].body && g.count != 2 {
				t.Fatalf("the requeued message came back with delivery count %d, want 2", g.count)
			}
			acked[g.body]++
			settleOn(ob, oq, 1, wire.SettleAck, g.tag)
		}
		if len(acked) == 29 {
			break
		}
		k.waitFor(t, "more deliveries", func() bool { return len(k.got) > seen })
	}
	for b, n := range acked {
		if n != 1 {
			t.Fatalf("%s acked %d times", b, n)
		}
	}
	if acked[first[3].body] != 0 {
		t.Fatalf("the rejected message %s came back", first[3].body)
	}
	c.waitFor("the leader has nothing left", func() bool { r, u, _ := queueCounts(lead); return r == 0 && u == 0 })

	// Cancel with requeue: what it held goes back; the client hears
	// ConsumerGone.
	lb := lead.b.Load()
	more := newDurSink()
	batch := publish(lb, lb.topo.lookupQueue("rq"), more, true, "n0", "n1", "n2", "n3")
	more.waitFor(t, "the confirm", func() bool { return more.confirmed(batch) })
	k.waitFor(t, "the new ones", func() bool { return len(k.got) >= seen+4 })
	ob.Submit(Command{Kind: CmdCancel, Queue: oq, Consumer: 1, Requeue: true})
	k.waitFor(t, "the cancelled consumer gone", func() bool { return slices.Contains(k.gone, 1) })
	c.waitFor("its messages back at the leader", func() bool { r, u, n := queueCounts(lead); return r == 4 && u == 0 && n == 0 })

	// A closed connection's forwarded consumers are Downed at the leader.
	k2 := newFwdClient()
	ob.Submit(Command{Kind: CmdSubscribe, Queue: oq, Sink: k2, Spec: queue.ConsumerSpec{ID: 2, Owner: 8, Prefetch: 3}, Req: 2})
	k2.waitFor(t, "three for the second consumer", func() bool { return len(k2.got) == 3 })
	for _, g := range k2.snap().got {
		if g.count != 2 {
			t.Fatalf("%s: delivery count %d after a requeueing cancel, want 2", g.body, g.count)
		}
	}
	ob.Submit(Command{Kind: CmdDown, Owner: 8})
	c.waitFor("the Down at the leader", func() bool { r, u, n := queueCounts(lead); return r == 4 && u == 0 && n == 0 })
}

// TestClusterForwardedGetAndPurge: a get (a one-shot consumer whose
// barrier is its answer) and a purge on a node that does not lead the
// queue are answered by the leader.
func TestClusterForwardedGetAndPurge(t *testing.T) {
	c, lead, other := rqCluster(t, 3)
	ob := other.b.Load()
	oq := ob.topo.lookupQueue("rq")
	k := newFwdClient()
	ob.Submit(Command{Kind: CmdSubscribe, Queue: oq, Sink: k, Spec: queue.ConsumerSpec{ID: 1, Owner: 7, Prefetch: 1, Get: true}})
	ob.Submit(Command{Kind: CmdBarrier, Queue: oq, Sink: k, Req: 1})
	k.waitFor(t, "the get's answer", func() bool { return len(k.answers) == 1 })
	k.mu.Lock()
	got := slices.Clone(k.got)
	k.mu.Unlock()
	if len(got) != 1 || got[0].body != "m0" {
		t.Fatalf("the get was handed %v before its barrier, want m0", got)
	}
	ob.Submit(Command{Kind: CmdCancel, Queue: oq, Consumer: 1})
	settleOn(ob, oq, 1, wire.SettleAck, got[0].tag)
	k.waitFor(t, "the get's consumer gone", func() bool { return slices.Contains(k.gone, 1) })
	c.waitFor("the get's ack at the leader", func() bool { r, u, n := queueCounts(lead); return r == 2 && u == 0 && n == 0 })

	// Two gets at once (their subscribes before their barriers): each
	// barrier comes once both leaders' drains are in, and each get has
	// its own message.
	k3, k4 := newFwdClient(), newFwdClient()
	ob.Submit(Command{Kind: CmdSubscribe, Queue: oq, Sink: k3, Spec: queue.ConsumerSpec{ID: 3, Owner: 7, Prefetch: 1, Get: true}})
	ob.Submit(Command{Kind: CmdSubscribe, Queue: oq, Sink: k4, Spec: queue.ConsumerSpec{ID: 4, Owner: 8, Prefetch: 1, Get: true}})
	ob.Submit(Command{Kind: CmdBarrier, Queue: oq, Sink: k3, Req: 3})
	ob.Submit(Command{Kind: CmdBarrier, Queue: oq, Sink: k4, Req: 4})
	k3.waitFor(t, "the first get's answer", func() bool { return len(k3.answers) == 1 })
	k4.waitFor(t, "the second get's answer", func() bool { return len(k4.answers) == 1 })
	g3, g4 := k3.snap().got, k4.snap().got
	if len(g3) != 1 || len(g4) != 1 || g3[0].body == g4[0].body {
		t.Fatalf("two gets were handed %v and %v before their barriers, want one message each", g3, g4)
	}
	ob.Submit(Command{Kind: CmdCancel, Queue: oq, Consumer: 3, Requeue: true})
	ob.Submit(Command{Kind: CmdCancel, Queue: oq, Consumer: 4, Requeue: true})
	k3.waitFor(t, "the first get gone", func() bool { return len(k3.gone) == 1 })
	k4.waitFor(t, "the second get gone", func() bool { return len(k4.gone) == 1 })

	ob.Submit(Command{Kind: CmdPurge, Queue: oq, Sink: k, Req: 2})
	k.waitFor(t, "the purge's answer", func() bool { return len(k.answers) == 2 })
	if a := k.snap().answers[1]; a.Code != wire.OK || a.N != 2 {
		t.Fatalf("the forwarded purge answered %+v, want 2 removed", a)
	}
	c.waitFor("the leader purged", func() bool { r, _, _ := queueCounts(lead); return r == 0 })

	// A get of an empty queue: its barrier comes with nothing.
	ob.Submit(Command{Kind: CmdSubscribe, Queue: oq, Sink: k, Spec: queue.ConsumerSpec{ID: 2, Owner: 7, Prefetch: 1, Get: true}})
	ob.Submit(Command{Kind: CmdBarrier, Queue: oq, Sink: k, Req: 3})
	k.waitFor(t, "the empty get's answer", func() bool { return len(k.answers) == 3 })
	if got := k.snap().got; len(got) != 1 {
		t.Fatalf("an empty get was handed %v", got[1:])
	}
	ob.Submit(Command{Kind: CmdCancel, Queue: oq, Consumer: 2, Requeue: true})
	k.waitFor(t, "the empty get's consumer gone", func() bool { return slices.Contains(k.gone, 2) })
}

// consumeAll acks what k's consumer id gets on node b, from its from-th
// delivery, until acked (body → delivery count when first acked) has
// want messages.
func consumeAll(t *testing.T, b *Broker, q *Queue, k *fwdClient, id queue.ConsumerID, acked map[string]uint32, want int, from int) {
	t.Helper()
	seen := from
	for len(acked) < want {
		k.waitFor(t, fmt.Sprintf("more deliveries (%d of %d acked)", len(acked), want), func() bool { return len(k.got) > seen })
		k.mu.Lock()
		todo := slices.Clone(k.got[seen:])
		k.mu.Unlock()
		seen += len(todo)
		for _, g := range todo {
			if _, dup := acked[g.body]; !dup {
				acked[g.body] = g.count
			}
			settleOn(b, q, id, wire.SettleAck, g.tag)
		}
	}
}

// TestClusterForwardedConsumerFailover: a consumer on a node that does
// not lead the queue goes on receiving when the leadership moves (a
// transfer, then the leader killed): what it held unacked comes back
// redelivered, its acks of the old tags are ignored (no error, the
// consumer lives on), and every message is consumed; none is lost.
func TestClusterForwardedConsumerFailover(t *testing.T) {
	c, lead, other := rqCluster(t, 40)
	ob := other.b.Load()
	oq := ob.topo.lookupQueue("rq")
	k := newFwdClient()
	ob.Submit(Command{Kind: CmdSubscribe, Queue: oq, Sink: k, Spec: queue.ConsumerSpec{ID: 1, Owner: 7, Prefetch: 4}, Req: 1})
	k.waitFor(t, "four deliveries", func() bool { return len(k.got) == 4 })
	k.mu.Lock()
	held := slices.Clone(k.got)
	k.mu.Unlock()

	// The leadership is handed on while four are unacked.
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	if err := lead.b.Load().TransferLeaderships(ctx); err != nil {
		t.Fatal(err)
	}
	next := c.queueLeader("rq")
	if next == lead {
		t.Fatal("the transfer left the leader in place")
	}
	k.waitFor(t, "the held four again, redelivered", func() bool {
		n := 0
		for _, g := range k.got[4:] {
			if g.count == 2 {
				n++
			}
		}
		return n == 4
	})
	// The old tags' acks match nothing at the new leader: ignored.
	for _, g := range held {
		settleOn(ob, oq, 1, wire.SettleAck, g.tag)
	}
	if sn := k.snap(); len(sn.cancels) != 0 || len(sn.gone) != 0 {
		t.Fatalf("the consumer was cancelled by the failover: %v %v", sn.cancels, sn.gone)
	}
	acked := map[string]uint32{}
	consumeAll(t, ob, oq, k, 1, acked, 20, 4)

	// Now the leader dies (not the consumer's node, if it leads now:
	// then the node it left).
	victim := next
	if victim == other {
		victim = lead
		c.waitFor("the old leader knows it follows", func() bool {
			info, _ := lead.b.Load().Queue("rq")
			return info.RaftRole == "follower"
		})
	}
	k.mu.Lock()
	seen := len(k.got)
	k.mu.Unlock()
	c.stop(victim)
	consumeAll(t, ob, oq, k, 1, acked, 40, seen)
	for i := range 40 {
		if _, ok := acked[fmt.Sprintf("m%d", i)]; !ok {
			t.Fatalf("m%d was never delivered", i)
		}
	}
	final := c.queueLeader("rq")
	c.waitFor("nothing left at the last leader", func() bool { r, u, _ := queueCounts(final); return r == 0 && u == 0 })
	if sn := k.snap(); len(sn.cancels) != 0 {
		t.Fatalf("the consumer was cancelled: %v", sn.cancels)
	}
}

// TestClusterForwardedOriginGone: when the node a forwarded consumer's
// client is on dies, its leader Downs the consumer once it has not heard
// from that node for the forward timeout: what it held is redelivered to
// others.
func TestClusterForwardedOriginGone(t *testing.T) {
	c, lead, other := rqCluster(t, 10)
	ob := other.b.Load()
	oq := ob.topo.lookupQueue("rq")
	k := newFwdClient()
	ob.Submit(Command{Kind: CmdSubscribe, Queue: oq, Sink: k, Spec: queue.ConsumerSpec{ID: 1, Owner: 7, Prefetch: 3}, Req: 1})
	k.waitFor(t, "three deliveries", func() bool { return len(k.got) == 3 })
	c.waitFor("the leader's count", func() bool { _, u, n := queueCounts(lead); return u == 3 && n == 1 })
	c.stop(other)
	if c.queueLeader("rq") != lead {
		t.Skip("the leadership moved as the node went") // the leader stays: the queue has a majority
	}
	c.waitFor("the gone node's consumer Downed", func() bool { r, u, n := queueCounts(lead); return r == 10 && u == 0 && n == 0 })
}

// TestClusterForwardedLossRecovers: the transport may lose forwarded
// messages when a connection breaks. A delivery lost on its way to the
// consumer's node, and then an ack lost on its way back, would each hold
// the consumer's only prefetch slot for good; the keepalive's counts
// tell, the link is replaced, and the message comes back redelivered.
func TestClusterForwardedLossRecovers(t *testing.T) {
	c, lead, other := rqCluster(t, 4)
	var lostD, lostA atomic.Int32
	lose := func(from, to uint64, p []byte) bool {
		switch {
		case len(p) < 2 || p[0] != 'c':
		case from == lead.id && to == other.id && p[1] == 'd':
			return lostD.Add(1) == 1
		case from == other.id && to == lead.id && p[1] == 'A':
			return lostA.Add(1) == 1
		}
		return false
	}
	c.lose.Store(&lose)
	ob := other.b.Load()
	oq := ob.topo.lookupQueue("rq")
	k := newFwdClient()
	ob.Submit(Command{Kind: CmdSubscribe, Queue: oq, Sink: k, Spec: queue.ConsumerSpec{ID: 1, Owner: 7, Prefetch: 1}, Req: 1})
	k.waitFor(t, "m0 after its lost delivery", func() bool { return len(k.got) == 1 })
	if g := k.snap().got[0]; g.body != "m0" || g.count != 2 {
		t.Fatalf("got %s with delivery count %d, want m0 redelivered (2)", g.body, g.count)
	}
	settleOn(ob, oq, 1, wire.SettleAck, k.snap().got[0].tag) // lost
	k.waitFor(t, "m0 again after its lost ack", func() bool { return len(k.got) == 2 })
	if g := k.snap().got[1]; g.body != "m0" || g.count != 3 {
		t.Fatalf("got %s with delivery count %d, want m0 redelivered again (3)", g.body, g.count)
	}
	acked := map[string]uint32{}
	consumeAll(t, ob, oq, k, 1, acked, 4, 1)
	c.waitFor("nothing left at the leader", func() bool { r, u, _ := queueCounts(lead); return r == 0 && u == 0 })
	if lostD.Load() < 1 || lostA.Load() < 1 {
		t.Fatal("nothing was lost")
	}
}

// TestClusterForwardedOriginRestarts: a forwarded consumer's node that
// restarts has none of its clients; its leader hears its new incarnation
// (its hello) and Downs the old links at once, not after the forward
// timeout (a minute here, past the wait).
func TestClusterForwardedOriginRestarts(t *testing.T) {
	c, lead, other := rqClusterFwd(t, 10, time.Minute)
	ob := other.b.Load()
	oq := ob.topo.lookupQueue("rq")
	k := newFwdClient()
	ob.Submit(Command{Kind: CmdSubscribe, Queue: oq, Sink: k, Spec: queue.ConsumerSpec{ID: 1, Owner: 7, Prefetch: 3}, Req: 1})
	k.waitFor(t, "three deliveries", func() bool { return len(k.got) == 3 })
	c.waitFor("the origin's first incarnation known", func() bool { return lead.b.Load().origins.known(other.id) != 0 })
	c.stop(other)
	c.start(other, nil)
	if c.queueLeader("rq") != lead {
		t.Skip("the leadership moved as the node restarted")
	}
	c.waitFor("the old incarnation's consumer Downed", func() bool { r, u, n := queueCounts(lead); return r == 10 && u == 0 && n == 0 })
	// The restarted node's own consumers are served (their links' ids
	// are not the old incarnation's).
	ob = other.b.Load()
	c.sees(other, "queue rq durable=true")
	oq = ob.topo.lookupQueue("rq")
	k2 := newFwdClient()
	ob.Submit(Command{Kind: CmdSubscribe, Queue: oq, Sink: k2, Spec: queue.ConsumerSpec{ID: 1, Owner: 7, Prefetch: 3}, Req: 1})
	k2.waitFor(t, "three deliveries on the restarted node", func() bool { return len(k2.got) == 3 })
	for _, g := range k2.snap().got {
		if g.count != 2 {
			t.Fatalf("%s: delivery count %d, want 2 (held by the old incarnation's consumer)", g.body, g.count)
		}
	}
}

// TestClusterForwardedQueueDeleted: a forwarded consumer's queue deleted
// (on a third node) cancels it: the client hears Cancelled, then
// ConsumerGone, once.
func TestClusterForwardedQueueDeleted(t *testing.T) {
	c, lead, other := rqCluster(t, 5)
	ob := other.b.Load()
	oq := ob.topo.lookupQueue("rq")
	k := newFwdClient()
	ob.Submit(Command{Kind: CmdSubscribe, Queue: oq, Sink: k, Spec: queue.ConsumerSpec{ID: 1, Owner: 7, Prefetch: 2}, Req: 1})
	k.waitFor(t, "two deliveries", func() bool { return len(k.got) == 2 })
	third := c.nodes[0]
	for third == lead || third == other {
		third = c.nodes[third.id%3]
	}
	if _, err := third.b.Load().DeleteQueue(t.Context(), "rq", false, false); err != nil {
		t.Fatal(err)
	}
	k.waitFor(t, "the consumer cancelled and gone", func() bool { return len(k.cancels) == 1 && len(k.gone) == 1 })
	// A settle of the deleted queue's delivery is no error.
	settleOn(ob, oq, 1, wire.SettleAck, k.snap().got[0].tag)
	barrier(t, oq.shard)
	if sn := k.snap(); len(sn.cancels) != 1 || len(sn.gone) != 1 || sn.cancels[0] != 1 {
		t.Fatalf("cancels %v, gone %v: want consumer 1 once each", sn.cancels, sn.gone)
	}
}

// TestClusterForwardedConsumerBecomesLocal: the consumer's own node
// takes the queue's leadership; the consumer goes on through a link to
// that node itself, and what it held comes back redelivered.
func TestClusterForwardedConsumerBecomesLocal(t *testing.T) {
	c, lead, other := rqCluster(t, 12)
	ob := other.b.Load()
	oq := ob.topo.lookupQueue("rq")
	k := newFwdClient()
	ob.Submit(Command{Kind: CmdSubscribe, Queue: oq, Sink: k, Spec: queue.ConsumerSpec{ID: 1, Owner: 7, Prefetch: 3}, Req: 1})
	k.waitFor(t, "three deliveries", func() bool { return len(k.got) == 3 })
	lq := lead.b.Load().topo.lookupQueue("rq")
	c.waitFor("the leadership handed to the consumer's node", func() bool {
		done := make(chan struct{})
		lq.shard.submit(Command{Kind: cmdPost, post: func() {
			if lq.grp != nil && lq.grp.Leader() {
				lq.grp.TransferToPreferred(other.id)
			}
			close(done)
		}})
		<-done
		info, _ := ob.Queue("rq")
		return info.RaftRole == "leader"
	})
	acked := map[string]uint32{}
	consumeAll(t, ob, oq, k, 1, acked, 12, 0)
	for _, g := range k.snap().got[:3] {
		if acked[g.body] != 1 {
			t.Fatalf("%s first acked with delivery count %d", g.body, acked[g.body])
		}
	}
	again := map[string]bool{}
	for _, g := range k.snap().got[3:] {
		if g.count == 2 {
			again[g.body] = true
		}
	}
	for _, g := range k.snap().got[:3] {
		if !again[g.body] {
			t.Fatalf("%s, held at the transfer, did not come back redelivered", g.body)
		}
	}
	c.waitFor("nothing left", func() bool { r, u, _ := queueCounts(other); return r == 0 && u == 0 })
}
