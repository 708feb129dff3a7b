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
func TestProposalBytesAllocatedOnce(t *testing.T) {
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
	const per, cmds = 64, 8
	msgs := make([]queue.Message, per)
	bodies := make([][]byte, per)
	for i := range msgs {
		msgs[i] = queue.Message{Size: 1024}
		bodies[i] = make([]byte, 1024)
	}
	enq := &queue.Enqueue{Msgs: msgs, Bodies: bodies}
	var size int
	entry := func() {
		for range cmds {
			if _, err := g.Add(enq); err != nil {
				t.Fatal(err)
			}
		}
		size = len(g.finish(1))
	}
	entry()
	entry()
	const rounds = 20
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	for range rounds {
		entry()
	}
	runtime.ReadMemStats(&after)
	perEntry := float64(after.TotalAlloc-before.TotalAlloc) / rounds
	if perEntry > 1.5*float64(size) {
		t.Fatalf("%.0f bytes allocated per entry of %d bytes (%.2f×): want at most 1.5×", perEntry, size, perEntry/float64(size))
	}
}
