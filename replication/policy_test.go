package replication

import (
	"testing"

	"github.com/warren-mq/warren/queue"
	"github.com/warren-mq/warren/segment"
	"github.com/warren-mq/warren/wire"
	"go.etcd.io/raft/v3/raftpb"
)

// TestSnapshotPolicy: with a snapshot store configured, the worker
// snapshots a group when that frees more log than the snapshot costs
// (design §2.4): a queue whose consumer keeps up (64 × 1 KiB per entry,
// each entry acking the previous one) is snapshotted about every 1 MiB
// consumed and its log stays short; a queue that only grows (nothing to
// reclaim) is not snapshotted; a little reclaimable log is cleaned up by
// the idle rule once 5 s passed since the last snapshot.
func TestSnapshotPolicy(t *testing.T) {
	fs := segment.NewMemFS()
	l := openMemLog(t, fs)
	defer l.Close()
	store, err := OpenSnapStore(l)
	if err != nil {
		t.Fatal(err)
	}
	s := &shard{t: t, inbox: make(chan func(), 1024)}
	snaps := map[uint64]int{}
	s.w = NewWorker(l, WorkerConfig{
		Post:      func(fn func()) { s.inbox <- fn },
		Snapshots: store,
		SnapshotDone: func(g *Group, meta raftpb.SnapshotMetadata, err error) {
			if err != nil {
				t.Errorf("group %d: snapshot at %d: %v", g.ID(), meta.Index, err)
			}
			snaps[g.ID()]++
		},
	})
	defer s.w.Close()
	voters := raftpb.ConfState{Voters: []uint64{1}}
	keep, _ := s.w.Open(3, raftpb.SnapshotMetadata{ConfState: voters}, NewQueueFSM(queue.New(queue.Config{}, 0), 0, nil))
	deep, _ := s.w.Open(4, raftpb.SnapshotMetadata{ConfState: voters}, NewQueueFSM(queue.New(queue.Config{}, 0), 0, nil))
	_, _ = keep.Add(&queue.Subscribe{Spec: queue.ConsumerSpec{ID: 1, Owner: 1}})
	s.settle()
	msgs := make([]queue.Message, 64)
	bodies := make([][]byte, 64)
	for i := range msgs {
		msgs[i] = queue.Message{Size: 1024}
		bodies[i] = make([]byte, 1024)
	}
	rounds := 120 // ≈ 7.5 MiB through each queue
	if raceEnabled {
		rounds = 70
	}
	for i := range rounds {
		s.nowMs += 10
		_, _ = keep.Add(&queue.Enqueue{Msgs: msgs, Bodies: bodies})
		_, _ = keep.Add(&queue.Settle{Consumer: 1, Op: wire.SettleAck, Last: uint64(i * 64)})
		_, _ = deep.Add(&queue.Enqueue{Msgs: msgs, Bodies: bodies})
		s.round()
		s.settle()
		s.settleSnapshots([]*snapGroup{{workerGroup: workerGroup{g: keep}}, {workerGroup: workerGroup{g: deep}}})
	}
	if n, mib := snaps[3], rounds*64/1024; n < mib/2 || n > mib*3/2 {
		t.Fatalf("the keep-up queue was snapshotted %d times over ≈ %d MiB consumed; want about one per MiB", n, mib)
	}
	if kept := l.LastIndex(3) - l.FirstIndex(3) + 1; kept > 40 {
		t.Fatalf("the keep-up queue's log holds %d entries after its snapshots", kept)
	}
	if snaps[4] != 0 {
		t.Fatalf("the growing queue was snapshotted %d times with nothing to reclaim", snaps[4])
	}
	// Idle clean-up: ack a little, then let 5 s pass.
	_, _ = keep.Add(&queue.Settle{Consumer: 1, Op: wire.SettleAck, Last: uint64(rounds * 64)})
	s.round()
	s.settle()
	s.settleSnapshots([]*snapGroup{{workerGroup: workerGroup{g: keep}}})
	before := snaps[3]
	s.nowMs += 5000
	s.w.MaybeSnapshot(s.nowMs)
	s.settleSnapshots([]*snapGroup{{workerGroup: workerGroup{g: keep}}})
	if snaps[3] != before+1 {
		t.Fatalf("idle for 5 s with reclaimable log: %d snapshots, want %d", snaps[3], before+1)
	}
	if snaps[4] != 0 {
		t.Fatal("the idle rule snapshotted a queue with nothing to reclaim")
	}
}

// TestSnapshotDueCostRule: a snapshot is due once the log it frees is
// snapReclaimFactor times the last snapshot's size (at least 1 MiB), not
// before: each snapshot is written whole, and a queue holding many
// messages has a large one.
func TestSnapshotDueCostRule(t *testing.T) {
	g := &Group{fsm: NewQueueFSM(queue.New(queue.Config{}, 0), 0, nil)}
	g.lastSnapAt = 1 // the idle rule is not what this tests
	for _, c := range []struct {
		last, reclaim uint64
		due           bool
	}{
		{0, 1<<20 - 1, false},
		{0, 1 << 20, true},
		{1 << 20, 2 << 20, false}, // twice its size: not yet
		{1 << 20, 8<<20 - 1, false},
		{1 << 20, 8 << 20, true},
		{100 << 10, 1 << 20, true}, // the 1 MiB floor
	} {
		g.lastSnapSize = int(c.last)
		g.deadAt, g.bytesAt = 0, 0
		g.fsm.live.deadBytes = c.reclaim
		if due := g.SnapshotDue(2); due != c.due {
			t.Errorf("last snapshot %d B, %d B reclaimable: due %v, want %v", c.last, c.reclaim, due, c.due)
		}
	}
}
