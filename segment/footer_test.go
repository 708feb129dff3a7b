package segment

import (
	"bytes"
	"errors"
	"strings"
	"sync"
	"testing"
)

// countFS counts the bytes Open reads of segment files: mapped (a mapping
// is counted whole, as a scan touches all of it) or read with ReadAt.
type countFS struct {
	FS
	mu   sync.Mutex
	read int64
}

type countFile struct {
	File
	fs   *countFS
	name string
}

func (c *countFS) Open(name string) (File, error) {
	f, err := c.FS.Open(name)
	if err != nil {
		return nil, err
	}
	return &countFile{File: f, fs: c, name: name}, nil
}

func (c *countFS) add(name string, n int64) {
	if strings.HasSuffix(name, ".seg") {
		c.mu.Lock()
		c.read += n
		c.mu.Unlock()
	}
}

func (c *countFS) bytesRead() int64 { c.mu.Lock(); defer c.mu.Unlock(); return c.read }

func (f *countFile) ReadAt(p []byte, off int64) (int, error) {
	n, err := f.File.ReadAt(p, off)
	f.fs.add(f.name, int64(n))
	return n, err
}

func (f *countFile) Map(size int64) ([]byte, func() error, error) {
	mp, ok := f.File.(mapper)
	if !ok {
		return nil, nil, errNoMap
	}
	data, unmap, err := mp.Map(size)
	if err == nil {
		sz, _ := f.File.Size()
		f.fs.add(f.name, min(int64(len(data)), sz))
	}
	return data, unmap, err
}

// sealedLog writes groups × n entries of 300 bytes into 4 KiB segment
// files (most of them sealed) and closes the log.
func sealedLog(t *testing.T, fs FS, groups, n uint64) {
	t.Helper()
	l, err := Open(fs, "/data", Options{Manual: true, SegmentSize: 4 << 10})
	must(t, err)
	for g := uint64(1); g <= groups; g++ {
		var es []Entry
		for i := uint64(1); i <= n; i++ {
			es = append(es, Entry{Index: i, Term: 1, Data: bytes.Repeat([]byte{byte(g + i)}, 300)})
		}
		must(t, l.Append(Batch{Group: g, Entries: es}))
	}
	l.Rotate()
	must(t, l.Append(Batch{Group: 1, HardState: &HardState{Term: 1, Commit: n}}))
	must(t, l.Maintain())
	must(t, l.Close())
}

func segBytes(fs *MemFS) int64 {
	names, _ := fs.List("/data")
	var total int64
	for _, n := range names {
		if strings.HasSuffix(n, ".seg") {
			total += fs.FileSize("/data/" + n)
		}
	}
	return total
}

// TestOpenReadsFooters: opening a log of sealed segment files reads each
// one's index footer, not the whole file; the entries still read back
// intact afterwards.
func TestOpenReadsFooters(t *testing.T) {
	mem := NewMemFS()
	const groups, n = 8, 200
	sealedLog(t, mem, groups, n)
	total := segBytes(mem)
	cfs := &countFS{FS: mem}
	l, err := Open(cfs, "/data", Options{Manual: true, SegmentSize: 4 << 10})
	must(t, err)
	read := cfs.bytesRead()
	t.Logf("segment files: %d bytes; read at open: %d", total, read)
	if read*10 > total {
		t.Fatalf("opening read %d of %d bytes of segment files: more than a tenth (the index footers)", read, total)
	}
	for g := uint64(1); g <= groups; g++ {
		es, err := l.Entries(g, 1, n+1)
		must(t, err)
		for i, e := range es {
			if !bytes.Equal(e.Data, bytes.Repeat([]byte{byte(g + uint64(i) + 1)}, 300)) {
				t.Fatalf("group %d entry %d: wrong data", g, e.Index)
			}
		}
	}
	must(t, l.Close())
}

// TestFooterCorruption: a bit flipped in a sealed file's entries is found
// when the entry is first read (ErrCorrupt, naming the file), not at
// Open; a bit flipped in the footer makes Open scan the file and report
// the damage.
func TestFooterCorruption(t *testing.T) {
	mem := NewMemFS()
	sealedLog(t, mem, 1, 40)
	names, _ := mem.List("/data")
	var seg string
	for _, nm := range names {
		if strings.HasSuffix(nm, ".seg") {
			seg = "/data/" + nm
			break
		}
	}
	size := mem.FileSize(seg)

	// An entry's data.
	entries := mem.Crash(0)
	entries.Corrupt(seg, fileHeader+recordHeader+12+entryHeader+7, 3)
	l, err := Open(entries, "/data", Options{Manual: true, SegmentSize: 4 << 10})
	must(t, err)
	if _, err := l.Entries(1, 1, 2); !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), seg[len("/data/"):]) {
		t.Fatalf("reading a corrupt entry: %v, want ErrCorrupt naming %s", err, seg)
	}
	must(t, l.Close())

	// The footer: its last bytes, then its middle.
	for _, off := range []int64{size - 1, size - 40} {
		footer := mem.Crash(0)
		footer.Corrupt(seg, off, 1)
		if _, err := Open(footer, "/data", Options{Manual: true, SegmentSize: 4 << 10}); !errors.Is(err, ErrCorrupt) {
			t.Fatalf("footer flipped at %d of %d: Open got %v, want ErrCorrupt", off, size, err)
		}
	}
}

// TestCrashWhileWritingFooter: a move that seals segment files is cut by
// a failed sync at each point in turn, then the machine crashes with a
// torn tail of every length; recovery must serve every entry intact
// (footers torn or missing are scanned as before), and once the move is
// done again the next Open loads the sealed files from their footers.
func TestCrashWhileWritingFooter(t *testing.T) {
	const groups, n = 2, 60
	opts := Options{Manual: true, SegmentSize: 4 << 10}
	want := func(g, i uint64) []byte { return bytes.Repeat([]byte{byte(g*7 + i)}, 300) }
	check := func(t *testing.T, l *Log) {
		t.Helper()
		for g := uint64(1); g <= groups; g++ {
			es, err := l.Entries(g, 1, n+1)
			must(t, err)
			for _, e := range es {
				if !bytes.Equal(e.Data, want(g, e.Index)) {
					t.Fatalf("group %d entry %d differs", g, e.Index)
				}
			}
		}
	}
	tornSeen := false
	for k := 1; ; k++ {
		mem := NewMemFS()
		l, err := Open(mem, "/data", opts)
		must(t, err)
		for g := uint64(1); g <= groups; g++ {
			var es []Entry
			for i := uint64(1); i <= n; i++ {
				es = append(es, Entry{Index: i, Term: 1, Data: want(g, i)})
			}
			must(t, l.Append(Batch{Group: g, Entries: es}))
		}
		l.Rotate()
		must(t, l.Append(Batch{Group: 1, HardState: &HardState{Term: 1, Commit: n}}))
		mem.FailSync(k)
		if l.Maintain() == nil {
			l.Close()
			if !tornSeen {
				t.Fatal("no crash cut the footers written")
			}
			return // every sync point tried
		}
		for _, torn := range []int{0, 5, 17, 40, 200, 1 << 20} {
			crashed := mem.Crash(torn)
			l2, err := Open(crashed, "/data", opts)
			if err != nil {
				t.Fatalf("sync %d failed, torn %d: recovery: %v", k, torn, err)
			}
			check(t, l2)
			if torn > 0 && l2.Stats().FootersRead == 0 {
				tornSeen = true // the footers were written, not synced: torn or lost
			}
			must(t, l2.Maintain())
			must(t, l2.Close())
			l3, err := Open(crashed, "/data", opts)
			must(t, err)
			check(t, l3)
			if l3.Stats().FootersRead == 0 {
				t.Fatalf("sync %d failed, torn %d: no footer loaded after the move was redone", k, torn)
			}
			must(t, l3.Close())
		}
	}
}
