package segment

import (
	"bufio"
	"errors"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"
)

// PowerLossFS is the real filesystem as a power cut would leave it, for
// tests of whole processes (warrend with WARREN_TEST_POWERLOSS=1): a
// write stays in this process's memory until its file's Sync, which
// writes it to the file and calls fdatasync, so a kill -9 loses every
// write not synced, as a power cut would (a plain kill -9 does not: the
// kernel's page cache outlives the process). Reads see the unsynced
// writes. Directory entries follow the same rule: a file created since
// its directory's last SyncDir is deleted at the next start (its name is
// kept in a journal file, PowerLossJournal, in the directory, which List
// hides), and a removal takes effect on disk at the next SyncDir (until
// then List and Open no longer see the file, and a kill brings it back).
//
// Every end of the process counts as a power cut, a clean exit too: there
// is no flush at Close. Mappings (the engine's reads) show what is on
// disk, which is what was synced; the engine reads only below a file's
// synced size. Unsynced bytes are lost whole, never torn. It is safe for
// concurrent use.
type PowerLossFS struct {
	mu    sync.Mutex
	dirs  map[string]*plDir
	files map[string]*plNode // open, or closed with unsynced writes
}

// PowerLossJournal is the file, in each directory a PowerLossFS uses,
// naming the files created there since the directory's last SyncDir.
const PowerLossJournal = ".powerloss-unsynced-creates"

type plDir struct {
	created map[string]bool // since the last SyncDir (also in the journal)
	removed map[string]bool // removed since the last SyncDir: still on disk
}

// plNode is one file: its descriptor, shared by every handle, and its
// unsynced writes.
type plNode struct {
	mu   sync.Mutex
	name string
	f    *os.File
	refs int
	pend []plExtent // unsynced writes, in order
	size int64      // what Size reports: the disk's size, grown by pend
}

type plExtent struct {
	off int64
	b   []byte
}

// NewPowerLossFS returns a PowerLossFS. A directory's leftovers from the
// previous process (files created and not made durable in it) are
// deleted the first time the directory is used.
func NewPowerLossFS() *PowerLossFS {
	return &PowerLossFS{dirs: map[string]*plDir{}, files: map[string]*plNode{}}
}

var powerLoss atomic.Pointer[PowerLossFS]

// UsePowerLoss makes every Open on OSFS from now on use one PowerLossFS
// instead (for warrend's test-only power-loss mode). It returns that FS.
func UsePowerLoss() *PowerLossFS {
	p := NewPowerLossFS()
	if !powerLoss.CompareAndSwap(nil, p) {
		return powerLoss.Load()
	}
	return p
}

var testSizes atomic.Pointer[[2]int64]

// UseTestSizes makes every Open from now on that leaves Options.WALSize
// or Options.SegmentSize unset (0) use these instead (0 keeps the
// default): small files make a short test rotate WAL files and write
// segment files (warrend's WARREN_TEST_WAL_SIZE, WARREN_TEST_SEGMENT_SIZE).
func UseTestSizes(wal, seg int64) { testSizes.Store(&[2]int64{wal, seg}) }

// testHooks is Open's hook: OSFS becomes the PowerLossFS once
// UsePowerLoss was called, and UseTestSizes fills in file sizes.
func testHooks(fsys FS, opts Options) (FS, Options) {
	if _, ok := fsys.(OSFS); ok {
		if p := powerLoss.Load(); p != nil {
			fsys = p
		}
	}
	if ts := testSizes.Load(); ts != nil {
		if opts.WALSize == 0 {
			opts.WALSize = ts[0]
		}
		if opts.SegmentSize == 0 {
			opts.SegmentSize = ts[1]
		}
	}
	return fsys, opts
}

// dirLocked returns dir's state, first deleting the files the journal
// says were created and never made durable in it (a power cut loses
// them).
func (p *PowerLossFS) dirLocked(dir string) (*plDir, error) {
	dir = filepath.Clean(dir)
	if d := p.dirs[dir]; d != nil {
		return d, nil
	}
	j := filepath.Join(dir, PowerLossJournal)
	if b, err := os.ReadFile(j); err == nil {
		sc := bufio.NewScanner(strings.NewReader(string(b)))
		for sc.Scan() {
			if name := sc.Text(); name != "" && !strings.ContainsRune(name, '/') {
				if err := os.Remove(filepath.Join(dir, name)); err != nil && !errors.Is(err, fs.ErrNotExist) {
					return nil, err
				}
			}
		}
		if err := os.Remove(j); err != nil {
			return nil, err
		}
	} else if !errors.Is(err, fs.ErrNotExist) {
		return nil, err
	}
	d := &plDir{created: map[string]bool{}, removed: map[string]bool{}}
	p.dirs[dir] = d
	return d, nil
}

func (p *PowerLossFS) MkdirAll(dir string) error {
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	_, err := p.dirLocked(dir)
	return err
}

func (p *PowerLossFS) Open(name string) (File, error) {
	name = filepath.Clean(name)
	dir, base := filepath.Split(name)
	p.mu.Lock()
	defer p.mu.Unlock()
	d, err := p.dirLocked(dir)
	if err != nil {
		return nil, err
	}
	if n := p.files[name]; n != nil {
		n.mu.Lock()
		n.refs++
		n.mu.Unlock()
		return &plHandle{p: p, n: n}, nil
	}
	if d.removed[base] {
		// A new file under a name removed since the last SyncDir: the old
		// one goes now (a crash will not bring it back).
		if err := os.Remove(name); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return nil, err
		}
		delete(d.removed, base)
	}
	_, statErr := os.Stat(name)
	if statErr != nil && !errors.Is(statErr, fs.ErrNotExist) {
		return nil, statErr
	}
	if errors.Is(statErr, fs.ErrNotExist) {
		// Journal the name before the file exists, so a kill between the
		// two leaves nothing behind.
		jf, err := os.OpenFile(filepath.Join(dir, PowerLossJournal), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o640)
		if err != nil {
			return nil, err
		}
		_, err = jf.WriteString(base + "\n")
		if cerr := jf.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return nil, err
		}
		d.created[base] = true
	}
	f, err := os.OpenFile(name, os.O_RDWR|os.O_CREATE, 0o640)
	if err != nil {
		return nil, err
	}
	st, err := f.Stat()
	if err != nil {
		_ = f.Close()
		return nil, err
	}
	n := &plNode{name: name, f: f, refs: 1, size: st.Size()}
	p.files[name] = n
	return &plHandle{p: p, n: n}, nil
}

// Remove hides the file now and deletes it at its directory's next
// SyncDir; its unsynced writes are dropped.
func (p *PowerLossFS) Remove(name string) error {
	name = filepath.Clean(name)
	dir, base := filepath.Split(name)
	p.mu.Lock()
	defer p.mu.Unlock()
	d, err := p.dirLocked(dir)
	if err != nil {
		return err
	}
	if d.removed[base] {
		return fs.ErrNotExist
	}
	if _, err := os.Stat(name); err != nil {
		return err
	}
	if n := p.files[name]; n != nil {
		n.mu.Lock()
		n.pend = nil
		n.mu.Unlock()
		delete(p.files, name) // open handles keep their descriptor
		if n.refs == 0 {
			_ = n.f.Close()
		}
	}
	d.removed[base] = true
	return nil
}

func (p *PowerLossFS) List(dir string) ([]string, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	d, err := p.dirLocked(dir)
	if err != nil {
		return nil, err
	}
	names, err := OSFS{}.List(dir)
	if err != nil {
		return nil, err
	}
	return slices.DeleteFunc(names, func(n string) bool { return n == PowerLossJournal || d.removed[n] }), nil
}

// SyncDir makes dir's creations and removals durable: removed files are
// deleted, the directory is fsynced and its journal emptied.
func (p *PowerLossFS) SyncDir(dir string) error {
	dir = filepath.Clean(dir)
	p.mu.Lock()
	defer p.mu.Unlock()
	d, err := p.dirLocked(dir)
	if err != nil {
		return err
	}
	for base := range d.removed {
		if err := os.Remove(filepath.Join(dir, base)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
	}
	if err := (OSFS{}).SyncDir(dir); err != nil {
		return err
	}
	if len(d.created) > 0 {
		if err := os.Remove(filepath.Join(dir, PowerLossJournal)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
	}
	clear(d.removed)
	clear(d.created)
	return nil
}

// plHandle is an open file of a PowerLossFS.
type plHandle struct {
	p      *PowerLossFS
	n      *plNode
	closed bool
}

func (h *plHandle) WriteAt(b []byte, off int64) (int, error) {
	n := h.n
	n.mu.Lock()
	defer n.mu.Unlock()
	if k := len(n.pend); k > 0 && n.pend[k-1].off+int64(len(n.pend[k-1].b)) == off {
		n.pend[k-1].b = append(n.pend[k-1].b, b...) // the usual case: appends
	} else {
		n.pend = append(n.pend, plExtent{off: off, b: append([]byte(nil), b...)})
	}
	n.size = max(n.size, off+int64(len(b)))
	return len(b), nil
}

func (h *plHandle) ReadAt(b []byte, off int64) (int, error) {
	n := h.n
	n.mu.Lock()
	defer n.mu.Unlock()
	if off >= n.size {
		return 0, io.EOF
	}
	want := int(min(int64(len(b)), n.size-off))
	clear(b[:want])
	if _, err := n.f.ReadAt(b[:want], off); err != nil && err != io.EOF {
		return 0, err
	}
	for _, e := range n.pend {
		lo, hi := max(off, e.off), min(off+int64(want), e.off+int64(len(e.b)))
		if lo < hi {
			copy(b[lo-off:hi-off], e.b[lo-e.off:hi-e.off])
		}
	}
	if want < len(b) {
		return want, io.EOF
	}
	return want, nil
}

// Sync writes the unsynced writes to the file, then fdatasync.
func (h *plHandle) Sync() error {
	n := h.n
	n.mu.Lock()
	for len(n.pend) > 0 {
		e := n.pend[0]
		if _, err := n.f.WriteAt(e.b, e.off); err != nil {
			n.mu.Unlock()
			return err
		}
		n.pend = n.pend[1:]
	}
	n.pend = nil
	n.mu.Unlock()
	return unix.Fdatasync(int(n.f.Fd()))
}

func (h *plHandle) Truncate(size int64) error {
	n := h.n
	n.mu.Lock()
	defer n.mu.Unlock()
	out := n.pend[:0]
	for _, e := range n.pend {
		if e.off >= size {
			continue
		}
		if end := e.off + int64(len(e.b)); end > size {
			e.b = e.b[:size-e.off]
		}
		out = append(out, e)
	}
	n.pend = out
	if err := n.f.Truncate(size); err != nil {
		return err
	}
	n.size = size
	return nil
}

func (h *plHandle) Size() (int64, error) {
	h.n.mu.Lock()
	defer h.n.mu.Unlock()
	return h.n.size, nil
}

// Close releases the handle. The file's unsynced writes stay in memory
// (a later Open sees them) until a Sync, a Remove or the end of the
// process.
func (h *plHandle) Close() error {
	if h.closed {
		return nil
	}
	h.closed = true
	h.p.mu.Lock()
	defer h.p.mu.Unlock()
	n := h.n
	n.mu.Lock()
	defer n.mu.Unlock()
	n.refs--
	if n.refs > 0 {
		return nil
	}
	if cur := h.p.files[n.name]; cur == n && len(n.pend) > 0 {
		return nil // kept open for its unsynced writes
	}
	if h.p.files[n.name] == n {
		delete(h.p.files, n.name)
	}
	return n.f.Close()
}

// Map maps the file on disk: what was synced (the engine maps only
// synced bytes).
func (h *plHandle) Map(size int64) ([]byte, func() error, error) {
	return osFile{h.n.f}.Map(size)
}
