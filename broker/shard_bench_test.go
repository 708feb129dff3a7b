package broker

import (
	"context"
	"sync"
	"testing"

	"github.com/warren-mq/warren/queue"
	"github.com/warren-mq/warren/wire"
)

// ackSink turns every delivery it gets into an ack, for the next round.
type ackSink struct {
	recSink
	q    *Queue
	mu   sync.Mutex
	acks []SettleItem
}

func (k *ackSink) Deliver(ds []Delivery) {
	k.mu.Lock()
	for _, d := range ds {
		k.acks = append(k.acks, SettleItem{Q: k.q, Consumer: d.Consumer, Op: wire.SettleAck, QTag: d.QTag})
	}
	k.mu.Unlock()
}

// BenchmarkShardCycle is the shard's part of the transient path alone:
// rounds of 1,000 messages enqueued in one command, delivered round-robin
// to two consumers (one sink each, prefetch 1,000) and acked in one
// settle command per sink. The shard and the benchmark take turns (a
// barrier ends each round); cpu-ns/msg is the process's CPU time (user +
// system, the benchmark's own small part included) per message, which a
// machine shared with other work moves far less than ns/op.
func BenchmarkShardCycle(b *testing.B) {
	br := New(Config{Shards: 1})
	br.Start()
	defer func() {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		_ = br.Stop(ctx)
	}()
	if _, err := br.DeclareQueue(wire.QueueDeclare{Name: "bench"}); err != nil {
		b.Fatal(err)
	}
	q := br.LookupQueue("bench")
	sh := br.shards[0]
	var sinks [2]*ackSink
	for i := range sinks {
		sinks[i] = &ackSink{q: q}
		br.Submit(Command{Kind: CmdSubscribe, Queue: q, Sink: sinks[i], Spec: queue.ConsumerSpec{ID: br.NewConsumerID(), Owner: queue.OwnerID(i + 1), Prefetch: 1000}})
	}
	const round = 1000
	props := wire.AppendProperties(nil, &wire.Properties{})[2:]
	body := make([]byte, 128)
	msgs := make([]StoredMsg, round)
	ar := &Arena{}
	for i := range msgs {
		msgs[i] = *ar.add([]byte{}, []byte("bench"), props, body, 0, 0)
	}
	ctx := context.Background()
	var settles []SettleItem
	b.ReportAllocs()
	b.SetBytes(int64(len(body)))
	b.ResetTimer()
	cpu0 := cpuNanos()
	for done := 0; done < b.N; done += round {
		ar.Refs.Store(round)
		items := make([]EnqItem, round) // the shard keeps what it is handed
		for i := range items {
			items[i] = EnqItem{Q: q, Msg: &msgs[i], Meta: queue.Message{Size: uint32(len(body))}, Idx: i}
		}
		br.Submit(Command{Kind: CmdPublish, Items: items})
		if _, err := ask(ctx, sh, Command{Kind: CmdBarrier}); err != nil {
			b.Fatal(err)
		}
		settles = settles[:0]
		for _, k := range sinks {
			k.mu.Lock()
			settles = append(settles, k.acks...)
			k.acks = k.acks[:0]
			k.mu.Unlock()
		}
		br.Submit(Command{Kind: CmdSettle, Settles: settles})
	}
	if _, err := ask(ctx, sh, Command{Kind: CmdBarrier}); err != nil {
		b.Fatal(err)
	}
	b.StopTimer()
	b.ReportMetric(float64(cpuNanos()-cpu0)/float64(b.N), "cpu-ns/msg")
	if n := q.unacked.Load(); n != 0 || q.m.Ready() != 0 {
		b.Fatalf("%d unacked and %d ready at the end", n, q.m.Ready())
	}
}
