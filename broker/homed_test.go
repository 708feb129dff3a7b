package broker

import (
	"bytes"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/warren-mq/warren/queue"
	"github.com/warren-mq/warren/wire"
)

// hasQueue says whether node nd's metadata has queue name.
func hasQueue(nd *clusterNode, name string) bool {
	t := nd.b.Load().topo
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.meta.HasQueue(name)
}

// askShard submits c to q's shard on b and returns its answer.
func askShard(t *testing.T, b *Broker, c Command) Result {
	t.Helper()
	k := newFwdClient()
	c.Sink = k
	b.Submit(c)
	k.waitFor(t, "the answer", func() bool { return len(k.answers) == 1 })
	return k.snap().answers[0]
}

// TestClusterHomedQueues: a non-durable queue lives on the node that
// declared it (its home) and is served from every node: a publish on a
// second node is forwarded and confirmed once enqueued at the home, its
// counts are fetched from the home by a barrier there, a consumer, a get
// and a purge on a third node are served by the home, and a conditional
// delete on the second is checked and done by the home.
// An exclusive queue takes publishes from every node, but a consumer or
// purge of it on another node is refused, as the home refuses another
// connection's; its owner's connection closing removes it everywhere.
// A home that restarts drops its queues everywhere (not those it
// declares in its new life, nor another node's).
func TestClusterHomedQueues(t *testing.T) {
	c := newTestCluster(t, 3)
	c.leader()
	n1, n2, n3 := c.nodes[0], c.nodes[1], c.nodes[2]
	c.declareOn(n1, wire.QueueDeclare{Name: "tq"})
	for _, nd := range c.nodes {
		c.sees(nd, "queue tq durable=false")
		if mq := metaQueueAt(nd, "tq"); mq.Home != 1 || mq.HomeInc == 0 {
			t.Fatalf("node %d: tq's home is %d (incarnation %d), want node 1", nd.id, mq.Home, mq.HomeInc)
		}
	}
	if info, _ := n2.b.Load().Queue("tq"); info.Leader != 1 {
		t.Fatalf("node 2 shows tq led by %d, want its home 1", info.Leader)
	}

	// Published on node 2: forwarded, in the queue at node 1 once.
	p := &fwdPublisher{t: t, k: newDurSink()}
	p.publish(n2, "tq", 10)
	p.publish(n2, "tq", 5)
	if got := p.confirmed(); len(got) != 15 {
		t.Fatalf("%d confirmed", len(got))
	}
	c.waitFor("15 messages at the home", func() bool { info, _ := n1.b.Load().Queue("tq"); return info.Ready == 15 })
	// Node 2 holds none of them, and fetches the counts from the home
	// for a barrier (what a passive declare is answered after).
	q2 := n2.b.Load().topo.lookupQueue("tq")
	barrier(t, q2.shard)
	if q2.m != nil || q2.ReadyCount() != 0 {
		t.Fatalf("node 2 holds a copy of a queue that lives on node 1 (%d ready)", q2.ReadyCount())
	}
	if r := askShard(t, n2.b.Load(), Command{Kind: CmdBarrier, Queue: q2}); r.Code != wire.OK || q2.ReadyCount() != 15 {
		t.Fatalf("a barrier on node 2 answered %+v with %d ready, want the home's 15", r, q2.ReadyCount())
	}

	// Consumed on node 3, through the home: each message once.
	b3 := n3.b.Load()
	q3 := b3.topo.lookupQueue("tq")
	k := newFwdClient()
	b3.Submit(Command{Kind: CmdSubscribe, Queue: q3, Sink: k, Spec: queue.ConsumerSpec{ID: 1, Owner: 9, Prefetch: 4}, Req: 1})
	acked := map[string]uint32{}
	consumeAll(t, b3, q3, k, 1, acked, 15, 0)
	if subs := k.snap().subs; len(subs) != 1 || subs[0] != wire.OK {
		t.Fatalf("the subscribe on node 3 answered %v", subs)
	}
	for body, n := range acked {
		if n != 1 {
			t.Fatalf("%s delivered %d times", body, n)
		}
	}
	c.waitFor("the home empty, one consumer", func() bool {
		info, _ := n1.b.Load().Queue("tq")
		return info.Ready == 0 && info.Unacked == 0 && info.Consumers == 1
	})
	b3.Submit(Command{Kind: CmdCancel, Queue: q3, Consumer: 1})
	k.waitFor(t, "the consumer gone", func() bool { return slices.Contains(k.gone, 1) })

	// Purged from node 3; deleted if empty from node 2: both checked
	// and done at the home.
	p.publish(n2, "tq", 3)
	p.confirmed()
	// A get on node 3 (a one-shot consumer answered after its barrier).
	kg := newFwdClient()
	b3.Submit(Command{Kind: CmdSubscribe, Queue: q3, Sink: kg, Spec: queue.ConsumerSpec{ID: 5, Owner: 9, Prefetch: 1, Get: true}})
	b3.Submit(Command{Kind: CmdBarrier, Queue: q3, Sink: kg, Req: 1})
	kg.waitFor(t, "the get's answer", func() bool { return len(kg.answers) == 1 })
	g := kg.snap().got
	if len(g) != 1 {
		t.Fatalf("the get on node 3 was handed %v, want one message", g)
	}
	b3.Submit(Command{Kind: CmdCancel, Queue: q3, Consumer: 5})
	settleOn(b3, q3, 5, wire.SettleAck, g[0].tag)
	kg.waitFor(t, "the get's consumer gone", func() bool { return slices.Contains(kg.gone, 5) })
	c.waitFor("the get's ack at the home", func() bool {
		info, _ := n1.b.Load().Queue("tq")
		return info.Ready == 2 && info.Unacked == 0 && info.Consumers == 0
	})
	if r := askShard(t, n2.b.Load(), Command{Kind: CmdDelete, Queue: q2, IfEmpty: true, Req: 3}); r.Code != wire.PreconditionFailed || !strings.Contains(r.Reason, "not empty") {
		t.Fatalf("an if-empty delete of a queue with messages, on node 2, answered %+v", r)
	}
	if r := askShard(t, b3, Command{Kind: CmdPurge, Queue: q3, Req: 2}); r.Code != wire.OK || r.N != 2 {
		t.Fatalf("the purge on node 3 answered %+v, want 2 purged", r)
	}
	if r := askShard(t, n2.b.Load(), Command{Kind: CmdDelete, Queue: q2, IfEmpty: true, IfUnused: true, Req: 4}); r.Code != wire.OK {
		t.Fatalf("an if-empty, if-unused delete of the empty queue on node 2 answered %+v", r)
	}
	c.waitFor("tq gone everywhere", func() bool { return !hasQueue(n1, "tq") && !hasQueue(n2, "tq") && !hasQueue(n3, "tq") })

	// An exclusive queue of a connection on node 1.
	owner := uint64(1)<<32 | 5
	if _, err := n1.b.Load().DeclareQueueAs(&wire.QueueDeclare{Name: "xq", Exclusive: true}, owner, ""); err != nil {
		t.Fatal(err)
	}
	for _, nd := range c.nodes {
		c.sees(nd, "queue xq durable=false")
	}
	b2 := n2.b.Load()
	x2 := b2.topo.lookupQueue("xq")
	kx := newFwdClient()
	b2.Submit(Command{Kind: CmdSubscribe, Queue: x2, Sink: kx, Spec: queue.ConsumerSpec{ID: 2, Owner: 2<<32 | 1, Prefetch: 1}, Req: 5})
	kx.waitFor(t, "the subscribe's answer", func() bool { return len(kx.subs) == 1 })
	if s := kx.snap(); s.subs[0] != wire.ResourceLocked || !strings.Contains(s.reasons[0], "exclusive") {
		t.Fatalf("a consumer of an exclusive queue on another node: %v %q, want resource_locked", s.subs, s.reasons)
	}
	if r := askShard(t, b2, Command{Kind: CmdPurge, Queue: x2, Req: 6}); r.Code != wire.ResourceLocked {
		t.Fatalf("a purge of an exclusive queue on another node answered %+v", r)
	}
	p.publish(n2, "xq", 2)
	p.confirmed()
	c.waitFor("the exclusive queue's messages at its home", func() bool { info, _ := n1.b.Load().Queue("xq"); return info.Ready == 2 })
	n1.b.Load().Submit(Command{Kind: CmdDown, Owner: owner})
	c.waitFor("xq gone with its owner", func() bool { return !hasQueue(n1, "xq") && !hasQueue(n2, "xq") && !hasQueue(n3, "xq") })

	// A home's restart drops its queues everywhere.
	for _, d := range []struct {
		nd    *clusterNode
		name  string
		owner uint64
	}{{n1, "t1", 0}, {n1, "x1", 1<<32 | 6}, {n2, "t2", 0}, {n1, "d1", 0}} {
		if _, err := d.nd.b.Load().DeclareQueueAs(&wire.QueueDeclare{Name: d.name, Exclusive: d.owner != 0, Durable: d.name == "d1"}, d.owner, ""); err != nil {
			t.Fatal(err)
		}
	}
	for _, nd := range c.nodes {
		c.sees(nd, "queue t1 ", "queue x1 ", "queue t2 ", "queue d1 ")
	}
	c.stop(n1)
	c.start(n1, nil)
	c.leader()
	c.declareOn(n1, wire.QueueDeclare{Name: "t3"})
	// It serves (its listener opens) only once they are gone there.
	if err := n1.b.Load().WaitMetaReady(t.Context()); err != nil {
		t.Fatal(err)
	}
	if hasQueue(n1, "t1") || hasQueue(n1, "x1") {
		t.Fatal("node 1 is ready with queues of its earlier life")
	}
	for _, nd := range c.nodes {
		c.waitFor("node 1's queues of its last life dropped", func() bool { return !hasQueue(nd, "t1") && !hasQueue(nd, "x1") })
	}
	// With the drop applied, the queues of other homes and of node 1's
	// new life are still there. t3's declare may sit behind the drop in
	// the log, so another node may not have applied it yet: waited for.
	for _, nd := range c.nodes {
		for _, name := range []string{"t2", "d1"} {
			if !hasQueue(nd, name) {
				t.Fatalf("node %d lost queue %s with node 1's restart", nd.id, name)
			}
		}
		c.waitFor(fmt.Sprintf("node %d has t3", nd.id), func() bool { return hasQueue(nd, "t3") })
	}
}

// TestClusterForwardRedirected: a publish forwarded to a node that holds
// no replica of the queue (the origin's knowledge is stale: the replica
// moved away from it) is sent on to the leader that node names and
// confirmed, once, not nacked.
func TestClusterForwardRedirected(t *testing.T) {
	c := newTestCluster(t, 3)
	c.leader()
	holder, others := c.declareOneReplica("one")
	origin, stale := others[0], others[1]
	oq := origin.b.Load().topo.lookupQueue("one")
	barrier(t, oq.shard)    // the queue is open there
	oq.lead.Store(stale.id) // as if the replica had been on stale until now
	p := &fwdPublisher{t: t, k: newDurSink()}
	p.publish(origin, "one", 4)
	if got := p.confirmed(); len(got) != 4 {
		t.Fatalf("%d confirmed, want 4", len(got))
	}
	if l := oq.lead.Load(); l != holder.id {
		t.Fatalf("the origin forwards to node %d after the redirect, want the holder %d", l, holder.id)
	}
	if r := askShard(t, origin.b.Load(), Command{Kind: CmdBarrier, Queue: oq}); r.Code != wire.OK || oq.ReadyCount() != 4 {
		t.Fatalf("a barrier at the origin answered %+v with %d ready, want the leader's 4", r, oq.ReadyCount())
	}
	if got := queueBodies(t, c, "one", 4); !slices.Equal(got, []string{"m000", "m001", "m002", "m003"}) {
		t.Fatalf("the queue holds %v", got)
	}
	// A conditional delete at the origin is checked by the leader (which
	// has queueBodies' consumer).
	if r := askShard(t, origin.b.Load(), Command{Kind: CmdDelete, Queue: oq, IfUnused: true, Req: 1}); r.Code != wire.PreconditionFailed || !strings.Contains(r.Reason, "has consumers") {
		t.Fatalf("an if-unused delete at the origin answered %+v", r)
	}
}

// TestMetaHomes: a queue that is not placed records its home when a
// cluster's declare says it (a placed one never has one); the home is in
// snapshots (version 8) and a version 7 snapshot restores with none;
// MetaDropHome drops a home's queues of earlier incarnations with their
// bindings, and deadHomes asks for it: for the node's own queues of an
// earlier life, and (on the leader) for a node no longer a member.
func TestMetaHomes(t *testing.T) {
	m := clusterMeta(1, 2, 3)
	decl := func(name string, home, inc uint64, durable bool) {
		t.Helper()
		c := MetaCommand{Op: MetaDeclareQueue, Queue: wire.QueueDeclare{Name: name, Durable: durable}, Home: home, HomeInc: inc}
		if r, _ := m.Apply(&c); r.Code != wire.OK {
			t.Fatalf("declare %s: %+v", name, r)
		}
	}
	decl("a", 1, 10, false)
	decl("b", 1, 11, false)
	decl("c", 2, 20, false)
	decl("gone", 4, 40, false)
	decl("d", 1, 10, true) // placed: no home
	metaDo(t, m, bindCmd("amq.direct", "a", "k"), wire.OK, "")
	if q, _ := m.Queue("a"); q.Home != 1 || q.HomeInc != 10 {
		t.Fatalf("a: home %d/%d", q.Home, q.HomeInc)
	}
	if q, _ := m.Queue("d"); q.Home != 0 || len(q.Replicas) == 0 {
		t.Fatalf("a durable queue: home %d, replicas %v", q.Home, q.Replicas)
	}
	snap := m.Snapshot()
	r := clusterMeta(1, 2, 3)
	if err := r.Restore(snap); err != nil || !bytes.Equal(r.Snapshot(), snap) {
		t.Fatalf("restore: %v", err)
	}
	if !maps.Equal(r.homes, m.homes) {
		t.Fatalf("restored homes %v, want %v", r.homes, m.homes)
	}
	old := clusterMeta(1, 2, 3)
	if err := old.Restore(m.snapshotAt(7)); err != nil {
		t.Fatal(err)
	}
	if q, _ := old.Queue("a"); q.Home != 0 || len(old.homes) != 0 {
		t.Fatalf("a version 7 snapshot's queue has home %d", q.Home)
	}

	want := []MetaCommand{{Op: MetaDropHome, Home: 1, HomeInc: 10, HomeUpTo: true}, {Op: MetaDropHome, Home: 4}}
	if got := m.deadHomes(1, 11, true, nil); !reflect.DeepEqual(got, want) {
		t.Fatalf("deadHomes on the leader, node 1 of incarnation 11: %+v", got)
	}
	decl("c2", 2, 21, false) // node 2's next life
	down := func(node uint64) (uint64, bool) { return 20, node == 2 }
	if got := m.deadHomes(3, 30, false, down); len(got) != 0 {
		t.Fatalf("deadHomes on node 3, a follower: %+v", got)
	}
	if got := m.deadHomes(3, 30, true, down); !reflect.DeepEqual(got, append(slices.Clone(want[1:]), MetaCommand{Op: MetaDropHome, Home: 2, HomeInc: 20, HomeUpTo: true})) {
		t.Fatalf("deadHomes on the leader, node 3, with node 2 down: %+v", got)
	}
	want = append(want, MetaCommand{Op: MetaDropHome, Home: 2, HomeInc: 20, HomeUpTo: true})
	for _, c := range want {
		m.Apply(&c)
	}
	for name, kept := range map[string]bool{"a": false, "b": true, "c": false, "c2": true, "gone": false, "d": true} {
		if m.HasQueue(name) != kept {
			t.Fatalf("queue %s kept %v after the drops, want %v", name, m.HasQueue(name), kept)
		}
	}
	if m.NumBindings() != 0 {
		t.Fatalf("%d bindings left of a dropped queue", m.NumBindings())
	}
	if got := m.deadHomes(1, 11, true, down); len(got) != 0 {
		t.Fatalf("deadHomes after the drops: %+v", got)
	}
	if r, _ := m.Apply(&MetaCommand{Op: MetaDropHome}); r.Code != wire.InvalidArgument {
		t.Fatalf("a drop of node 0: %+v", r)
	}
}

// TestMetaHomeLives: a restarted node's drop of its earlier lives'
// queues, committed after it restarted once more, leaves the queues of
// that later life. A declare by a node's new life
// of a queue its earlier life still holds replaces it (a new id, bindings
// gone, an exclusive owner of that life no obstacle: connection ids
// restart with the node).
func TestMetaHomeLives(t *testing.T) {
	m := clusterMeta(1, 2, 3)
	decl := func(name string, inc, conn uint64) MetaResult {
		t.Helper()
		c := MetaCommand{Op: MetaDeclareQueue, Conn: conn, Queue: wire.QueueDeclare{Name: name, Exclusive: conn != 0}, Home: 1, HomeInc: inc}
		r, _ := m.Apply(&c)
		if r.Code != wire.OK {
			t.Fatalf("declare %s: %+v", name, r)
		}
		return r
	}
	decl("life1", 11, 0)
	drop := m.deadHomes(1, 21, false, nil) // life 2 starts, proposes its drop
	decl("life3", 31, 0)                   // life 3 declares before that commits
	if len(drop) != 1 {
		t.Fatalf("life 2's drop: %+v", drop)
	}
	m.Apply(&drop[0])
	if m.HasQueue("life1") || !m.HasQueue("life3") {
		t.Fatalf("after life 2's late drop: life1 %v, life3 %v", m.HasQueue("life1"), m.HasQueue("life3"))
	}

	old := decl("x", 31, 1<<32|1)
	metaDo(t, m, bindCmd("amq.direct", "x", "k"), wire.OK, "")
	r := decl("x", 41, 1<<32|1) // life 4, the same connection id
	if r.QueueID == old.QueueID || m.NumBindings() != 0 {
		t.Fatalf("life 4's declare of life 3's x: id %d (was %d), %d bindings", r.QueueID, old.QueueID, m.NumBindings())
	}
	if q, _ := m.Queue("x"); q.HomeInc != 41 {
		t.Fatalf("x's incarnation %d, want 41", q.HomeInc)
	}
	if r2 := decl("x", 41, 1<<32|1); r2.QueueID != r.QueueID {
		t.Fatal("a redeclare in the same life replaced the queue")
	}
	if _, effs := m.Apply(&MetaCommand{Op: MetaDeclareQueue, Conn: 1<<32 | 2, Queue: wire.QueueDeclare{Name: "x", Exclusive: true}, Home: 1, HomeInc: 41}); len(effs) != 0 {
		t.Fatalf("another connection of the same life: %+v", effs)
	}
}

// TestMetaDropHomeLegacyReplay: a MetaDropHome in the form builds
// b09a9d2..4334fcd wrote (HomeInc without HomeUpTo, and with no flag byte
// before cb6f99a) replays as it applied when written: every incarnation
// of the home but HomeInc goes, a later one too (the snapshot those
// builds took, and every node that applied it live, has it so).
func TestMetaDropHomeLegacyReplay(t *testing.T) {
	for _, flagByte := range []bool{false, true} {
		mm := &MetaMachine{Meta: clusterMeta(1, 2, 3)}
		apply := func(c MetaCommand, cut bool) {
			t.Helper()
			b := AppendMetaCommand(nil, &c)
			if cut {
				b = b[:len(b)-1] // b09a9d2..cb6f99a: no HomeUpTo byte
			}
			if _, err := mm.Apply(1, b); err != nil {
				t.Fatal(err)
			}
		}
		for i, inc := range []uint64{11, 21, 31} {
			apply(MetaCommand{Op: MetaDeclareQueue, Queue: wire.QueueDeclare{Name: fmt.Sprintf("life%d", i+1)}, Home: 1, HomeInc: inc}, false)
		}
		apply(MetaCommand{Op: MetaDeclareQueue, Queue: wire.QueueDeclare{Name: "other"}, Home: 2, HomeInc: 21}, false)
		apply(MetaCommand{Op: MetaDropHome, Home: 1, HomeInc: 21}, !flagByte) // life 2's drop, written by an old build
		m := mm.Meta
		if m.HasQueue("life1") || !m.HasQueue("life2") || m.HasQueue("life3") || !m.HasQueue("other") {
			t.Fatalf("flag byte %v: after the legacy drop: life1 %v life2 %v life3 %v other %v, want false true false true",
				flagByte, m.HasQueue("life1"), m.HasQueue("life2"), m.HasQueue("life3"), m.HasQueue("other"))
		}
	}
}

// TestClusterHomeDown: the non-durable queues of a node the metadata
// leader has not heard from for 3 forward timeouts are dropped (the node
// is down); another node's stay; the node comes back without them.
func TestClusterHomeDown(t *testing.T) {
	c := newTestClusterFwd(t, 3, 0, 500*time.Millisecond)
	c.leader()
	n1, n2, n3 := c.nodes[0], c.nodes[1], c.nodes[2]
	for _, d := range []struct {
		nd   *clusterNode
		name string
	}{{n1, "dq"}, {n2, "kq"}} {
		if _, err := d.nd.b.Load().DeclareQueueAs(&wire.QueueDeclare{Name: d.name}, 0, ""); err != nil {
			t.Fatal(err)
		}
	}
	for _, nd := range c.nodes {
		c.sees(nd, "queue dq ", "queue kq ")
	}
	c.waitFor("nodes 2 and 3 heard node 1", func() bool {
		return n2.b.Load().origins.known(1) != 0 && n3.b.Load().origins.known(1) != 0
	})
	c.stop(n1)
	for _, nd := range []*clusterNode{n2, n3} {
		c.waitFor("node 1's queue dropped", func() bool { return !hasQueue(nd, "dq") })
		if !hasQueue(nd, "kq") {
			t.Fatalf("node %d dropped node 2's queue", nd.id)
		}
	}
	c.start(n1, nil)
	c.waitFor("node 1 back, without its queue", func() bool { return !hasQueue(n1, "dq") && hasQueue(n1, "kq") })
}

// TestClusterHomeOldLife: a queue the metadata says lives on node 1 in
// another of its lives (here a later one: its own restart's drop leaves
// it, as it would a queue of a clock gone back) is not served by node 1:
// it holds no copy, and a publish forwarded to it from node 2 is nacked,
// never confirmed into a copy that its drop would delete.
func TestClusterHomeOldLife(t *testing.T) {
	c := newTestCluster(t, 3)
	c.leader()
	n1, n2 := c.nodes[0], c.nodes[1]
	b2 := n2.b.Load()
	cl := b2.topo.cl.Load()
	cmd := MetaCommand{Op: MetaDeclareQueue, Queue: wire.QueueDeclare{Name: "old"}, Home: 1, HomeInc: n1.b.Load().homeInc() + 2}
	if r := b2.topo.clusterChange(cl, &cmd); r.Code != wire.OK {
		t.Fatalf("declare: %+v", r)
	}
	for _, nd := range c.nodes {
		c.sees(nd, "queue old ")
	}
	q1 := n1.b.Load().topo.lookupQueue("old")
	barrier(t, q1.shard)
	if q1.m != nil {
		t.Fatal("node 1 holds a copy of a queue of another of its lives")
	}
	k := newDurSink()
	batch := publish(b2, b2.topo.lookupQueue("old"), k, true, "a", "b")
	k.waitFor(t, "the forwarded publish's answer", func() bool { return k.confirmed(batch) })
	for i, code := range batch.Codes {
		if code == 0 {
			t.Fatalf("message %d confirmed into a queue of node 1's other life", i)
		}
	}

	// One of node 1's earlier life, declared again by node 1 (before or
	// after its drop applies): a new queue, served at node 1 and known
	// as that one everywhere.
	cmd = MetaCommand{Op: MetaDeclareQueue, Queue: wire.QueueDeclare{Name: "prev"}, Home: 1, HomeInc: n1.b.Load().homeInc() - 2}
	if r := b2.topo.clusterChange(cl, &cmd); r.Code != wire.OK {
		t.Fatalf("declare: %+v", r)
	}
	q, err := n1.b.Load().DeclareQueueAs(&wire.QueueDeclare{Name: "prev"}, 0, "")
	if err != nil {
		t.Fatal(err)
	}
	barrier(t, q.shard)
	if q.m == nil {
		t.Fatal("node 1 does not serve the queue it declared again")
	}
	for _, nd := range c.nodes {
		c.waitFor("the new prev everywhere", func() bool {
			mq := metaQueueAt(nd, "prev")
			return mq.ID == uint64(q.id) && mq.HomeInc == n1.b.Load().homeInc()
		})
	}
}

// TestClusterHomeLiveWithoutHellos: a node whose hellos are lost (the
// forward queue to a busy peer drops them when full) is not declared
// down while the metadata group hears it: its queue stays, long past
// homeDownMs without a hello.
func TestClusterHomeLiveWithoutHellos(t *testing.T) {
	c := newTestClusterFwd(t, 3, 0, 200*time.Millisecond)
	lead := c.leader()
	var home *clusterNode
	for _, nd := range c.nodes {
		if nd != lead {
			home = nd
			break
		}
	}
	c.declareOn(home, wire.QueueDeclare{Name: "hq"})
	c.sees(lead, "queue hq ")
	lb := lead.b.Load()
	c.waitFor("the leader heard the home", func() bool { return lb.origins.known(home.id) != 0 })
	lose := func(from, _ uint64, p []byte) bool {
		return from == home.id && len(p) > 1 && p[0] == 'c' && p[1] == 'I'
	}
	c.lose.Store(&lose)
	defer c.lose.Store(nil)
	silent := func() time.Duration {
		o := &lb.origins
		o.mu.Lock()
		defer o.mu.Unlock()
		return time.Since(o.heardAt[home.id])
	}
	// Several of the leader's checks (every placeTicks: 200 ms here)
	// after homeDownMs (600 ms) without a hello.
	c.waitFor("no hello from the home for 3 homeDownMs", func() bool {
		return silent() > 3*time.Duration(lb.homeDownMs())*time.Millisecond
	})
	if l := c.leader(); l != lead {
		t.Skipf("the metadata leader moved (node %d to %d): the check ran on another", lead.id, l.id)
	}
	if !hasQueue(lead, "hq") {
		t.Fatal("a live node's queue was dropped for lost hellos")
	}
}

// TestHomeDownHeard: a node is down as a home only when neither its
// hello nor a metadata raft message came for homeDownMs.
func TestHomeDownHeard(t *testing.T) {
	b := &Broker{cfg: Config{Durable: &DurableConfig{ForwardTimeout: time.Second}}}
	b.heardOrigin(2, 7, helloFeatures)
	hello := b.origins.heardAt[2]
	if _, down := b.homeDown(2, hello.Add(2*time.Second), time.Time{}); down {
		t.Fatal("down 2 s after its hello")
	}
	if inc, down := b.homeDown(2, hello.Add(4*time.Second), time.Time{}); !down || inc != 7 {
		t.Fatalf("4 s after its hello, raft silent: down %v, inc %d", down, inc)
	}
	if _, down := b.homeDown(2, hello.Add(4*time.Second), hello.Add(3500*time.Millisecond)); down {
		t.Fatal("down 0.5 s after a raft message")
	}
	if _, down := b.homeDown(3, hello.Add(time.Hour), time.Time{}); down {
		t.Fatal("a node never heard from is down")
	}
}

// TestClusterDeleteCount: a delete on a node without a copy of the
// queue answers the count of messages the queue held, from its home (a
// non-durable queue) or its leader (a durable one with one replica),
// not 0.
func TestClusterDeleteCount(t *testing.T) {
	c := newTestCluster(t, 3)
	c.leader()
	n2 := c.nodes[1]
	one := wire.Table{{Key: "replicas", Value: wire.Int(1)}}
	c.declareOn(n2, wire.QueueDeclare{Name: "n1"})
	c.declareOn(n2, wire.QueueDeclare{Name: "d1", Durable: true, Args: one})
	for _, nd := range c.nodes {
		c.sees(nd, "queue n1 ", "queue d1 ")
	}
	lead := c.queueLeader("d1")
	var origin *clusterNode // holds no copy of either
	for _, nd := range c.nodes {
		if nd != n2 && nd != lead {
			origin = nd
		}
	}
	p := &fwdPublisher{t: t, k: newDurSink()}
	p.publish(n2, "n1", 3)
	p.publish(lead, "d1", 2)
	p.confirmed()
	for name, want := range map[string]int64{"n1": 3, "d1": 2} {
		b := origin.b.Load()
		q := b.topo.lookupQueue(name)
		if !q.remote {
			t.Fatalf("node %d holds a copy of %s", origin.id, name)
		}
		if r := askShard(t, b, Command{Kind: CmdDelete, Queue: q, Req: 1}); r.Code != wire.OK || r.N != want {
			t.Fatalf("delete %s on node %d: %+v, want %d messages", name, origin.id, r, want)
		}
	}
	c.waitFor("both gone everywhere", func() bool {
		for _, nd := range c.nodes {
			if hasQueue(nd, "n1") || hasQueue(nd, "d1") {
				return false
			}
		}
		return true
	})
}

// TestClusterHomeBacklog: a publish forwarded to a home whose queue is
// over its soft limit is answered busy and held at its origin (nothing
// of it enqueued), as the home's own publishers' confirms are held; once
// the queue drains it is enqueued and confirmed.
func TestClusterHomeBacklog(t *testing.T) {
	c := newTestClusterWith(t, 3, func(c *testCluster) { c.softLimit = 5 })
	c.leader()
	n1, n2 := c.nodes[0], c.nodes[1]
	c.declareOn(n1, wire.QueueDeclare{Name: "bq"})
	for _, nd := range c.nodes {
		c.sees(nd, "queue bq ")
	}
	p := &fwdPublisher{t: t, k: newDurSink()}
	p.publish(n2, "bq", 10)
	p.confirmed()
	ready := func() int64 { info, _ := n1.b.Load().Queue("bq"); return info.Ready }
	b2 := n2.b.Load()
	busy := b2.fwdBusy.Load()
	k := newDurSink()
	held := publish(b2, b2.topo.lookupQueue("bq"), k, true, "x", "y")
	c.waitFor("a busy answer from the home", func() bool { return b2.fwdBusy.Load() > busy })
	k.mu.Lock()
	early := k.confirmed(held)
	k.mu.Unlock()
	if early || ready() != 10 {
		t.Fatalf("over the soft limit: confirmed %v, %d ready at the home, want held and 10", early, ready())
	}
	if r := askShard(t, n1.b.Load(), Command{Kind: CmdPurge, Queue: n1.b.Load().topo.lookupQueue("bq"), Req: 1}); r.N != 10 {
		t.Fatalf("purge: %+v", r)
	}
	k.waitFor(t, "the held publish confirmed once the queue drained", func() bool { return k.confirmed(held) })
	for i, code := range held.Codes {
		if code != 0 {
			t.Fatalf("message %d nacked (%d)", i, code)
		}
	}
	c.waitFor("its 2 messages at the home", func() bool { return ready() == 2 })
}

// TestClusterStatusWaitsCapped: barriers on a queue this node holds no
// copy of wait for its home's counts, at most maxStatusWaits of them per
// shard; the ones past it are answered at once with the counts last
// fetched (here the home's answers are lost, so the waiting ones stay).
func TestClusterStatusWaitsCapped(t *testing.T) {
	c := newTestCluster(t, 3)
	c.leader()
	n1, n2 := c.nodes[0], c.nodes[1]
	c.declareOn(n1, wire.QueueDeclare{Name: "sq"})
	c.sees(n2, "queue sq ")
	lose := func(_, _ uint64, p []byte) bool { return len(p) > 1 && p[0] == 'c' && p[1] == 't' }
	c.lose.Store(&lose)
	defer c.lose.Store(nil)
	b2 := n2.b.Load()
	q := b2.topo.lookupQueue("sq")
	k := newDurSink()
	for i := range maxStatusWaits + 10 {
		b2.Submit(Command{Kind: CmdBarrier, Queue: q, Sink: k, Req: uint64(i)})
	}
	waiting := make(chan int, 1)
	q.shard.submit(Command{Kind: cmdPost, post: func() { waiting <- len(q.shard.fc.status) }})
	if n := <-waiting; n != maxStatusWaits {
		t.Fatalf("%d barriers wait for counts, want %d", n, maxStatusWaits)
	}
	k.waitFor(t, "the barriers past the cap answered", func() bool { return len(k.answers) >= 10 })
}

// TestForwardNackReason: the broker's log line for forwarded publishes
// nacked for no answer names the queue and the node, its home or leader
// (a CONFIRM nack carries only its code).
func TestForwardNackReason(t *testing.T) {
	got := forwardNackReason(&Queue{name: "n1", home: 2}, 2, 10*time.Second)
	for _, want := range []string{`queue "n1" in vhost "/"`, "its home", "node 2", "10s"} {
		if !strings.Contains(got, want) {
			t.Fatalf("%q lacks %q", got, want)
		}
	}
	if got := forwardNackReason(&Queue{name: "d1"}, 3, time.Second); !strings.Contains(got, "its leader, node 3") {
		t.Fatalf("a replicated queue's: %q", got)
	}
}
