package queue

import (
	"fmt"
	"runtime"
	"testing"

	"github.com/warren-mq/warren/wire"
)

// BenchmarkCycle: enqueue a batch of 64, dispatch it to the consumers, and
// ack each consumer's deliveries with one multiple-ack, per iteration;
// reported per message.
func BenchmarkCycle(b *testing.B) {
	for _, levels := range []int{1, 10} {
		for _, consumers := range []int{1, 100} {
			b.Run(fmt.Sprintf("levels=%d/consumers=%d", levels, consumers), func(b *testing.B) {
				const batch = 64
				m := New(Config{MaxPriority: uint8(levels - 1)}, 0)
				for c := 1; c <= consumers; c++ {
					if _, err := m.Subscribe(0, ConsumerSpec{ID: ConsumerID(c), Prefetch: 1000}); err != nil {
						b.Fatal(err)
					}
				}
				msgs := make([]Message, batch)
				lastTag := make([]uint64, consumers+1)
				var id uint64
				b.ReportAllocs()
				for b.Loop() {
					for i := range msgs {
						id++
						msgs[i] = Message{ID: id, Size: 128, Priority: uint8(int(id) % levels)}
					}
					for _, e := range m.Enqueue(0, msgs) {
						if e.Kind == Deliver {
							lastTag[e.Consumer] = e.Tag
						}
					}
					for c := 1; c <= consumers; c++ {
						if lastTag[c] != 0 {
							if _, err := m.Settle(0, ConsumerID(c), wire.SettleAck, 0, lastTag[c], 0); err != nil {
								b.Fatal(err)
							}
							lastTag[c] = 0
						}
					}
				}
				b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*batch), "ns/msg")
			})
		}
	}
}

// TestReadyMessageFootprint measures heap bytes per ready message (bodies
// excluded) over 1,000,000 messages. It is a measurement with a generous
// bound (the rings double, so up to 2× the 32-byte entry), not a timing.
func TestReadyMessageFootprint(t *testing.T) {
	if testing.Short() {
		t.Skip("allocates ~64 MB")
	}
	const n = 1_000_000
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	m := New(Config{}, 0)
	msgs := make([]Message, 1000)
	for i := 0; i < n/len(msgs); i++ {
		for j := range msgs {
			msgs[j] = Message{ID: uint64(i*len(msgs) + j + 1), Size: 128}
		}
		m.Enqueue(0, msgs)
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	per := float64(after.HeapAlloc-before.HeapAlloc) / n
	t.Logf("%.1f bytes per ready message (1,000,000 ready, bodies excluded)", per)
	if m.Ready() != n {
		t.Fatalf("ready %d", m.Ready())
	}
	if per > 64 {
		t.Fatalf("%.1f bytes per ready message, want ≤ 64", per)
	}
	runtime.KeepAlive(m)
}

// BenchmarkCounts: Unacked and Consumers, which the broker reads after
// every command, on a queue with 1,000 consumers.
func BenchmarkCounts(b *testing.B) {
	m := New(Config{}, 0)
	for c := 1; c <= 1000; c++ {
		if _, err := m.Subscribe(0, ConsumerSpec{ID: ConsumerID(c), Prefetch: 10}); err != nil {
			b.Fatal(err)
		}
	}
	msgs := make([]Message, 5000)
	for i := range msgs {
		msgs[i] = Message{ID: uint64(i + 1), Size: 1}
	}
	m.Enqueue(0, msgs)
	b.ReportAllocs()
	n := 0
	for b.Loop() {
		n += m.Unacked() + m.Consumers()
	}
	if m.Unacked() != 5000 || m.Consumers() != 1000 {
		b.Fatalf("unacked %d consumers %d", m.Unacked(), m.Consumers())
	}
}
