package segment

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
)

func ents(lo, hi, term uint64, tag string) []Entry {
	var out []Entry
	for i := lo; i <= hi; i++ {
		out = append(out, Entry{Index: i, Term: term, Data: []byte(fmt.Sprintf("%s-%d", tag, i))})
	}
	return out
}

func mustOpen(t testing.TB, fs FS) *Log {
	t.Helper()
	l, err := Open(fs, "/data", Options{})
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func TestAppendReadReopen(t *testing.T) {
	fs := NewMemFS()
	l := mustOpen(t, fs)
	must(t, l.Append(Batch{Group: 1, Entries: ents(1, 5, 1, "a"), HardState: &HardState{Term: 1, Vote: 2, Commit: 3}},
		Batch{Group: 2, Entries: ents(1, 3, 1, "b")}))
	must(t, l.Append(Batch{Group: 1, Entries: ents(4, 6, 2, "c")})) // overwrites 4 and 5
	must(t, l.Truncate(2, 3))
	must(t, l.Compact(1, 2, nil))
	check := func(l *Log) {
		t.Helper()
		if f, la := l.FirstIndex(1), l.LastIndex(1); f != 3 || la != 6 {
			t.Fatalf("group 1 range %d..%d", f, la)
		}
		es, err := l.Entries(1, 3, 7)
		must(t, err)
		want := append(ents(3, 3, 1, "a"), ents(4, 6, 2, "c")...)
		for i := range want {
			if es[i].Index != want[i].Index || es[i].Term != want[i].Term || !bytes.Equal(es[i].Data, want[i].Data) {
				t.Fatalf("entry %d: %+v, want %+v", i, es[i], want[i])
			}
		}
		if term, _ := l.Term(1, 5); term != 2 {
			t.Fatalf("term %d", term)
		}
		if term, err := l.Term(1, 2); err != nil || term != 1 {
			t.Fatalf("term of the compaction point (first-1): %d, %v", term, err)
		}
		if _, err := l.Term(1, 1); !errors.Is(err, ErrUnavailable) {
			t.Fatalf("compacted term: %v", err)
		}
		if la := l.LastIndex(2); la != 2 {
			t.Fatalf("group 2 last %d after truncate", la)
		}
		if hs, ok := l.HardState(1); !ok || hs != (HardState{1, 2, 3}) {
			t.Fatalf("hard state %+v", hs)
		}
	}
	check(l)
	l.Close()
	check(mustOpen(t, fs.Crash(0)))
	if err := mustOpen(t, fs).Append(Batch{Group: 1, Entries: ents(9, 9, 2, "gap")}); !errors.Is(err, ErrGap) {
		t.Fatalf("gap: %v", err)
	}
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// gateFS holds every Sync until the test opens the gate, and says when
// one is waiting.
type gateFS struct {
	*MemFS
	gate, waiting chan struct{}
}

type gateFile struct {
	File
	gate, waiting chan struct{}
}

func (g gateFS) Open(name string) (File, error) {
	f, err := g.MemFS.Open(name)
	return gateFile{f, g.gate, g.waiting}, err
}

func (f gateFile) Sync() error {
	f.waiting <- struct{}{}
	<-f.gate
	return f.File.Sync()
}

// TestGroupCommitSharesSyncs: while one append's fsync is in flight, the
// next write starts and its fsync overlaps (pipelining), and every append
// queued behind them goes out in one more: 32 appends, at most
// maxInflight+1 = 3 fdatasyncs.
func TestGroupCommitSharesSyncs(t *testing.T) {
	mem := NewMemFS()
	gate, waiting := make(chan struct{}, 1000), make(chan struct{}, 1000)
	gate <- struct{}{} // let Open create the file header
	l, err := Open(gateFS{mem, gate, waiting}, "/data", Options{})
	must(t, err)
	<-waiting
	const writers = 32
	queued := make(chan struct{}, writers)
	l.queuedHook = func() { queued <- struct{}{} }
	var wg sync.WaitGroup
	start := func(w int) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := l.Append(Batch{Group: uint64(w), Entries: ents(1, 1, 1, "x")}); err != nil {
				t.Error(err)
			}
		}()
	}
	start(0)
	<-waiting // writer 0 is in its fsync
	for w := 1; w < writers; w++ {
		start(w)
	}
	<-waiting // a second write started and is in its fsync too
	for w := 0; w < writers; w++ {
		<-queued // all queued
	}
	for range 3 {
		gate <- struct{}{}
	}
	wg.Wait()
	if s := l.Stats().Syncs; s < 2 || s > 3 {
		t.Fatalf("%d syncs for %d appends, want 2 or 3", s, writers)
	}
	l2 := mustOpen(t, mem.Crash(0))
	for w := 0; w < writers; w++ {
		if l2.LastIndex(uint64(w)) != 1 {
			t.Fatalf("group %d lost after crash", w)
		}
	}
}

func TestSyncFailureStopsTheEngine(t *testing.T) {
	fs := NewMemFS()
	l := mustOpen(t, fs)
	must(t, l.Append(Batch{Group: 1, Entries: ents(1, 1, 1, "a")}))
	fs.FailSync(1)
	if err := l.Append(Batch{Group: 1, Entries: ents(2, 2, 1, "b")}); !errors.Is(err, ErrStopped) {
		t.Fatalf("got %v", err)
	}
	if err := l.Append(Batch{Group: 1, Entries: ents(3, 3, 1, "c")}); !errors.Is(err, ErrStopped) {
		t.Fatalf("after a failed sync the engine must refuse work, got %v", err)
	}
}

func TestRepairTruncatesMidLogCorruption(t *testing.T) {
	fs := NewMemFS()
	l := mustOpen(t, fs)
	for i := uint64(1); i <= 20; i++ {
		must(t, l.Append(Batch{Group: 7, Entries: ents(i, i, 1, "x")}))
	}
	fs.Corrupt("/data/"+walName(1), fileHeader+40, 3) // inside the first record
	_, err := Open(fs, "/data", Options{})
	if !errors.Is(err, ErrCorrupt) || !bytes.Contains([]byte(err.Error()), []byte("group 7")) {
		t.Fatalf("got %v, want ErrCorrupt naming group 7", err)
	}
	l2, err := Open(fs, "/data", Options{Repair: true})
	if err != nil {
		t.Fatal(err)
	}
	if l2.LastIndex(7) != 0 {
		t.Fatalf("repair kept data after the damage: last %d", l2.LastIndex(7))
	}
	must(t, l2.Append(Batch{Group: 7, Entries: ents(1, 1, 2, "y")}))
}

// TestEntriesViewSurvivesRemap: views stay valid while held, across the
// log growing (and being remapped), on the real filesystem.
func TestEntriesViewSurvivesRemap(t *testing.T) {
	for _, fs := range []FS{NewMemFS(), OSFS{}} {
		dir := t.TempDir()
		l, err := Open(fs, dir, Options{})
		must(t, err)
		must(t, l.Append(Batch{Group: 1, Entries: ents(1, 10, 1, "v")}))
		view, release, err := l.EntriesView(1, 3, 6)
		must(t, err)
		// Grow the log well past the first mapping's headroom.
		big := make([]byte, 64<<10)
		for i := uint64(11); i < 11+40; i++ {
			must(t, l.Append(Batch{Group: 1, Entries: []Entry{{Index: i, Term: 1, Data: big}}}))
		}
		later, release2, err := l.EntriesView(1, 40, 41)
		must(t, err)
		if len(later[0].Data) != len(big) {
			t.Fatalf("view after growth has %d bytes", len(later[0].Data))
		}
		for i, e := range view {
			if want := fmt.Sprintf("v-%d", 3+i); string(e.Data) != want {
				t.Fatalf("held view %d = %q, want %q", i, e.Data, want)
			}
		}
		release()
		release() // idempotent
		release2()
		if _, _, err := l.EntriesView(1, 0, 2); !errors.Is(err, ErrUnavailable) {
			t.Fatalf("out of range: %v", err)
		}
		must(t, l.Close())
	}
}

// TestWorkerWithConcurrentUse: appenders, compactions with live sets and
// readers holding views run while the background worker rotates, moves,
// compacts and deletes files underneath them (run with -race). Every view
// must read what was written, also after the files under it are gone, and
// a reopen must find the same state.
func TestWorkerWithConcurrentUse(t *testing.T) {
	t.Run("memfs", func(t *testing.T) { workerWithConcurrentUse(t, NewMemFS(), "/data") })
	// The real filesystem: views are slices of real mappings of files the
	// worker deletes; reading one after an early munmap would fault.
	t.Run("osfs", func(t *testing.T) { workerWithConcurrentUse(t, OSFS{}, t.TempDir()) })
}

func workerWithConcurrentUse(t *testing.T, fs FS, dir string) {
	opts := Options{WALSize: 8 << 10, SegmentSize: 4 << 10}
	l, err := Open(fs, dir, opts)
	must(t, err)
	const groups, appends = 4, 300
	var wg sync.WaitGroup
	for g := uint64(0); g < groups; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var held [][]Entry
			var releases []func()
			for i := uint64(1); i <= appends; i++ {
				if err := l.Append(Batch{Group: g, Entries: []Entry{{Index: i, Term: 1, Data: payload(g, i)}}}); err != nil {
					t.Error(err)
					return
				}
				if i%25 == 0 {
					// Every third entry stays live below the compaction point.
					if err := l.Compact(g, i-10, liveBelow(i-10)); err != nil {
						t.Error(err)
						return
					}
					k := (i - 10) / 3 * 3
					es, release, err := l.EntriesView(g, k, k+1)
					if err != nil {
						t.Errorf("group %d live %d: %v", g, k, err)
						return
					}
					held, releases = append(held, es), append(releases, release)
				}
			}
			for i, es := range held {
				if !bytes.Equal(es[0].Data, payload(g, es[0].Index)) {
					t.Errorf("group %d: held view of %d changed", g, es[0].Index)
				}
				releases[i]()
			}
		}()
	}
	wg.Wait()
	must(t, l.Maintain())
	st := l.Stats()
	if st.Moved == 0 || st.DeletedFiles == 0 {
		t.Fatalf("the worker did nothing: %+v", st)
	}
	check := func(l *Log) {
		t.Helper()
		for g := uint64(0); g < groups; g++ {
			first := l.FirstIndex(g)
			if first != appends-9 || l.LastIndex(g) != appends {
				t.Fatalf("group %d range %d..%d", g, first, l.LastIndex(g))
			}
			must(t, l.Compact(g, first-1, liveBelow(first-1)))
			for _, k := range append(liveBelow(first-1), first, appends) {
				es, release, err := l.EntriesView(g, k, k+1)
				if err != nil || !bytes.Equal(es[0].Data, payload(g, k)) {
					t.Fatalf("group %d entry %d: %v", g, k, err)
				}
				release()
			}
		}
	}
	check(l)
	must(t, l.Close())
	if mem, ok := fs.(*MemFS); ok {
		fs = mem.Crash(0)
	}
	l2, err := Open(fs, dir, opts)
	must(t, err)
	check(l2)
	must(t, l2.Close())
}

// TestNewerFormatVersionIsRefused: a file written by a later format is
// refused with ErrVersion, and left as it is (never cut as a torn file).
func TestNewerFormatVersionIsRefused(t *testing.T) {
	fs := NewMemFS()
	l := mustOpen(t, fs)
	must(t, l.Append(Batch{Group: 1, Entries: ents(1, 3, 1, "a")}))
	must(t, l.Close())
	name := "/data/" + walName(1)
	size := fs.FileSize(name)
	fs.Corrupt(name, 6, 1) // version 4 → 6
	if _, err := Open(fs, "/data", Options{}); !errors.Is(err, ErrVersion) {
		t.Fatalf("got %v, want ErrVersion", err)
	}
	if fs.FileSize(name) != size {
		t.Fatal("a file of another version was modified")
	}
}

// TestGapRollsBack: an append refused for a gap in one batch leaves no
// trace of the batches before it in the same call.
func TestGapRollsBack(t *testing.T) {
	l := mustOpen(t, NewMemFS())
	err := l.Append(Batch{Group: 1, Entries: ents(1, 3, 1, "a")}, Batch{Group: 2, Entries: ents(1, 1, 1, "b")},
		Batch{Group: 2, Entries: ents(5, 5, 1, "gap")})
	if !errors.Is(err, ErrGap) {
		t.Fatalf("got %v, want ErrGap", err)
	}
	if l.LastIndex(1) != 0 || l.LastIndex(2) != 0 {
		t.Fatal("a refused append left entries behind")
	}
	// Had the refused batches' ranges stuck, these would be gaps.
	must(t, l.Append(Batch{Group: 1, Entries: ents(1, 1, 1, "a")}))
	must(t, l.Append(Batch{Group: 2, Entries: ents(1, 2, 1, "b")}))
	if err := l.Append(Batch{Group: 1, Entries: ents(3, 3, 1, "a")}); !errors.Is(err, ErrGap) {
		t.Fatalf("got %v, want ErrGap", err)
	}
	if err := l.Append(Batch{Group: 3, Entries: ents(0, 0, 1, "zero")}); !errors.Is(err, ErrGap) {
		t.Fatalf("index 0: got %v, want ErrGap", err)
	}
	if err := l.Compact(1, 1, []uint64{1, 0}); err == nil {
		t.Fatal("an unsorted live set was taken")
	}
	if l.FirstIndex(1) != 1 {
		t.Fatal("a refused compaction compacted")
	}
	if err := l.Truncate(1, 0); err == nil || l.LastIndex(1) != 1 {
		t.Fatalf("Truncate from 0: %v, last %d", err, l.LastIndex(1))
	}
}

// TestLayout: sealed WAL files are moved into one segment file per group
// and deleted; segment files left with nothing live are deleted; a lost
// segment file is reported naming the group and the entries, and Repair
// truncates the group's log there.
func TestLayout(t *testing.T) {
	fs := NewMemFS()
	opts := Options{Manual: true, SegmentSize: 2 << 10}
	l, err := Open(fs, "/data", opts)
	must(t, err)
	big := func(g, lo, hi uint64) []Entry {
		var out []Entry
		for i := lo; i <= hi; i++ {
			out = append(out, Entry{Index: i, Term: 1, Data: bytes.Repeat([]byte{byte(g)}, 300)})
		}
		return out
	}
	must(t, l.Append(Batch{Group: 1, Entries: big(1, 1, 20)}, Batch{Group: 2, Entries: big(2, 1, 5)}))
	l.Rotate()
	must(t, l.Append(Batch{Group: 2, Entries: big(2, 6, 6)}))
	must(t, l.Maintain())
	files, _ := fs.List("/data")
	var wals, segs1, segs2 int
	for _, f := range files {
		_, g, wal, _ := parseName(f)
		switch {
		case wal:
			wals++
		case g == 1:
			segs1++
		case g == 2:
			segs2++
		}
	}
	// 20 × 300 B of group 1 in 2 KiB segment files: several; group 2's
	// five fit in one; the sealed WAL file is gone.
	if wals != 1 || segs1 < 3 || segs2 != 1 {
		t.Fatalf("files after the move: %v", files)
	}
	// Nothing of group 1 below 19 is live any more: its sealed segment
	// files go.
	must(t, l.Compact(1, 18, nil))
	must(t, l.Maintain())
	files, _ = fs.List("/data")
	segs1 = 0
	for _, f := range files {
		if _, g, wal, _ := parseName(f); !wal && g == 1 {
			segs1++
		}
	}
	if segs1 != 1 {
		t.Fatalf("group 1 should keep only the segment file holding 19..20: %v", files)
	}
	es, err := l.Entries(1, 19, 21)
	must(t, err)
	if len(es) != 2 || es[1].Data[0] != 1 {
		t.Fatalf("entries after deletion: %+v", es)
	}
	must(t, l.Close())

	// Lose group 2's segment file: its raft log has a hole now.
	for _, f := range files {
		if _, g, wal, _ := parseName(f); !wal && g == 2 {
			must(t, fs.Remove("/data/"+f))
		}
	}
	_, err = Open(fs, "/data", opts)
	if !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), "group 2: entries 1..6") {
		t.Fatalf("got %v, want ErrCorrupt naming group 2 entries 1..6", err)
	}
	opts.Repair = true
	l, err = Open(fs, "/data", opts)
	must(t, err)
	if l.LastIndex(2) >= l.FirstIndex(2) || l.LastIndex(1) != 20 {
		t.Fatalf("after repair: group 2 %d..%d, group 1 last %d", l.FirstIndex(2), l.LastIndex(2), l.LastIndex(1))
	}
	must(t, l.Close())
}

// TestWriteFailureStopsTheEngine: a failed write, like a failed fsync,
// stops the engine, also in the background mover.
func TestWriteFailureStopsTheEngine(t *testing.T) {
	fs := NewMemFS()
	l, err := Open(fs, "/data", Options{Manual: true})
	must(t, err)
	must(t, l.Append(Batch{Group: 1, Entries: ents(1, 1, 1, "a")}))
	l.Rotate()
	must(t, l.Append(Batch{Group: 1, Entries: ents(2, 2, 1, "b")}))
	fs.FailWrite(2) // the segment file's header is written, then its first record fails
	if err := l.Maintain(); !errors.Is(err, ErrStopped) {
		t.Fatalf("mover: got %v, want ErrStopped", err)
	}
	if err := l.Append(Batch{Group: 1, Entries: ents(3, 3, 1, "c")}); !errors.Is(err, ErrStopped) {
		t.Fatalf("append after a failed write: %v", err)
	}
	l2, err := Open(fs.Crash(0), "/data", Options{Manual: true})
	must(t, err)
	if l2.LastIndex(1) != 2 {
		t.Fatalf("recovered last %d, want 2", l2.LastIndex(1))
	}
}

// TestPromiseOutlivesItsWALFile: a move's promise record lands in one WAL
// file; if the WAL rotates before the move finishes and that file is then
// moved and deleted, the next checkpoint must still promise the synced
// size. Otherwise damage in the newest copy of an index would be cut as a
// torn tail and an older copy, of an older term, served in its place.
func TestPromiseOutlivesItsWALFile(t *testing.T) {
	fs := NewMemFS()
	l, err := Open(fs, "/data", Options{Manual: true})
	must(t, err)
	seal := func(g2 uint64) { // seal the current WAL file with one more append
		l.Rotate()
		must(t, l.Append(Batch{Group: 2, Entries: ents(g2, g2, 1, "other")}))
	}
	must(t, l.Append(Batch{Group: 1, Entries: ents(1, 3, 1, "old")}))
	seal(1)
	must(t, l.Maintain()) // 1..3 of term 1 in group 1's segment file
	must(t, l.Append(Batch{Group: 1, Entries: ents(3, 3, 2, "new")}))
	seal(2)
	l.promisedHook = func() {
		l.promisedHook = nil
		seal(3) // the WAL file holding the promise is sealed, to be moved and deleted
	}
	must(t, l.Maintain()) // index 3 of term 2 appended to the same segment file
	must(t, l.Close())

	var seg string
	files, _ := fs.List("/data")
	for _, f := range files {
		if _, g, wal, _ := parseName(f); !wal && g == 1 {
			seg = "/data/" + f
		} else if wal && f == walName(3) {
			t.Fatalf("the WAL file with the promise was not deleted: %v", files)
		}
	}
	// Damage the last record: the term-2 copy of index 3.
	fs.Corrupt(seg, fs.FileSize(seg)-8, 0)
	l2, err := Open(fs, "/data", Options{Manual: true})
	if err == nil {
		es, err := l2.Entries(1, 3, 4)
		t.Fatalf("damage in a promised part was cut as a torn tail: index 3 reads %q (term %d), %v", es[0].Data, es[0].Term, err)
	}
	if !errors.Is(err, ErrCorrupt) {
		t.Fatal(err)
	}
	// Repair cuts the damage; opening again with Repair does not trip over
	// the promise of the bytes that were cut (without Repair it does, until
	// the WAL files from before the repair have been moved).
	l2, err = Open(fs, "/data", Options{Manual: true, Repair: true})
	must(t, err)
	must(t, l2.Close())
	l2, err = Open(fs, "/data", Options{Manual: true, Repair: true})
	must(t, err)
	must(t, l2.Close())
}

// TestRemoveGroup: a removed group's entries, hard state and files are
// gone (the worker deletes its segment files), before and after a reopen;
// the other groups are intact; its id starts afresh when reused.
func TestRemoveGroup(t *testing.T) {
	fs := NewMemFS()
	opts := Options{Manual: true, WALSize: 2048, SegmentSize: 1024}
	l, err := Open(fs, "/data", opts)
	must(t, err)
	for i := uint64(0); i < 20; i++ {
		must(t, l.Append(Batch{Group: 7, Entries: ents(1+3*i, 3+3*i, 1, "a"), HardState: &HardState{Term: 1, Commit: 3 * i}},
			Batch{Group: 8, Entries: ents(1+3*i, 3+3*i, 1, "b")}))
	}
	l.Rotate()
	must(t, l.Append(Batch{Group: 8, Entries: ents(61, 61, 1, "b")}))
	must(t, l.Maintain())
	segFiles := func(g uint64) []string {
		names, _ := fs.List("/data")
		prefix := fmt.Sprintf("seg-%016x-", g)
		return slices.DeleteFunc(names, func(n string) bool { return !strings.HasPrefix(n, prefix) })
	}
	if len(segFiles(7)) == 0 {
		t.Fatal("setup: group 7 has no segment files")
	}
	must(t, l.RemoveGroup(7))
	check := func(l *Log, when string) {
		t.Helper()
		if g := l.Groups(); !slices.Equal(g, []uint64{8}) {
			t.Fatalf("%s: groups %v, want [8]", when, g)
		}
		if _, ok := l.HardState(7); ok || l.LastIndex(7) != 0 || l.FirstIndex(7) != 1 {
			t.Fatalf("%s: group 7 still has state: %d..%d", when, l.FirstIndex(7), l.LastIndex(7))
		}
		if _, err := l.Entries(7, 1, 2); !errors.Is(err, ErrUnavailable) {
			t.Fatalf("%s: group 7 entry 1: %v", when, err)
		}
		es, err := l.Entries(8, 1, 62)
		must(t, err)
		if len(es) != 61 || string(es[60].Data) != string(ents(61, 61, 1, "b")[0].Data) {
			t.Fatalf("%s: group 8 has %d entries", when, len(es))
		}
	}
	check(l, "after RemoveGroup")
	must(t, l.Maintain())
	if f := segFiles(7); len(f) != 0 {
		t.Fatalf("group 7's segment files are still on disk after maintenance: %v", f)
	}
	check(l, "after Maintain")
	must(t, l.Close())
	l, err = Open(fs, "/data", opts)
	must(t, err)
	check(l, "after reopen")
	// The id starts afresh.
	must(t, l.Append(Batch{Group: 7, Entries: ents(1, 2, 5, "c")}))
	must(t, l.Close())
	l, err = Open(fs, "/data", opts)
	must(t, err)
	defer l.Close()
	if l.FirstIndex(7) != 1 || l.LastIndex(7) != 2 {
		t.Fatalf("reused group 7: %d..%d, want 1..2", l.FirstIndex(7), l.LastIndex(7))
	}
	if _, ok := l.HardState(7); ok {
		t.Fatal("reused group 7 has the removed group's hard state")
	}
}

// TestRemoveGroupCrashBeforeDelete: a crash after RemoveGroup is durable
// but before the worker deleted the group's files: recovery drops the
// group and the files go at the next maintenance.
func TestRemoveGroupCrashBeforeDelete(t *testing.T) {
	fs := NewMemFS()
	opts := Options{Manual: true, WALSize: 2048, SegmentSize: 1024}
	l, err := Open(fs, "/data", opts)
	must(t, err)
	for i := uint64(0); i < 20; i++ {
		must(t, l.Append(Batch{Group: 7, Entries: ents(1+3*i, 3+3*i, 1, "a")}, Batch{Group: 8, Entries: ents(1+3*i, 3+3*i, 1, "b")}))
	}
	l.Rotate()
	must(t, l.Append(Batch{Group: 8, Entries: ents(61, 61, 1, "b")}))
	must(t, l.Maintain())
	must(t, l.RemoveGroup(7))
	crashed := fs.Crash(0)
	l.Close()
	l, err = Open(crashed, "/data", opts)
	must(t, err)
	defer l.Close()
	if g := l.Groups(); !slices.Equal(g, []uint64{8}) {
		t.Fatalf("groups %v after recovery, want [8]", g)
	}
	must(t, l.Maintain())
	names, _ := crashed.List("/data")
	for _, n := range names {
		if strings.HasPrefix(n, fmt.Sprintf("seg-%016x-", 7)) {
			t.Fatalf("group 7's file %s survived recovery and maintenance", n)
		}
	}
}

// TestRemoveGroupNeverInVersion1File: a log whose WAL file is version 1
// (written by an older build) starts a new WAL file for a remove record,
// so an older build refuses the log (ErrVersion) rather than misreading it.
func TestRemoveGroupNeverInVersion1File(t *testing.T) {
	fs := NewMemFS()
	l := mustOpen(t, fs)
	must(t, l.Append(Batch{Group: 1, Entries: ents(1, 3, 1, "a")}, Batch{Group: 2, Entries: ents(1, 3, 1, "b")}))
	must(t, l.Close())
	name := "/data/" + walName(1)
	for b := uint(0); b < 8; b++ { // the version → 1
		if (formatVersion^1)>>b&1 != 0 {
			fs.Corrupt(name, 6, b)
		}
	}
	l = mustOpen(t, fs)
	must(t, l.RemoveGroup(1))
	must(t, l.Close())
	l = mustOpen(t, fs)
	defer l.Close()
	if g := l.Groups(); !slices.Equal(g, []uint64{2}) {
		t.Fatalf("groups %v, want [2]", g)
	}
}

// removeHookFS runs hook once, right after the first Remove of a file
// whose name starts with prefix.
type removeHookFS struct {
	*MemFS
	prefix string
	hook   func()
}

func (h *removeHookFS) Remove(name string) error {
	err := h.MemFS.Remove(name)
	if f := h.hook; f != nil && strings.HasPrefix(name[strings.LastIndexByte(name, '/')+1:], h.prefix) {
		h.hook = nil
		f()
	}
	return err
}

// TestRemoveGroupWhileDeletingDeadSegment: a group removed while
// Maintain deletes one of its emptied segment files (after Maintain took
// the dead list, before it forgot the file) does not get that file deleted
// a second time by the next Maintain: that failed with "file does not
// exist" and stopped the engine (the broker's crash simulation, seed 886:
// a clean stop that lost the last settles, since the node had stopped).
func TestRemoveGroupWhileDeletingDeadSegment(t *testing.T) {
	mem := NewMemFS()
	fs := &removeHookFS{MemFS: mem, prefix: fmt.Sprintf("seg-%016x-", 7)}
	opts := Options{Manual: true, WALSize: 2048, SegmentSize: 1024}
	l, err := Open(fs, "/data", opts)
	must(t, err)
	defer l.Close()
	for i := uint64(0); i < 20; i++ {
		must(t, l.Append(Batch{Group: 7, Entries: ents(1+3*i, 3+3*i, 1, "a")}, Batch{Group: 8, Entries: ents(1+3*i, 3+3*i, 1, "b")}))
	}
	l.Rotate()
	must(t, l.Append(Batch{Group: 8, Entries: ents(61, 61, 1, "b")}))
	must(t, l.Maintain()) // group 7's entries now in its sealed segment files
	must(t, l.Compact(7, 50, nil))
	removed := false
	fs.hook = func() {
		// Maintain is deleting group 7's emptied segment file(s) now.
		removed = true
		must(t, l.RemoveGroup(7))
	}
	must(t, l.Maintain())
	if !removed {
		t.Fatal("setup: Maintain deleted no segment file of group 7 (the compaction emptied none)")
	}
	if err := l.Maintain(); err != nil {
		t.Fatalf("Maintain after the group was removed while its emptied segment file was being deleted: %v", err)
	}
	if err := l.Append(Batch{Group: 8, Entries: ents(62, 62, 1, "b")}); err != nil {
		t.Fatalf("append after that Maintain: %v", err)
	}
}

// TestAppendToOlderWALLeavesTagsZero: records this build appends to an
// active WAL file of an older format version carry no write tag (bytes
// 13..15 zero, as that version requires): an older build reading the file
// back must not take them for damage and cut them (a review found the
// write's last record tagged, and build 9eb919a dropped five acknowledged
// appends without an error).
func TestAppendToOlderWALLeavesTagsZero(t *testing.T) {
	fs := NewMemFS()
	l := mustOpen(t, fs)
	must(t, l.Append(Batch{Group: 1, Entries: ents(1, 3, 1, "a")}))
	must(t, l.Close())
	name := "/data/" + walName(1)
	for b := uint(0); b < 8; b++ { // the version → 4, the one before write tags
		if (formatVersion^4)>>b&1 != 0 {
			fs.Corrupt(name, 6, b)
		}
	}
	before := fs.FileSize(name)
	l = mustOpen(t, fs)
	for i := uint64(4); i <= 8; i++ {
		must(t, l.Append(Batch{Group: 1, Entries: ents(i, i, 1, "b")}))
	}
	must(t, l.Close())
	if after := fs.FileSize(name); after <= before {
		t.Fatalf("nothing appended to the version-4 file (%d bytes before, %d after)", before, after)
	}
	h, err := fs.Open(name)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	buf := make([]byte, fs.FileSize(name))
	if _, err := h.ReadAt(buf, 0); err != nil {
		t.Fatal(err)
	}
	if v := binary.LittleEndian.Uint16(buf[6:]); v != 4 {
		t.Fatalf("the file's version is %d, want it left at 4", v)
	}
	appended := 0
	for off := int(before); off+recordHeader <= len(buf); {
		n := int(binary.LittleEndian.Uint32(buf[off+4:]))
		if n == 0 && binary.LittleEndian.Uint32(buf[off:]) == 0 {
			break // the rest is unwritten
		}
		if tag := buf[off+13 : off+16]; tag[0]|tag[1]|tag[2] != 0 {
			t.Fatalf("record at %d appended to a version-4 file carries tag bytes % x, want zero", off, tag)
		}
		appended++
		off += padded(recordHeader + n)
	}
	if appended == 0 {
		t.Fatal("no appended record found")
	}
}
