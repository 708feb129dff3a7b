package broker

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/warren-mq/warren/queue"
	"github.com/warren-mq/warren/segment"
	"github.com/warren-mq/warren/wire"
	"go.etcd.io/raft/v3/raftpb"
)

// qbarrier waits until everything submitted for q before it is applied
// (from the log, for a durable queue) and its effects handed out.
func qbarrier(t *testing.T, q *Queue) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	if _, err := ask(ctx, q.shard, Command{Kind: CmdBarrier, Queue: q}); err != nil {
		t.Fatal("queue did not drain: ", err)
	}
}

// dlPair declares, on n's broker, the durable direct exchange dlx, the
// durable queue dlq bound to it (key dlq), and a durable source queue
// with dead-letter-exchange dlx and dead-letter-routing-key dlq (plus
// extra arguments), placed on a shard other than dlq's.
func dlPair(t *testing.T, b *Broker, dlqArgs, srcArgs wire.Table) (src, dlq *Queue) {
	t.Helper()
	if err := b.DeclareExchangeAs(&wire.ExchangeDeclare{Name: "dlx", Kind: wire.ExchangeDirect, Durable: true}, "u"); err != nil {
		t.Fatal(err)
	}
	if _, err := b.DeclareQueueAs(&wire.QueueDeclare{Name: "dlq", Durable: true, Args: dlqArgs}, 0, "u"); err != nil {
		t.Fatal(err)
	}
	if err := b.BindAs(&wire.Bind{Source: "dlx", Destination: "dlq", RoutingKey: "dlq"}, Requester{User: "u"}); err != nil {
		t.Fatal(err)
	}
	name := ""
	for i := 0; i < 64 && name == ""; i++ {
		if c := fmt.Sprintf("src%d", i); b.topo.meta.ShardOf(c) != b.topo.meta.ShardOf("dlq") {
			name = c
		}
	}
	args := append(wire.Table{{Key: "dead-letter-exchange", Value: wire.String("dlx")},
		{Key: "dead-letter-routing-key", Value: wire.String("dlq")}}, srcArgs...)
	if _, err := b.DeclareQueueAs(&wire.QueueDeclare{Name: name, Durable: true, Args: args}, 0, "u"); err != nil {
		t.Fatal(err)
	}
	if err := b.MetaSync(t.Context()); err != nil {
		t.Fatal(err)
	}
	src, dlq = b.topo.lookupQueue(name), b.topo.lookupQueue("dlq")
	if src == nil || dlq == nil || src.shard == dlq.shard {
		t.Fatalf("setup: source %v and target %v must be on different shards", src, dlq)
	}
	qbarrier(t, src)
	qbarrier(t, dlq)
	return src, dlq
}

// TestDeadLetterSurvivesCrash: a message rejected (without requeue) in a
// durable queue whose dead letters go to a durable queue is, after a
// crash at any point, in one of the two. The crash here falls after the
// source applied the reject and took a snapshot of it, and before the
// target's shard wrote the dead letter: the source must still hold it
// (and send it again after recovery).
func TestDeadLetterSurvivesCrash(t *testing.T) {
	mem := segment.NewMemFS()
	n := openDurNode(t, mem)
	b := n.b
	src, dlq := dlPair(t, b, nil, nil)
	k := newDurSink()
	p := publish(b, src, k, true, "m")
	k.waitFor(t, "the confirm", func() bool { return k.confirmed(p) })
	b.Submit(Command{Kind: CmdSubscribe, Queue: src, Sink: k, Spec: queue.ConsumerSpec{ID: 1, Owner: 7}, Req: 1})
	k.waitFor(t, "the delivery", func() bool { return len(k.got) == 1 })

	// The target's shard is held: the dead letter waits in its inbox.
	gate, held := make(chan struct{}), make(chan struct{})
	dlq.shard.submit(Command{Kind: cmdPost, post: func() { close(held); <-gate }})
	<-held
	released := false
	release := func() {
		if !released {
			released = true
			close(gate)
		}
	}
	defer release()
	k.mu.Lock()
	tag := k.got[0].tag
	k.mu.Unlock()
	b.Submit(Command{Kind: CmdSettle, Settles: []SettleItem{{Q: src, Consumer: 1, Op: wire.SettleReject, QTag: tag}}})
	qbarrier(t, src) // the reject is applied (after its sync)
	if src.deadLettered.Load() != 1 {
		t.Fatalf("setup: the source dead-lettered %d messages, want 1", src.deadLettered.Load())
	}
	// A snapshot of the source after the reject, stored and compacted.
	snapped := make(chan error, 1)
	src.shard.submit(Command{Kind: cmdPost, post: func() {
		if err := src.grp.Snapshot(b.cfg.Durable.Snapshots, func(_ raftpb.SnapshotMetadata, err error) { snapped <- err }); err != nil {
			snapped <- err
		}
	}})
	select {
	case err := <-snapped:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the source's snapshot was not taken")
	}

	img := mem.Crash(0)
	release()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_ = b.Stop(ctx)

	n2 := openDurNode(t, img)
	defer n2.close(t)
	if err := n2.b.WaitRecovered(t.Context()); err != nil {
		t.Fatal(err)
	}
	src2, dlq2 := n2.b.topo.lookupQueue(src.name), n2.b.topo.lookupQueue("dlq")
	qbarrier(t, src2)
	qbarrier(t, dlq2)
	if r, d := src2.ready.Load(), dlq2.ready.Load(); r+d == 0 {
		t.Fatalf("after the crash the dead letter is gone from both the source (ready %d) and the target (ready %d)", r, d)
	}
	k2 := newDurSink()
	n2.b.Submit(Command{Kind: CmdSubscribe, Queue: dlq2, Sink: k2, Spec: queue.ConsumerSpec{ID: 1, Owner: 8}, Req: 1})
	k2.waitFor(t, "the dead letter in the target", func() bool { return len(k2.got) == 1 })
}

// TestDeadLetterNotResentAfterRestart: a dead letter its durable target
// took, delivered and acked, is not sent again by a restart (the
// source's recovery replays the log that dead-lettered it, which must not
// dead-letter it again once the target has it).
func TestDeadLetterNotResentAfterRestart(t *testing.T) {
	mem := segment.NewMemFS()
	n := openDurNode(t, mem)
	b := n.b
	src, dlq := dlPair(t, b, nil, nil)
	k := newDurSink()
	p := publish(b, src, k, true, "m")
	k.waitFor(t, "the confirm", func() bool { return k.confirmed(p) })
	b.Submit(Command{Kind: CmdSubscribe, Queue: src, Sink: k, Spec: queue.ConsumerSpec{ID: 1, Owner: 7}, Req: 1})
	k.waitFor(t, "the delivery", func() bool { return len(k.got) == 1 })
	k.mu.Lock()
	tag := k.got[0].tag
	k.mu.Unlock()
	b.Submit(Command{Kind: CmdSettle, Settles: []SettleItem{{Q: src, Consumer: 1, Op: wire.SettleReject, QTag: tag}}})
	kd := newDurSink()
	b.Submit(Command{Kind: CmdSubscribe, Queue: dlq, Sink: kd, Spec: queue.ConsumerSpec{ID: 2, Owner: 7}, Req: 2})
	kd.waitFor(t, "the dead letter", func() bool { return len(kd.got) == 1 })
	kd.mu.Lock()
	dtag := kd.got[0].tag
	kd.mu.Unlock()
	b.Submit(Command{Kind: CmdSettle, Settles: []SettleItem{{Q: dlq, Consumer: 2, Op: wire.SettleAck, QTag: dtag}}})
	qbarrier(t, dlq)
	qbarrier(t, src)
	n.close(t)

	n2 := openDurNode(t, mem)
	defer n2.close(t)
	if err := n2.b.WaitRecovered(t.Context()); err != nil {
		t.Fatal(err)
	}
	src2, dlq2 := n2.b.topo.lookupQueue(src.name), n2.b.topo.lookupQueue("dlq")
	qbarrier(t, src2)
	qbarrier(t, dlq2)
	if r, d := src2.ready.Load(), dlq2.ready.Load(); r+d != 0 {
		t.Fatalf("after a clean restart the source has %d ready and the target %d, want 0 and 0: the acked dead letter was sent again", r, d)
	}
}
