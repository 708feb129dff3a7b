package replication

import (
	"runtime"
	"testing"

	"github.com/warren-mq/warren/queue"
	"github.com/warren-mq/warren/segment"
	"go.etcd.io/raft/v3/raftpb"
)

// TestProposalBytesAllocatedOnce: a group's entry is built in memory
// raft keeps as the proposal: bytes allocated per entry stay near the
// entry's size. A 512 KiB entry (8 Enqueues of 64 × 1 KiB) used to be
// built in a buffer grown from empty by doubling and then copied into
// the proposal, about 3× its size in allocations and copies per entry
// (memmove and page faults: most of a durable queue's CPU per message).
// Entries of alternating sizes (64 KiB, then 512 KiB) must not grow by
// many small copies either (at most 2.5×: a buffer sized for the last
// entries may be too large for a small one, briefly: until it is applied).
func TestProposalBytesAllocatedOnce(t *testing.T) {
	t.Run("same", func(t *testing.T) { proposalBytes(t, []int{8}, 1.5) })
	// Small entries (64 KiB: one of many queues in a round) are handed
	// over too, not copied out: nothing is applied here, so none comes
	// back (TestProposalBuffersRecycled), and each is a buffer of the
	// last entry's size and a quarter, rounded up to a pool class (at
	// most a quarter more): at most about 1.6×, built without a copy.
	t.Run("small", func(t *testing.T) { proposalBytes(t, []int{1}, 1.6) })
	t.Run("alternating", func(t *testing.T) { proposalBytes(t, []int{1, 8}, 2.5) })
	// A busy queue's round of 3 MiB ends up in entries of about
	// entryBufMax, each built in a buffer of its own size (not one grown
	// by doubling to 4 MiB, copied at every step).
	t.Run("burst", func(t *testing.T) { proposalBytes(t, []int{48}, 1.4) })
}

func proposalBytes(t *testing.T, cmdsPerEntry []int, bound float64) {
	l, err := segment.Open(segment.NewMemFS(), "/data", segment.Options{Manual: true})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	w := NewWorker(l, WorkerConfig{Post: func(func()) {}})
	defer w.Close()
	g, err := w.Open(10, raftpb.SnapshotMetadata{ConfState: raftpb.ConfState{Voters: []uint64{1}}}, NewQueueFSM(queue.New(queue.Config{}, 0), 0, nil))
	if err != nil {
		t.Fatal(err)
	}
	const per = 64
	msgs := make([]queue.Message, per)
	bodies := make([][]byte, per)
	for i := range msgs {
		msgs[i] = queue.Message{Size: 1024}
		bodies[i] = make([]byte, 1024)
	}
	enq := &queue.Enqueue{Msgs: msgs, Bodies: bodies}
	size, k, entries := 0, 0, 0
	entry := func() {
		for range cmdsPerEntry[k%len(cmdsPerEntry)] {
			if _, err := g.Add(enq); err != nil {
				t.Fatal(err)
			}
		}
		k++
		for _, e := range append(g.full, g.finish(1)) {
			if len(e) > 2*entryBufMax {
				t.Fatalf("an entry of %d bytes: not split", len(e))
			}
			size += len(e)
			entries++
		}
		g.full = g.full[:0]
	}
	entry()
	entry()
	size, entries = 0, 0
	const rounds = 20
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	for range rounds {
		entry()
	}
	runtime.ReadMemStats(&after)
	alloc := after.TotalAlloc - before.TotalAlloc
	if float64(alloc) > bound*float64(size) {
		t.Fatalf("%d bytes allocated for %d entries of %d bytes in all (%.2f×): want at most %.1f×", alloc, entries, size, float64(alloc)/float64(size), bound)
	}
	t.Logf("%d entries, %d bytes, %d allocated (%.2f×)", entries, size, alloc, float64(alloc)/float64(size))
}
