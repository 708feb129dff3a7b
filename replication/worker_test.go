package replication

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/warren-mq/warren/queue"
	"github.com/warren-mq/warren/segment"
	"go.etcd.io/raft/v3/raftpb"
)

var workerSeeds = flag.Int("worker.seeds", 0, "seeds for the worker test (0: 30, or 4 under -race)")

// shard is the test's stand-in for a broker shard: an inbox the
// appender posts completions to, and a loop that runs them and rounds.
type shard struct {
	t       *testing.T
	w       *Worker
	inbox   chan func()
	fatal   error
	nowMs   int64
	rounds  int
	appends []int // Stats().Appends after each round
}

func newShard(t *testing.T, l *segment.Log) *shard {
	s := &shard{t: t, inbox: make(chan func(), 1024)}
	s.w = NewWorker(l, WorkerConfig{
		Post:  func(fn func()) { s.inbox <- fn },
		Fatal: func(err error) { s.fatal = err },
	})
	return s
}

// round runs one round and returns how many Appends it submitted.
func (s *shard) round() int {
	before := s.w.Stats().Appends
	s.w.Round(s.nowMs)
	s.rounds++
	return int(s.w.Stats().Appends - before)
}

// settle runs rounds and completions until nothing is dirty or in flight.
func (s *shard) settle() {
	for i := 0; ; i++ {
		if i > 10000 {
			s.t.Fatal("the worker never settles")
		}
		more := s.w.Round(s.nowMs)
		inflight := s.w.Stats().Appends - s.w.Stats().Persisted
		if !more && inflight == 0 {
			return
		}
		if inflight > 0 {
			select {
			case fn := <-s.inbox:
				fn()
			case <-time.After(10 * time.Second):
				s.t.Fatal("no completion from the appender within 10 s")
			}
		}
	}
}

type workerGroup struct {
	g    *Group
	w    *workload
	cfg  queue.Config
	cmds int // commands added
	seen int // commands the sink saw applied
	// seqs: the proposal seq Add returned for each command; seen: the
	// entry header seq each command was applied under (the same, in order:
	// a leader matches confirms to applies by it).
	seqs, appliedSeqs []uint64
}

// TestWorkerRounds: one worker drives several groups (random
// configurations and workloads) over segment on MemFS. Each round with
// commands for several groups submits exactly one Append holding them
// all; every command added is applied exactly once; after a clean close
// (or a crash at a random sync, which stops the worker through Fatal) a
// new worker recovers every group from the log alone: every entry whose
// write had returned is there, and each queue equals both a reference FSM
// applying the recovered entries and, after a clean close, the live one.
func TestWorkerRounds(t *testing.T) {
	seeds := *workerSeeds
	if seeds == 0 {
		seeds = 30
		if raceEnabled {
			seeds = 4
		}
	}
	for seed := uint64(0); seed < uint64(seeds); seed++ {
		t.Run(fmt.Sprint(seed), func(t *testing.T) { workerRun(t, seed) })
	}
}

func workerRun(t *testing.T, seed uint64) {
	r := rand.New(rand.NewPCG(seed, 31))
	fs := segment.NewMemFS()
	l := openMemLog(t, fs)
	s := newShard(t, l)
	voters := raftpb.ConfState{Voters: []uint64{1}}
	var groups []*workerGroup
	for gid := uint64(10); gid < 10+uint64(2+r.IntN(5)); gid++ {
		wg := &workerGroup{cfg: randomConfig(r), w: &workload{r: r, tags: map[queue.ConsumerID][]uint64{}}}
		fsm := NewQueueFSM(queue.New(wg.cfg, 0), 0, func(a *Applied) {
			wg.seen++
			// Applied (and so confirmed) only once its write is durable,
			// pipelined rounds included.
			if wg.g != nil && a.Index > wg.g.st.durable {
				t.Errorf("group %d: entry %d applied before it was durable (durable up to %d)", wg.g.ID(), a.Index, wg.g.st.durable)
			}
			if a.Header.Proposer != 1<<48 {
				t.Errorf("proposer %#x, want node 1 shard 0", a.Header.Proposer)
			}
			wg.appliedSeqs = append(wg.appliedSeqs, a.Header.Seq)
			for _, e := range a.Effects {
				wg.w.saw(e)
			}
		})
		g, err := s.w.Open(gid, raftpb.SnapshotMetadata{ConfState: voters}, fsm)
		if err != nil {
			t.Fatal(err)
		}
		wg.g = g
		groups = append(groups, wg)
	}
	s.settle() // elections
	crash := seed%2 == 1
	if crash {
		fs.FailSync(1 + r.IntN(100))
	}
	acked := map[uint64]uint64{}
	for step := 0; step < 50 && s.fatal == nil; step++ {
		s.nowMs += int64(r.IntN(50))
		busy := 0 // groups with commands and no write in flight: each has a Ready to write
		for _, wg := range groups {
			n := r.IntN(4)
			if n > 0 && !wg.g.inflight {
				busy++
			}
			for range n {
				seq, err := wg.g.Add(wg.w.command())
				if err != nil {
					t.Fatal(err)
				}
				wg.seqs = append(wg.seqs, seq)
				wg.cmds++
			}
		}
		if got := s.round(); got > 1 || busy > 0 && got != 1 {
			t.Fatalf("step %d: %d groups had commands and nothing in flight; the round made %d Appends, want 1", step, busy, got)
		}
		if r.IntN(3) > 0 {
			s.settle()
		}
		if r.IntN(10) == 0 {
			if err := l.Maintain(); err != nil && !crash {
				t.Fatal(err)
			}
		}
		for _, wg := range groups {
			acked[wg.g.ID()] = wg.g.st.durable // what segment made durable
		}
	}
	if s.fatal == nil {
		s.settle()
	}
	for _, wg := range groups {
		acked[wg.g.ID()] = wg.g.st.durable
		if wg.g.Err() != nil {
			t.Fatalf("group %d: %v", wg.g.ID(), wg.g.Err())
		}
		if s.fatal == nil && wg.seen != wg.cmds {
			t.Fatalf("group %d: %d commands added, %d applied", wg.g.ID(), wg.cmds, wg.seen)
		}
		if s.fatal == nil && !slices.Equal(wg.seqs, wg.appliedSeqs) {
			t.Fatalf("group %d: Add said seqs %v; the commands were applied under %v", wg.g.ID(), wg.seqs, wg.appliedSeqs)
		}
	}
	if crash && s.fatal != nil && !errors.Is(s.fatal, segment.ErrStopped) {
		t.Fatalf("fatal: %v", s.fatal)
	}
	if !crash && s.fatal != nil {
		t.Fatalf("fatal without a crash: %v", s.fatal)
	}
	s.w.Close()
	l.Close()

	if crash {
		fs = fs.Crash(r.IntN(300))
	}
	l = openMemLog(t, fs)
	defer l.Close()
	s2 := newShard(t, l)
	defer s2.w.Close()
	var recovered []*QueueFSM
	for _, wg := range groups {
		gid := wg.g.ID()
		st, err := openRaftStorage(l, gid, raftpb.SnapshotMetadata{ConfState: voters})
		if err != nil {
			t.Fatal(err)
		}
		if st.last < acked[gid] {
			t.Fatalf("group %d: the log ends at %d; writes up to %d had returned", gid, st.last, acked[gid])
		}
		if !crash && st.last != acked[gid] {
			t.Fatalf("group %d: clean close: the log ends at %d, not %d", gid, st.last, acked[gid])
		}
		ref := NewQueueFSM(queue.New(wg.cfg, 0), 0, nil)
		if st.last > 0 {
			es, err := st.Entries(1, st.last+1, 1<<62)
			if err != nil {
				t.Fatal(err)
			}
			for _, e := range es {
				if _, err := ref.Apply(e.Index, e.Data); err != nil {
					t.Fatalf("group %d: %v", gid, err)
				}
			}
		}
		fsm := NewQueueFSM(queue.New(wg.cfg, 0), 0, nil)
		if _, err := s2.w.Open(gid, raftpb.SnapshotMetadata{ConfState: voters}, fsm); err != nil {
			t.Fatal(err)
		}
		recovered = append(recovered, fsm)
		defer func(ref *QueueFSM, fsm *QueueFSM, live *QueueFSM) {
			if fsm.AppliedIndex() <= ref.AppliedIndex() {
				t.Errorf("group %d: applied %d after recovery, the log held %d (and a new term adds one)", gid, fsm.AppliedIndex(), ref.AppliedIndex())
			}
			for _, want := range []*QueueFSM{ref, live} {
				if want == live && crash {
					continue
				}
				if !bytes.Equal(fsm.Machine().Snapshot(), want.Machine().Snapshot()) || fsm.LastNow() != want.LastNow() {
					t.Errorf("group %d: the recovered queue differs (crash %v)", gid, crash)
				}
			}
		}(ref, fsm, wg.g.FSM())
	}
	s2.settle()
	if len(recovered) != len(groups) {
		t.Fatal("not every group reopened")
	}
}

// TestWorkerStopsOnWriteFailure: after an Append fails, the worker tells
// Fatal once, refuses new commands with ErrWorkerStopped, and submits
// nothing more.
func TestWorkerStopsOnWriteFailure(t *testing.T) {
	fs := segment.NewMemFS()
	l := openMemLog(t, fs)
	defer l.Close()
	s := newShard(t, l)
	defer s.w.Close()
	g, err := s.w.Open(10, raftpb.SnapshotMetadata{ConfState: raftpb.ConfState{Voters: []uint64{1}}}, NewQueueFSM(queue.New(queue.Config{}, 0), 0, nil))
	if err != nil {
		t.Fatal(err)
	}
	s.settle()
	fs.FailSync(1)
	if _, err := g.Add(&queue.Tick{}); err != nil {
		t.Fatal(err)
	}
	s.settle()
	if !errors.Is(s.fatal, segment.ErrStopped) {
		t.Fatalf("Fatal got %v", s.fatal)
	}
	if _, err := g.Add(&queue.Tick{}); !errors.Is(err, ErrWorkerStopped) {
		t.Fatalf("Add after the failure: %v", err)
	}
	before := s.w.Stats().Appends
	s.w.Round(1)
	if s.w.Stats().Appends != before {
		t.Fatal("a stopped worker submitted a write")
	}
}

// TestWorkerPacesLargeRounds: more than raft's uncommitted limit buffered
// for one group in one round is proposed over several rounds, never
// dropped (a dropped proposal loses its commands): every command is
// applied.
func TestWorkerPacesLargeRounds(t *testing.T) {
	l := openMemLog(t, segment.NewMemFS())
	defer l.Close()
	s := &shard{t: t, inbox: make(chan func(), 1024)}
	s.w = NewWorker(l, WorkerConfig{Post: func(fn func()) { s.inbox <- fn }, MaxUncommittedBytes: 1 << 20})
	defer s.w.Close()
	applied := 0
	g, err := s.w.Open(3, raftpb.SnapshotMetadata{ConfState: raftpb.ConfState{Voters: []uint64{1}}}, NewQueueFSM(queue.New(queue.Config{}, 0), 0, func(a *Applied) { applied++ }))
	if err != nil {
		t.Fatal(err)
	}
	s.settle()
	body := make([]byte, 3<<20) // one entry per command (4 MiB cap), each above the 1 MiB limit
	const n = 4
	for range n {
		if _, err := g.Add(&queue.Enqueue{Msgs: []queue.Message{{Size: uint32(len(body))}}, Bodies: [][]byte{body}}); err != nil {
			t.Fatal(err)
		}
	}
	s.settle()
	if d := s.w.Stats().Dropped; d != 0 || applied != n {
		t.Fatalf("%d of %d commands applied, %d proposals dropped", applied, n, d)
	}
}

// TestWorkerRemoveWaitsForItsWrite: Remove closes a group at once (Add
// refuses, nothing more is applied, the worker no longer counts it) and
// removes its log only after its write in flight completed, so nothing
// writes to the group after its removal.
func TestWorkerRemoveWaitsForItsWrite(t *testing.T) {
	fs := segment.NewMemFS()
	l := openMemLog(t, fs)
	defer l.Close()
	s := newShard(t, l)
	defer s.w.Close()
	applied := 0
	g, err := s.w.Open(10, raftpb.SnapshotMetadata{ConfState: raftpb.ConfState{Voters: []uint64{1}}},
		NewQueueFSM(queue.New(queue.Config{}, 0), 0, func(*Applied) { applied++ }))
	if err != nil {
		t.Fatal(err)
	}
	s.settle()
	if _, err := g.Add(&queue.Tick{}); err != nil {
		t.Fatal(err)
	}
	if s.round() != 1 {
		t.Fatal("setup: the round submitted no write")
	}
	before := applied
	var removed error
	called := false
	s.w.Remove(g, nil, nil, func(err error) { removed, called = err, true })
	if s.w.Groups() != 0 {
		t.Fatalf("the worker still counts %d groups after Remove", s.w.Groups())
	}
	if _, err := g.Add(&queue.Tick{}); !errors.Is(err, ErrGroupRemoved) {
		t.Fatalf("Add after Remove: %v, want ErrGroupRemoved", err)
	}
	// The first thing posted is the write's completion: the log must
	// still hold the group then; the removal's done comes after it.
	for i := 0; !called; i++ {
		select {
		case fn := <-s.inbox:
			if i == 0 && !slices.Contains(l.Groups(), 10) {
				t.Fatal("the group's log was removed while its write was in flight")
			}
			fn()
		case <-time.After(10 * time.Second):
			t.Fatal("Remove's done never came")
		}
		s.w.Round(s.nowMs)
	}
	if removed != nil {
		t.Fatal(removed)
	}
	if slices.Contains(l.Groups(), 10) || l.LastIndex(10) != 0 {
		t.Fatalf("group 10 is still in the log: %v", l.Groups())
	}
	if applied != before {
		t.Fatalf("%d entries were applied after Remove", applied-before)
	}
}

// WorkerConfig.SeqBase: a group counts its proposal seqs from it, so a
// node that restarts never reuses a seq of an earlier run, and the
// entries carry them (an entry applied here after a restart is never
// taken for one of this run's).
func TestWorkerSeqBase(t *testing.T) {
	fs := segment.NewMemFS()
	l := openMemLog(t, fs)
	defer l.Close()
	s := &shard{t: t, inbox: make(chan func(), 1024)}
	const base = 1 << 40
	s.w = NewWorker(l, WorkerConfig{Post: func(fn func()) { s.inbox <- fn }, SeqBase: base})
	defer s.w.Close()
	var seen []uint64
	fsm := NewQueueFSM(queue.New(queue.Config{}, 0), 0, func(a *Applied) { seen = append(seen, a.Header.Seq) })
	g, err := s.w.Open(10, raftpb.SnapshotMetadata{ConfState: raftpb.ConfState{Voters: []uint64{1}}}, fsm)
	if err != nil {
		t.Fatal(err)
	}
	s.settle()
	seq, err := g.Add(&queue.Tick{})
	if err != nil || seq != base+1 {
		t.Fatalf("the first seq: %d %v, want %d", seq, err, base+1)
	}
	s.settle()
	if len(seen) != 1 || seen[0] != base+1 {
		t.Fatalf("applied seqs %v, want [%d]", seen, base+1)
	}
}
