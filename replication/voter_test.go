package replication

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"testing"

	"github.com/warren-mq/warren/queue"
	"github.com/warren-mq/warren/segment"
	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
)

var voterSeeds = flag.Int("voter.seeds", 0, "seeds for the single-voter crash test (0: 200, or 20 under -race)")

// voter drives one single-voter group the way the worker round will
// (design §3.2, reduced to one group and synchronous appends): Ready →
// segment Append → storage mirror → apply committed entries → Advance.
type voter struct {
	l   *segment.Log
	st  *raftStorage
	rn  *raft.RawNode
	fsm *QueueFSM
	// appended records the data written at each index (for the checks),
	// whether or not its append returned.
	appended map[uint64][]byte
	acked    uint64 // the last index whose Append returned
}

func startVoter(l *segment.Log, fsm *QueueFSM, appended map[uint64][]byte) (*voter, error) {
	st, err := openRaftStorage(l, testGroup, raftpb.SnapshotMetadata{ConfState: raftpb.ConfState{Voters: []uint64{1}}})
	if err != nil {
		return nil, err
	}
	rn, err := raft.NewRawNode(groupConfig(1, st, fsm.AppliedIndex(), slog.New(slog.DiscardHandler)))
	if err != nil {
		return nil, err
	}
	v := &voter{l: l, st: st, rn: rn, fsm: fsm, appended: appended, acked: st.last}
	if err := rn.Campaign(); err != nil {
		return nil, err
	}
	return v, v.run()
}

// run processes Readys until there are none.
func (v *voter) run() error {
	for v.rn.HasReady() {
		rd := v.rn.Ready()
		if v.appended != nil {
			for _, e := range rd.Entries {
				v.appended[e.Index] = e.Data // written: it may survive a crash even if the append fails
			}
		}
		if err := appendDurably(v.l, v.st, rd.Entries, rd.HardState); err != nil {
			return err
		}
		if n := len(rd.Entries); n > 0 {
			v.acked = rd.Entries[n-1].Index
		}
		for _, e := range rd.CommittedEntries {
			var err error
			switch e.Type {
			case raftpb.EntryNormal:
				_, err = v.fsm.Apply(e.Index, e.Data)
			default:
				return fmt.Errorf("unexpected %v at %d", e.Type, e.Index)
			}
			if err != nil {
				return err
			}
			v.st.applied(e.Index)
		}
		v.rn.Advance(rd)
	}
	if st := v.rn.BasicStatus(); st.Applied != v.fsm.AppliedIndex() || st.Commit != v.fsm.AppliedIndex() {
		return fmt.Errorf("raft says applied %d of commit %d; the FSM applied %d", st.Applied, st.Commit, v.fsm.AppliedIndex())
	}
	return nil
}

func (v *voter) propose(data []byte) error {
	if err := v.rn.Propose(data); err != nil {
		return err
	}
	return v.run()
}

// TestSingleVoterRecovers: a single-voter group proposes, commits and
// applies random queue entries through raftStorage over segment (on
// MemFS, with segment maintenance moving entries into segment files),
// then recovers from the log alone:
//
//   - after a clean close, a new FSM replaying the log reaches the same
//     queue state (machine snapshot, time, wake time), and the group keeps
//     committing;
//   - after a crash at a random sync (the failing fsync stops segment; the
//     crash keeps synced bytes plus a torn piece of the rest), every entry
//     whose append returned is still there with the same bytes, nothing
//     else is invented, and the recovered queue equals a reference FSM
//     that applied exactly the recovered entries.
func TestSingleVoterRecovers(t *testing.T) {
	seeds := *voterSeeds
	if seeds == 0 {
		seeds = 200
		if raceEnabled {
			seeds = 20
		}
	}
	for seed := uint64(0); seed < uint64(seeds); seed++ {
		t.Run(fmt.Sprint(seed), func(t *testing.T) { singleVoterRun(t, seed) })
	}
}

func singleVoterRun(t *testing.T, seed uint64) {
	r := rand.New(rand.NewPCG(seed, 2026))
	cfg := randomConfig(r)
	w := &workload{r: r, tags: map[queue.ConsumerID][]uint64{}}
	sink := func(a *Applied) {
		for _, e := range a.Effects {
			w.saw(e)
		}
	}
	fs := segment.NewMemFS()
	l := openMemLog(t, fs)
	appended := map[uint64][]byte{}
	v, err := startVoter(l, NewQueueFSM(queue.New(cfg, 0), 0, sink), appended)
	if err != nil {
		t.Fatal(err)
	}
	crash := seed%2 == 1
	if crash {
		fs.FailSync(1 + r.IntN(180)) // about 170 syncs in a run: sometimes none fails, and the crash comes at the end
	}
	var enc EntryEncoder
	failed := false
	for i := 0; i < 80 && !failed; i++ {
		h, cmds := w.entry()
		enc.Reset()
		for _, c := range cmds {
			if err := enc.Add(c); err != nil {
				t.Fatal(err)
			}
		}
		data := append([]byte(nil), enc.Finish(h)...) // raft keeps the slice
		err := v.propose(data)
		if err == nil && r.IntN(8) == 0 {
			err = l.Maintain()
		}
		if err != nil {
			if !crash || !errors.Is(err, segment.ErrStopped) && !errors.Is(err, segment.ErrInjected) {
				t.Fatalf("entry %d: %v", i, err)
			}
			failed = true
		}
	}
	if err := v.run(); err != nil && !failed {
		t.Fatal(err)
	}
	before := v.fsm
	acked := v.acked
	l.Close()

	if crash {
		fs = fs.Crash(r.IntN(200))
	}
	l = openMemLog(t, fs)
	defer l.Close()
	// What the log holds before raft runs again: the acked entries, with
	// the bytes appended, and nothing that was never written (an entry
	// whose append failed may survive: a torn write can hold it whole).
	st, err := openRaftStorage(l, testGroup, raftpb.SnapshotMetadata{ConfState: raftpb.ConfState{Voters: []uint64{1}}})
	if err != nil {
		t.Fatal(err)
	}
	last := st.last
	if last < acked {
		t.Fatalf("the log ends at %d; appends up to %d had returned (crash %v)", last, acked, crash)
	}
	if last > 0 {
		es, err := st.Entries(1, last+1, 1<<62)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range es {
			if want, ok := appended[e.Index]; !ok || !bytes.Equal(e.Data, want) {
				t.Fatalf("recovered entry %d differs from what was written (written: %v)", e.Index, ok)
			}
		}
	}
	if !crash && last != acked {
		t.Fatalf("clean close: the log ends at %d, appends reached %d", last, acked)
	}

	// Replay through raft into a new FSM.
	after := NewQueueFSM(queue.New(cfg, 0), 0, nil)
	v2, err := startVoter(l, after, map[uint64][]byte{})
	if err != nil {
		t.Fatal(err)
	}
	if after.AppliedIndex() <= last {
		t.Fatalf("applied %d after recovery; the log holds %d entries and a new term adds one", after.AppliedIndex(), last)
	}
	ref := NewQueueFSM(queue.New(cfg, 0), 0, nil)
	for i := uint64(1); i <= last; i++ {
		if _, err := ref.Apply(i, appended[i]); err != nil {
			t.Fatal(err)
		}
	}
	if !crash && before.AppliedIndex() != last {
		t.Fatalf("before the close %d were applied of %d", before.AppliedIndex(), last)
	}
	for _, want := range []*QueueFSM{ref, before} {
		if want == before && crash {
			continue // entries past the failed sync may or may not have survived
		}
		if !bytes.Equal(after.Machine().Snapshot(), want.Machine().Snapshot()) || after.LastNow() != want.LastNow() {
			t.Fatalf("the recovered queue differs from the one that applied entries 1..%d", last)
		}
		aw, _ := after.WakeAt()
		ww, _ := want.WakeAt()
		if aw != ww {
			t.Fatalf("recovered wake time %d, want %d", aw, ww)
		}
	}
	// The group keeps working.
	d, _ := AppendEntry(nil, EntryHeader{NowMs: after.LastNow() + 1}, &queue.Tick{})
	applied := after.AppliedIndex()
	if err := v2.propose(d); err != nil {
		t.Fatal(err)
	}
	if after.AppliedIndex() != applied+1 {
		t.Fatalf("a proposal after recovery was not applied (%d → %d)", applied, after.AppliedIndex())
	}
}
