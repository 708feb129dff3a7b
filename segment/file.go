package segment

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"

	"golang.org/x/sys/unix"
)

// file is one WAL or segment file of the log.
type file struct {
	name  string // base name
	seq   uint64 // from the name; also the generation in its header (low 32 bits)
	wal   bool
	group uint64 // segment files: the group whose entries it holds
	f     File
	size  int64 // bytes durable (and readable)
	wsize int64 // bytes written: where the next write goes
	head  int64 // WAL: bytes of header and checkpoint (a WAL holding only these is never sealed)
	refs  int   // stored entries the index points at in it
	// written counts the entries ever written (segments: live/written is
	// the ratio that triggers compaction).
	written int
	sealed  bool // no more appends
	touched bool // written by the current move (worker-owned)
	dead    bool // scheduled for deletion
	old     bool // written in a format version before formatVersion
	// wnum: WAL files of version 5: the number of the last write into it
	// (record.go: write tags).
	wnum uint32
	// afterWAL: at Open, an earlier WAL file is still there, so this one's
	// first write (its checkpoint) need not have been synced.
	afterWAL bool
	// partial: at Open, a WAL file of version 5 whose last write kept is
	// not whole (its last record, tagged tagLast, is not there).
	partial bool
	// marked: WAL files of version 5, the last write into it is a close
	// mark (an empty promise written alone, markLocked): every write
	// before it is synced, and damage in one of them is reported.
	marked bool
	// damaged: Open found damage in it (Options.Quarantine): never
	// appended to, never cut. held: a segment file of a quarantined group,
	// kept on disk until the group is removed.
	damaged, held bool
	promised      int64  // segment files: the size the WAL files promised at Open
	version       uint16 // its format version
	// Segment files: what was written into it, for its footer (dropped
	// once sealed).
	foot   footIndex
	footed bool       // ends with an index footer (sealed)
	lazy   *lazyCheck // loaded from its footer: records are checked on first read
	maps   mappings
	owner  *Log
}

func (f *file) gen() uint32 { return uint32(f.seq) }

// unref drops n index references; a sealed segment left with none is
// scheduled for deletion.
func (f *file) unref(n int) {
	f.refs -= n
	if f.refs == 0 && n > 0 {
		f.owner.maybeDead(f)
	}
}

var errNoMap = errors.New("segment: file cannot be mapped")

func walName(seq uint64) string { return fmt.Sprintf("wal-%016x.log", seq) }

func segName(group, seq uint64) string { return fmt.Sprintf("seg-%016x-%016x.seg", group, seq) }

// parseName recognises the log's file names.
func parseName(name string) (seq, group uint64, wal, ok bool) {
	switch {
	case strings.HasPrefix(name, "wal-") && strings.HasSuffix(name, ".log") && len(name) == 4+16+4:
		s, err := strconv.ParseUint(name[4:20], 16, 64)
		return s, 0, true, err == nil
	case strings.HasPrefix(name, "seg-") && strings.HasSuffix(name, ".seg") && len(name) == 4+16+1+16+4:
		g, err1 := strconv.ParseUint(name[4:20], 16, 64)
		s, err2 := strconv.ParseUint(name[21:37], 16, 64)
		return s, g, false, err1 == nil && err2 == nil && name[20] == '-'
	}
	return 0, 0, false, false
}

// mapper is implemented by files that can be mapped read-only. A mapping
// is never written through and a file is never shrunk while it is mapped
// (recovery drops a file's mapping before it cuts a torn tail). A mapping
// may reach past the end of the file; only bytes below the file's durable
// size are ever touched.
type mapper interface {
	// Map maps the first size bytes; unmap releases them.
	Map(size int64) (data []byte, unmap func() error, err error)
}

func (o osFile) Map(size int64) ([]byte, func() error, error) {
	b, err := unix.Mmap(int(o.f.Fd()), 0, int(size), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		return nil, nil, err
	}
	return b, func() error { return unix.Munmap(b) }, nil
}

// Map on a MemFS file returns a snapshot of what is written now (MemFS has
// no page cache to share), so it never covers more than that: a later read
// past it remaps.
func (h *memHandle) Map(int64) ([]byte, func() error, error) {
	h.fs.mu.Lock()
	defer h.fs.mu.Unlock()
	return append([]byte(nil), h.f.data...), func() error { return nil }, nil
}

// mapping is one read-only mapping of a file, reference-counted:
// it is unmapped when it is no longer current and its last reader has
// released it.
type mapping struct {
	data  []byte
	unmap func() error
	refs  int
	stale bool
}

type mappings struct {
	mu  sync.Mutex
	cur *mapping
}

// acquire returns a mapping covering at least size bytes, remapping the
// file (larger) when the log has grown past the current one.
func (ms *mappings) acquire(f File, size int64) (*mapping, error) {
	ms.mu.Lock()
	defer ms.mu.Unlock()
	if ms.cur == nil || int64(len(ms.cur.data)) < size {
		mp, ok := f.(mapper)
		if !ok {
			return nil, errNoMap
		}
		// Map with headroom so a growing log does not remap on every read.
		data, unmap, err := mp.Map(size + size/2 + 1<<20)
		if err != nil {
			// The file may be shorter than the headroom: map exactly.
			if data, unmap, err = mp.Map(size); err != nil {
				return nil, err
			}
		}
		if old := ms.cur; old != nil {
			old.stale = true
			if old.refs == 0 {
				_ = old.unmap()
			}
		}
		ms.cur = &mapping{data: data, unmap: unmap}
	}
	ms.cur.refs++
	return ms.cur, nil
}

func (ms *mappings) release(m *mapping) {
	ms.mu.Lock()
	defer ms.mu.Unlock()
	m.refs--
	if m.refs == 0 && m.stale {
		_ = m.unmap()
	}
}

func (ms *mappings) close() {
	ms.mu.Lock()
	defer ms.mu.Unlock()
	if ms.cur != nil {
		ms.cur.stale = true
		if ms.cur.refs == 0 {
			_ = ms.cur.unmap()
		}
		ms.cur = nil
	}
}
