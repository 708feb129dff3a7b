package broker

import (
	"context"
	"encoding/binary"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/warren-mq/warren/queue"
	"github.com/warren-mq/warren/segment"
	"github.com/warren-mq/warren/wire"
)

// fwdPublisher publishes numbered messages at one node and keeps every
// batch, to check their answers.
type fwdPublisher struct {
	t       *testing.T
	k       *durSink
	n       int
	batches []*PublishBatch
	bodies  [][]string
}

func (p *fwdPublisher) publish(nd *clusterNode, name string, count int) {
	b := nd.b.Load()
	q := b.topo.lookupQueue(name)
	var bodies []string
	for range count {
		bodies = append(bodies, fmt.Sprintf("m%03d", p.n))
		p.n++
	}
	p.batches = append(p.batches, publish(b, q, p.k, true, bodies...))
	p.bodies = append(p.bodies, bodies)
}

// settled waits for every batch's answer and returns the bodies
// confirmed; a nack fails the test (none of these publishes may be).
func (p *fwdPublisher) confirmed() []string {
	p.t.Helper()
	p.k.waitFor(p.t, "every forwarded publish's answer", func() bool {
		for _, b := range p.batches {
			if !p.k.confirmed(b) {
				return false
			}
		}
		return true
	})
	var ok []string
	for i, b := range p.batches {
		for j, code := range b.Codes {
			if code != 0 {
				p.t.Fatalf("message %s nacked (%d)", p.bodies[i][j], code)
			}
			ok = append(ok, p.bodies[i][j])
		}
	}
	return ok
}

// queueBodies consumes every message of queue name at its leader and
// returns their bodies, sorted.
func queueBodies(t *testing.T, c *testCluster, name string, want int) []string {
	t.Helper()
	lead := c.queueLeader(name)
	q := lead.b.Load().topo.lookupQueue(name)
	k := newDurSink()
	q.shard.submit(Command{Kind: CmdSubscribe, Queue: q, Sink: k, Spec: queue.ConsumerSpec{ID: 77, Owner: 77}, Req: 1})
	k.waitFor(t, fmt.Sprintf("%d deliveries at the leader", want), func() bool { return len(k.got) >= want })
	barrier(t, q.shard)
	if info, _ := lead.b.Load().Queue(name); info.Ready != 0 {
		t.Fatalf("%d messages left ready after %d delivered", info.Ready, want)
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	var got []string
	for _, d := range k.got {
		got = append(got, d.body)
	}
	slices.Sort(got)
	return got
}

// TestClusterForwardDedup: publishes forwarded to a replicated queue's
// leader across a lost confirm, a leadership transfer and the leader's
// death are every one confirmed and in the queue exactly once (enqueuer
// deduplication, forward.go): a part whose confirm was lost is sent
// again and confirmed, not enqueued twice; parts in flight when the
// leader changes go to the new leader, which applies only those not in
// its log.
func TestClusterForwardDedup(t *testing.T) {
	c := newTestClusterFwd(t, 3, 0, 8*time.Second)
	c.leader()
	if _, err := c.nodes[0].b.Load().DeclareQueueAs(&wire.QueueDeclare{Name: "dq", Durable: true}, 0, ""); err != nil {
		t.Fatal(err)
	}
	for _, nd := range c.nodes {
		c.sees(nd, "queue dq durable=true")
	}
	// notLeading is a node up other than the queue's leader and skip.
	notLeading := func(skip *clusterNode) *clusterNode {
		lead := c.queueLeader("dq")
		for _, nd := range c.nodes {
			if nd.up && nd != lead && nd != skip {
				return nd
			}
		}
		t.Fatal("no node to choose")
		return nil
	}
	origin := notLeading(nil)
	var origins, leaders []uint64
	defer func() { origins = append(origins, origin.id) }()
	pub := &fwdPublisher{t: t, k: newDurSink()}

	// A lost confirm: the leader applies the part, its answer is dropped;
	// the origin sends the part again and the leader confirms it without
	// enqueueing it twice.
	drop := func(from, to uint64, p []byte) bool { return p[0] == 'C' }
	c.lose.Store(&drop)
	pub.publish(origin, "dq", 5)
	c.waitFor("the leader applied the first part", func() bool {
		info, _ := c.queueLeader("dq").b.Load().Queue("dq")
		return info.Ready == 5
	})
	c.lose.Store(nil)
	pub.confirmed()
	if info, _ := c.queueLeader("dq").b.Load().Queue("dq"); info.Ready != 5 {
		t.Fatalf("after the resend the leader holds %d messages, want 5", info.Ready)
	}
	dups := uint64(0)
	for _, nd := range c.nodes {
		dups += nd.b.Load().fwdDuplicates.Load()
	}
	if dups < 5 {
		t.Fatalf("the leaders saw %d duplicate messages, want the 5 resent", dups)
	}

	// A transfer while parts are in flight.
	origin = notLeading(nil)
	lead, next := c.queueLeader("dq"), notLeading(origin)
	origins, leaders = append(origins, origin.id), append(leaders, lead.id, next.id)
	for range 5 {
		pub.publish(origin, "dq", 20)
	}
	lq := lead.b.Load().topo.lookupQueue("dq")
	transfer := func() { lq.shard.submit(Command{Kind: cmdPost, post: func() { lq.grp.TransferLeadership(next.id) }}) }
	transfer()
	for range 5 {
		pub.publish(origin, "dq", 20)
	}
	asked := time.Now()
	c.waitFor("the transfer", func() bool {
		if time.Since(asked) > time.Second { // raft abandons a transfer after an election timeout
			transfer()
			asked = time.Now()
		}
		return c.queueLeader("dq") == next
	})
	pub.confirmed()

	// The leader dies while parts are in flight (some applied, their
	// confirms lost with it).
	origin = notLeading(nil)
	dead := c.queueLeader("dq")
	origins, leaders = append(origins, origin.id), append(leaders, dead.id)
	for range 5 {
		pub.publish(origin, "dq", 20)
	}
	c.stop(dead)
	for range 5 {
		pub.publish(origin, "dq", 20)
	}
	ok := pub.confirmed()
	final := c.queueLeader("dq")
	leaders = append(leaders, final.id)
	t.Logf("origin resent %d parts", origin.b.Load().fwdResent.Load())
	slices.Sort(ok)
	got := queueBodies(t, c, "dq", len(ok))
	defer func() {
		// Idle streams end, and their enqueuers leave the table.
		if n := enqueuers(t, final, "dq"); n == 0 {
			t.Fatal("no enqueuer in the table after forwarded publishes")
		}
		c.skewMs.Store(streamIdle.Milliseconds() + 1000)
		c.waitFor("the idle enqueuers gone from the table", func() bool { return enqueuers(t, final, "dq") == 0 })
	}()
	if strings.Join(got, " ") != strings.Join(ok, " ") {
		n := map[string]int{}
		for _, b := range got {
			n[b]++
		}
		var twice, missing []string
		for _, b := range ok {
			switch n[b] {
			case 0:
				missing = append(missing, b)
			case 1:
			default:
				twice = append(twice, fmt.Sprintf("%s×%d", b, n[b]))
			}
		}
		t.Errorf("the queue holds %d messages for %d confirmed: missing %d %v, more than once %d %v; phases' origins %v, leaders %v", len(got), len(ok), len(missing), missing, len(twice), twice, origins, leaders)
	}
}

// enqueuers is the size of queue name's enqueuer table at node nd.
func enqueuers(t *testing.T, nd *clusterNode, name string) int {
	q := nd.b.Load().topo.lookupQueue(name)
	n := make(chan int, 1)
	q.shard.submit(Command{Kind: cmdPost, post: func() { n <- q.grp.FSM().Enqueuers() }})
	return <-n
}

// TestClusterForwardHonoursAlarm: a publish forwarded to a leader whose
// memory or disk alarm is on (Config.PublishBlocked) is not taken there:
// the leader answers busy, and the origin holds it and sends it again
// until the alarm clears (then it is confirmed) or the forward timeout
// passes (then it is nacked; here nothing of it is in the queue).
func TestClusterForwardHonoursAlarm(t *testing.T) {
	c := newTestCluster(t, 3)
	c.leader()
	if _, err := c.nodes[0].b.Load().DeclareQueueAs(&wire.QueueDeclare{Name: "aq", Durable: true,
		Args: wire.Table{{Key: "replicas", Value: wire.Int(1)}}}, 0, ""); err != nil {
		t.Fatal(err)
	}
	for _, nd := range c.nodes {
		c.sees(nd, "queue aq durable=true")
	}
	lead := c.queueLeader("aq")
	info, _ := lead.b.Load().Queue("aq")
	var origin *clusterNode
	for _, nd := range c.nodes {
		if !slices.Contains(info.Replicas, nd.id) {
			origin = nd // never the leader: it holds no replica
		}
	}
	for _, id := range info.Replicas {
		c.alarm[id].Store(true)
	}
	ready := func() int64 {
		info, _ := c.queueLeader("aq").b.Load().Queue("aq")
		return info.Ready
	}
	k := newDurSink()
	held := publish(origin.b.Load(), origin.b.Load().topo.lookupQueue("aq"), k, true, "a", "b", "c")
	c.waitFor("a busy answer from the leader", func() bool { return origin.b.Load().fwdBusy.Load() > 0 })
	k.mu.Lock()
	answered := k.confirmed(held)
	k.mu.Unlock()
	if answered || ready() != 0 {
		t.Fatalf("under the leader's alarm: answered %v, %d messages in the queue", answered, ready())
	}
	for _, id := range info.Replicas {
		c.alarm[id].Store(false)
	}
	k.waitFor(t, "the confirm once the alarm cleared", func() bool { return k.confirmed(held) })
	if held.Codes[0]|held.Codes[1]|held.Codes[2] != 0 || ready() != 3 {
		t.Fatalf("after the alarm: codes %v, %d messages in the queue, want confirms and 3", held.Codes, ready())
	}

	// An alarm that outlasts the forward timeout: nacked, not in the queue.
	for _, id := range info.Replicas {
		c.alarm[id].Store(true)
	}
	refused := publish(origin.b.Load(), origin.b.Load().topo.lookupQueue("aq"), k, true, "d")
	k.waitFor(t, "the nack after the forward timeout", func() bool { return k.confirmed(refused) })
	if refused.Codes[0] != uint32(wire.InternalNack) || ready() != 3 {
		t.Fatalf("under a long alarm: code %d, %d messages in the queue, want a nack and 3", refused.Codes[0], ready())
	}
}

// TestClusterDeadLetterForwarded: a dead letter whose target is a
// replicated queue led by another node is forwarded to that leader, and
// its durable source lets it go only once the leader confirmed it: with
// the leader's confirms lost, the source still holds the dead letters the
// target already has; once they get through (sent again, confirmed, not
// enqueued twice) the source settles them.
func TestClusterDeadLetterForwarded(t *testing.T) {
	c := newTestCluster(t, 3)
	c.leader()
	b0 := c.nodes[0].b.Load()
	if err := b0.DeclareExchangeAs(&wire.ExchangeDeclare{Name: "dlx", Kind: wire.ExchangeDirect, Durable: true}, ""); err != nil {
		t.Fatal(err)
	}
	one := wire.Table{{Key: "replicas", Value: wire.Int(1)}}
	if _, err := b0.DeclareQueueAs(&wire.QueueDeclare{Name: "dlq", Durable: true, Args: one}, 0, ""); err != nil {
		t.Fatal(err)
	}
	if err := b0.BindAs(&wire.Bind{Source: "dlx", Destination: "dlq", RoutingKey: "dlq"}, Requester{}); err != nil {
		t.Fatal(err)
	}
	srcArgs := append(wire.Table{{Key: "dead-letter-exchange", Value: wire.String("dlx")},
		{Key: "dead-letter-routing-key", Value: wire.String("dlq")}}, one...)
	var src string
	for i := range 6 {
		name := fmt.Sprintf("src%d", i)
		if _, err := b0.DeclareQueueAs(&wire.QueueDeclare{Name: name, Durable: true, Args: srcArgs}, 0, ""); err != nil {
			t.Fatal(err)
		}
		c.sees(c.nodes[0], "queue "+name+" durable=true")
		if c.queueLeader(name) != c.queueLeader("dlq") {
			src = name
			break
		}
	}
	if src == "" {
		t.Fatal("every source placed with the target")
	}
	sn, tn := c.queueLeader(src), c.queueLeader("dlq")
	c.sees(sn, "queue dlq durable=true")
	sb := sn.b.Load()
	sq := sb.topo.lookupQueue(src)
	k := newDurSink()
	batch := publish(sb, sq, k, true, "x", "y", "z")
	k.waitFor(t, "the source's confirm", func() bool { return k.confirmed(batch) })

	// The target's confirms are lost: it has the dead letters, the source
	// still holds them.
	lose := func(from, to uint64, p []byte) bool { return from == tn.id && p[0] == 'C' }
	c.lose.Store(&lose)
	sq.shard.submit(Command{Kind: CmdSubscribe, Queue: sq, Sink: k, Spec: queue.ConsumerSpec{ID: 1, Owner: 1, Prefetch: 10}, Req: 1})
	k.waitFor(t, "three deliveries", func() bool { return len(k.got) == 3 })
	k.mu.Lock()
	var rejects []SettleItem
	for _, d := range k.got {
		rejects = append(rejects, SettleItem{Q: sq, Consumer: 1, Op: wire.SettleReject, QTag: d.tag})
	}
	k.mu.Unlock()
	sb.Submit(Command{Kind: CmdSettle, Settles: rejects})
	c.waitFor("the dead letters at the target", func() bool {
		info, _ := tn.b.Load().Queue("dlq")
		return info.Ready == 3
	})
	if held, _ := heldOf(t, sq); held != 3 {
		t.Fatalf("the source holds %d dead letters while their confirms are lost, want 3", held)
	}
	c.lose.Store(nil)
	c.waitFor("the source lets them go", func() bool { held, _ := heldOf(t, sq); return held == 0 })
	if info, _ := tn.b.Load().Queue("dlq"); info.Ready != 3 {
		t.Fatalf("the target holds %d dead letters, want 3", info.Ready)
	}
}

// TestClusterRemovedNodeEnqueuersSwept: a node removed from the cluster
// leaves no enqueuer in the tables of the queues it forwarded to (the
// node sweep): their leader logs an enqueuer-down for the node.
func TestClusterRemovedNodeEnqueuersSwept(t *testing.T) {
	c := newTestCluster(t, 3)
	c.leader()
	if _, err := c.nodes[0].b.Load().DeclareQueueAs(&wire.QueueDeclare{Name: "sq", Durable: true,
		Args: wire.Table{{Key: "replicas", Value: wire.Int(1)}}}, 0, ""); err != nil {
		t.Fatal(err)
	}
	for _, nd := range c.nodes {
		c.sees(nd, "queue sq durable=true")
	}
	lead := c.queueLeader("sq")
	var origin *clusterNode
	for _, nd := range c.nodes {
		if nd != lead && nd != c.leader() {
			origin = nd
		}
	}
	if origin == nil { // the queue's leader leads the metadata group too
		origin = c.nodes[lead.id%3]
	}
	k := newDurSink()
	batch := publish(origin.b.Load(), origin.b.Load().topo.lookupQueue("sq"), k, true, "a")
	k.waitFor(t, "the forwarded confirm", func() bool { return k.confirmed(batch) })
	if n := enqueuers(t, lead, "sq"); n != 1 {
		t.Fatalf("%d enqueuers after a forward, want 1", n)
	}
	if err := c.leader().b.Load().RemoveNode(context.Background(), origin.id); err != nil {
		t.Fatal(err)
	}
	c.waitFor("the removed node's enqueuer swept", func() bool { return enqueuers(t, lead, "sq") == 0 })
}

// TestClusterForwardResendOfRejected: a forwarded part that a full
// reject-publish queue refused in part, whose answer was lost, is sent
// again; the leader finds it applied (a duplicate) but does not remember
// what the queue refused, so it must not confirm it: each message is
// nacked (it may be in the queue: at-least-once), never acked while the
// queue does not hold it.
func TestClusterForwardResendOfRejected(t *testing.T) {
	c := newTestClusterFwd(t, 3, 0, 8*time.Second)
	c.leader()
	args := wire.Table{{Key: "max-length", Value: wire.Int(1)}, {Key: "overflow", Value: wire.String("reject-publish")}}
	if _, err := c.nodes[0].b.Load().DeclareQueueAs(&wire.QueueDeclare{Name: "full", Durable: true, Args: args}, 0, ""); err != nil {
		t.Fatal(err)
	}
	for _, nd := range c.nodes {
		c.sees(nd, "queue full durable=true")
	}
	lead := c.queueLeader("full")
	var origin *clusterNode
	for _, nd := range c.nodes {
		if nd != lead {
			origin = nd
		}
	}
	drop := func(from, to uint64, p []byte) bool { return p[0] == 'C' }
	c.lose.Store(&drop)
	k := newDurSink()
	b := origin.b.Load()
	batch := publish(b, b.topo.lookupQueue("full"), k, true, "a", "b", "c")
	c.waitFor("the leader applied the part", func() bool {
		info, _ := c.queueLeader("full").b.Load().Queue("full")
		return info.Ready == 1
	})
	c.lose.Store(nil)
	k.waitFor(t, "the part's answer", func() bool { return k.confirmed(batch) })
	info, _ := c.queueLeader("full").b.Load().Queue("full")
	acked := 0
	for _, code := range batch.Codes {
		if code == 0 {
			acked++
		}
	}
	if int64(acked) > info.Ready {
		t.Fatalf("%d of the 3 messages confirmed, but the queue holds %d (codes %v)", acked, info.Ready, batch.Codes)
	}
}

// TestClusterForwardPastSoftLimit: a forwarded publish into a queue past
// its soft limit is confirmed (its leader does not hold the answer back,
// which its origin would take for a lost one and nack at its timeout
// though the messages are in the queue).
func TestClusterForwardPastSoftLimit(t *testing.T) {
	c := newTestClusterWith(t, 3, func(c *testCluster) { c.softLimit = 2 })
	c.leader()
	_, others := c.declareOneReplica("fq")
	origin := others[0]
	k := newDurSink()
	batch := publish(origin.b.Load(), origin.b.Load().topo.lookupQueue("fq"), k, true, "a", "b", "c", "d", "e")
	k.waitFor(t, "the forwarded confirm", func() bool { return k.confirmed(batch) })
	for i, code := range batch.Codes {
		if code != 0 {
			t.Fatalf("message %d nacked (%d) past the soft limit", i, code)
		}
	}
}

// TestClusterForwardPartOverEntryBound: a publish part forwarded to a
// replicated queue's leader with more messages (70,000) or bytes (three
// of 12 MiB) than one of the leader's log entries holds is confirmed
// whole: the origin sends it as parts of their own. The leader refused it
// whole (internal_nack), each message though small enough alone. A
// message alone over the bound is nacked at the origin, and nothing else.
func TestClusterForwardPartOverEntryBound(t *testing.T) {
	c := newTestClusterFwd(t, 3, 0, 30*time.Second) // 36 MiB under -race takes seconds
	c.leader()
	lead, others := c.declareOneReplica("fbig")
	origin := others[0]
	q := origin.b.Load().topo.lookupQueue("fbig")
	var many, big []string
	for i := range 70_000 {
		many = append(many, fmt.Sprintf("%06d", i))
	}
	for i := range 3 {
		big = append(big, strings.Repeat(string(rune('a'+i)), 12<<20))
	}
	k := newDurSink()
	for _, bodies := range [][]string{many, big} {
		batch := publish(origin.b.Load(), q, k, true, bodies...)
		k.waitFor(t, "the forwarded confirm", func() bool { return k.confirmed(batch) })
		for i, code := range batch.Codes {
			if code != 0 {
				t.Fatalf("message %d of %d nacked (%v)", i, len(bodies), wire.Code(code))
			}
		}
	}
	// A message alone over an entry's bound is nacked at its origin; the
	// others, of its part and of the next, are taken (the leader refused
	// the part whole, and the stream's later parts with it).
	over := publish(origin.b.Load(), q, k, true, "x", strings.Repeat("o", segment.MaxEntry), "y")
	after := publish(origin.b.Load(), q, k, true, "z")
	k.waitFor(t, "the confirms", func() bool { return k.confirmed(over) && k.confirmed(after) })
	if got := []wire.Code{wire.Code(over.Codes[0]), wire.Code(over.Codes[1]), wire.Code(over.Codes[2]), wire.Code(after.Codes[0])}; !slices.Equal(got, []wire.Code{wire.OK, wire.InternalNack, wire.OK, wire.OK}) {
		t.Fatalf("a part with a message over an entry's bound, then another: %v, want ok, internal_nack, ok, ok", got)
	}
	if info, _ := lead.b.Load().Queue("fbig"); info.Ready != 70_006 {
		t.Fatalf("the leader's queue holds %d messages, want 70,006", info.Ready)
	}
	msgs, err := lead.b.Load().PeekQueue(t.Context(), "fbig", 70_000)
	if err != nil || len(msgs) != 70_000 {
		t.Fatalf("peek: %d messages, %v", len(msgs), err)
	}
	for i, m := range msgs {
		if string(m.Body) != many[i] {
			t.Fatalf("message %d is %q, want %q (in order)", i, m.Body, many[i])
		}
	}
}

// TestForwardAnswersOfEarlierTries: an origin takes the answer to a
// part's last send: a refusal of an earlier send (from a node that no
// longer had the queue) is ignored and the part confirmed by the next
// answer; a resend-from below the stream's first unconfirmed part (a
// node that forgot the stream: a home that restarted) nacks the part and
// starts the stream over instead of resending it in a loop.
func TestForwardAnswersOfEarlierTries(t *testing.T) {
	var mu sync.Mutex
	var sent [][]byte
	n := openDurNodeWith(t, segment.NewMemFS(), "/data", func(c *Config, _ *MetaLogConfig) {
		c.Durable.NodeID = 1
		c.Durable.Forward = func(_ uint64, p []byte) bool {
			mu.Lock()
			sent = append(sent, slices.Clone(p))
			mu.Unlock()
			return true
		}
	})
	defer n.close(t)
	b := n.b
	declareDurable(t, b, "q", false)
	q := b.topo.lookupQueue("q")
	s := q.shard
	k := newDurSink()
	part := func(body string) *PublishBatch {
		ar := &Arena{}
		ar.Refs.Store(1)
		items := []EnqItem{{Q: q, Msg: ar.add(nil, []byte("q"), nil, []byte(body), 0, 0), Meta: queue.Message{Size: uint32(len(body))}}}
		batch := &PublishBatch{Sink: k, Codes: make([]uint32, 1)}
		batch.Pending.Store(1)
		done := make(chan struct{})
		s.submit(Command{Kind: cmdPost, post: func() {
			q.lead.Store(2) // led by node 2, as far as this node knows
			if w := s.forward(q, items, batch, nil); w != nil {
				s.partRelease(w)
			}
			close(done)
		}})
		<-done
		return batch
	}
	onShard := func(fn func()) {
		done := make(chan struct{})
		s.submit(Command{Kind: cmdPost, post: func() { fn(); close(done) }})
		<-done
	}
	// answer is a node's answer to the stream's part at qseq: 'C' (a
	// confirm, or refused) or 'R' (resend from).
	answer := func(op byte, qseq uint64, try uint32, refused bool, from uint64) {
		var inc uint64
		onShard(func() { inc = s.streams[q.id].inc })
		p := append([]byte{op}, make([]byte, 32)...)
		binary.LittleEndian.PutUint64(p[1:], 1<<48|uint64(s.idx))
		binary.LittleEndian.PutUint64(p[9:], inc)
		binary.LittleEndian.PutUint64(p[17:], uint64(q.id))
		binary.LittleEndian.PutUint64(p[25:], qseq)
		if op == 'C' {
			p = binary.LittleEndian.AppendUint64(p, 2)
			p = append(p, flagByte(refused))
			p = binary.LittleEndian.AppendUint32(p, 1)
			p = binary.LittleEndian.AppendUint32(p, 0)
			p = binary.LittleEndian.AppendUint32(p, try)
		} else {
			p = binary.LittleEndian.AppendUint32(p, try)
			p = binary.LittleEndian.AppendUint64(p, from)
			p = binary.LittleEndian.AppendUint64(p, 2)
		}
		b.StepForward(2, p)
		barrier(t, s)
	}

	first := part("a")
	onShard(func() { st := s.streams[q.id]; s.sendPart(st, st.parts[0], 3) }) // sent again, to node 3: try 2
	answer('C', 1, 1, true, 0)                                                // node 2 refuses the first try
	k.mu.Lock()
	early := k.confirmed(first)
	k.mu.Unlock()
	if early {
		t.Fatalf("a refusal of an earlier try answered the part: %v", first.Codes)
	}
	answer('C', 1, 2, false, 0)
	k.waitFor(t, "the confirm of the last try", func() bool { return k.confirmed(first) })
	if first.Codes[0] != 0 {
		t.Fatalf("the part answered %d, want a confirm", first.Codes[0])
	}

	second := part("b") // qseq 2
	var inc uint64
	onShard(func() { inc = s.streams[q.id].inc })
	answer('R', 2, 1, false, 1) // "missing from 1": it forgot what it confirmed
	k.waitFor(t, "the nack of a part of a forgotten stream", func() bool { return k.confirmed(second) })
	if second.Codes[0] != uint32(wire.InternalNack) {
		t.Fatalf("the part answered %d, want a nack", second.Codes[0])
	}
	onShard(func() {
		if st := s.streams[q.id]; st.inc == inc || len(st.parts) != 0 {
			t.Errorf("the stream did not start over: incarnation %d (was %d), %d parts", st.inc, inc, len(st.parts))
		}
	})
	mu.Lock()
	defer mu.Unlock()
	if len(sent) != 3 {
		t.Fatalf("%d sends, want 3 (no resend of the forgotten stream)", len(sent))
	}
}

// fwdPublishFrom is a forwarded publish ('P') of bodies to queue qid from
// enqueuer enq (of incarnation inc), its first message at qseq, as an
// origin node's shard writes it (shard.forward).
func fwdPublishFrom(enq, inc, qid, qseq uint64, try uint32, bodies ...string) []byte {
	p := []byte{'P'}
	p = binary.LittleEndian.AppendUint64(p, enq)
	p = binary.LittleEndian.AppendUint64(p, inc)
	p = binary.LittleEndian.AppendUint64(p, qid)
	p = binary.LittleEndian.AppendUint64(p, qseq)
	p = binary.LittleEndian.AppendUint32(p, try)
	p = binary.LittleEndian.AppendUint32(p, uint32(len(bodies)))
	ar := &Arena{}
	for _, body := range bodies {
		p = binary.LittleEndian.AppendUint32(p, uint32(len(body)))
		p = append(p, 0, 0)                        // priority, no expiration
		p = binary.LittleEndian.AppendUint32(p, 0) // expiration ms
		p = binary.LittleEndian.AppendUint64(p, 0) // dedup key
		p = binary.LittleEndian.AppendUint32(p, 0) // length, below
		off := len(p)
		p = appendLogMsg(p, ar.add(nil, []byte("q"), nil, []byte(body), wire.Persistent, 0))
		binary.LittleEndian.PutUint32(p[off-4:], uint32(len(p)-off))
	}
	return p
}

// TestForwardedResendUnderAlarmConfirmed: a part forwarded again whose
// messages the queue already holds (the answer to its first send was
// lost) is answered as the duplicate it is, a confirm, even while the
// node's alarm holds new publishes back (busy): answered busy, its origin
// would send it again until its forward timeout and then nack messages
// that are in the queue. A new part under the alarm is still answered
// busy. Both for a replicated queue's leader and a queue's home.
func TestForwardedResendUnderAlarmConfirmed(t *testing.T) {
	for _, durable := range []bool{true, false} {
		t.Run(fmt.Sprintf("durable=%v", durable), func(t *testing.T) {
			var alarm atomic.Bool
			answers := make(chan []byte, 16)
			n := openDurNodeWith(t, segment.NewMemFS(), "/data", func(c *Config, _ *MetaLogConfig) {
				c.Durable.NodeID = 1
				c.PublishBlocked = alarm.Load
				c.Durable.Forward = func(to uint64, p []byte) bool {
					if to == 2 {
						answers <- slices.Clone(p)
					}
					return true
				}
			})
			defer n.close(t)
			b := n.b
			q := declareDurable(t, b, "q", durable)
			if !durable {
				// One node has no homes (meta_declare.go): this node is the
				// queue's home as a cluster node would be.
				done := make(chan struct{})
				q.shard.submit(Command{Kind: cmdPost, post: func() { q.home = 1; close(done) }})
				<-done
			}
			// A publish here confirmed: the queue's group leads (a
			// single voter elects itself after its open).
			k := newDurSink()
			first := publish(b, q, k, true, "x")
			k.waitFor(t, "the local publish's confirm", func() bool { return k.confirmed(first) })
			const enq, inc = 2<<48 | 1, 7
			// answer sends p as node 2 and returns the answer: its op and,
			// for a confirm, refused and the codes.
			answer := func(p []byte) (byte, bool, []uint32) {
				t.Helper()
				b.StepForward(2, p)
				a := <-answers
				if a[0] != 'C' {
					return a[0], false, nil
				}
				codes := make([]uint32, binary.LittleEndian.Uint32(a[42:]))
				for i := range codes {
					codes[i] = binary.LittleEndian.Uint32(a[fwdConfirmHeader+4*i:])
				}
				return a[0], a[41] != 0, codes
			}
			ready := func() int64 {
				info, _ := b.Queue("q")
				return info.Ready
			}
			if op, refused, codes := answer(fwdPublishFrom(enq, inc, uint64(q.id), 1, 1, "a", "b")); op != 'C' || refused || codes[0]|codes[1] != 0 {
				t.Fatalf("first send answered %q refused=%v codes %v, want a confirm", op, refused, codes)
			}
			alarm.Store(true)
			if op, refused, codes := answer(fwdPublishFrom(enq, inc, uint64(q.id), 1, 2, "a", "b")); op != 'C' || refused || len(codes) != 2 || codes[0]|codes[1] != 0 {
				t.Fatalf("the resend of a stored part under the alarm answered %q refused=%v codes %v, want a confirm", op, refused, codes)
			}
			if op, _, _ := answer(fwdPublishFrom(enq, inc, uint64(q.id), 3, 1, "c")); op != 'B' {
				t.Fatalf("a new part under the alarm answered %q, want busy", op)
			}
			if got := ready(); got != 3 {
				t.Fatalf("the queue holds %d messages, want 3 (the local one and the part's two: the resend not enqueued again, the new part held back)", got)
			}
			if got := b.fwdDuplicates.Load(); got != 2 {
				t.Fatalf("%d duplicates counted, want 2", got)
			}
		})
	}
}
