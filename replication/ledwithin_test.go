package replication

import (
	"testing"

	"github.com/warren-mq/warren/queue"
	"github.com/warren-mq/warren/segment"
	"go.etcd.io/raft/v3/raftpb"
)

// TestLedWithinCountsFromOpen: a group's quiet window (no leader heard
// from) is counted from its open, so a copy just opened, which has not
// heard from its leader yet, is not taken as one no leader counts (the
// broker would delete it: reconcile.go's dropDue); once the window has
// passed with no leader heard, it is.
func TestLedWithinCountsFromOpen(t *testing.T) {
	l := openMemLog(t, segment.NewMemFS())
	defer l.Close()
	s := newShard(t, l)
	defer s.w.Close()
	for range 100 { // a worker that has run a while before this group opens
		s.w.RaftTick()
	}
	g, err := s.w.Open(3, raftpb.SnapshotMetadata{ConfState: raftpb.ConfState{Voters: []uint64{1, 2, 3}}},
		NewQueueFSM(queue.New(queue.Config{}, 0), 0, nil))
	if err != nil {
		t.Fatal(err)
	}
	if !g.LedWithin(30) {
		t.Fatal("a group just opened counts as not led for 30 ticks")
	}
	for range 30 {
		s.w.RaftTick()
	}
	if !g.LedWithin(30) {
		t.Fatal("30 ticks after its open the window has not passed yet")
	}
	s.w.RaftTick()
	if g.LedWithin(30) {
		t.Fatal("31 ticks after its open, with no leader heard, it still counts as led")
	}
}
