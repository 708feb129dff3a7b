package segment

import (
	"bytes"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
)

// walGateFS holds every WAL fdatasync at a gate, so a test can stop the
// engine with writes in flight: each Sync of a WAL file reports on
// syncing, then waits for a value on release (an error fails it).
type walGateFS struct {
	*MemFS
	syncing chan string
	release chan error
	open    atomic.Bool // while set, syncs pass (an Open's own writes)
}

type walGateFile struct {
	File
	g    *walGateFS
	name string
}

func (g *walGateFS) Open(name string) (File, error) {
	f, err := g.MemFS.Open(name)
	if err != nil || !strings.Contains(name, "wal-") {
		return f, err
	}
	return &walGateFile{File: f, g: g, name: name}, nil
}

func (f *walGateFile) Map(size int64) ([]byte, func() error, error) {
	return f.File.(mapper).Map(size)
}

func (f *walGateFile) Sync() error {
	if f.g.open.Load() {
		return f.File.Sync()
	}
	f.g.syncing <- f.name
	if err := <-f.g.release; err != nil {
		return err
	}
	return f.File.Sync()
}

// TestTornInFlightWrites: with two writes in flight (A in its fdatasync,
// B written after it), a power cut may keep B's bytes and lose part of
// A's. Neither was acknowledged, so Open must recover it as a torn tail,
// with and without Quarantine: cut at the first damaged byte, nothing
// acknowledged lost, nothing after the cut kept (B would leave a hole in
// the raft log).
func TestTornInFlightWrites(t *testing.T) {
	for _, lose := range []struct {
		name       string
		skip, size int
	}{
		{"A's middle", 100, 512},
		{"A's start", 0, 64},
		{"A's end and B's start", -8, 24}, // from A's last 8 bytes into B
	} {
		t.Run(lose.name, func(t *testing.T) {
			mem := NewMemFS()
			l, err := Open(mem, "/data", Options{Manual: true})
			must(t, err)
			must(t, l.Append(Batch{Group: 1, Entries: ents(1, 3, 1, "acked"), HardState: &HardState{Term: 1, Commit: 3}}))
			must(t, l.Close())

			g := &walGateFS{MemFS: mem, syncing: make(chan string), release: make(chan error)}
			g.open.Store(true)
			l, err = Open(g, "/data", Options{Manual: true})
			g.open.Store(false)
			must(t, err)
			go func() { <-g.syncing; g.release <- nil }() // the first write after Open
			must(t, l.Append(Batch{Group: 1, Entries: ents(4, 4, 1, "acked")}))
			crashed, wal, synced, sizeA := tearInFlight(t, l, g,
				[]Batch{{Group: 1, Entries: []Entry{{Index: 5, Term: 1, Data: bytes.Repeat([]byte("a"), 3000)}}}},
				[]Batch{{Group: 1, Entries: []Entry{{Index: 6, Term: 1, Data: []byte("B")}}}, {Group: 2, Entries: ents(1, 2, 1, "B")}},
				lose.skip, lose.size)
			skip := lose.skip
			if skip < 0 {
				skip += int(sizeA)
			}
			if crashed.FileSize(wal) <= synced+sizeA {
				t.Fatalf("the crash kept %d bytes, B's should survive past %d", crashed.FileSize(wal), synced+sizeA)
			}

			for _, q := range []bool{false, true} {
				fs := crashed.Crash(0)
				l2, err := Open(fs, "/data", Options{Manual: true, Quarantine: q})
				if err != nil {
					t.Fatalf("Quarantine %v: %v", q, err)
				}
				if d := l2.Damaged(); len(d) != 0 {
					t.Fatalf("Quarantine %v: damaged %+v", q, d)
				}
				if la := l2.LastIndex(2); la != 0 {
					t.Fatalf("Quarantine %v: B's group 2 kept, up to %d", q, la)
				}
				if la := l2.LastIndex(1); la != 4 {
					t.Fatalf("Quarantine %v: last index %d, want 4 (the acknowledged ones; A and B cut)", q, la)
				}
				es, err := l2.Entries(1, 1, 5)
				must(t, err)
				for i, e := range es {
					if string(e.Data) != string(ents(uint64(i+1), uint64(i+1), 1, "acked")[0].Data) {
						t.Fatalf("entry %d: %q", e.Index, e.Data)
					}
				}
				// Cut, synced, then closed by Open with a mark (markLocked).
				got := fs.FileSize(wal) - markSize
				if want := synced + int64(min(skip, int(sizeA))); got > want || got < synced {
					t.Fatalf("Quarantine %v: the WAL was cut to %d, want %d..%d (from the first damaged byte)", q, got, synced, want)
				}
				if !endsWithMark(readAllFS(t, fs, wal)[got:], walGen(t, wal)) {
					t.Fatalf("Quarantine %v: no close mark after the cut at %d", q, got)
				}
				// The log goes on: index 5 follows, and a restart finds it
				// with nothing of B after it.
				must(t, l2.Append(Batch{Group: 1, Entries: ents(5, 5, 2, "after")}))
				must(t, l2.Close())
				l3, err := Open(fs.Crash(0), "/data", Options{Manual: true})
				must(t, err)
				if la := l3.LastIndex(1); la != 5 {
					t.Fatalf("after a restart: last index %d", la)
				}
				must(t, l3.Close())
			}
		})
	}
}

// TestDamageBeforeSyncedWrite: damage in a write that the next write
// proves synced (it started alone, with nothing in flight) is damage, not
// a torn tail, even when it is in the last two writes.
func TestDamageBeforeSyncedWrite(t *testing.T) {
	mem := NewMemFS()
	l, err := Open(mem, "/data", Options{Manual: true})
	must(t, err)
	must(t, l.Append(Batch{Group: 1, Entries: ents(1, 1, 1, "a")}))
	wal := walFiles(mem)[len(walFiles(mem))-1]
	before := mem.FileSize(wal)
	must(t, l.Append(Batch{Group: 1, Entries: []Entry{{Index: 2, Term: 1, Data: bytes.Repeat([]byte("x"), 400)}}}))
	must(t, l.Append(Batch{Group: 1, Entries: ents(3, 3, 1, "c")}))
	must(t, l.Close())
	for _, q := range []bool{false, true} {
		fs := mem.Crash(0)
		fs.Corrupt(wal, before+200, 3)
		if _, err := Open(fs, "/data", Options{Manual: true, Quarantine: q}); !errors.Is(err, ErrCorrupt) {
			t.Fatalf("Quarantine %v: %v, want ErrCorrupt", q, err)
		}
	}
}

// TestWriteTags: every record of a version-5 WAL file names its write;
// each write's last record (extents included) and only it carries
// tagLast; a write that started alone carries tagAlone; numbers follow
// one another from the checkpoint's write 1.
func TestWriteTags(t *testing.T) {
	mem := NewMemFS()
	l, err := Open(mem, "/data", Options{Manual: true})
	must(t, err)
	big := bytes.Repeat([]byte("e"), 2*minExtent) // written from the caller's slice (an extent)
	must(t, l.Append(Batch{Group: 1, Entries: []Entry{{Index: 1, Term: 1, Data: big}}},
		Batch{Group: 2, Entries: ents(1, 2, 1, "x")}))
	must(t, l.Append(Batch{Group: 1, Entries: ents(2, 2, 1, "y")},
		Batch{Group: 2, Entries: []Entry{{Index: 3, Term: 1, Data: big}}}))
	must(t, l.Close())
	wal := walFiles(mem)[0]
	buf := readAllFS(t, mem, wal)
	var tags []uint32
	for off := fileHeader; ; {
		_, _, next, err := readRecord(buf, off, 1)
		if err != nil {
			if off != len(buf) {
				t.Fatalf("records end at %d of %d", off, len(buf))
			}
			break
		}
		tags = append(tags, recTag(buf, off))
		off = next
	}
	// newWAL's checkpoint (no group yet: the empty promise, write 1 alone),
	// then two writes of two records each, each started alone.
	// Close's mark, write 4, alone.
	want := []uint32{1 | tagAlone | tagLast, 2 | tagAlone, 2 | tagAlone | tagLast, 3 | tagAlone, 3 | tagAlone | tagLast, 4 | tagAlone | tagLast}
	if len(tags) != len(want) {
		t.Fatalf("tags %x, want %x", tags, want)
	}
	for i := range want {
		if tags[i] != want[i] {
			t.Fatalf("tags %x, want %x", tags, want)
		}
	}
}

// tearInFlight writes a (alone: nothing may be in flight) and b,
// pipelined behind it, into l, opened over g.MemFS through g; cuts the
// power with both in their fdatasync, losing size bytes skip bytes into
// a (a negative skip counts back from a's end) and keeping b's
// (MemFS.CrashHole); and returns the crashed filesystem, the WAL file
// written, where its synced part ended and a's size. Neither write is
// acknowledged.
func tearInFlight(t *testing.T, l *Log, g *walGateFS, a, b []Batch, skip, size int) (*MemFS, string, int64, int64) {
	t.Helper()
	wal := walFiles(g.MemFS)[len(walFiles(g.MemFS))-1]
	synced := g.MemFS.FileSize(wal)
	var wg sync.WaitGroup
	errs := make([]error, 2)
	wg.Add(1)
	go func() { defer wg.Done(); errs[0] = l.Append(a...) }()
	<-g.syncing // a is in its fdatasync
	sizeA := g.MemFS.FileSize(wal) - synced
	if skip < 0 {
		skip += int(sizeA)
	}
	wg.Add(1)
	go func() { defer wg.Done(); errs[1] = l.Append(b...) }()
	<-g.syncing // b too
	if st := l.Stats(); st.Pipelined == 0 {
		t.Fatalf("b was not pipelined behind a: %+v", st)
	}
	crashed := g.MemFS.CrashHole(skip, size, nil)
	g.release <- ErrInjected
	g.release <- ErrInjected
	wg.Wait()
	for i, err := range errs {
		if !errors.Is(err, ErrStopped) {
			t.Fatalf("write %d: %v, want ErrStopped (never acknowledged)", i, err)
		}
	}
	l.Close()
	if crashed.FileSize(wal) < synced+int64(skip+size) {
		t.Fatalf("the crash kept %d bytes of %s, the hole ends at %d: b's bytes should survive", crashed.FileSize(wal), wal, synced+int64(skip+size))
	}
	return crashed, wal, synced, sizeA
}

// openTorn opens fs, with and without Quarantine (each on a copy), and
// checks that nothing is reported damaged and that group 1's raft log is
// 1..last; it returns the log opened without Quarantine, and its copy.
func openTorn(t *testing.T, fs *MemFS, last uint64) (*Log, *MemFS) {
	t.Helper()
	for _, q := range []bool{true, false} {
		c := fs.Crash(0)
		l, err := Open(c, "/data", Options{Manual: true, Quarantine: q})
		if err != nil {
			t.Fatalf("Quarantine %v: %v", q, err)
		}
		if d := l.Damaged(); len(d) != 0 {
			t.Fatalf("Quarantine %v: damaged %+v", q, d)
		}
		if la := l.LastIndex(1); la != last {
			t.Fatalf("Quarantine %v: group 1's last index %d, want %d", q, la, last)
		}
		if la := l.LastIndex(2); la != 0 {
			t.Fatalf("Quarantine %v: the torn writes' group 2 kept, up to %d", q, la)
		}
		if !q {
			return l, c
		}
		must(t, l.Close())
	}
	panic("unreachable")
}

// TestTornFirstWriteOfEmptyLog: a WAL file started while the log held no
// group (a fresh node) has a checkpoint with no group in it; a tear in
// the first writes after it, both in flight, is a torn tail like any
// other (it was refused as damage: the damaged write could not be told
// from a damaged checkpoint). Also for a file an earlier build wrote with
// an empty checkpoint (header only), restarted before the tear.
func TestTornFirstWriteOfEmptyLog(t *testing.T) {
	for _, start := range []string{"fresh", "restarted", "earlier build's file"} {
		t.Run(start, func(t *testing.T) {
			mem := NewMemFS()
			switch start {
			case "restarted":
				l, err := Open(mem, "/data", Options{Manual: true})
				must(t, err)
				must(t, l.Close())
			case "earlier build's file":
				h, err := mem.Open("/data/" + walName(1))
				must(t, err)
				_, err = h.WriteAt(appendFileHeader(nil, walMagic, 1), 0)
				must(t, err)
				must(t, h.Sync())
				must(t, mem.SyncDir("/data"))
			}
			g := &walGateFS{MemFS: mem, syncing: make(chan string), release: make(chan error)}
			g.open.Store(true)
			l, err := Open(g, "/data", Options{Manual: true})
			must(t, err)
			g.open.Store(false)
			big := bytes.Repeat([]byte("a"), 3000)
			crashed, _, _, _ := tearInFlight(t, l, g,
				[]Batch{{Group: 1, Entries: []Entry{{Index: 1, Term: 1, Data: big}}, HardState: &HardState{Term: 1}}},
				[]Batch{{Group: 1, Entries: ents(2, 2, 1, "b")}, {Group: 2, Entries: ents(1, 2, 1, "b")}}, 0, 64)
			l2, crashed := openTorn(t, crashed, 0)
			if _, ok := l2.HardState(1); ok {
				t.Fatal("the torn write's hard state was kept")
			}
			must(t, l2.Maintain()) // a WAL file sealed at Open (the earlier build's) is moved and deleted
			must(t, l2.Append(Batch{Group: 1, Entries: ents(1, 2, 2, "after")}))
			must(t, l2.Close())
			if n := len(walFiles(crashed)); n != 1 {
				t.Fatalf("%d WAL files after maintenance, want 1", n)
			}
			l3, err := Open(crashed, "/data", Options{Manual: true})
			must(t, err)
			if la := l3.LastIndex(1); la != 2 {
				t.Fatalf("after a restart: last index %d", la)
			}
			must(t, l3.Close())
		})
	}
}

// partialWrite returns a log's files after a power cut that kept the
// first record of a write of two (group 1's entry 4) and tore the other
// (group 3's entries), and an Open that cut the torn record: group 1
// holds 1..3 acknowledged (hard state commit 3), and 4. With rotated,
// the write was a new WAL file's first, with its checkpoint.
func partialWrite(t *testing.T, rotated bool) *MemFS {
	t.Helper()
	mem := NewMemFS()
	l, err := Open(mem, "/data", Options{Manual: true})
	must(t, err)
	must(t, l.Append(Batch{Group: 1, Entries: ents(1, 3, 1, "acked"), HardState: &HardState{Term: 1, Commit: 3}}))
	if rotated {
		l.Rotate() // the next write starts a new WAL file, with it its checkpoint
	}
	wal := walFiles(mem)[len(walFiles(mem))-1]
	synced := mem.FileSize(wal)
	// The partial write: group 1's entry 4, then group 3's entries,
	// whose record is torn.
	mem.FailSync(1)
	if err := l.Append(Batch{Group: 1, Entries: ents(4, 4, 1, "partial")}, Batch{Group: 3, Entries: ents(1, 3, 1, "torn")}); !errors.Is(err, ErrStopped) {
		t.Fatalf("the partial write: %v, want ErrStopped", err)
	}
	l.Close()
	wal = walFiles(mem)[len(walFiles(mem))-1]
	if rotated {
		// The new file's directory entry reached the disk (a
		// journal commit), its data not all.
		must(t, mem.SyncDir("/data"))
		synced = 0
	}
	crashed := mem.Crash(int(mem.FileSize(wal)-synced) - 8) // all but the last 8 bytes
	l, err = Open(crashed, "/data", Options{Manual: true})
	must(t, err)
	if la, la3 := l.LastIndex(1), l.LastIndex(3); la != 4 || la3 != 0 {
		t.Fatalf("after the first crash: last indexes %d, %d; want 4, 0 (the partial write's first record kept)", la, la3)
	}
	must(t, l.Close())
	return crashed
}

// TestTornAfterKeptPartialWrite: a power cut kept the first records of a
// write of several and tore the rest; Open cut the torn record and kept
// the others (a partial write: its last record, with tagLast, is gone).
// A tear of the next two writes in flight after that restart is a torn
// tail too (it was refused as damage: the damage seemed to lie in the
// partial write, which the next write, started alone, proves synced).
// Also when the partial write is a new WAL file's first, its checkpoint
// and part of the records written with it.
func TestTornAfterKeptPartialWrite(t *testing.T) {
	for _, rotated := range []bool{false, true} {
		t.Run(fmt.Sprintf("rotated=%v", rotated), func(t *testing.T) {
			crashed := partialWrite(t, rotated)
			g := &walGateFS{MemFS: crashed, syncing: make(chan string), release: make(chan error)}
			g.open.Store(true)
			l, err := Open(g, "/data", Options{Manual: true})
			must(t, err)
			g.open.Store(false)
			big := bytes.Repeat([]byte("a"), 3000)
			torn, _, _, _ := tearInFlight(t, l, g,
				[]Batch{{Group: 1, Entries: []Entry{{Index: 5, Term: 1, Data: big}}, HardState: &HardState{Term: 1, Commit: 4}}},
				[]Batch{{Group: 1, Entries: ents(6, 6, 1, "b")}, {Group: 2, Entries: ents(1, 2, 1, "b")}}, 0, 64)
			l2, torn := openTorn(t, torn, 4)
			if hs, _ := l2.HardState(1); hs.Commit != 3 {
				t.Fatalf("hard state %+v, want the acknowledged one (commit 3)", hs)
			}
			es, err := l2.Entries(1, 1, 4)
			must(t, err)
			for i, e := range es {
				if want := fmt.Sprintf("acked-%d", i+1); string(e.Data) != want {
					t.Fatalf("entry %d: %q, want %q", e.Index, e.Data, want)
				}
			}
			must(t, l2.Append(Batch{Group: 1, Entries: ents(5, 5, 2, "after")}))
			must(t, l2.Close())
			l3, err := Open(torn, "/data", Options{Manual: true})
			must(t, err)
			if la := l3.LastIndex(1); la != 5 {
				t.Fatalf("after a restart: last index %d", la)
			}
			must(t, l3.Close())
		})
	}
}

// TestDamageNearTornShapes: what the two shapes above now cut must not
// hide damage to acknowledged data next to them. A bit flipped in a fresh
// log's empty checkpoint or in its first write, each followed by a write
// that started alone (so it was synced), is reported; so is one in a
// kept partial write, or in the first write after it (the WAL file Open
// started after it), acknowledged before the next one started.
func TestDamageNearTornShapes(t *testing.T) {
	type flip struct {
		name string
		fs   func(t *testing.T) (*MemFS, string, int64) // the files, the WAL file, the offset to flip
	}
	acked := func(t *testing.T, mem *MemFS, at func(l *Log, wal string, off []int64) int64) (*MemFS, string, int64) {
		l, err := Open(mem, "/data", Options{Manual: true})
		must(t, err)
		wal := walFiles(mem)[len(walFiles(mem))-1]
		offs := []int64{mem.FileSize(wal)} // where each write starts, and the end
		next := l.LastIndex(1) + 1
		must(t, l.Append(Batch{Group: 1, Entries: ents(next, next, 2, "first"), HardState: &HardState{Term: 2, Commit: next}}))
		offs = append(offs, mem.FileSize(wal))
		must(t, l.Append(Batch{Group: 1, Entries: ents(next+1, next+1, 2, "second")}))
		offs = append(offs, mem.FileSize(wal))
		off := at(l, wal, offs)
		must(t, l.Close())
		return mem, wal, off
	}
	for _, c := range []flip{
		{"empty checkpoint", func(t *testing.T) (*MemFS, string, int64) {
			return acked(t, NewMemFS(), func(l *Log, wal string, offs []int64) int64 { return fileHeader + 20 })
		}},
		{"first write after an empty checkpoint", func(t *testing.T) (*MemFS, string, int64) {
			return acked(t, NewMemFS(), func(l *Log, wal string, offs []int64) int64 { return offs[0] + 30 })
		}},
		{"kept partial write", func(t *testing.T) (*MemFS, string, int64) {
			mem := partialWrite(t, false)
			wal := walFiles(mem)[0] // sealed by the Open after the crash
			return mem, wal, mem.FileSize(wal) - 8
		}},
		{"first write after a kept partial write", func(t *testing.T) (*MemFS, string, int64) {
			return acked(t, partialWrite(t, false), func(l *Log, wal string, offs []int64) int64 { return offs[0] + 30 })
		}},
		{"first write after a kept partial first write", func(t *testing.T) (*MemFS, string, int64) {
			return acked(t, partialWrite(t, true), func(l *Log, wal string, offs []int64) int64 { return offs[0] + 30 })
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			mem, wal, off := c.fs(t)
			mem.Corrupt(wal, off, 2)
			_, err := Open(mem.Crash(0), "/data", Options{Manual: true})
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("a flip at %s:%d: %v, want ErrCorrupt", wal, off, err)
			}
			l, err := Open(mem.Crash(0), "/data", Options{Manual: true, Quarantine: true})
			if err == nil {
				defer l.Close()
				if d := l.Damaged(); len(d) == 0 || l.LastIndex(1) != 0 {
					t.Fatalf("Quarantine: a flip at %s:%d: opened with no damage: %+v, group 1 up to %d", wal, off, d, l.LastIndex(1))
				}
			} else if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("Quarantine: a flip at %s:%d: %v, want ErrCorrupt or group 1 quarantined", wal, off, err)
			}
		})
	}
}
