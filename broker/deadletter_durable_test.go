package broker

import (
	"context"
	"fmt"
	"reflect"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/warren-mq/warren/queue"
	"github.com/warren-mq/warren/segment"
	"github.com/warren-mq/warren/wire"
	"go.etcd.io/raft/v3/raftpb"
)

// deathSink is a durSink that also keeps each delivery's death history.
type deathSink struct {
	*durSink
	deaths [][]wire.Death
}

func newDeathSink() *deathSink { return &deathSink{durSink: newDurSink()} }

func (k *deathSink) Deliver(ds []Delivery) {
	k.mu.Lock()
	for _, d := range ds {
		var props wire.Properties
		var deaths []wire.Death
		if err := wire.ParseProperties(d.Msg.Props(), &props); err == nil && props.Has(wire.PropDeaths) {
			deaths, _ = wire.DecodeDeaths(props.Deaths)
		}
		k.deaths = append(k.deaths, deaths)
	}
	k.mu.Unlock()
	k.durSink.Deliver(ds)
}

// wantDeath is the death history of message "m" (published via exchange
// x with key rk) rejected in src at time at.
func wantDeath(src string, at int64) []wire.Death {
	return []wire.Death{{Queue: src, Reason: wire.ReasonRejected, Count: 1, FirstMs: at, LastMs: at, Exchange: "x", RoutingKeys: []string{"rk"}}}
}

// clockAt is a broker clock tests set.
func clockAt(c *atomic.Int64) func(*Config, *MetaLogConfig) {
	return func(cfg *Config, _ *MetaLogConfig) { cfg.Clock = c.Load }
}

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

// deliverM publishes message "m" (persistent, confirmed) to src and
// delivers it to consumer 1 (owner 7); it returns the delivery's tag.
func deliverM(t *testing.T, b *Broker, src *Queue) (tag uint64) {
	t.Helper()
	k := newDurSink()
	p := publish(b, src, k, true, "m")
	k.waitFor(t, "the confirm", func() bool { return k.confirmed(p) })
	b.Submit(Command{Kind: CmdSubscribe, Queue: src, Sink: k, Spec: queue.ConsumerSpec{ID: 1, Owner: 7}, Req: 1})
	k.waitFor(t, "the delivery", func() bool { return len(k.got) == 1 })
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.got[0].tag
}

// holdShard holds s: what is submitted to it after waits in its inbox
// until release (which may be called more than once).
func holdShard(s *shard) (release func()) {
	gate, held := make(chan struct{}), make(chan struct{})
	s.submit(Command{Kind: cmdPost, post: func() { close(held); <-gate }})
	<-held
	var once sync.Once
	return func() { once.Do(func() { close(gate) }) }
}

// recoveredPair waits for n's recovery and returns its queues src and dlq
// (dlPair's), each with what it recovered applied.
func recoveredPair(t *testing.T, n *durNode, src string) (*Queue, *Queue) {
	t.Helper()
	if err := n.b.WaitRecovered(t.Context()); err != nil {
		t.Fatal(err)
	}
	src2, dlq2 := n.b.topo.lookupQueue(src), n.b.topo.lookupQueue("dlq")
	qbarrier(t, src2)
	qbarrier(t, dlq2)
	return src2, dlq2
}

// TestDeadLetterSurvivesCrash: a message rejected (without requeue) in a
// durable queue whose dead letters go to a durable queue is, after a
// crash at any point, in one of the two. The crash here falls after the
// source applied the reject and took a snapshot of it, and before the
// target's shard wrote the dead letter: the source must still hold it
// (and send it again after recovery).
func TestDeadLetterSurvivesCrash(t *testing.T) {
	mem := segment.NewMemFS()
	var clock atomic.Int64
	clock.Store(1_000_000)
	n := openDurNodeWith(t, mem, "/data", clockAt(&clock))
	b := n.b
	src, dlq := dlPair(t, b, nil, nil)
	tag := deliverM(t, b, src)

	// The target's shard is held: the dead letter waits in its inbox.
	release := holdShard(dlq.shard)
	defer release()
	clock.Store(1_000_500)
	b.Submit(Command{Kind: CmdSettle, Settles: []SettleItem{{Q: src, Consumer: 1, Op: wire.SettleReject, QTag: tag}}})
	qbarrier(t, src) // the reject is applied (after its sync)
	if src.deadLettered.Load() != 1 {
		t.Fatalf("setup: the source dead-lettered %d messages, want 1", src.deadLettered.Load())
	}
	// Held until the target has it: counted in the source's stats (and
	// /metrics), not ready.
	if st := statsOf(src); st.DeadLettersHeld != 1 || st.Ready != 0 {
		t.Fatalf("the source while its dead letter is on its way: %d held, %d ready; want 1 and 0", st.DeadLettersHeld, st.Ready)
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

	clock.Store(2_000_000)
	n2 := openDurNodeWith(t, img, "/data", clockAt(&clock))
	defer n2.close(t)
	src2, dlq2 := recoveredPair(t, n2, src.name)
	if r, d := src2.ready.Load(), dlq2.ready.Load(); r+d == 0 {
		t.Fatalf("after the crash the dead letter is gone from both the source (ready %d) and the target (ready %d)", r, d)
	}
	k2 := newDeathSink()
	n2.b.Submit(Command{Kind: CmdSubscribe, Queue: dlq2, Sink: k2, Spec: queue.ConsumerSpec{ID: 1, Owner: 8}, Req: 1})
	k2.waitFor(t, "the dead letter in the target", func() bool { return len(k2.got) == 1 })
	k2.mu.Lock()
	defer k2.mu.Unlock()
	// Sent again after the crash, with the history the first send had:
	// the death's time is the reject's, not the recovery's.
	if want := wantDeath(src.name, 1_000_500); k2.got[0].body != "m" || !reflect.DeepEqual(k2.deaths[0], want) {
		t.Errorf("the dead letter after recovery: %q with deaths %+v, want \"m\" with %+v", k2.got[0].body, k2.deaths[0], want)
	}
}

// TestDeadLetterNotResentAfterRestart: a dead letter its durable target
// took, delivered and acked, is not sent again by a restart (the
// source's recovery replays the log that dead-lettered it, which must not
// dead-letter it again once the target has it).
func TestDeadLetterNotResentAfterRestart(t *testing.T) {
	mem := segment.NewMemFS()
	var clock atomic.Int64
	clock.Store(1_000_500)
	n := openDurNodeWith(t, mem, "/data", clockAt(&clock))
	b := n.b
	src, dlq := dlPair(t, b, nil, nil)
	tag := deliverM(t, b, src)
	b.Submit(Command{Kind: CmdSettle, Settles: []SettleItem{{Q: src, Consumer: 1, Op: wire.SettleReject, QTag: tag}}})
	kd := newDeathSink()
	b.Submit(Command{Kind: CmdSubscribe, Queue: dlq, Sink: kd, Spec: queue.ConsumerSpec{ID: 2, Owner: 7}, Req: 2})
	kd.waitFor(t, "the dead letter", func() bool { return len(kd.got) == 1 })
	kd.mu.Lock()
	dtag := kd.got[0].tag
	if want := wantDeath(src.name, 1_000_500); !reflect.DeepEqual(kd.deaths[0], want) {
		t.Errorf("the dead letter's deaths %+v, want %+v", kd.deaths[0], want)
	}
	kd.mu.Unlock()
	b.Submit(Command{Kind: CmdSettle, Settles: []SettleItem{{Q: dlq, Consumer: 2, Op: wire.SettleAck, QTag: dtag}}})
	qbarrier(t, dlq)
	qbarrier(t, src)
	n.close(t)

	n2 := openDurNodeWith(t, mem, "/data", clockAt(&clock))
	defer n2.close(t)
	src2, dlq2 := recoveredPair(t, n2, src.name)
	if r, d := src2.ready.Load(), dlq2.ready.Load(); r+d != 0 {
		t.Fatalf("after a clean restart the source has %d ready and the target %d, want 0 and 0: the acked dead letter was sent again", r, d)
	}
}

// heldOf reads q's held dead letters and the messages its machine still
// keeps (ready, unacked, held) on its shard.
func heldOf(t *testing.T, q *Queue) (held, kept int) {
	t.Helper()
	done := make(chan struct{})
	q.shard.submit(Command{Kind: cmdPost, post: func() {
		held, _ = q.m.HeldDeadLetters()
		q.m.EachMessage(func(uint64, uint32) { kept++ })
		close(done)
	}})
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("the shard did not answer")
	}
	return held, kept
}

// TestHeldDeadLetterBound: a target that refuses a dead letter (a full
// reject-publish durable queue) or a dead letter that routes nowhere
// does not keep it held in its source: it is dropped and counted, as
// before, and the source lets it go (its log entry too), so the held
// dead letters never grow past those in flight.
func TestHeldDeadLetterBound(t *testing.T) {
	var refused, unroutable atomic.Int64
	n := openDurNodeWith(t, segment.NewMemFS(), "/data", func(c *Config, _ *MetaLogConfig) {
		c.DeadLetterDropped = func(r DLDrop) {
			switch r {
			case dlTargetRefused:
				refused.Add(1)
			case dlUnroutable:
				unroutable.Add(1)
			}
		}
	})
	defer n.close(t)
	b := n.b
	full := wire.Table{{Key: "max-length", Value: wire.Int(1)}, {Key: "overflow", Value: wire.String("reject-publish")}}
	src, dlq := dlPair(t, b, full, nil)
	nowhere := wire.Table{{Key: "dead-letter-exchange", Value: wire.String("dlx")}, {Key: "dead-letter-routing-key", Value: wire.String("nowhere")}}
	if _, err := b.DeclareQueueAs(&wire.QueueDeclare{Name: "lost", Durable: true, Args: nowhere}, 0, "u"); err != nil {
		t.Fatal(err)
	}
	if err := b.MetaSync(t.Context()); err != nil {
		t.Fatal(err)
	}
	lost := b.topo.lookupQueue("lost")
	k := newDurSink()
	filler := publish(b, dlq, k, true, "filler")
	k.waitFor(t, "the filler's confirm", func() bool { return k.confirmed(filler) })

	const count = 20
	var bodies []string
	for i := range count {
		bodies = append(bodies, fmt.Sprintf("m%d", i))
	}
	for i, q := range []*Queue{src, lost} {
		p := publish(b, q, k, true, bodies...)
		k.waitFor(t, "the confirm", func() bool { return k.confirmed(p) })
		ks := newDurSink()
		b.Submit(Command{Kind: CmdSubscribe, Queue: q, Sink: ks, Spec: queue.ConsumerSpec{ID: queue.ConsumerID(10 + i), Owner: 7}, Req: 1})
		ks.waitFor(t, "the deliveries", func() bool { return len(ks.got) == count })
		ks.mu.Lock()
		var settles []SettleItem
		for _, d := range ks.got {
			settles = append(settles, SettleItem{Q: q, Consumer: queue.ConsumerID(10 + i), Op: wire.SettleReject, QTag: d.tag})
		}
		ks.mu.Unlock()
		b.Submit(Command{Kind: CmdSettle, Settles: settles})
		qbarrier(t, q)   // the rejects are applied: the dead letters are sent
		qbarrier(t, dlq) // the target refused them
		qbarrier(t, q)   // the source settled them
		if held, kept := heldOf(t, q); held != 0 || kept != 0 {
			t.Errorf("%s: %d dead letters still held, %d messages kept, want 0 and 0", q.name, held, kept)
		}
		if st := statsOf(q); st.DeadLettersHeld != 0 {
			t.Errorf("%s: its stats say %d dead letters held, want 0", q.name, st.DeadLettersHeld)
		}
	}
	if r, u := refused.Load(), unroutable.Load(); r != count || u != count {
		t.Errorf("dropped dead letters: %d refused by the full target, %d unroutable; want %d and %d", r, u, count, count)
	}
	if r := dlq.ready.Load(); r != 1 {
		t.Errorf("the full target has %d ready, want 1 (the filler)", r)
	}
}

// TestDeadLetterInFlightAtStop: a clean stop while a dead letter is on its
// way to its target waits until the target has it and the source has
// settled it, so the next start sends no second copy.
func TestDeadLetterInFlightAtStop(t *testing.T) {
	mem := segment.NewMemFS()
	n := openDurNode(t, mem)
	b := n.b
	src, dlq := dlPair(t, b, nil, nil)
	tag := deliverM(t, b, src)

	release := holdShard(dlq.shard)
	b.Submit(Command{Kind: CmdSettle, Settles: []SettleItem{{Q: src, Consumer: 1, Op: wire.SettleReject, QTag: tag}}})
	qbarrier(t, src) // the dead letter waits in the target shard's inbox

	waiting := make(chan struct{}, 1)
	quiesceDLWait = func() {
		select {
		case waiting <- struct{}{}:
		default:
		}
	}
	defer func() { quiesceDLWait = nil }()
	stopped := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := b.CloseMetaLog(ctx); err != nil {
			stopped <- err
			return
		}
		stopped <- b.Stop(ctx)
	}()
	// The source's shard stops, or waits for its dead letter; then the
	// target's shard goes on.
	select {
	case <-src.shard.done:
	case <-waiting:
	case <-time.After(10 * time.Second):
		t.Fatal("the source's shard neither stopped nor waited for its dead letter")
	}
	release()
	if err := <-stopped; err != nil {
		t.Fatal(err)
	}
	if err := n.log.Close(); err != nil {
		t.Fatal(err)
	}

	n2 := openDurNode(t, mem)
	defer n2.close(t)
	src2, dlq2 := recoveredPair(t, n2, src.name)
	if r, d := src2.ready.Load(), dlq2.ready.Load(); r != 0 || d != 1 {
		t.Fatalf("after a clean stop with a dead letter in flight and a restart: source ready %d, target ready %d; want 0 and 1 (one copy)", r, d)
	}
}
