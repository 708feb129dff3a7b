package broker

import (
	"bytes"
	"cmp"
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/warren-mq/warren/queue"
	"github.com/warren-mq/warren/wire"
)

// step is one command of a recorded workload, as data: queues by name,
// consumers by id, the time the broker's clock read when it was applied.
type step struct {
	AtMs     int64
	Kind     CmdKind
	Queue    string
	Bodies   []string           // CmdPublish
	Spec     queue.ConsumerSpec // CmdSubscribe
	Consumer queue.ConsumerID   // CmdCancel, CmdSettle
	Requeue  bool               // CmdCancel
	Owner    uint64             // CmdDown
	Op       wire.SettleOp      // CmdSettle
	QTag     uint64             // CmdSettle
	Exchange string             // CmdPublish: routed through this exchange (else straight to Queue)
	Key      string             // CmdPublish through Exchange: the routing key
	// Meta: the metadata commands a declare, bind or exchange delete of
	// the workload applied, encoded (AppendMetaCommand), with their time:
	// replayed as they are through Broker.ApplyMeta. A queue's deletion is
	// a queue command (CmdDelete): its shard decides, and the metadata
	// command it then applies is the replay's own, compared with the
	// recording's (metaLog).
	Meta [][]byte
}

// metaLog records every metadata command a broker applies, encoded, with
// its result: the workload's and those its shards apply (a queue deleted,
// auto-deleted or gone with its exclusive owner).
type metaLog struct {
	mu      sync.Mutex
	all     []string
	pending [][]byte // since the last take
}

func (m *metaLog) record(c *MetaCommand, r MetaResult) {
	enc := AppendMetaCommand(nil, c)
	m.mu.Lock()
	defer m.mu.Unlock()
	m.all = append(m.all, fmt.Sprintf("%x -> %v %q %d %s %v", enc, r.Code, r.Reason, r.QueueID, r.Name, r.Removed))
	m.pending = append(m.pending, enc)
}

func (m *metaLog) take() [][]byte {
	m.mu.Lock()
	defer m.mu.Unlock()
	p := m.pending
	m.pending = nil
	return p
}

// effectLog records what the broker hands its sinks, per queue.
type effectLog struct {
	mu      sync.Mutex
	byQueue map[string][]string
	owner   map[queue.ConsumerID]string // consumer → its queue
	open    map[queue.ConsumerID][]uint64
}

func newEffectLog() *effectLog {
	return &effectLog{byQueue: map[string][]string{}, owner: map[queue.ConsumerID]string{}, open: map[queue.ConsumerID][]uint64{}}
}

func (l *effectLog) add(q, s string) { l.byQueue[q] = append(l.byQueue[q], s) }

func (l *effectLog) Deliver(ds []Delivery) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, d := range ds {
		l.add(l.owner[d.Consumer], fmt.Sprintf("deliver c%d t%d %q dc%d fc%d props %x", d.Consumer, d.QTag, d.Msg.Body(), d.DeliveryCount, d.FailedCount, d.Msg.Props()))
		l.open[d.Consumer] = append(l.open[d.Consumer], d.QTag)
	}
}
func (l *effectLog) Confirm(b *PublishBatch) {}
func (l *effectLog) Subscribed(id queue.ConsumerID, _ uint32, code wire.Code, _ string) {
	l.mu.Lock()
	l.add(l.owner[id], fmt.Sprintf("subscribed c%d %v", id, code))
	l.mu.Unlock()
}
func (l *effectLog) Cancelled(id queue.ConsumerID, code wire.Code, _ string) {}
func (l *effectLog) LeaseExpired(id queue.ConsumerID, qtag uint64) {
	l.mu.Lock()
	l.add(l.owner[id], fmt.Sprintf("lease c%d t%d", id, qtag))
	l.mu.Unlock()
}
func (l *effectLog) ConsumerGone(id queue.ConsumerID) {
	l.mu.Lock()
	l.add(l.owner[id], fmt.Sprintf("gone c%d", id))
	l.mu.Unlock()
}
func (l *effectLog) Answer(req uint64, r Result) {}

// confirmLog records a publish's codes under its queue.
type confirmLog struct {
	l *effectLog
	q string
}

func (c confirmLog) Confirm(b *PublishBatch) {
	c.l.mu.Lock()
	c.l.add(c.q, fmt.Sprintf("confirm %v", b.Codes))
	c.l.mu.Unlock()
}
func (c confirmLog) Deliver([]Delivery)                                     {}
func (c confirmLog) Subscribed(queue.ConsumerID, uint32, wire.Code, string) {}
func (c confirmLog) Cancelled(queue.ConsumerID, wire.Code, string)          {}
func (c confirmLog) LeaseExpired(queue.ConsumerID, uint64)                  {}
func (c confirmLog) ConsumerGone(queue.ConsumerID)                          {}
func (c confirmLog) Answer(uint64, Result)                                  {}

// answerLog records a purge's count under its queue.
type answerLog struct {
	confirmLog
}

func (a answerLog) Answer(_ uint64, r Result) {
	a.l.mu.Lock()
	a.l.add(a.q, fmt.Sprintf("answer %v n%d", r.Code, r.N))
	a.l.mu.Unlock()
}

var detQueues = []string{"q0", "q1", "q2", "q3", "dlq"}

// detBroker declares the workload's topology on a fresh broker whose clock
// is *now.
// Its timers are ticked by the workload (ManualTicks); onApply sees every
// command a shard applies; ml records its metadata commands.
func detBroker(t *testing.T, shards int, now *atomic.Int64, onApply func(int, int64, *Command), ml *metaLog) *Broker {
	t.Helper()
	b := startBroker(t, Config{Shards: shards, Clock: now.Load, ManualTicks: true, OnApply: onApply})
	b.topo.mu.Lock()
	b.topo.record = ml.record
	b.topo.mu.Unlock()
	must := mustFunc(t)
	declareDeadLetterQueue(t, b)
	dl := wire.Table{{Key: "dead-letter-exchange", Value: wire.String("dlx")}}
	for i, args := range []wire.Table{
		append(wire.Table{{Key: "message-ttl", Value: wire.Int(100)}}, dl...),
		append(wire.Table{{Key: "delivery-limit", Value: wire.Int(2)}}, dl...),
		{{Key: "max-length", Value: wire.Int(5)}, {Key: "overflow", Value: wire.String("reject-publish")}},
		append(wire.Table{{Key: "max-priority", Value: wire.Int(3)}}, dl...),
	} {
		_, err := b.DeclareQueue(wire.QueueDeclare{Name: detQueues[i], Args: args})
		must(err)
	}
	return b
}

// apply runs one recorded step on b and waits until it and the dead
// letters it caused have been applied everywhere.
func (st *step) apply(t *testing.T, b *Broker, now *atomic.Int64, l *effectLog) {
	t.Helper()
	now.Store(st.AtMs)
	if st.Meta != nil {
		for _, enc := range st.Meta {
			if _, err := b.ApplyMeta(enc); err != nil {
				t.Fatal(err)
			}
		}
		settle(t, b)
		return
	}
	q := b.LookupQueue(st.Queue)
	if q == nil && st.Exchange == "" {
		t.Fatalf("step %+v: no queue %q", st, st.Queue)
	}
	switch st.Kind {
	case CmdPublish:
		if st.Exchange != "" {
			st.publishRouted(b, l)
			break
		}
		ar := &Arena{}
		ar.Refs.Store(int64(len(st.Bodies)))
		props := wire.AppendProperties(nil, &wire.Properties{})[2:]
		items := make([]EnqItem, len(st.Bodies))
		for i, body := range st.Bodies {
			m := ar.add([]byte{}, []byte(st.Queue), props, []byte(body), 0, uint8(i%4))
			items[i] = EnqItem{Q: q, Msg: m, Meta: queue.Message{Size: uint32(len(body)), Priority: m.Priority}, Idx: i}
		}
		batch := &PublishBatch{Sink: confirmLog{l, st.Queue}, Codes: make([]uint32, len(items))}
		batch.Pending.Store(2)
		batch.PartDone() // the publisher's own part first: the shard's confirms, in its order
		b.Submit(Command{Kind: CmdPublish, Items: items, Batch: batch})
	case CmdSubscribe:
		l.mu.Lock()
		l.owner[st.Spec.ID] = st.Queue
		l.mu.Unlock()
		b.Submit(Command{Kind: CmdSubscribe, Queue: q, Sink: l, Spec: st.Spec})
	case CmdCancel:
		b.Submit(Command{Kind: CmdCancel, Queue: q, Consumer: st.Consumer, Requeue: st.Requeue})
	case CmdSettle:
		b.Submit(Command{Kind: CmdSettle, Settles: []SettleItem{{Q: q, Consumer: st.Consumer, Op: st.Op, QTag: st.QTag}}})
	case CmdPurge:
		b.Submit(Command{Kind: CmdPurge, Queue: q, Sink: answerLog{confirmLog{l, st.Queue}}})
	case CmdTick: // recorded from a timer firing
		b.Submit(Command{Kind: CmdTick, Queue: q})
	case CmdDelete:
		n, err := b.DeleteQueue(context.Background(), st.Queue, false, false)
		l.mu.Lock()
		l.add(st.Queue, fmt.Sprintf("deleted n%d %v", n, err))
		l.mu.Unlock()
	case CmdDown:
		// Submit hands a Down to every shard at once, so a dead letter one
		// shard makes of it can reach another shard's inbox before or after
		// that shard's own Down: an order nothing records. A replicated
		// queue's log fixes that order; here the workload fixes it by
		// applying the Down one shard at a time.
		for _, sh := range b.shards {
			sh.submit(Command{Kind: CmdDown, Owner: st.Owner})
			settle(t, b)
		}
		return
	}
	settle(t, b)
}

// publishRouted publishes one message through the routing view, to every
// queue its exchange and key route it to.
func (st *step) publishRouted(b *Broker, l *effectLog) {
	refs, _ := b.View().Table.Route(nil, st.Exchange, []byte(st.Key), nil)
	var qs []*Queue
	for _, ref := range refs {
		if q := b.View().Queue(ref); q != nil {
			qs = append(qs, q)
		}
	}
	if len(qs) == 0 {
		return
	}
	ar := &Arena{}
	ar.Refs.Store(int64(len(qs)))
	props := wire.AppendProperties(nil, &wire.Properties{})[2:]
	m := ar.add([]byte(st.Exchange), []byte(st.Key), props, []byte(st.Bodies[0]), 0, 0)
	for _, q := range qs {
		batch := &PublishBatch{Sink: confirmLog{l, q.name}, Codes: make([]uint32, 1)}
		batch.Pending.Store(2)
		batch.PartDone()
		b.Submit(Command{Kind: CmdPublish, Items: []EnqItem{{Q: q, Msg: m, Meta: queue.Message{Size: uint32(len(m.Body()))}}}, Batch: batch})
	}
}

// settle waits until what was submitted, and the dead letters it caused,
// have been applied everywhere.
func settle(t *testing.T, b *Broker) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for i := 0; i < 2; i++ { // the second round applies the dead letters the first caused
		if err := b.Barrier(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

// liveQueues names the queues that exist now, by name.
//
// In the order of their ids, not their names: a generated name is random,
// and the workload must not depend on where it sorts.
func liveQueues(b *Broker) []string {
	b.topo.mu.Lock()
	qs := b.topo.meta.Queues()
	b.topo.mu.Unlock()
	slices.SortFunc(qs, func(x, y MetaQueue) int { return cmp.Compare(x.ID, y.ID) })
	out := make([]string, len(qs))
	for i, q := range qs {
		out[i] = q.Name
	}
	return out
}

// snapshots reads every queue's machine snapshot on its own shard.
func snapshots(t *testing.T, b *Broker) map[string][]byte {
	t.Helper()
	out := map[string][]byte{}
	for _, name := range liveQueues(b) {
		q := b.LookupQueue(name)
		w := make(waitSink, 1)
		var snap []byte
		b.Submit(Command{Kind: CmdBarrier, Queue: q, Sink: snapSink{waitSink: w, q: q, out: &snap}})
		select {
		case <-w:
		case <-time.After(10 * time.Second):
			t.Fatal("no snapshot")
		}
		out[name] = snap
	}
	return out
}

// snapSink takes a queue's snapshot when the queue's shard answers it.
type snapSink struct {
	waitSink
	q   *Queue
	out *[]byte
}

func (s snapSink) Answer(req uint64, r Result) {
	*s.out = s.q.m.Snapshot() // on the queue's shard
	s.waitSink.Answer(req, r)
}

// TestDeterministicReplay: every command a random workload sends to the
// broker is recorded with its time: queue commands, and the metadata
// commands of its declares, binds, unbinds and exchange deletes, encoded.
// Replayed into a fresh broker, each queue hands out the same effects in
// the same order and ends with the same machine snapshot, bytes for bytes;
// the metadata state machine applies the same commands (the workload's
// and those its shards apply on a queue's deletion) with the same results
// and ends with the same snapshot bytes; with one shard and with four.
// This is the property a replicated log of commands relies on.
func TestDeterministicReplay(t *testing.T) {
	for _, shards := range []int{1, 4} {
		t.Run(fmt.Sprintf("shards=%d", shards), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(uint64(shards), 12)) // fixed: the test is deterministic
			var now atomic.Int64
			now.Store(1_000_000)
			first := newEffectLog()
			var metaA metaLog
			var ticksMu sync.Mutex
			var ticks []step // the CmdTicks the timers made, as the shards applied them
			b := detBroker(t, shards, &now, func(_ int, nowMs int64, c *Command) {
				if c.Kind == CmdTick {
					ticksMu.Lock()
					ticks = append(ticks, step{AtMs: nowMs, Kind: CmdTick, Queue: c.Queue.Name()})
					ticksMu.Unlock()
				}
			}, &metaA)
			metaA.take()
			var rec []step
			timerTicks := 0
			var consumers []step // subscribes done
			nextID := queue.ConsumerID(100)
			metaOps := map[string]int{}
			for i := 0; i < 500; i++ {
				live := liveQueues(b)
				st := step{AtMs: now.Load() + int64(rng.IntN(50)), Queue: live[rng.IntN(len(live))]}
				switch r := rng.IntN(130); {
				case r < 30:
					st.Kind = CmdPublish
					for j := rng.IntN(4) + 1; j > 0; j-- {
						st.Bodies = append(st.Bodies, fmt.Sprintf("m%d.%d", i, j))
					}
				case r < 35:
					st.Kind, st.Exchange, st.Key = CmdPublish, "work", []string{"a.b", "a.c", "b.c"}[rng.IntN(3)]
					st.Bodies = []string{fmt.Sprintf("r%d", i)}
				case r < 45:
					nextID++
					st.Kind = CmdSubscribe
					st.Spec = queue.ConsumerSpec{ID: nextID, Owner: queue.OwnerID(rng.IntN(3) + 1), Prefetch: uint32(rng.IntN(4) + 1)}
					consumers = append(consumers, st)
				case r < 85 && len(consumers) > 0:
					c := consumers[rng.IntN(len(consumers))]
					first.mu.Lock()
					open := first.open[c.Spec.ID]
					if len(open) == 0 || b.LookupQueue(c.Queue) == nil {
						first.mu.Unlock()
						continue
					}
					k := rng.IntN(len(open))
					st.QTag = open[k]
					first.open[c.Spec.ID] = append(open[:k], open[k+1:]...)
					first.mu.Unlock()
					st.Kind, st.Queue, st.Consumer = CmdSettle, c.Queue, c.Spec.ID
					st.Op = []wire.SettleOp{wire.SettleAck, wire.SettleAck, wire.SettleRequeue, wire.SettleReject}[rng.IntN(4)]
				case r < 90 && len(consumers) > 0:
					c := consumers[rng.IntN(len(consumers))]
					if b.LookupQueue(c.Queue) == nil {
						continue
					}
					st.Kind, st.Queue, st.Consumer, st.Requeue = CmdCancel, c.Queue, c.Spec.ID, rng.IntN(2) == 0
				case r < 95:
					st.Kind = CmdPurge
				case r < 98:
					st.Kind, st.Owner = CmdDown, uint64(rng.IntN(3)+1)
				case r < 100:
					if slices.Contains(detQueues, st.Queue) {
						continue // the fixed queues stay
					}
					st.Kind = CmdDelete
					metaOps["delete queue"]++
				case r < 125:
					now.Store(st.AtMs)
					metaA.take() // what the shards applied before is theirs to redo
					metaOps[metaStep(b, rng, live)]++
					st.Meta = metaA.take()
					if len(st.Meta) == 0 {
						t.Fatal("a metadata step applied no command")
					}
					rec = append(rec, st)
					settle(t, b)
					continue
				default:
					// The shards' timers fire, one shard at a time (as a Down
					// is applied): what they do is recorded as CmdTicks.
					now.Store(st.AtMs)
					for _, sh := range b.shards {
						sh.submit(Command{Kind: cmdFire})
						settle(t, b)
						ticksMu.Lock()
						rec, ticks = append(rec, ticks...), ticks[:0]
						ticksMu.Unlock()
					}
					continue
				}
				rec = append(rec, st)
				st.apply(t, b, &now, first)
			}
			snapA := snapshots(t, b)
			for _, st := range rec {
				if st.Kind == CmdTick {
					timerTicks++
				}
			}
			if timerTicks == 0 {
				t.Error("the timers ticked no queue (a weak test)")
			}
			liveA := liveQueues(b)
			metaSnapA := b.MetaSnapshot()

			var now2 atomic.Int64
			now2.Store(1_000_000)
			second := newEffectLog()
			var metaB metaLog
			b2 := detBroker(t, shards, &now2, nil, &metaB)
			for i := range rec {
				rec[i].apply(t, b2, &now2, second)
			}
			snapB := snapshots(t, b2)

			if !slices.Equal(liveA, liveQueues(b2)) {
				t.Fatalf("queues differ: %v vs %v", liveA, liveQueues(b2))
			}
			for _, name := range append(liveA, "m0", "m1", "m2") {
				ea, eb := first.byQueue[name], second.byQueue[name]
				if len(ea) == 0 && name != "dlq" && slices.Contains(detQueues, name) {
					t.Errorf("queue %s: the workload had no effect on it (a weak test)", name)
				}
				if fmt.Sprint(ea) != fmt.Sprint(eb) {
					n := 0
					for n < min(len(ea), len(eb)) && ea[n] == eb[n] {
						n++
					}
					t.Errorf("queue %s: effects differ at %d of %d/%d: %q vs %q", name, n, len(ea), len(eb), at(ea, n), at(eb, n))
				}
				if !bytes.Equal(snapA[name], snapB[name]) {
					t.Errorf("queue %s: snapshots differ (%d vs %d bytes)", name, len(snapA[name]), len(snapB[name]))
				}
			}
			if fmt.Sprint(metaA.all) != fmt.Sprint(metaB.all) {
				n := 0
				for n < min(len(metaA.all), len(metaB.all)) && metaA.all[n] == metaB.all[n] {
					n++
				}
				t.Errorf("metadata commands differ at %d of %d/%d: %q vs %q", n, len(metaA.all), len(metaB.all), at(metaA.all, n), at(metaB.all, n))
			}
			if !bytes.Equal(metaSnapA, b2.MetaSnapshot()) {
				t.Errorf("metadata snapshots differ (%d vs %d bytes)", len(metaSnapA), len(b2.MetaSnapshot()))
			}
			for _, op := range []string{"declare exchange", "delete exchange", "declare queue", "declare generated", "bind", "unbind", "delete queue"} {
				if metaOps[op] == 0 {
					t.Errorf("the workload did no %s (a weak test)", op)
				}
			}
			t.Logf("%d commands (%d timer ticks), %d metadata commands (%v); effects per queue: q0 %d, q1 %d, q2 %d, q3 %d, dlq %d; queues at the end %v", len(rec),
				timerTicks, len(metaA.all), metaOps, len(first.byQueue["q0"]), len(first.byQueue["q1"]), len(first.byQueue["q2"]), len(first.byQueue["q3"]), len(first.byQueue["dlq"]), liveA)
		})
	}
}

// metaStep does one random topology request of the workload through the
// broker's request API (as netio and admin do) and names it.
func metaStep(b *Broker, rng *rand.Rand, live []string) string {
	who := Requester{User: []string{"alice", "bob"}[rng.IntN(2)], Admin: rng.IntN(3) == 0, Conn: uint64(rng.IntN(3) + 1)}
	switch r := rng.IntN(10); {
	case r < 1:
		_ = b.DeclareExchange(wire.ExchangeDeclare{Name: "work", Kind: wire.ExchangeTopic})
		return "declare exchange"
	case r < 2:
		_ = b.DeleteExchange("work", rng.IntN(2) == 0)
		return "delete exchange"
	case r < 4:
		d := wire.QueueDeclare{Name: fmt.Sprintf("m%d", rng.IntN(3)), AutoDelete: rng.IntN(3) == 0, Exclusive: rng.IntN(3) == 0}
		if rng.IntN(2) == 0 {
			d.Args = wire.Table{{Key: "dead-letter-exchange", Value: wire.String("dlx")}, {Key: "delivery-limit", Value: wire.Int(1)}}
		}
		_, _ = b.DeclareQueueAs(&d, who.Conn, who.User)
		return "declare queue"
	case r < 5:
		_, _ = b.DeclareQueueAs(&wire.QueueDeclare{}, who.Conn, who.User)
		return "declare generated"
	case r < 8:
		_ = b.BindAs(&wire.Bind{Source: "work", Destination: live[rng.IntN(len(live))], RoutingKey: []string{"a.*", "*.c", "#", "a.b"}[rng.IntN(4)]}, who)
		return "bind"
	default:
		bs := b.Bindings()
		var work []BindingInfo
		for _, x := range bs {
			if x.Source == "work" {
				work = append(work, x)
			}
		}
		if len(work) == 0 {
			_ = b.BindAs(&wire.Bind{Unbind: true, Source: "work", Destination: live[0], RoutingKey: "none"}, who)
			return "unbind none"
		}
		x := work[rng.IntN(len(work))]
		_ = b.BindAs(&wire.Bind{Unbind: true, Source: x.Source, Destination: x.Destination, RoutingKey: x.RoutingKey}, who)
		return "unbind"
	}
}

func at(s []string, i int) string {
	if i < len(s) {
		return s[i]
	}
	return "(end)"
}
