package replication

import (
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/warren-mq/warren/queue"
	"github.com/warren-mq/warren/segment"
	"go.etcd.io/raft/v3/raftpb"
)

// TestInstallWaitsForOwnSnapshot: a follower's own snapshot (at its
// applied 15, the store's Put done, the Post that starts its compaction
// still in the shard's queue) when raft hands it its leader's snapshot at
// 42. The install must not run before that snapshot ends: the install
// compacts the log to 42 keeping the entries live at 42 that the follower
// holds (16..20) and appends the others, and a compaction to 15 run after
// it (Compact(15, live at 15) on a log starting at 43) dropped every
// entry below 43 not live at 15: the installed snapshot's live entries,
// silently (a review found it; the peek or the next delivery failed).
// The install now waits (Group.deferred), and a snapshot asked for while
// it runs is refused (ErrSnapshotLater).
func TestInstallWaitsForOwnSnapshot(t *testing.T) {
	const gid, M = 9, 42
	var ents []raftpb.Entry
	var data [][]byte
	for i := uint64(1); i <= M; i++ {
		d, err := AppendEntry(nil, EntryHeader{NowMs: int64(i)}, &queue.Enqueue{Msgs: []queue.Message{{Size: 8}}, Bodies: [][]byte{[]byte(fmt.Sprintf("body-%03d", i))}})
		if err != nil {
			t.Fatal(err)
		}
		data = append(data, d)
		ents = append(ents, raftpb.Entry{Index: i, Term: 1, Type: raftpb.EntryNormal, Data: d})
	}
	leader := NewQueueFSM(queue.New(queue.Config{}, 0), 0, nil)
	for i, d := range data {
		if _, err := leader.Apply(uint64(i+1), d); err != nil {
			t.Fatal(err)
		}
	}
	live := leader.LiveEntries(nil, M)
	snapData, _ := leader.Snapshot()
	conf := raftpb.ConfState{Voters: []uint64{1, 2, 3}}

	fs := segment.NewMemFS()
	l := openMemLog(t, fs)
	store, err := OpenSnapStore(l)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var posted []func()
	wake := make(chan struct{}, 1)
	post := func(fn func()) {
		mu.Lock()
		posted = append(posted, fn)
		mu.Unlock()
		select {
		case wake <- struct{}{}:
		default:
		}
	}
	take := func() []func() { mu.Lock(); defer mu.Unlock(); p := posted; posted = nil; return p }
	pool := NewInlinePool()
	defer pool.Close()
	w := NewWorker(l, WorkerConfig{NodeID: 2, Post: post, Send: func(uint64, []raftpb.Message) {}, Snapshots: store, Pool: pool})
	defer w.Close()
	g, err := w.Recover(gid, store, conf, func() *queue.Machine { return queue.New(queue.Config{}, 0) }, nil)
	if err != nil {
		t.Fatal(err)
	}
	now := int64(1000)
	// drive runs rounds and what they post until cond holds, waiting for
	// the appender's completions (posted from its goroutine).
	drive := func(cond func() bool) {
		t.Helper()
		for range 1000 {
			if cond() {
				return
			}
			w.Round(now)
			fns := take()
			for _, fn := range fns {
				fn()
			}
			if len(fns) == 0 && w.Stats().Appends > w.Stats().Persisted {
				select {
				case <-wake:
				case <-time.After(10 * time.Second):
					t.Fatal("no completion from the appender within 10 s")
				}
			}
		}
		t.Fatal("no progress in 1000 rounds")
	}
	// The leader (node 1, term 1) sends 1..20, committed up to 15.
	if err := w.Step(gid, raftpb.Message{Type: raftpb.MsgApp, From: 1, To: 2, Term: 1, Index: 0, LogTerm: 0, Entries: ents[:20], Commit: 15}); err != nil {
		t.Fatal(err)
	}
	drive(func() bool { _, a := g.Indexes(); return a >= 15 })
	// Own snapshot at 15: its Put runs (inline pool), the Post that
	// starts its compaction waits in the queue.
	var snapErr error
	if err := g.Snapshot(store, func(_ raftpb.SnapshotMetadata, err error) { snapErr = err }); err != nil {
		t.Fatal(err)
	}
	held := take()
	// The leader's snapshot at 42, with the live entries above Match 20.
	var sent []segment.Entry
	for _, idx := range live {
		if idx > 20 {
			sent = append(sent, segment.Entry{Index: idx, Term: 1, Data: data[idx-1]})
		}
	}
	msg := raftpb.Message{Type: raftpb.MsgSnap, From: 1, To: 2, Term: 1, Snapshot: &raftpb.Snapshot{Metadata: raftpb.SnapshotMetadata{Index: M, Term: 1, ConfState: conf}}}
	if err := w.StepSnapshot(gid, &SnapshotMessage{Msg: msg, Data: snapData, Entries: sent}); err != nil {
		t.Fatal(err)
	}
	w.Round(now) // raft hands over the leader's snapshot: the install waits for the own one
	if g.Installing() {
		t.Fatal("the install started while the group's own snapshot was still being stored")
	}
	if err := g.Snapshot(store, func(raftpb.SnapshotMetadata, error) {}); !errors.Is(err, ErrSnapshotLater) {
		t.Fatalf("a snapshot asked for with an install waiting: %v, want ErrSnapshotLater", err)
	}
	for _, fn := range held { // the own snapshot's Post, queued first
		fn()
	}
	drive(func() bool { return !g.Installing() })
	drive(func() bool { _, a := g.Indexes(); return a >= M })
	if !errors.Is(snapErr, ErrSnapshotSuperseded) {
		t.Fatalf("the own snapshot ended with %v, want ErrSnapshotSuperseded", snapErr)
	}
	var lost []uint64
	for _, idx := range g.FSM().LiveEntries(nil, g.FSM().AppliedIndex()) {
		if es, release, err := l.EntriesView(gid, idx, idx+1); err != nil || len(es) != 1 {
			lost = append(lost, idx)
		} else {
			release()
		}
	}
	if len(lost) > 0 {
		t.Fatalf("live entries of the installed snapshot gone from the follower's log: %v", lost)
	}
}
