package replication

import (
	"testing"

	"github.com/warren-mq/warren/queue"
	"github.com/warren-mq/warren/wire"
)

// BenchmarkFSMApply: the steady state of a queue whose consumer keeps up,
// through the log: each entry carries a 64-message Enqueue (1 KiB bodies)
// and the ack of the previous entry's 64 deliveries. Reported per message;
// the entries are encoded once, outside the timer (the apply path:
// check, decode, Machine commands, live set, sink).
func BenchmarkFSMApply(b *testing.B) {
	const per = 64
	body := make([]byte, 1024)
	msgs := make([]queue.Message, per)
	bodies := make([][]byte, per)
	for i := range msgs {
		msgs[i] = queue.Message{Size: 1024}
		bodies[i] = body
	}
	delivered := 0
	f := NewQueueFSM(queue.New(queue.Config{}, 0), 0, func(a *Applied) {
		for _, e := range a.Effects {
			if e.Kind == queue.Deliver {
				delivered++
			}
		}
	})
	first, _ := AppendEntry(nil, EntryHeader{NowMs: 1}, &queue.Subscribe{Spec: queue.ConsumerSpec{ID: 1, Owner: 1}})
	if _, err := f.Apply(1, first); err != nil {
		b.Fatal(err)
	}
	// Entry k (k ≥ 1) acks tags up to (k-1)*per: the previous entry's.
	var enc EntryEncoder
	entries := make([][]byte, 256)
	for k := range entries {
		enc.Reset()
		_ = enc.Add(&queue.Enqueue{Msgs: msgs, Bodies: bodies})
		_ = enc.Add(&queue.Settle{Consumer: 1, Op: wire.SettleAck, Last: 0}) // Last patched below
		entries[k] = append([]byte(nil), enc.Finish(EntryHeader{NowMs: 2})...)
	}
	// The Settle's Last field is at a fixed offset from the end: frame
	// (8) + command header (10) + consumer (8) + op (1) + first (8).
	settleLast := func(e []byte) []byte {
		cmdLen := 10 + 29
		start := len(e) - ((8 + cmdLen + 7) &^ 7)
		return e[start+8+10+8+1+8 : start+8+10+8+1+8+8]
	}
	b.SetBytes(per * 1024)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		e := entries[i%len(entries)]
		le.PutUint64(settleLast(e), uint64(i)*per)
		if _, err := f.Apply(uint64(i)+2, e); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*per), "ns/msg")
	if delivered != b.N*per || f.Machine().Unacked() != per || f.live.entries() != 1 {
		b.Fatalf("delivered %d of %d, unacked %d, live entries %d", delivered, b.N*per, f.Machine().Unacked(), f.live.entries())
	}
}
