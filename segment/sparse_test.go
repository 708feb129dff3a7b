package segment

import (
	"bytes"
	"errors"
	"testing"
)

// TestInstallWithLiveEntries: the segment side of a snapshot install
// (design/replication.md §6.7): a follower whose log is 1..10 takes a
// snapshot of entry 40 (term 3) whose live entries are 4 (held), 12 and
// 30 (not held): CompactAt moves the raft log past 40 with the term
// given, AppendLive stores 12 and 30 below it, Compact with the whole live
// set then finds every one, and raft appends continue at 41. All of it
// survives a crash (only synced bytes), maintenance (the WAL moved into
// segment files) and a reopen; a stale copy of a lower term never
// replaces an entry; misuse is refused.
func TestInstallWithLiveEntries(t *testing.T) {
	fs := NewMemFS()
	l, err := Open(fs, "/data", Options{Manual: true, WALSize: 4 << 10, SegmentSize: 8 << 10})
	must(t, err)
	must(t, l.Append(Batch{Group: 5, Entries: ents(1, 10, 1, "old")}))
	must(t, l.Truncate(5, 11))
	if err := l.AppendLive(5, ents(12, 12, 3, "live")); err == nil {
		t.Fatal("AppendLive inside or above the raft log was taken")
	}
	must(t, l.CompactAt(5, 40, 3, []uint64{4}))
	if f, la := l.FirstIndex(5), l.LastIndex(5); f != 41 || la != 40 {
		t.Fatalf("after CompactAt: range %d..%d, want 41..40", f, la)
	}
	if term, err := l.Term(5, 40); err != nil || term != 3 {
		t.Fatalf("term of the snapshot entry: %d, %v", term, err)
	}
	live := append(ents(12, 12, 3, "live"), ents(30, 30, 3, "live")...)
	for _, bad := range [][]Entry{
		{live[1], live[0]},                     // unsorted
		{{Index: 41, Term: 3, Data: []byte{}}}, // in the raft log
		{{Index: 7, Term: 0}},                  // no term
	} {
		if err := l.AppendLive(5, bad); err == nil {
			t.Fatalf("AppendLive(%+v) was taken", bad)
		}
	}
	must(t, l.AppendLive(5, live))
	// A stale copy of a lower term does not replace the stored one.
	must(t, l.AppendLive(5, ents(12, 12, 2, "stale")))
	must(t, l.Compact(5, 40, []uint64{4, 12, 30}))
	must(t, l.Append(Batch{Group: 5, Entries: ents(41, 45, 4, "new"), HardState: &HardState{Term: 4, Commit: 45}}))

	check := func(l *Log, when string) {
		t.Helper()
		if f, la := l.FirstIndex(5), l.LastIndex(5); f != 41 || la != 45 {
			t.Fatalf("%s: range %d..%d, want 41..45", when, f, la)
		}
		for _, want := range append(append(ents(4, 4, 1, "old"), live...), ents(41, 45, 4, "new")...) {
			es, release, err := l.EntriesView(5, want.Index, want.Index+1)
			if err != nil {
				t.Fatalf("%s: entry %d: %v", when, want.Index, err)
			}
			if es[0].Term != want.Term || !bytes.Equal(es[0].Data, want.Data) {
				t.Fatalf("%s: entry %d is (term %d, %q), want (term %d, %q)", when, want.Index, es[0].Term, es[0].Data, want.Term, want.Data)
			}
			release()
		}
		for _, gone := range []uint64{1, 5, 10, 11, 13, 40} {
			if _, _, err := l.EntriesView(5, gone, gone+1); !errors.Is(err, ErrUnavailable) {
				t.Fatalf("%s: entry %d is readable (%v): the compaction dropped it", when, gone, err)
			}
		}
	}
	check(l, "before a crash")
	// Recovery keeps only synced bytes; the owner then calls Compact with
	// its live set (§2.4), which must find every live entry.
	reopen := func(fs *MemFS, when string) *Log {
		t.Helper()
		l, err := Open(fs, "/data", Options{Manual: true, WALSize: 4 << 10, SegmentSize: 8 << 10})
		if err != nil {
			t.Fatalf("%s: %v", when, err)
		}
		if err := l.Compact(5, 40, []uint64{4, 12, 30}); err != nil {
			t.Fatalf("%s: Compact with the live set: %v", when, err)
		}
		if term, err := l.Term(5, 40); err != nil || term != 3 {
			t.Fatalf("%s: term of the snapshot entry: %d, %v", when, term, err)
		}
		return l
	}
	fs = fs.Crash(0)
	l = reopen(fs, "after a crash")
	check(l, "after a crash")
	l.Rotate()
	must(t, l.Append(Batch{Group: 6, Entries: ents(1, 40, 1, "fill")}))
	must(t, l.Maintain())
	if l.Stats().Moved == 0 {
		t.Fatal("maintenance moved nothing: the test does not cover moved entries")
	}
	check(l, "after maintenance")
	must(t, l.Close())
	l = reopen(fs, "after maintenance and a reopen")
	check(l, "after maintenance and a reopen")
	must(t, l.Close())
}

// TestLiveRecordNeverInAnOlderFile: a log whose WAL file is of version 3
// (an older build's) starts a new WAL file for a live record, so an older
// build refuses the log (ErrVersion) rather than misreading it; the
// entries survive a reopen.
func TestLiveRecordNeverInAnOlderFile(t *testing.T) {
	fs := NewMemFS()
	l := mustOpen(t, fs)
	must(t, l.Append(Batch{Group: 1, Entries: ents(1, 3, 1, "a")}))
	must(t, l.Close())
	name := "/data/" + walName(1)
	fs.Corrupt(name, 6, 2) // version 4 → 0
	fs.Corrupt(name, 6, 0)
	fs.Corrupt(name, 6, 1) // → 3
	l, err := Open(fs, "/data", Options{Manual: true})
	must(t, err)
	must(t, l.CompactAt(1, 9, 2, nil))
	must(t, l.AppendLive(1, ents(5, 6, 2, "live")))
	if n := l.Stats().WALFiles; n < 2 {
		t.Fatalf("%d WAL files: the live record went into the version-3 file", n)
	}
	must(t, l.Close())
	l = mustOpen(t, fs)
	defer l.Close()
	must(t, l.Compact(1, 9, []uint64{5, 6}))
}
