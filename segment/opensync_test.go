package segment

import (
	"errors"
	"fmt"
	"testing"
)

// shortWriteAtRecordEnd leaves mem as a process crash (not a power cut)
// would: group 1's entries 1..3 acknowledged (synced), then a write of
// group 1's entry 4 and group 3's entries cut short by the crash exactly
// at the end of its first record (a short pwrite: SIGKILL, ENOSPC),
// its bytes in the page cache, not synced.
func shortWriteAtRecordEnd(t *testing.T) (*MemFS, string) {
	t.Helper()
	mem := NewMemFS()
	l, err := Open(mem, "/data", Options{Manual: true})
	must(t, err)
	must(t, l.Append(Batch{Group: 1, Entries: ents(1, 3, 1, "acked"), HardState: &HardState{Term: 1, Commit: 3}}))
	wal := walFiles(mem)[len(walFiles(mem))-1]
	synced := mem.FileSize(wal)
	mem.FailSync(1)
	if err := l.Append(Batch{Group: 1, Entries: ents(4, 4, 1, "partial")}, Batch{Group: 3, Entries: ents(1, 3, 1, "torn")}); !errors.Is(err, ErrStopped) {
		t.Fatalf("%v", err)
	}
	l.Close()
	h, err := mem.Open(wal)
	must(t, err)
	buf := make([]byte, mem.FileSize(wal))
	h.ReadAt(buf, 0)
	_, _, next, err := readRecord(buf, int(synced), uint32(1))
	must(t, err)
	must(t, h.Truncate(int64(next))) // the short write ends at its first record's end
	return mem, wal
}

// TestOpenSyncsKeptPartialWrite: a process restart finds the short write
// (page cache), keeps its first record, seals the file and writes a
// checkpoint (synced) that restates group 1 as 1..4. Open must sync the
// sealed file first: it is never synced again, and a power cut later would
// lose entry 4 from under the checkpoint (reported as damage).
func TestOpenSyncsKeptPartialWrite(t *testing.T) {
	for _, appendAfter := range []bool{false, true} {
		for _, q := range []bool{false, true} {
			t.Run(fmt.Sprintf("append=%v/quarantine=%v", appendAfter, q), func(t *testing.T) {
				mem, _ := shortWriteAtRecordEnd(t)
				l, err := Open(mem, "/data", Options{Manual: true}) // process restart: no power cut
				must(t, err)
				if la := l.LastIndex(1); la != 4 {
					t.Fatalf("last %d", la)
				}
				t.Logf("WAL files after the restart: %v", walFiles(mem))
				want := uint64(3) // entry 4 was never acknowledged: may go
				if appendAfter {
					must(t, l.Append(Batch{Group: 1, Entries: ents(5, 5, 1, "acked-after")})) // acknowledged
					want = 5
				}
				must(t, l.Close())
				crashed := mem.Crash(0) // a power cut, later
				l2, err := Open(crashed, "/data", Options{Manual: true, Quarantine: q})
				if err != nil {
					t.Fatalf("after the power cut: %v", err)
				}
				if d := l2.Damaged(); len(d) != 0 {
					t.Fatalf("after the power cut: damaged %+v", d)
				}
				if la := l2.LastIndex(1); la < want {
					t.Fatalf("after the power cut: last %d, want ≥ %d", la, want)
				}
				must(t, l2.Close())
			})
		}
	}
}

// TestOpenSyncsReplayedTail: a process killed after a write's pwrite,
// before its fdatasync (the whole write in the page cache); the restart
// replays it and the first write after it starts a new WAL file (full, or
// Rotate), whose synced checkpoint restates entry 4: Open must have synced
// the earlier file, which is never synced again.
func TestOpenSyncsReplayedTail(t *testing.T) {
	mem := NewMemFS()
	l, err := Open(mem, "/data", Options{Manual: true})
	must(t, err)
	must(t, l.Append(Batch{Group: 1, Entries: ents(1, 3, 1, "acked"), HardState: &HardState{Term: 1, Commit: 3}}))
	mem.FailSync(1)
	if err := l.Append(Batch{Group: 1, Entries: ents(4, 4, 1, "unsynced")}); !errors.Is(err, ErrStopped) {
		t.Fatalf("%v", err)
	}
	l.Close()
	l, err = Open(mem, "/data", Options{Manual: true}) // process restart
	must(t, err)
	l.Rotate()
	must(t, l.Append(Batch{Group: 1, Entries: ents(5, 5, 1, "acked-after")}))
	must(t, l.Close())
	l2, err := Open(mem.Crash(0), "/data", Options{Manual: true})
	if err != nil {
		t.Fatalf("after the power cut: %v", err)
	}
	if la := l2.LastIndex(1); la != 5 {
		t.Fatalf("last %d", la)
	}
	must(t, l2.Close())
}
