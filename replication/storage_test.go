package replication

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/warren-mq/warren/segment"
	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
)

const testGroup = 3

func openMemLog(t testing.TB, fs *segment.MemFS) *segment.Log {
	t.Helper()
	l, err := segment.Open(fs, "/data", segment.Options{Manual: true, WALSize: 16 << 10, SegmentSize: 32 << 10})
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// appendDurably writes ents (and hs) to segment and mirrors them, as the
// worker does between Ready and Advance.
func appendDurably(l *segment.Log, s *raftStorage, ents []raftpb.Entry, hs raftpb.HardState) error {
	b, err := s.batch(ents, hs)
	if err != nil {
		return err
	}
	if len(b.Entries) > 0 || b.HardState != nil {
		if err := l.Append(b); err != nil {
			return err
		}
	}
	return s.appended(ents, hs)
}

// compareStorage checks every query raft may make of s against the model
// (raft's own MemoryStorage, given the same appends and compactions):
// FirstIndex, LastIndex, Term over [0, last+2], Entries over every range
// within [first-1, last+1] at several size limits, and InitialState.
func compareStorage(t *testing.T, where string, s *raftStorage, m *raft.MemoryStorage) {
	t.Helper()
	mf, _ := m.FirstIndex()
	ml, _ := m.LastIndex()
	sf, _ := s.FirstIndex()
	sl, _ := s.LastIndex()
	if sf != mf || sl != ml {
		t.Fatalf("%s: range %d..%d, want %d..%d", where, sf, sl, mf, ml)
	}
	for i := uint64(0); i <= ml+2; i++ {
		st, serr := s.Term(i)
		mt, merr := m.Term(i)
		if st != mt || !errors.Is(serr, merr) {
			t.Fatalf("%s: Term(%d) = %d, %v; want %d, %v", where, i, st, serr, mt, merr)
		}
	}
	sizes := []uint64{0, 100, 300, math.MaxUint64}
	for lo := mf - 1; lo <= ml; lo++ {
		for hi := lo + 1; hi <= ml+1; hi++ {
			if hi-lo > 8 && hi <= ml-3 {
				continue // long ranges: those ending near the end suffice
			}
			for _, max := range sizes {
				se, serr := s.Entries(lo, hi, max)
				me, merr := m.Entries(lo, hi, max)
				if !errors.Is(serr, merr) || len(se) != len(me) {
					t.Fatalf("%s: Entries(%d, %d, %d) = %d entries, %v; want %d, %v", where, lo, hi, max, len(se), serr, len(me), merr)
				}
				for k := range se {
					if se[k].Index != me[k].Index || se[k].Term != me[k].Term || se[k].Type != me[k].Type || string(se[k].Data) != string(me[k].Data) {
						t.Fatalf("%s: Entries(%d, %d, %d)[%d] = %+v, want %+v", where, lo, hi, max, k, se[k], me[k])
					}
				}
				if cap(se) != len(se) {
					t.Fatalf("%s: Entries(%d, %d) returned spare capacity: raft's appends would write into the storage", where, lo, hi)
				}
			}
		}
	}
	shs, _, _ := s.InitialState()
	mhs, _, _ := m.InitialState()
	if shs != mhs {
		t.Fatalf("%s: hard state %+v, want %+v", where, shs, mhs)
	}
}

// TestStorageAgainstMemoryStorage: random appends (overwrites from below
// last with higher terms included), conf-change and empty entries, hard
// states, tail trimming, segment maintenance (entries moved from the WAL
// into segment files, so reads come from there), compactions and reopens
// of the segment log: after each, every Storage query answers exactly as
// raft's MemoryStorage given the same operations, ErrCompacted and
// ErrUnavailable included; and entries returned earlier never change
// (raft holds them: Storage must not mutate what it handed out).
func TestStorageAgainstMemoryStorage(t *testing.T) {
	seeds := 12
	if raceEnabled {
		seeds = 2
	}
	for seed := uint64(0); seed < uint64(seeds); seed++ {
		r := rand.New(rand.NewPCG(seed, 77))
		fs := segment.NewMemFS()
		l := openMemLog(t, fs)
		cs := raftpb.ConfState{Voters: []uint64{1}}
		s, err := openRaftStorage(l, testGroup, raftpb.SnapshotMetadata{ConfState: cs})
		if err != nil {
			t.Fatal(err)
		}
		s.maxTail = 200 + r.IntN(400)
		m := raft.NewMemoryStorage()
		term, commit := uint64(1), uint64(0)
		var held []heldEntries
		for op := 0; op < 50; op++ {
			where := fmt.Sprintf("seed %d op %d", seed, op)
			last, _ := m.LastIndex()
			first, _ := m.FirstIndex()
			switch k := r.IntN(10); {
			case k < 5: // append, sometimes overwriting an uncommitted suffix at a higher term
				from := last + 1
				if r.IntN(3) == 0 {
					term++ // a new leader
				}
				if lo := max(first, commit+1); r.IntN(3) == 0 && last >= lo {
					from = lo + r.Uint64N(last-lo+1)
					term++
				}
				var ents []raftpb.Entry
				for i := range 1 + r.IntN(6) {
					e := raftpb.Entry{Index: from + uint64(i), Term: term}
					switch r.IntN(6) {
					case 0: // a raft no-op
					case 1:
						e.Type = raftpb.EntryConfChangeV2
						e.Data = []byte{byte(r.IntN(256)), 2, 3}
					default:
						e.Data, _ = AppendEntry(nil, EntryHeader{NowMs: int64(e.Index), Seq: uint64(r.IntN(1000))})
					}
					ents = append(ents, e)
				}
				if end := ents[len(ents)-1].Index; end > commit {
					commit += r.Uint64N(end - commit + 1)
				}
				hs := raftpb.HardState{Term: term, Vote: 1, Commit: commit}
				if err := appendDurably(l, s, ents, hs); err != nil {
					t.Fatalf("%s: %v", where, err)
				}
				m.Append(ents)
				m.SetHardState(hs)
			case k < 6:
				s.applied(first + r.Uint64N(last-first+2))
			case k < 7:
				if err := l.Maintain(); err != nil {
					t.Fatal(err)
				}
			case k < 8 && commit >= first: // compact after a snapshot (of committed entries)
				upTo := first + r.Uint64N(commit-first+1)
				tm, _ := m.Term(upTo)
				if err := l.Compact(testGroup, upTo, nil); err != nil {
					t.Fatal(err)
				}
				if err := s.compacted(raftpb.SnapshotMetadata{Index: upTo, Term: tm, ConfState: cs}); err != nil {
					t.Fatalf("%s: %v", where, err)
				}
				if _, err := m.CreateSnapshot(upTo, &cs, nil); err != nil {
					t.Fatal(err)
				}
				if err := m.Compact(upTo); err != nil {
					t.Fatal(err)
				}
			default: // reopen: the storage is rebuilt from segment alone
				if err := l.Close(); err != nil {
					t.Fatal(err)
				}
				l = openMemLog(t, fs)
				snap, _ := m.Snapshot()
				meta := snap.Metadata
				meta.ConfState = cs
				if s, err = openRaftStorage(l, testGroup, meta); err != nil {
					t.Fatalf("%s: reopen: %v", where, err)
				}
				if len(s.tail) != 0 {
					t.Fatal("a reopened storage has a tail")
				}
			}
			if !raceEnabled || op%3 == 0 {
				compareStorage(t, where, s, m)
			}
			// raft keeps what Entries returned (Ready.CommittedEntries,
			// messages); nothing the storage does later may change it.
			for _, h := range held {
				for k := range h.got {
					if h.got[k].Index != h.want[k].Index || h.got[k].Term != h.want[k].Term || string(h.got[k].Data) != string(h.want[k].Data) {
						t.Fatalf("%s: an entry returned earlier changed from %+v to %+v", where, h.want[k], h.got[k])
					}
				}
			}
			if f, _ := s.FirstIndex(); f <= s.last && r.IntN(2) == 0 {
				got, err := s.Entries(f, s.last+1, math.MaxUint64)
				if err != nil {
					t.Fatal(err)
				}
				want := make([]raftpb.Entry, len(got))
				for k := range got {
					want[k] = got[k]
					want[k].Data = append([]byte(nil), got[k].Data...)
				}
				held = append(held, heldEntries{got, want})
			}
		}
		l.Close()
	}
}

type heldEntries struct{ got, want []raftpb.Entry }

// TestStorageRefusesWhatRaftWouldPanicOn: a log that lost entries after
// the snapshot, and a commit index past the log, are errors at open that
// name the group (raft would panic on either).
func TestStorageRefusesWhatRaftWouldPanicOn(t *testing.T) {
	fs := segment.NewMemFS()
	l := openMemLog(t, fs)
	defer l.Close()
	var ents []segment.Entry
	for i := uint64(1); i <= 10; i++ {
		ents = append(ents, segment.Entry{Index: i, Term: 1})
	}
	if err := l.Append(segment.Batch{Group: testGroup, Entries: ents, HardState: &segment.HardState{Term: 1, Commit: 10}}); err != nil {
		t.Fatal(err)
	}
	if err := l.Compact(testGroup, 6, nil); err != nil {
		t.Fatal(err)
	}
	_, err := openRaftStorage(l, testGroup, raftpb.SnapshotMetadata{Index: 4, Term: 1})
	if !errors.Is(err, errStorage) || !containsAll(err.Error(), "group 3", "entries 5..6 are lost") {
		t.Fatalf("log compacted past the snapshot: %v", err)
	}
	s, err := openRaftStorage(l, testGroup, raftpb.SnapshotMetadata{Index: 8, Term: 1})
	if err != nil {
		t.Fatal(err)
	}
	if f, _ := s.FirstIndex(); f != 9 {
		t.Fatalf("first %d after a snapshot at 8", f)
	}
	if _, err := s.Entries(8, 9, math.MaxUint64); !errors.Is(err, raft.ErrCompacted) {
		t.Fatalf("entry of the snapshot: %v", err)
	}
	if err := l.Append(segment.Batch{Group: 4, Entries: ents[:3], HardState: &segment.HardState{Term: 1, Commit: 7}}); err != nil {
		t.Fatal(err)
	}
	if _, err := openRaftStorage(l, 4, raftpb.SnapshotMetadata{}); !errors.Is(err, errStorage) || !containsAll(err.Error(), "group 4", "commit index 7") {
		t.Fatalf("commit past the log: %v", err)
	}
}

func containsAll(s string, parts ...string) bool {
	for _, p := range parts {
		if !contains(s, p) {
			return false
		}
	}
	return true
}

func contains(s, sub string) bool {
	for i := 0; i+len(sub) <= len(s); i++ {
		if s[i:i+len(sub)] == sub {
			return true
		}
	}
	return false
}
