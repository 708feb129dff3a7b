package broker

import (
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"slices"
	"strings"
	"sync"

	"github.com/warren-mq/warren/replication"
	"github.com/warren-mq/warren/segment"
)

// Naming the queues a refused start leaves without data (issue 14): damage
// in a WAL file quarantines every group alive while it was written, the
// metadata group included, or cannot be bounded at all; the node does not
// start, and the operator needs to know which queues to rebuild or check
// elsewhere. The names come from the metadata that can still be read: the
// log opened a second time with Options.Repair (cut at the damage) over a
// copy-on-write view of its files, so nothing is written to the damaged
// log, and the result is used for names only, never served.

// maxDamageNames caps the queues an error names.
const maxDamageNames = 20

// damagedQueueNames says which durable queues the damage may reach: the
// queues of the quarantined groups (groups; every durable queue the
// readable metadata holds when groups is nil: damage that cannot be
// attributed). The text starts with "; ". wal, if not "", is the
// damaged WAL file: the WAL files after it are left out of the reading
// (they may carry quarantine marks, written by an earlier start that went
// on with a damaged queue's group or by an earlier build, which a Repair
// open refuses; records after the damage name nothing reliably).
func damagedQueueNames(fs segment.FS, path, wal string, groups []uint64) string {
	byGroup, err := readableQueues(fs, path, wal)
	if err != nil {
		return fmt.Sprintf("; the queues it reaches cannot be named (reading the metadata that is left: %v)", err)
	}
	var names []string
	unnamed := 0
	if groups == nil {
		for _, n := range byGroup {
			names = append(names, n)
		}
	} else {
		for _, g := range groups {
			if n, ok := byGroup[g]; ok {
				names = append(names, n)
			} else {
				unnamed++
			}
		}
	}
	var b strings.Builder
	if groups == nil {
		b.WriteString("; it cannot be attributed to queues: every durable queue of this node may be affected")
	} else {
		b.WriteString("; durable queues whose data may be affected")
	}
	if len(names) > 0 {
		b.WriteString(" (from the metadata before the damage): ")
		b.WriteString(queueList(names, maxDamageNames))
	} else if groups == nil {
		b.WriteString(" (the metadata before the damage names none)")
	}
	if unnamed > 0 {
		if len(names) == 0 {
			b.WriteString(":")
		} else {
			b.WriteString(",")
		}
		fmt.Fprintf(&b, " %d queue group(s) the metadata before the damage does not name (declared after it)", unnamed)
	}
	return b.String()
}

// readableQueues reads the durable queues' (internal) names, by group id, from the
// metadata of the log in path that survives a cut at its damage, the WAL
// files after wal (if not "") left out. Nothing is written to fs.
func readableQueues(fs segment.FS, path, wal string) (map[uint64]string, error) {
	quiet := slog.New(slog.DiscardHandler)
	view := newCOWFS(fs)
	if wal != "" {
		names, err := fs.List(path)
		if err != nil {
			return nil, err
		}
		for _, n := range names {
			if strings.HasPrefix(n, "wal-") && n > wal {
				view.gone[filepath.Join(path, n)] = true
			}
		}
	}
	l, err := segment.Open(view, path, segment.Options{Repair: true, Manual: true, Logger: quiet})
	if err != nil {
		return nil, err
	}
	defer func() { _ = l.Close() }()
	store, err := replication.OpenSnapStore(l)
	if err != nil {
		return nil, err
	}
	rec := NewMetaWithLimits(1, noMetaLimits)
	var mu sync.Mutex
	// Not started: it only recovers (snapshot, then the entries after it).
	if _, err := replication.OpenMeta(replication.MetaConfig{
		Log: l, Snapshots: store, Machine: &MetaMachine{Meta: rec}, Lock: &mu,
		Snapshot: func() []byte { return rec.Snapshot() }, Logger: quiet,
	}); err != nil {
		return nil, err
	}
	out := map[uint64]string{}
	for _, q := range rec.Queues() {
		if q.Decl.Durable && q.Exclusive == 0 {
			out[QueueGroupBase+q.ID] = q.Name // internal: queueList names it
		}
	}
	return out, nil
}

// cowFS is a copy-on-write view of base: reads go to base's files until
// one is written, truncated or created; from then on that file lives in
// memory, for every handle of it (cowNode). Removes only hide base's
// files; a handle still open on one removed keeps it, as an unlinked
// file's (a write through it copies it outside the view, so the file
// does not come back: the view does not rely on segment never doing
// that). base is never written.
type cowFS struct {
	base  segment.FS
	mem   *segment.MemFS
	mu    sync.Mutex
	own   map[string]bool     // in mem
	gone  map[string]bool     // base's, removed in the view
	nodes map[string]*cowNode // base's files open in the view
}

// cowNode is what the handles of one base file share: its copy in the
// view's memory, once one of them changed it. Guarded by cowFS.mu.
type cowNode struct {
	refs int
	mem  segment.File // nil until changed
	// removed: the view removed the file; its handles still read and
	// change it, as an unlinked file's, but a copy made now is not in
	// the view (not under its name, which a new file may have since).
	removed bool
}

func newCOWFS(base segment.FS) *cowFS {
	return &cowFS{base: base, mem: segment.NewMemFS(), own: map[string]bool{}, gone: map[string]bool{}, nodes: map[string]*cowNode{}}
}

func (c *cowFS) inBase(name string) bool {
	names, err := c.base.List(filepath.Dir(name))
	return err == nil && slices.Contains(names, filepath.Base(name))
}

func (c *cowFS) Open(name string) (segment.File, error) {
	name = filepath.Clean(name)
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.own[name] && !c.gone[name] && c.inBase(name) {
		f, err := c.base.Open(name)
		if err != nil {
			return nil, err
		}
		n := c.nodes[name]
		if n == nil {
			n = &cowNode{}
			c.nodes[name] = n
		}
		n.refs++
		return &cowFile{fs: c, name: name, base: f, node: n}, nil
	}
	c.own[name] = true
	return c.mem.Open(name)
}

func (c *cowFS) Remove(name string) error {
	name = filepath.Clean(name)
	c.mu.Lock()
	defer c.mu.Unlock()
	// Handles still open keep what they had (their node), as an
	// unlinked file's do.
	if c.own[name] {
		delete(c.own, name)
		delete(c.nodes, name)
		c.gone[name] = true
		return c.mem.Remove(name)
	}
	if c.gone[name] || !c.inBase(name) {
		return errors.New("cowfs: " + name + ": no such file")
	}
	if n := c.nodes[name]; n != nil {
		n.removed = true
	}
	delete(c.nodes, name)
	c.gone[name] = true
	return nil
}

func (c *cowFS) List(dir string) ([]string, error) {
	dir = filepath.Clean(dir)
	c.mu.Lock()
	defer c.mu.Unlock()
	base, err := c.base.List(dir)
	if err != nil {
		base = nil
	}
	var out []string
	for _, n := range base {
		if p := filepath.Join(dir, n); !c.gone[p] && !c.own[p] {
			out = append(out, n)
		}
	}
	mem, _ := c.mem.List(dir)
	out = append(out, mem...)
	slices.Sort(out)
	return out, nil
}

func (c *cowFS) MkdirAll(string) error { return nil }
func (c *cowFS) SyncDir(string) error  { return nil }

// cowFile is a handle of one of base's files in the view: it reads base
// until the first change through any handle of the file, which copies it
// into the view's memory (node.mem), where every handle then reads.
type cowFile struct {
	fs   *cowFS
	name string
	base segment.File
	node *cowNode
}

// copied returns the file's copy in memory, making it on first use.
func (f *cowFile) copied() (segment.File, error) {
	f.fs.mu.Lock()
	defer f.fs.mu.Unlock()
	if f.node.mem != nil {
		return f.node.mem, nil
	}
	size, err := f.base.Size()
	if err != nil {
		return nil, err
	}
	buf := make([]byte, size)
	if n, err := f.base.ReadAt(buf, 0); err != nil && int64(n) != size {
		return nil, err
	}
	var m segment.File
	if f.node.removed {
		// Unlinked: a copy of its own, outside the view.
		m, err = segment.NewMemFS().Open(f.name)
	} else {
		m, err = f.fs.mem.Open(f.name)
	}
	if err != nil {
		return nil, err
	}
	if !f.node.removed {
		f.fs.own[f.name] = true
	}
	if _, err := m.WriteAt(buf, 0); err != nil {
		_ = m.Close()
		return nil, err
	}
	f.node.mem = m
	return m, nil
}

// cur is what the handle reads now: the copy once there is one, else
// base (and whether it is the copy).
func (f *cowFile) cur() (segment.File, bool) {
	f.fs.mu.Lock()
	defer f.fs.mu.Unlock()
	if f.node.mem != nil {
		return f.node.mem, true
	}
	return f.base, false
}

func (f *cowFile) ReadAt(p []byte, off int64) (int, error) {
	m, _ := f.cur()
	return m.ReadAt(p, off)
}

func (f *cowFile) WriteAt(p []byte, off int64) (int, error) {
	m, err := f.copied()
	if err != nil {
		return 0, err
	}
	return m.WriteAt(p, off)
}

func (f *cowFile) Truncate(size int64) error {
	m, err := f.copied()
	if err != nil {
		return err
	}
	return m.Truncate(size)
}

func (f *cowFile) Sync() error { return nil }

func (f *cowFile) Size() (int64, error) {
	m, _ := f.cur()
	return m.Size()
}

func (f *cowFile) Close() error {
	err := f.base.Close()
	f.fs.mu.Lock()
	defer f.fs.mu.Unlock()
	if f.node.refs--; f.node.refs == 0 {
		if f.node.mem != nil {
			_ = f.node.mem.Close()
		}
		if f.fs.nodes[f.name] == f.node {
			delete(f.fs.nodes, f.name)
		}
	}
	return err
}

// fileMapper is segment's optional read-only mapping of a file.
type fileMapper interface {
	Map(size int64) (data []byte, unmap func() error, err error)
}

// Map maps the file as it is now in the view (segment reads through it).
// Its copy, once changed, is mapped as a MemFS file is: a snapshot of
// what it holds now. A file not changed is base's, mapped read-only, but
// never past base's end: reading a mapping there faults (SIGBUS), and the
// view may have grown the file by then. A mapping shorter than size is
// what segment's reader expects of a file that grew since (it maps
// again), and one taken before a change keeps base's bytes, as a MemFS
// snapshot does: segment changes no mapped byte without dropping the
// mapping first.
func (f *cowFile) Map(size int64) ([]byte, func() error, error) {
	m, isCopy := f.cur()
	if !isCopy {
		n, err := m.Size()
		if err != nil {
			return nil, nil, err
		}
		if size = min(size, n); size == 0 {
			return []byte{}, func() error { return nil }, nil
		}
	}
	mp, ok := m.(fileMapper)
	if !ok {
		return nil, nil, errors.New("cowfs: " + f.name + ": cannot be mapped")
	}
	return mp.Map(size)
}
