package segment

import (
	"bytes"
	"errors"
	"strings"
	"sync"
	"testing"
)

// walGateFS holds every WAL fdatasync at a gate, so a test can stop the
// engine with writes in flight: each Sync of a WAL file reports on
// syncing, then waits for a value on release (an error fails it).
type walGateFS struct {
	*MemFS
	syncing chan string
	release chan error
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
		{"A's end and B's start", 0, 0}, // set below: from A's last bytes into B
	} {
		t.Run(lose.name, func(t *testing.T) {
			mem := NewMemFS()
			l, err := Open(mem, "/data", Options{Manual: true})
			must(t, err)
			must(t, l.Append(Batch{Group: 1, Entries: ents(1, 3, 1, "acked"), HardState: &HardState{Term: 1, Commit: 3}}))
			must(t, l.Close())

			g := &walGateFS{MemFS: mem, syncing: make(chan string), release: make(chan error)}
			l, err = Open(g, "/data", Options{Manual: true})
			must(t, err)
			go func() { <-g.syncing; g.release <- nil }() // the first write after Open
			must(t, l.Append(Batch{Group: 1, Entries: ents(4, 4, 1, "acked")}))
			wal := walFiles(mem)[len(walFiles(mem))-1]
			synced := mem.FileSize(wal)

			big := bytes.Repeat([]byte("a"), 3000)
			var wg sync.WaitGroup
			errs := make([]error, 2)
			wg.Add(1)
			go func() {
				defer wg.Done()
				errs[0] = l.Append(Batch{Group: 1, Entries: []Entry{{Index: 5, Term: 1, Data: big}}})
			}()
			<-g.syncing // A is in its fdatasync
			sizeA := mem.FileSize(wal) - synced
			wg.Add(1)
			go func() {
				defer wg.Done()
				errs[1] = l.Append(Batch{Group: 1, Entries: []Entry{{Index: 6, Term: 1, Data: []byte("B")}}},
					Batch{Group: 2, Entries: ents(1, 2, 1, "B")})
			}()
			<-g.syncing // B is written, in its fdatasync too
			if st := l.Stats(); st.Pipelined == 0 {
				t.Fatalf("B was not pipelined behind A: %+v", st)
			}
			skip, size := lose.skip, lose.size
			if size == 0 {
				skip, size = int(sizeA)-8, 24
			}
			crashed := mem.CrashHole(skip, size, nil)
			g.release <- ErrInjected
			g.release <- ErrInjected
			wg.Wait()
			for i, err := range errs {
				if !errors.Is(err, ErrStopped) {
					t.Fatalf("write %d: %v, want ErrStopped (never acknowledged)", i, err)
				}
			}
			l.Close()
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
				if got, want := fs.FileSize(wal), synced+int64(min(skip, int(sizeA))); got > want || got < synced {
					t.Fatalf("Quarantine %v: the WAL was cut to %d, want %d..%d (from the first damaged byte)", q, got, synced, want)
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
	// newWAL's checkpoint (no group yet: none), then two writes of two
	// records each, each started alone.
	want := []uint32{2 | tagAlone, 2 | tagAlone | tagLast, 3 | tagAlone, 3 | tagAlone | tagLast}
	if len(tags) != len(want) {
		t.Fatalf("tags %x, want %x", tags, want)
	}
	for i := range want {
		if tags[i] != want[i] {
			t.Fatalf("tags %x, want %x", tags, want)
		}
	}
}
