package broker

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/warren-mq/warren/queue"
	"github.com/warren-mq/warren/wire"
	"go.etcd.io/raft/v3/raftpb"
)

// TestClusterReplicatedQueue: a durable queue with three replicas is a
// raft group over the three nodes. Persistent messages published with
// confirms at its leader, and acks of some of them, are committed on a
// majority; a publish at a follower is forwarded to the leader and
// confirmed from there (a consumer there too: cluster_consume_test.go).
// With the leader stopped, another
// replica is elected, and a consumer there gets every confirmed message
// not acked, those the dead leader had delivered unacked as redelivered;
// none lost. The stopped node restarts and catches up as a follower.
func TestClusterReplicatedQueue(t *testing.T) {
	c := newTestCluster(t, 3)
	c.leader()
	c.declareSeen(wire.QueueDeclare{Name: "rq", Durable: true})
	lead := c.queueLeader("rq")
	lq := lead.b.Load().topo.lookupQueue("rq")
	k := newDurSink()
	var bodies []string
	for i := range 20 {
		bodies = append(bodies, fmt.Sprintf("m%d", i))
	}
	batch := publish(lead.b.Load(), lq, k, true, bodies...)
	k.waitFor(t, "the confirm at the leader", func() bool { return k.confirmed(batch) })
	for i, code := range batch.Codes {
		if code != 0 {
			t.Fatalf("message %d nacked (%d) at the leader", i, code)
		}
	}
	lq.shard.submit(Command{Kind: CmdSubscribe, Queue: lq, Sink: k, Spec: queue.ConsumerSpec{ID: 1, Owner: 7, Prefetch: 5}, Req: 1})
	k.waitFor(t, "five deliveries at the leader", func() bool { return len(k.got) == 5 })
	k.mu.Lock()
	acked := []uint64{k.got[0].tag, k.got[1].tag}
	k.mu.Unlock()
	for _, tag := range acked {
		lead.b.Load().Submit(Command{Kind: CmdSettle, Settles: []SettleItem{{Q: lq, Consumer: 1, Op: wire.SettleAck, QTag: tag}}})
	}
	// Its confirm says the acks before it are committed too.
	sync := publish(lead.b.Load(), lq, k, true, "m20")
	k.waitFor(t, "the acks' commit", func() bool { return k.confirmed(sync) && len(k.got) == 7 })

	// A follower serves nothing of the queue.
	var follower *clusterNode
	for _, nd := range c.nodes {
		if nd != lead {
			follower = nd
		}
	}
	// Each node's part and indexes (admin API, /metrics): the follower
	// applies what the leader committed.
	li, _ := lead.b.Load().Queue("rq")
	if li.RaftRole != "leader" || li.RaftApplied == 0 || li.RaftCommit < li.RaftApplied {
		t.Fatalf("at the leader: role %q, commit %d, applied %d", li.RaftRole, li.RaftCommit, li.RaftApplied)
	}
	c.waitFor("the follower applied what the leader did", func() bool {
		fi, _ := follower.b.Load().Queue("rq")
		return fi.RaftRole == "follower" && fi.RaftApplied >= li.RaftApplied && fi.Ready == li.Ready
	})
	// A publish at a follower goes to the leader (forward.go), and its
	// confirm comes back once the leader applied it.
	fq := follower.b.Load().topo.lookupQueue("rq")
	fk := newDurSink()
	fwd := publish(follower.b.Load(), fq, fk, true, "forwarded")
	fk.waitFor(t, "the forwarded publish's confirm", func() bool { return fk.confirmed(fwd) })
	if fwd.Codes[0] != 0 {
		t.Fatalf("a publish at a follower: code %d, want a confirm", fwd.Codes[0])
	}

	// The leader goes.
	c.stop(lead)
	lead2 := c.queueLeader("rq")
	if lead2 == lead {
		t.Fatal("the stopped node still leads")
	}
	nq := lead2.b.Load().topo.lookupQueue("rq")
	k2 := newDurSink()
	nq.shard.submit(Command{Kind: CmdSubscribe, Queue: nq, Sink: k2, Spec: queue.ConsumerSpec{ID: 3, Owner: 9}, Req: 3})
	k2.waitFor(t, "20 deliveries at the new leader", func() bool { return len(k2.got) >= 20 })
	barrier(t, nq.shard)
	k2.mu.Lock()
	var got []string
	for _, d := range k2.got {
		got = append(got, fmt.Sprintf("%s/%d", d.body, d.count))
	}
	k2.mu.Unlock()
	slices.Sort(got)
	var want []string
	for i := 2; i <= 20; i++ {
		n := 1
		if i < 7 {
			n = 2 // delivered unacked at the dead leader (prefetch 5, then 2 more after the acks)
		}
		want = append(want, fmt.Sprintf("m%d/%d", i, n))
	}
	want = append(want, "forwarded/1")
	slices.Sort(want)
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Fatalf("at the new leader the consumer got\n%v\nwant\n%v", got, want)
	}

	// The stopped node restarts and follows: it applies what was
	// committed while it was down (20 delivered to the new consumer, none acked yet).
	c.start(lead, nil)
	c.sees(lead, "queue rq durable=true")
	c.waitFor("the restarted node's copy of rq caught up", func() bool {
		info, _ := lead.b.Load().Queue("rq")
		want, _ := lead2.b.Load().Queue("rq")
		return info.Leader == lead2.id && info.Ready == want.Ready && info.Unacked == want.Unacked && info.Unacked == 20
	})
}

// TestClusterSnapshotInstall: a replica that was down while its leader
// snapshotted and compacted the queue's log gets the snapshot (with the
// live entries it lacks) over the transport, installs it and follows
// again: with the other follower stopped, a publish is confirmed, which
// needs the restarted replica's vote.
func TestClusterSnapshotInstall(t *testing.T) {
	c := newTestCluster(t, 3)
	c.leader()
	c.declareSeen(wire.QueueDeclare{Name: "rq", Durable: true})
	lead := c.queueLeader("rq")
	var behind, other *clusterNode
	for _, nd := range c.nodes {
		switch {
		case nd == lead:
		case behind == nil:
			behind = nd
		default:
			other = nd
		}
	}
	c.stop(behind)
	lb := lead.b.Load()
	lq := lb.topo.lookupQueue("rq")
	k := newDurSink()
	var bodies []string
	for i := range 10 {
		bodies = append(bodies, fmt.Sprintf("m%d", i))
	}
	batch := publish(lb, lq, k, true, bodies...)
	k.waitFor(t, "the confirm", func() bool { return k.confirmed(batch) })
	lq.shard.submit(Command{Kind: CmdSubscribe, Queue: lq, Sink: k, Spec: queue.ConsumerSpec{ID: 1, Owner: 7, Prefetch: 3}, Req: 1})
	k.waitFor(t, "three deliveries", func() bool { return len(k.got) == 3 })
	k.mu.Lock()
	tag := k.got[0].tag
	k.mu.Unlock()
	lb.Submit(Command{Kind: CmdSettle, Settles: []SettleItem{{Q: lq, Consumer: 1, Op: wire.SettleAck, QTag: tag}}})
	sync := publish(lb, lq, k, true, "m10")
	k.waitFor(t, "the ack's commit", func() bool { return k.confirmed(sync) && len(k.got) == 4 })

	// The leader snapshots and compacts: the stopped replica's next entry
	// is gone from its log. So does the other follower, which may lead
	// for a while (an election under load, the balancer): whichever node
	// leads when the stopped replica is back has to send it a snapshot.
	for _, nd := range []*clusterNode{lead, other} {
		b := nd.b.Load()
		q := b.topo.lookupQueue("rq")
		snapped := make(chan error, 1)
		c.waitFor("the replica applied the ack", func() bool {
			info, _ := b.Queue("rq")
			want, _ := lb.Queue("rq")
			return info.RaftApplied >= want.RaftApplied
		})
		q.shard.submit(Command{Kind: cmdPost, post: func() {
			err := q.grp.Snapshot(b.cfg.Durable.Snapshots, func(_ raftpb.SnapshotMetadata, err error) { snapped <- err })
			if err != nil {
				snapped <- err
			}
		}})
		if err := <-snapped; err != nil {
			t.Fatal(err)
		}
	}

	c.start(behind, nil)
	c.sees(behind, "queue rq durable=true")
	want, _ := lb.Queue("rq")
	c.waitFor("the restarted replica installed the snapshot and caught up", func() bool {
		got, _ := behind.b.Load().Queue("rq")
		return got.Ready == want.Ready && got.Unacked == want.Unacked && got.Leader == lead.id
	})
	bq := behind.b.Load().topo.lookupQueue("rq")
	installs := make(chan uint64, 1)
	bq.shard.submit(Command{Kind: cmdPost, post: func() { installs <- bq.shard.rw.Stats().SnapshotsInstalled }})
	// One install, as a rule. None when the appends the leader sent while
	// the replica was down were still queued in the transport and reached
	// it after its restart (they hold the entries: about 1 run in 10 here);
	// the catch-up above then came from them, and a broken install still
	// fails the test in the other runs (it never catches up).
	if n := <-installs; n > 1 {
		t.Fatalf("the restarted replica installed %d snapshots, want 1", n)
	}
	c.stop(other)
	last := publish(lb, lq, k, true, "m11")
	k.waitFor(t, "a confirm with the restarted replica as the majority", func() bool { return k.confirmed(last) })
	if last.Codes[0] != 0 {
		t.Fatalf("m11 nacked (%d)", last.Codes[0])
	}
}

// TestClusterTransferLeaderships: a node about to shut down hands every
// queue it leads to a follower, which then leads and confirms; what was
// confirmed stays.
func TestClusterTransferLeaderships(t *testing.T) {
	c := newTestCluster(t, 3)
	c.leader()
	for _, name := range []string{"a", "b", "c"} {
		if _, err := c.nodes[0].b.Load().DeclareQueueAs(&wire.QueueDeclare{Name: name, Durable: true}, 0, ""); err != nil {
			t.Fatal(err)
		}
	}
	lead := c.queueLeader("a")
	lq := lead.b.Load().topo.lookupQueue("a")
	k := newDurSink()
	batch := publish(lead.b.Load(), lq, k, true, "m0", "m1")
	k.waitFor(t, "the confirm", func() bool { return k.confirmed(batch) })
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	if err := lead.b.Load().TransferLeaderships(ctx); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"a", "b", "c"} {
		if info, _ := lead.b.Load().Queue(name); info.RaftRole == "leader" {
			t.Fatalf("queue %s still led by node %d after the transfer", name, lead.id)
		}
	}
	next := c.queueLeader("a")
	if next == lead {
		t.Fatal("the transfer ended with the same leader")
	}
	nq := next.b.Load().topo.lookupQueue("a")
	more := publish(next.b.Load(), nq, k, true, "m2")
	k.waitFor(t, "a confirm at the new leader", func() bool { return k.confirmed(more) })
	if info, _ := next.b.Load().Queue("a"); info.Ready != 3 {
		t.Fatalf("the new leader holds %d messages, want 3", info.Ready)
	}
}

// TestClusterLeaderBalancer: a queue's preferred leader that was down and
// came back gets the leadership back from the node that took it (the
// balancer runs every 100 ticks: 1 s at the tests' 10 ms tick).
func TestClusterLeaderBalancer(t *testing.T) {
	c := newTestCluster(t, 3)
	c.leader()
	c.declareOn(c.nodes[0], wire.QueueDeclare{Name: "rq", Durable: true})
	lead := c.queueLeader("rq")
	pref := c.nodes[lead.b.Load().topo.lookupQueue("rq").prefLeader-1]
	if lead != pref {
		// Placement's preferred leader campaigns first, but another may
		// win the first election: make it the preferred one's.
		c.waitFor("the preferred leader leads", func() bool { return c.queueLeader("rq") == pref })
	}
	c.stop(pref)
	if c.queueLeader("rq") == pref {
		t.Fatal("a stopped node leads")
	}
	c.start(pref, nil)
	c.waitFor("the preferred leader leads again", func() bool { return c.queueLeader("rq") == pref })
}

// TestClusterForwardedPublish: a publish on a node holding no replica of
// the queue (replicas 1) goes to the one that does and is confirmed from
// there; with that node down, the forward gets no answer and is nacked
// once the forward timeout passes (never left unanswered).
func TestClusterForwardedPublish(t *testing.T) {
	c := newTestCluster(t, 3)
	c.leader()
	holder, others := c.declareOneReplica("one")
	other := others[len(others)-1]
	if info, _ := other.b.Load().Queue("one"); info.RaftRole != "none" {
		t.Fatalf("node %d, not a replica, says its part is %q", other.id, info.RaftRole)
	}
	oq := other.b.Load().topo.lookupQueue("one")
	k := newDurSink()
	batch := publish(other.b.Load(), oq, k, true, "a", "b")
	k.waitFor(t, "the forwarded confirm", func() bool { return k.confirmed(batch) })
	if batch.Codes[0] != 0 || batch.Codes[1] != 0 {
		t.Fatalf("forwarded publish answered %v, want confirms", batch.Codes)
	}
	if info, _ := holder.b.Load().Queue("one"); info.Ready != 2 {
		t.Fatalf("the replica holds %d messages, want 2", info.Ready)
	}
	// Inspection on a node with no replica names the one that has it.
	pk := &recSink{}
	oq.shard.submit(Command{Kind: CmdPeek, Queue: oq, Sink: pk, N: 1, Req: 9})
	barrier(t, oq.shard)
	pk.mu.Lock()
	answers := slices.Clone(pk.answers)
	pk.mu.Unlock()
	if len(answers) != 1 || answers[0].Code != wire.PreconditionFailed || !strings.Contains(answers[0].Reason, "holds no replica") {
		t.Fatalf("a peek on a node without a replica answered %+v", answers)
	}
	c.stop(holder)
	lost := publish(other.b.Load(), oq, k, true, "c")
	k.waitFor(t, "the nack of a forward nobody answers", func() bool { return k.confirmed(lost) })
	if lost.Codes[0] != uint32(wire.InternalNack) {
		t.Fatalf("a forward to a stopped node answered %d, want a nack", lost.Codes[0])
	}
}

// TestClusterStepDownNacks: messages added at a leader in the same batch
// as a leadership transfer are never proposed (raft refuses proposals
// during a transfer); when the leader steps down their publish is nacked,
// never confirmed (a confirm would promise a message no log holds).
func TestClusterStepDownNacks(t *testing.T) {
	c := newTestCluster(t, 3)
	c.leader()
	c.declareOn(c.nodes[0], wire.QueueDeclare{Name: "rq", Durable: true})
	lead := c.queueLeader("rq")
	lb := lead.b.Load()
	lq := lb.topo.lookupQueue("rq")
	k := newDurSink()
	ar := &Arena{}
	ar.Refs.Store(1)
	batch := &PublishBatch{Sink: k, Codes: make([]uint32, 1)}
	batch.Pending.Store(1)
	msg := ar.add([]byte("x"), []byte("rq"), nil, []byte("late"), wire.Persistent, 0)
	lq.shard.submit(Command{Kind: cmdPost, post: func() {
		lq.shard.apply(&Command{Kind: CmdPublish, Items: []EnqItem{{Q: lq, Msg: msg, Meta: queue.Message{Size: 4}}}, Batch: batch})
		if _, ok := lq.grp.TransferToFollower(); !ok {
			t.Error("no follower to transfer to")
		}
	}})
	k.waitFor(t, "the publish's answer", func() bool { return k.confirmed(batch) })
	next := c.queueLeader("rq")
	info, _ := next.b.Load().Queue("rq")
	if batch.Codes[0] == 0 && info.Ready != 1 {
		t.Fatalf("confirmed, and the new leader (node %d) holds %d messages", next.id, info.Ready)
	}
	if next == lead {
		t.Fatal("the transfer did not happen")
	}
}

// A publish made while a leadership transfer is pending (raft drops every
// proposal then) is held and proposed once the transfer ends. Here the
// transfer goes to a stopped follower, so raft abandons it after an
// election timeout and this node still leads: the publish is confirmed.
// Before, it was dropped with its entry and never answered while no later
// publish came (review).
func TestClusterPublishDuringAbortedTransfer(t *testing.T) {
	c := newTestCluster(t, 3)
	c.leader()
	c.declareOn(c.nodes[0], wire.QueueDeclare{Name: "rq", Durable: true})
	lead := c.queueLeader("rq")
	var gone *clusterNode
	for _, nd := range c.nodes {
		if nd != lead && nd != c.leader() {
			gone = nd
		}
	}
	if gone == nil { // the queue's leader leads the metadata group too
		for _, nd := range c.nodes {
			if nd != lead {
				gone = nd
				break
			}
		}
	}
	c.stop(gone)
	lq := lead.b.Load().topo.lookupQueue("rq")
	k := newDurSink()
	ar := &Arena{}
	ar.Refs.Store(1)
	batch := &PublishBatch{Sink: k, Codes: make([]uint32, 1)}
	batch.Pending.Store(1)
	msg := ar.add([]byte("x"), []byte("rq"), nil, []byte("during"), wire.Persistent, 0)
	lq.shard.submit(Command{Kind: cmdPost, post: func() {
		lq.grp.TransferLeadership(gone.id)
		lq.shard.apply(&Command{Kind: CmdPublish, Items: []EnqItem{{Q: lq, Msg: msg, Meta: queue.Message{Size: 6}}}, Batch: batch})
	}})
	k.waitFor(t, "the publish's answer", func() bool { return k.confirmed(batch) })
	if batch.Codes[0] != 0 {
		t.Fatalf("the publish was nacked (%d) though this node still leads", batch.Codes[0])
	}
	if info, _ := lead.b.Load().Queue("rq"); info.Ready != 1 {
		t.Fatalf("the leader holds %d messages, want 1", info.Ready)
	}
}

// A message as large as the AMQP front takes (16 MiB) fits the cluster
// transport's frames: its entry commits, and so does what follows it.
// Before, its raft message was over the 16 MiB frame limit and dropped at
// every retry: nothing after it was ever confirmed (review).
func TestClusterLargestMessageReplicates(t *testing.T) {
	if raceEnabled {
		t.Skip("16 MiB copied across three nodes: slow under the race detector")
	}
	c := newTestCluster(t, 3)
	c.leader()
	c.declareOn(c.nodes[0], wire.QueueDeclare{Name: "big", Durable: true})
	lead := c.queueLeader("big")
	lq := lead.b.Load().topo.lookupQueue("big")
	k := newDurSink()
	huge := publish(lead.b.Load(), lq, k, true, strings.Repeat("x", 16<<20-64))
	small := publish(lead.b.Load(), lq, k, true, "after")
	k.waitFor(t, "the answers", func() bool { return k.confirmed(huge) && k.confirmed(small) })
	if huge.Codes[0] == 0 && small.Codes[0] == 0 {
		return
	}
	// On a loaded machine the 16 MiB append can hold heartbeats up long
	// enough for an election (the raft messages share one connection): the
	// leader that stepped down nacked both. The queue must still confirm
	// what comes next, on whichever node leads it now.
	for i := 0; ; i++ {
		if i == 20 {
			t.Fatalf("nothing published after the 16 MiB message was confirmed (codes %d, %d)", huge.Codes[0], small.Codes[0])
		}
		nl := c.queueLeader("big")
		b := publish(nl.b.Load(), nl.b.Load().topo.lookupQueue("big"), k, true, "again")
		k.waitFor(t, "an answer", func() bool { return k.confirmed(b) })
		if b.Codes[0] == 0 {
			return
		}
	}
}
