package segment

import (
	"errors"
	"io"
	"os"
	"path/filepath"
	"sort"
	"sync"

	"golang.org/x/sys/unix"
)

// FS is every file operation the engine makes, so tests can run it on an
// in-memory filesystem that simulates crashes and I/O errors.
type FS interface {
	// Open opens or creates a file for reading and writing.
	Open(name string) (File, error)
	Remove(name string) error
	// List returns the names of the files in dir, sorted.
	List(dir string) ([]string, error)
	MkdirAll(dir string) error
	// SyncDir makes the directory's entries durable: files created or
	// removed in it before the call survive a crash as created or removed.
	SyncDir(dir string) error
}

// File is an open file. Writes are positional; Sync makes every write so
// far durable (fdatasync on a real disk).
type File interface {
	WriteAt(p []byte, off int64) (int, error)
	ReadAt(p []byte, off int64) (int, error)
	Sync() error
	Truncate(size int64) error
	Size() (int64, error)
	Close() error
}

// OSFS is the real filesystem.
type OSFS struct{}

func (OSFS) Open(name string) (File, error) {
	f, err := os.OpenFile(name, os.O_RDWR|os.O_CREATE, 0o640)
	if err != nil {
		return nil, err
	}
	return osFile{f}, nil
}
func (OSFS) Remove(name string) error  { return os.Remove(name) }
func (OSFS) MkdirAll(dir string) error { return os.MkdirAll(dir, 0o750) }
func (OSFS) SyncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

func (OSFS) List(dir string) ([]string, error) {
	es, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, e := range es {
		if !e.IsDir() {
			out = append(out, e.Name())
		}
	}
	return out, nil
}

type osFile struct{ f *os.File }

func (o osFile) WriteAt(p []byte, off int64) (int, error) { return o.f.WriteAt(p, off) }

// WritevAt writes bufs one after another at off: pwritev, in runs of
// at most iovMax buffers, until all is written. It consumes bufs.
func (o osFile) WritevAt(bufs [][]byte, off int64) (int, error) {
	total := 0
	for len(bufs) > 0 {
		n, err := unix.Pwritev(int(o.f.Fd()), bufs[:min(len(bufs), iovMax)], off)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return total, err
		}
		if n == 0 {
			return total, io.ErrShortWrite
		}
		total, off = total+n, off+int64(n)
		for n > 0 {
			if k := min(n, len(bufs[0])); k < len(bufs[0]) {
				bufs[0], n = bufs[0][k:], 0
			} else {
				bufs, n = bufs[1:], n-k
			}
		}
		for len(bufs) > 0 && len(bufs[0]) == 0 {
			bufs = bufs[1:]
		}
	}
	return total, nil
}

// iovMax is Linux's IOV_MAX: the most buffers one pwritev takes.
const iovMax = 1024

// vectorFile is a File that writes several buffers in one call.
type vectorFile interface {
	WritevAt(bufs [][]byte, off int64) (int, error)
}

// writevAt writes bufs one after another at off in f: in one call where
// f can (pwritev), else joined into one WriteAt (the test filesystems,
// whose write counts and torn writes are per WriteAt). It consumes bufs.
func writevAt(f File, bufs [][]byte, off int64) error {
	if v, ok := f.(vectorFile); ok {
		_, err := v.WritevAt(bufs, off)
		return err
	}
	n := 0
	for _, b := range bufs {
		n += len(b)
	}
	joined := make([]byte, 0, n)
	for _, b := range bufs {
		joined = append(joined, b...)
	}
	_, err := f.WriteAt(joined, off)
	return err
}
func (o osFile) ReadAt(p []byte, off int64) (int, error) { return o.f.ReadAt(p, off) }
func (o osFile) Sync() error                             { return unix.Fdatasync(int(o.f.Fd())) }
func (o osFile) Truncate(size int64) error               { return o.f.Truncate(size) }
func (o osFile) Close() error                            { return o.f.Close() }
func (o osFile) Size() (int64, error) {
	st, err := o.f.Stat()
	if err != nil {
		return 0, err
	}
	return st.Size(), nil
}

// ErrInjected is what MemFS returns for an injected failure.
var ErrInjected = errors.New("segment: injected I/O error")

// MemFS is an in-memory filesystem that remembers, per file, what was
// synced, and which creations and removals the directory has synced.
// Crash returns the filesystem a machine would find after losing power:
// only synced bytes survive, optionally plus a torn prefix of the unsynced
// ones; a file created since the last SyncDir is gone and a file removed
// since then is back. It is safe for concurrent use.
type MemFS struct {
	mu        sync.Mutex
	files     map[string]*memFile
	created   map[string]bool     // since the last SyncDir
	removed   map[string]*memFile // since the last SyncDir
	failSync  int                 // fail the n-th Sync from now (1 = the next); 0: never
	failWrite int
	syncs     int // Sync and SyncDir calls so far
}

type memFile struct {
	data   []byte // what reads see
	synced []byte // what survives a crash
}

// NewMemFS returns an empty MemFS.
func NewMemFS() *MemFS {
	return &MemFS{files: map[string]*memFile{}, created: map[string]bool{}, removed: map[string]*memFile{}}
}

// Syncs counts the Sync and SyncDir calls so far (a crash test picks one
// to fail).
func (m *MemFS) Syncs() int { m.mu.Lock(); defer m.mu.Unlock(); return m.syncs }

// syncFailsLocked consumes one sync and reports whether it is the one to fail.
func (m *MemFS) syncFailsLocked() bool {
	m.syncs++
	if m.failSync > 0 {
		if m.failSync--; m.failSync == 0 {
			return true
		}
	}
	return false
}

// FailSync makes the n-th Sync from now fail with ErrInjected (n ≥ 1).
func (m *MemFS) FailSync(n int) { m.mu.Lock(); m.failSync = n; m.mu.Unlock() }

// FailWrite makes the n-th WriteAt from now fail with ErrInjected.
func (m *MemFS) FailWrite(n int) { m.mu.Lock(); m.failWrite = n; m.mu.Unlock() }

// Crash returns what survives a power loss: each file's synced content;
// with tornBytes > 0, also up to tornBytes of the unsynced bytes that
// follow it (a torn write).
func (m *MemFS) Crash(tornBytes int) *MemFS {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.crashLocked(tornBytes)
}

func (m *MemFS) crashLocked(tornBytes int) *MemFS {
	out := NewMemFS()
	for name, f := range m.removed {
		out.files[name] = &memFile{data: append([]byte(nil), f.synced...), synced: append([]byte(nil), f.synced...)}
	}
	for name, f := range m.files {
		if m.created[name] {
			continue
		}
		keep := append([]byte(nil), f.synced...)
		if tornBytes > 0 && len(f.data) > len(f.synced) && bytesEqualPrefix(f.data, f.synced) {
			n := min(tornBytes, len(f.data)-len(f.synced))
			keep = append(keep, f.data[len(f.synced):len(f.synced)+n]...)
		}
		out.files[name] = &memFile{data: keep, synced: append([]byte(nil), keep...)}
	}
	return out
}

// CrashHole is Crash with the unsynced bytes reordered, as a disk may
// write them (XFS, btrfs, ext4 data=writeback): every unsynced byte that
// extends a file's synced content survives except lose bytes from skip
// bytes after the synced end, which read as zeros. A later write survives
// while part of an earlier one, not yet synced either, does not. Synced
// bytes are never touched. Only files whose name match accepts (nil: all)
// are holed; the others keep their synced content, as Crash(0).
func (m *MemFS) CrashHole(skip, lose int, match func(name string) bool) *MemFS {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := m.crashLocked(0)
	for name, f := range m.files {
		o := out.files[name]
		if o == nil || len(f.data) <= len(f.synced) || !bytesEqualPrefix(f.data, f.synced) || match != nil && !match(name) {
			continue
		}
		keep := append(o.data, f.data[len(f.synced):]...)
		lo := min(len(f.synced)+skip, len(keep))
		clear(keep[lo:min(lo+lose, len(keep))])
		o.data, o.synced = keep, append([]byte(nil), keep...)
	}
	return out
}

func bytesEqualPrefix(data, prefix []byte) bool {
	return len(data) >= len(prefix) && string(data[:len(prefix)]) == string(prefix)
}

// Corrupt flips one bit of a file, as bit rot would.
func (m *MemFS) Corrupt(name string, off int64, bit uint) {
	m.mu.Lock()
	defer m.mu.Unlock()
	f := m.files[name]
	f.data[off] ^= 1 << bit
	f.synced[off] ^= 1 << bit
}

// FileSize is a file's current size (for tests).
func (m *MemFS) FileSize(name string) int64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return int64(len(m.files[name].data))
}

func (m *MemFS) Open(name string) (File, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	name = filepath.Clean(name)
	f := m.files[name]
	if f == nil {
		f = &memFile{}
		m.files[name] = f
		if _, ok := m.removed[name]; !ok {
			m.created[name] = true
		}
	}
	return &memHandle{fs: m, f: f}, nil
}

func (m *MemFS) Remove(name string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	name = filepath.Clean(name)
	f, ok := m.files[name]
	if !ok {
		return os.ErrNotExist
	}
	delete(m.files, name)
	if m.created[name] {
		delete(m.created, name)
	} else if _, ok := m.removed[name]; !ok {
		m.removed[name] = f
	}
	return nil
}

func (m *MemFS) MkdirAll(string) error { return nil }

func (m *MemFS) SyncDir(dir string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.syncFailsLocked() {
		return ErrInjected
	}
	dir = filepath.Clean(dir)
	for name := range m.created {
		if filepath.Dir(name) == dir {
			delete(m.created, name)
		}
	}
	for name := range m.removed {
		if filepath.Dir(name) == dir {
			delete(m.removed, name)
		}
	}
	return nil
}

func (m *MemFS) List(dir string) ([]string, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []string
	for name := range m.files {
		if filepath.Dir(name) == filepath.Clean(dir) {
			out = append(out, filepath.Base(name))
		}
	}
	sort.Strings(out)
	return out, nil
}

type memHandle struct {
	fs *MemFS
	f  *memFile
}

func (h *memHandle) WriteAt(p []byte, off int64) (int, error) {
	h.fs.mu.Lock()
	defer h.fs.mu.Unlock()
	if h.fs.failWrite > 0 {
		if h.fs.failWrite--; h.fs.failWrite == 0 {
			return 0, ErrInjected
		}
	}
	if end := int(off) + len(p); end > len(h.f.data) {
		h.f.data = append(h.f.data, make([]byte, end-len(h.f.data))...)
	}
	copy(h.f.data[off:], p)
	return len(p), nil
}

func (h *memHandle) ReadAt(p []byte, off int64) (int, error) {
	h.fs.mu.Lock()
	defer h.fs.mu.Unlock()
	if off >= int64(len(h.f.data)) {
		return 0, io.EOF
	}
	n := copy(p, h.f.data[off:])
	if n < len(p) {
		return n, io.EOF
	}
	return n, nil
}

func (h *memHandle) Sync() error {
	h.fs.mu.Lock()
	defer h.fs.mu.Unlock()
	if h.fs.syncFailsLocked() {
		return ErrInjected
	}
	h.f.synced = append(h.f.synced[:0], h.f.data...)
	return nil
}

func (h *memHandle) Truncate(size int64) error {
	h.fs.mu.Lock()
	defer h.fs.mu.Unlock()
	if size < int64(len(h.f.data)) {
		h.f.data = h.f.data[:size]
	} else {
		h.f.data = append(h.f.data, make([]byte, size-int64(len(h.f.data)))...)
	}
	// Truncation is metadata; like the size, it is durable with the next
	// sync. Model it as immediate for shrinking (repair truncates, then
	// syncs).
	if int64(len(h.f.synced)) > size {
		h.f.synced = h.f.synced[:size]
	}
	return nil
}

func (h *memHandle) Size() (int64, error) {
	h.fs.mu.Lock()
	defer h.fs.mu.Unlock()
	return int64(len(h.f.data)), nil
}

func (h *memHandle) Close() error { return nil }
