package replication

import (
	"runtime"
	"testing"

	"github.com/warren-mq/warren/queue"
	"github.com/warren-mq/warren/segment"
	"go.etcd.io/raft/v3/raftpb"
)

// TestReplayRoundHoldsNoAppliedCopies: on a restart raft hands each
// group up to MaxCommittedSizePerReady (8 MiB) of committed entries per
// Ready, copied out of the log into one buffer per Ready. Once applied,
// nothing may keep that buffer alive: the FSM's decoder kept views into
// the last entry it applied, which pinned the whole buffer until the
// group's next apply (an idle queue: forever), so 100 queues held ~800 MB
// after a restart. Here 10 groups × 4 MiB replay in one round: after it,
// with its write in flight, the live heap holds less than a quarter of
// what was replayed.
func TestReplayRoundHoldsNoAppliedCopies(t *testing.T) {
	l, err := segment.Open(segment.OSFS{}, t.TempDir(), segment.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	const groups, entries, size = 10, 16, 256 << 10
	voters := raftpb.ConfState{Voters: []uint64{1}}
	s := newShard(t, l)
	var gs []*Group
	for gid := uint64(1); gid <= groups; gid++ {
		g, err := s.w.Open(gid, raftpb.SnapshotMetadata{ConfState: voters}, NewQueueFSM(queue.New(queue.Config{}, 0), 0, nil))
		if err != nil {
			t.Fatal(err)
		}
		gs = append(gs, g)
	}
	s.settle()
	body := make([]byte, size)
	for range entries {
		for _, g := range gs {
			if _, err := g.Add(&queue.Enqueue{Msgs: []queue.Message{{Size: size}}, Bodies: [][]byte{body}}); err != nil {
				t.Fatal(err)
			}
		}
		s.settle()
	}
	s.w.Close()

	s2 := newShard(t, l)
	defer s2.w.Close()
	var fsms []*QueueFSM
	for gid := uint64(1); gid <= groups; gid++ {
		fsm := NewQueueFSM(queue.New(queue.Config{}, 0), 0, nil)
		if _, err := s2.w.Open(gid, raftpb.SnapshotMetadata{ConfState: voters}, fsm); err != nil {
			t.Fatal(err)
		}
		fsms = append(fsms, fsm)
	}
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	s2.w.Round(0)
	runtime.GC()
	runtime.ReadMemStats(&after)
	for i, fsm := range fsms {
		if fsm.AppliedIndex() < entries {
			t.Fatalf("group %d applied %d entries in the first round, want %d", i+1, fsm.AppliedIndex(), entries)
		}
	}
	replayed := uint64(groups * entries * size)
	held := int64(after.HeapAlloc) - int64(before.HeapAlloc)
	t.Logf("replayed %d MiB; live heap after the round: %+d MiB", replayed>>20, held>>20)
	if held > int64(replayed/4) {
		t.Fatalf("after a replay round the live heap grew by %d MiB of %d MiB replayed: the round's write holds the applied entries",
			held>>20, replayed>>20)
	}
	s2.settle()
}
