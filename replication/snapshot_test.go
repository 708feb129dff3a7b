package replication

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/warren-mq/warren/queue"
	"github.com/warren-mq/warren/segment"
	"go.etcd.io/raft/v3/raftpb"
)

// TestSnapshotsCompactAndRecover: groups on a worker take snapshots into
// the snapshot store at random points of random workloads; each finished
// snapshot compacts the group's log to its index (segment's first index
// moves past it) while every entry still holding a message stays
// readable. After a clean close, or a crash at a random sync, a new
// worker recovers each group from its latest snapshot plus the log after
// it: the one Compact after the restart finds every live entry, every
// snapshot whose Put had returned is there, the recovered queue equals
// the live one at the same applied index (after a clean close: the final
// state), and every message it holds still has the body it was published
// with. make soak-replication runs it (and the worker and single-voter
// crash tests) over 10,000 seeds.
func TestSnapshotsCompactAndRecover(t *testing.T) {
	seeds := *workerSeeds
	if seeds == 0 {
		seeds = 30
		if raceEnabled {
			seeds = 4
		}
	}
	for seed := uint64(0); seed < uint64(seeds); seed++ {
		t.Run(fmt.Sprint(seed), func(t *testing.T) { snapshotRun(t, seed) })
	}
}

type snapGroup struct {
	workerGroup
	states   map[uint64][]byte // applied index → machine snapshot, as the live FSM went
	snapped  uint64            // the index of the last snapshot whose Put and compaction returned
	snapErrs int
	bodies   map[uint64][]byte // message id → the body published with it
}

func snapshotRun(t *testing.T, seed uint64) {
	r := rand.New(rand.NewPCG(seed, 53))
	fs := segment.NewMemFS()
	l := openMemLog(t, fs)
	store, err := OpenSnapStore(l)
	if err != nil {
		t.Fatal(err)
	}
	s := newShard(t, l)
	voters := raftpb.ConfState{Voters: []uint64{1}}
	var groups []*snapGroup
	for gid := uint64(3); gid < 3+uint64(1+r.IntN(4)); gid++ {
		sg := &snapGroup{states: map[uint64][]byte{}, bodies: map[uint64][]byte{}}
		sg.cfg, sg.w = randomConfig(r), &workload{r: r, tags: map[queue.ConsumerID][]uint64{}}
		fsm := NewQueueFSM(queue.New(sg.cfg, 0), 0, func(a *Applied) {
			if e, ok := a.Command.(*queue.Enqueue); ok && e.Bodies != nil {
				for i, m := range e.Msgs {
					sg.bodies[m.ID] = bytes.Clone(e.Bodies[i])
				}
			}
			for _, e := range a.Effects {
				sg.w.saw(e)
			}
		})
		g, err := s.w.Open(gid, raftpb.SnapshotMetadata{ConfState: voters}, fsm)
		if err != nil {
			t.Fatal(err)
		}
		sg.g = g
		groups = append(groups, sg)
	}
	record := func() {
		for _, sg := range groups {
			f := sg.g.FSM()
			if _, ok := sg.states[f.AppliedIndex()]; !ok {
				sg.states[f.AppliedIndex()] = f.Machine().Snapshot()
			}
		}
	}
	s.settle()
	crash := seed%2 == 1
	if crash {
		fs.FailSync(1 + r.IntN(150))
	}
	snaps := 0
	for step := 0; step < 60 && s.fatal == nil; step++ {
		s.nowMs += int64(r.IntN(50))
		for _, sg := range groups {
			for range r.IntN(4) {
				if _, err := sg.g.Add(sg.w.command()); err != nil {
					t.Fatal(err)
				}
			}
		}
		s.round()
		s.settle()
		record()
		for _, sg := range groups {
			if r.IntN(5) != 0 {
				continue
			}
			sg := sg
			err := sg.g.Snapshot(store, func(meta raftpb.SnapshotMetadata, err error) {
				if err != nil {
					sg.snapErrs++
					return
				}
				sg.snapped = meta.Index
				snaps++
				// The log now starts after the snapshot, and every live
				// entry below it is still readable.
				if f := l.FirstIndex(sg.g.ID()); f != meta.Index+1 {
					t.Errorf("group %d: snapshot at %d, the log starts at %d", sg.g.ID(), meta.Index, f)
				}
				for _, idx := range sg.g.FSM().LiveEntries(nil, meta.Index) {
					es, release, err := l.EntriesView(sg.g.ID(), idx, idx+1)
					if err != nil {
						t.Errorf("group %d: live entry %d unreadable after compaction: %v", sg.g.ID(), idx, err)
						continue
					}
					if _, _, err := new(EntryDecoder).Check(es[0].Data); err != nil {
						t.Errorf("group %d: live entry %d: %v", sg.g.ID(), idx, err)
					}
					release()
				}
			})
			if err != nil && !errors.Is(err, ErrSnapshotLater) && !errors.Is(err, ErrWorkerStopped) {
				t.Fatal(err)
			}
		}
		s.settleSnapshots(groups)
		if r.IntN(6) == 0 {
			if err := l.Maintain(); err != nil && !crash {
				t.Fatal(err)
			}
		}
	}
	if s.fatal == nil {
		s.settle()
		record()
	}
	if !crash && (s.fatal != nil || snaps == 0) {
		t.Fatalf("no crash: fatal %v, %d snapshots", s.fatal, snaps)
	}
	for _, sg := range groups {
		if !crash && sg.snapErrs > 0 {
			t.Fatalf("group %d: %d snapshots failed without a crash", sg.g.ID(), sg.snapErrs)
		}
	}
	s.w.Close()
	l.Close()

	if crash {
		fs = fs.Crash(r.IntN(300))
	}
	l = openMemLog(t, fs)
	defer l.Close()
	store, err = OpenSnapStore(l)
	if err != nil {
		t.Fatal(err)
	}
	s2 := newShard(t, l)
	defer s2.w.Close()
	var recovered []*Group
	for _, sg := range groups {
		gid := sg.g.ID()
		if m, ok := store.Latest(gid); sg.snapped > 0 && (!ok || m.Index < sg.snapped) {
			t.Fatalf("group %d: the snapshot of %d had been stored; the store has %v %v", gid, sg.snapped, m.Index, ok)
		}
		cfg := sg.cfg
		g, err := s2.w.Recover(gid, store, voters, func() *queue.Machine { return queue.New(cfg, 0) }, nil)
		if err != nil {
			t.Fatalf("group %d: %v", gid, err)
		}
		recovered = append(recovered, g)
	}
	lasts := map[uint64]uint64{}
	for _, g := range recovered {
		lasts[g.ID()] = g.st.last // before the new term's entry
	}
	s2.settle()
	for i, g := range recovered {
		sg := groups[i]
		last := lasts[g.ID()]
		want, ok := sg.states[last]
		if !ok {
			if !crash {
				t.Fatalf("group %d: recovered to %d, which the live group never applied", g.ID(), last)
			}
			continue // written but not applied before the crash
		}
		if !bytes.Equal(g.FSM().Machine().Snapshot(), want) {
			t.Fatalf("group %d: the queue recovered to entry %d differs from the live one there (crash %v)", g.ID(), last, crash)
		}
		if !crash && last != sg.g.FSM().AppliedIndex() {
			t.Fatalf("group %d: recovered to %d, the live group applied %d", g.ID(), last, sg.g.FSM().AppliedIndex())
		}
		// Every message the recovered queue holds still has its body.
		g.FSM().Machine().EachMessage(func(id uint64, _ uint32) {
			want, ok := sg.bodies[id]
			if !ok {
				return // published without a body, or applied only after the crash
			}
			if b, err := g.Body(id); err != nil || !bytes.Equal(b, want) {
				t.Fatalf("group %d: message %#x: body %q, %v after recovery; want %q", g.ID(), id, b, err, want)
			}
		})
		g.ReleaseBodies()
	}
}

// settleSnapshots waits for the snapshots in flight to post their
// completions (running rounds meanwhile).
func (s *shard) settleSnapshots(groups []*snapGroup) {
	for {
		busy := false
		for _, sg := range groups {
			busy = busy || sg.g.snapping && sg.g.Err() == nil && s.fatal == nil
		}
		if !busy {
			s.settle()
			return
		}
		select {
		case fn := <-s.inbox:
			fn()
		case <-time.After(10 * time.Second):
			s.t.Fatal("no snapshot completion within 10 s")
		}
		s.w.Round(s.nowMs)
	}
}
