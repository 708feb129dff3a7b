package replication

import (
	"bytes"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/warren-mq/warren/queue"
	"github.com/warren-mq/warren/segment"
	"github.com/warren-mq/warren/wire"
	"go.etcd.io/raft/v3/raftpb"
)

// TestInstallSurvivesACrashAtEverySync: a follower (its log 11..18 after
// its own snapshot at 10, entries 16..18 divergent) installs its leader's
// snapshot of entry 42 with the live entries above its Match 15, and
// crashes at each sync the install makes in turn (the failing fsync stops
// segment; only synced bytes survive). Every restart (Worker.Recover)
// finds either the follower as it was (its snapshot at 10, its matching
// entries 11..15) or the installed snapshot with every live entry of it
// stored and holding the leader's bytes: never a mix, never a lost entry.
// Installed from the transport's spool file (the entries read one at a
// time, not in the install record: lazy), a restart may also refuse the
// copy, naming the live entries missing (it is rebuilt from the other
// replicas): never an install that reads as whole with entries missing.
func TestInstallSurvivesACrashAtEverySync(t *testing.T) {
	for _, lazy := range []bool{false, true} {
		t.Run(fmt.Sprintf("lazy=%v", lazy), func(t *testing.T) { installCrashes(t, lazy) })
	}
}

func installCrashes(t *testing.T, lazy bool) {
	const gid, S = 7, 42
	// The leader's log: 1..40 publish one message each, 41 subscribes a
	// consumer that takes 10, 42 acks the first 5 of them: entries 6..40
	// hold a message at 42.
	var log []segment.Entry
	for i := uint64(1); i <= S; i++ {
		var cmd queue.Command
		switch {
		case i <= 40:
			cmd = &queue.Enqueue{Msgs: []queue.Message{{Size: 8}}, Bodies: [][]byte{[]byte(fmt.Sprintf("body-%03d", i))}}
		case i == 41:
			cmd = &queue.Subscribe{Spec: queue.ConsumerSpec{ID: 1, Owner: 1, Prefetch: 10}}
		default:
			cmd = &queue.Settle{Consumer: 1, Op: wire.SettleAck, First: 1, Last: 5}
		}
		data, err := AppendEntry(nil, EntryHeader{NowMs: int64(i)}, cmd)
		if err != nil {
			t.Fatal(err)
		}
		term := uint64(2)
		if i > 15 {
			term = 4
		}
		log = append(log, segment.Entry{Index: i, Term: term, Data: data})
	}
	leader := NewQueueFSM(queue.New(queue.Config{}, 0), 0, nil)
	for _, e := range log {
		if _, err := leader.Apply(e.Index, e.Data); err != nil {
			t.Fatal(err)
		}
	}
	live := leader.LiveEntries(nil, S)
	if len(live) != 35 || live[0] != 6 {
		t.Fatalf("the leader's live entries at %d: %v", S, live)
	}
	snapData, _ := leader.Snapshot()
	conf := raftpb.ConfState{Voters: []uint64{1, 2, 3}}
	meta := raftpb.SnapshotMetadata{Index: S, Term: 4, ConfState: conf}
	var sent []segment.Entry // live above Match 15
	for _, idx := range live {
		if idx > 15 {
			sent = append(sent, log[idx-1])
		}
	}

	var read func(int, []byte) ([]byte, error)
	if lazy {
		stored := sent
		sent = nil
		for _, e := range stored {
			sent = append(sent, segment.Entry{Index: e.Index, Term: e.Term})
		}
		read = func(i int, dst []byte) ([]byte, error) { return append(dst[:0], stored[i].Data...), nil }
	}
	refused := 0
	for failAt := 1; ; failAt++ {
		// The follower: entries 1..15 as the leader's, 16..18 divergent
		// (term 3), its own snapshot at 10.
		fs := segment.NewMemFS()
		l := openMemLog(t, fs)
		store, err := OpenSnapStore(l)
		if err != nil {
			t.Fatal(err)
		}
		own := NewQueueFSM(queue.New(queue.Config{}, 0), 0, nil)
		fl := append([]segment.Entry(nil), log[:15]...)
		for i := uint64(16); i <= 18; i++ {
			fl = append(fl, segment.Entry{Index: i, Term: 3, Data: log[i-1].Data})
		}
		for _, e := range fl[:10] {
			if _, err := own.Apply(e.Index, e.Data); err != nil {
				t.Fatal(err)
			}
		}
		ownSnap, _ := own.Snapshot()
		must := func(err error) {
			t.Helper()
			if err != nil {
				t.Fatal(err)
			}
		}
		must(l.Append(segment.Batch{Group: gid, Entries: fl, HardState: &segment.HardState{Term: 3, Commit: 12}}))
		must(store.Put(gid, raftpb.SnapshotMetadata{Index: 10, Term: 2, ConfState: conf}, ownSnap))
		must(l.Compact(gid, 10, own.LiveEntries(nil, 10)))

		fs.FailSync(failAt)
		err = installSnapshot(l, store, gid, meta, snapData, sent, read, live, 11, 18, 5)
		fs.FailSync(0)
		done := err == nil
		fs2 := fs.Crash(0)

		l2 := openMemLog(t, fs2)
		store2, err := OpenSnapStore(l2)
		if err != nil {
			t.Fatalf("sync %d: reopening the store: %v", failAt, err)
		}
		w := NewWorker(l2, WorkerConfig{NodeID: 2, Post: func(func()) {}})
		g, err := w.Recover(gid, store2, conf, func() *queue.Machine { return queue.New(queue.Config{}, 0) }, nil)
		if err != nil && lazy && !done && errors.Is(err, segment.ErrCorrupt) && strings.Contains(err.Error(), "live entries are not stored") {
			t.Logf("crash at sync %d: the copy refused: %v", failAt, err)
			refused++
			w.Close()
			continue
		}
		if err != nil {
			t.Fatalf("crash at sync %d: recovering: %v", failAt, err)
		}
		switch at := g.FSM().AppliedIndex(); at {
		case 10:
			if done {
				t.Fatalf("the install returned, yet a restart finds the old snapshot")
			}
			for i := uint64(11); i <= 15; i++ {
				es, err := l2.Entries(gid, i, i+1)
				if err != nil || es[0].Term != 2 || !bytes.Equal(es[0].Data, log[i-1].Data) {
					t.Fatalf("crash at sync %d: the follower's matching entry %d is lost (%v)", failAt, i, err)
				}
			}
		case S:
			if got, _ := g.FSM().Snapshot(); !bytes.Equal(got, snapData) {
				t.Fatalf("crash at sync %d: the installed state differs from the leader's", failAt)
			}
			if f := l2.FirstIndex(gid); f != S+1 {
				t.Fatalf("crash at sync %d: the log starts at %d after the install, want %d", failAt, f, S+1)
			}
			for _, idx := range live {
				es, release, err := l2.EntriesView(gid, idx, idx+1)
				if err != nil {
					t.Fatalf("crash at sync %d: live entry %d: %v", failAt, idx, err)
				}
				if !bytes.Equal(es[0].Data, log[idx-1].Data) {
					t.Fatalf("crash at sync %d: live entry %d holds %d bytes not the leader's", failAt, idx, len(es[0].Data))
				}
				release()
			}
		default:
			t.Fatalf("crash at sync %d: recovered at entry %d", failAt, at)
		}
		t.Logf("crash at sync %d: recovered at entry %d", failAt, g.FSM().AppliedIndex())
		w.Close()
		if done {
			if failAt < 4 {
				t.Fatalf("the install made only %d syncs: the test covers little", failAt-1)
			}
			if lazy && refused == 0 {
				t.Fatal("no crash left the lazy install's copy refused: the test covers little")
			}
			break
		}
	}
}
