package broker

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/warren-mq/warren/queue"
	"github.com/warren-mq/warren/wire"
)

// heldReplicaCluster starts three nodes and declares the replicated
// queue rq while a replica that is not its preferred leader hears none
// of its raft messages (held, as if slow to arrive): the other two elect
// a leader, which has n messages m0.. confirmed, and the held node knows
// the queue but no leader of it. It returns the cluster, the leader and
// the held node (release it with c.release).
func heldReplicaCluster(t *testing.T, n int, fwdTimeout time.Duration) (*testCluster, *clusterNode, *clusterNode) {
	c := newTestClusterFwd(t, 3, 0, fwdTimeout)
	c.leader()
	c.hold(1, 2, 3) // no queue group's messages reach anyone yet
	if _, err := c.nodes[0].b.Load().DeclareQueueAs(&wire.QueueDeclare{Name: "rq", Durable: true}, 0, ""); err != nil {
		t.Fatal(err)
	}
	for _, nd := range c.nodes {
		c.sees(nd, "queue rq durable=true")
	}
	b0 := c.nodes[0].b.Load()
	b0.topo.mu.Lock()
	mq, _ := b0.topo.meta.Queue("rq")
	b0.topo.mu.Unlock()
	held := c.nodes[mq.Leader%3] // a replica, not the preferred leader
	for _, nd := range c.nodes {
		if nd != held {
			c.release(nd)
		}
	}
	var lead *clusterNode
	c.waitFor("a leader of rq among the two nodes not held", func() bool {
		for _, nd := range c.nodes {
			if info, _ := nd.b.Load().Queue("rq"); nd != held && info.RaftRole == "leader" {
				lead = nd
				return true
			}
		}
		return false
	})
	if info, _ := held.b.Load().Queue("rq"); info.Leader != 0 {
		t.Fatalf("the held node knows leader %d", info.Leader)
	}
	var bodies []string
	for i := range n {
		bodies = append(bodies, "m"+string(rune('0'+i)))
	}
	if n > 0 {
		lb := lead.b.Load()
		k := newDurSink()
		batch := publish(lb, lb.topo.lookupQueue("rq"), k, true, bodies...)
		k.waitFor(t, "the confirm", func() bool { return k.confirmed(batch) })
	}
	return c, lead, held
}

// TestClusterForwardedWaitsForLeader: a purge and a consumer on a
// replica that knows no leader of the queue yet (right after its declare,
// as a client that declares and at once consumes does) wait instead of
// being refused, and go to the leader as soon as the node hears of it:
// the purge (asked first) removes what was there, and the consumer gets
// what comes after.
func TestClusterForwardedWaitsForLeader(t *testing.T) {
	c, lead, held := heldReplicaCluster(t, 5, 2*time.Second)
	hb := held.b.Load()
	hq := hb.topo.lookupQueue("rq")
	k := newFwdClient()
	hb.Submit(Command{Kind: CmdPurge, Queue: hq, Sink: k, Req: 1})
	hb.Submit(Command{Kind: CmdSubscribe, Queue: hq, Sink: k, Spec: queue.ConsumerSpec{ID: 1, Owner: 7, Prefetch: 10}, Req: 1})
	barrier(t, hq.shard)
	if sn := k.snap(); len(sn.subs) != 0 || len(sn.answers) != 0 {
		t.Fatalf("answered with no leader known: subscribes %v %q, answers %+v", sn.subs, sn.reasons, sn.answers)
	}

	c.release(held)
	k.waitFor(t, "the purge and the subscribe answered", func() bool { return len(k.subs) == 1 && len(k.answers) == 1 })
	sn := k.snap()
	if sn.subs[0] != wire.OK {
		t.Fatalf("the subscribe answered %v: %q", sn.subs[0], sn.reasons)
	}
	if a := sn.answers[0]; a.Code != wire.OK || a.N != 5 {
		t.Fatalf("the purge answered %+v, want 5 removed", a)
	}
	lb := lead.b.Load()
	ks := newDurSink()
	batch := publish(lb, lb.topo.lookupQueue("rq"), ks, true, "a", "b", "c")
	ks.waitFor(t, "the confirm", func() bool { return ks.confirmed(batch) })
	k.waitFor(t, "three deliveries through the leader", func() bool { return len(k.got) == 3 })
	if got := k.snap().got; got[0].body != "a" || got[2].body != "c" {
		t.Fatalf("delivered %v, want a, b, c", got)
	}
}

// TestClusterForwardedNoLeaderRefused: what waits for a leader is bounded
// in count (past maxLeaderWaits a request of the queue is refused at
// once) and in time: with no leader heard of for the forward timeout,
// subscribes, gets and purges are refused saying so (the get's barrier
// answered, with nothing). Once the node hears the leader, a new
// subscribe is served.
func TestClusterForwardedNoLeaderRefused(t *testing.T) {
	const fwdTimeout = 2 * time.Second
	c, _, held := heldReplicaCluster(t, 0, fwdTimeout)
	hb := held.b.Load()
	hq := hb.topo.lookupQueue("rq")
	k, kg, kp := newFwdClient(), newFwdClient(), newFwdClient()
	hb.Submit(Command{Kind: CmdPurge, Queue: hq, Sink: kp, Req: 1})
	hb.Submit(Command{Kind: CmdSubscribe, Queue: hq, Sink: kg, Spec: queue.ConsumerSpec{ID: 1, Owner: 7, Prefetch: 1, Get: true}})
	hb.Submit(Command{Kind: CmdBarrier, Queue: hq, Sink: kg, Req: 2})
	for i := range maxLeaderWaits - 2 {
		hb.Submit(Command{Kind: CmdSubscribe, Queue: hq, Sink: k, Spec: queue.ConsumerSpec{ID: queue.ConsumerID(10 + i), Owner: 7, Prefetch: 1}})
	}
	barrier(t, hq.shard)
	if sn := k.snap(); len(sn.subs)+len(kg.snap().subs)+len(kp.snap().answers) != 0 {
		t.Fatalf("%d subscribes answered with no leader known (%q…)", len(sn.subs), sn.reasons[:min(1, len(sn.reasons))])
	}
	// One more is past the bound: refused at once.
	kx := newFwdClient()
	hb.Submit(Command{Kind: CmdSubscribe, Queue: hq, Sink: kx, Spec: queue.ConsumerSpec{ID: 5, Owner: 7, Prefetch: 1}})
	barrier(t, hq.shard)
	if sn := kx.snap(); len(sn.subs) != 1 || sn.subs[0] != wire.PreconditionFailed || !strings.Contains(sn.reasons[0], "wait for one") {
		t.Fatalf("a subscribe past the bound answered %v %q", sn.subs, sn.reasons)
	}

	// The forward timeout passes (the clock is moved, not waited for).
	c.skewMs.Add((fwdTimeout + time.Second).Milliseconds())
	k.waitFor(t, "every waiting subscribe refused", func() bool { return len(k.subs) == maxLeaderWaits-2 })
	kg.waitFor(t, "the get refused and its barrier answered", func() bool { return len(kg.subs) == 1 && len(kg.answers) == 1 })
	kp.waitFor(t, "the purge refused", func() bool { return len(kp.answers) == 1 })
	const want = "no leader is known yet"
	ks, gs := k.snap(), kg.snap()
	for _, sn := range []*fwdClient{&ks, &gs} {
		for i, code := range sn.subs {
			if code != wire.PreconditionFailed || !strings.Contains(sn.reasons[i], want) {
				t.Fatalf("a waiting subscribe refused with %v %q, want %q", code, sn.reasons[i], want)
			}
		}
	}
	if a := kg.snap().answers[0]; a.Code != wire.OK || len(kg.snap().got) != 0 {
		t.Fatalf("the get's barrier answered %+v with %v", a, kg.snap().got)
	}
	if a := kp.snap().answers[0]; a.Code != wire.PreconditionFailed || !strings.Contains(a.Reason, want) {
		t.Fatalf("the waiting purge answered %+v", a)
	}

	c.release(held)
	c.queueLeader("rq") // every replica knows it
	k2 := newFwdClient()
	hb.Submit(Command{Kind: CmdSubscribe, Queue: hq, Sink: k2, Spec: queue.ConsumerSpec{ID: 2, Owner: 7, Prefetch: 1}, Req: 1})
	k2.waitFor(t, "a subscribe once the leader is known", func() bool { return len(k2.subs) == 1 })
	if sn := k2.snap(); sn.subs[0] != wire.OK {
		t.Fatalf("answered %v %q", sn.subs, sn.reasons)
	}
}

// TestClusterForwardedPurgeFollowsLeader: a purge forwarded to a node
// that no longer leads the queue (the origin has not heard of the new
// leader yet: its raft messages are held) follows that node's answer to
// the new leader instead of being refused.
func TestClusterForwardedPurgeFollowsLeader(t *testing.T) {
	c, lead, other := rqCluster(t, 4)
	third := c.nodes[0]
	for third == lead || third == other {
		third = c.nodes[third.id%3]
	}
	c.waitFor("the third replica knows the leader", func() bool { info, _ := third.b.Load().Queue("rq"); return info.Leader == lead.id })
	c.hold(third.id)
	// One more message, which the third replica lacks: the transfer goes
	// to the other, more caught up.
	lb := lead.b.Load()
	ks := newDurSink()
	batch := publish(lb, lb.topo.lookupQueue("rq"), ks, true, "m4")
	ks.waitFor(t, "the confirm", func() bool { return ks.confirmed(batch) })
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	if err := lb.TransferLeaderships(ctx); err != nil {
		t.Fatal(err)
	}
	c.waitFor("the old leader names the new one", func() bool {
		info, _ := lead.b.Load().Queue("rq")
		oi, _ := other.b.Load().Queue("rq")
		return info.Leader == other.id && oi.RaftRole == "leader"
	})
	if info, _ := third.b.Load().Queue("rq"); info.Leader != lead.id {
		t.Fatalf("the held replica knows leader %d", info.Leader)
	}
	tb := third.b.Load()
	k := newFwdClient()
	tb.Submit(Command{Kind: CmdPurge, Queue: tb.topo.lookupQueue("rq"), Sink: k, Req: 1})
	k.waitFor(t, "the purge's answer", func() bool { return len(k.answers) == 1 })
	if a := k.snap().answers[0]; a.Code != wire.OK || a.N != 5 {
		t.Fatalf("the purge answered %+v, want 5 removed", a)
	}
	c.release(third)
}

// TestClusterForwardedPublishWaitsForLeader: a publish on a replica that
// knows no leader of the queue yet is held (not nacked) and confirmed
// once the node hears of the leader.
func TestClusterForwardedPublishWaitsForLeader(t *testing.T) {
	c, lead, held := heldReplicaCluster(t, 0, 2*time.Second)
	hb := held.b.Load()
	hq := hb.topo.lookupQueue("rq")
	k := newDurSink()
	batch := publish(hb, hq, k, true, "p")
	barrier(t, hq.shard)
	k.mu.Lock()
	n := len(k.confirms)
	k.mu.Unlock()
	if n != 0 {
		t.Fatalf("confirmed with no leader known: %v", batch.Codes)
	}
	c.release(held)
	k.waitFor(t, "the confirm", func() bool { return k.confirmed(batch) })
	if batch.Codes[0] != 0 {
		t.Fatalf("nacked: %d", batch.Codes[0])
	}
	c.waitFor("the message at the leader", func() bool { r, _, _ := queueCounts(lead); return r == 1 })
}
