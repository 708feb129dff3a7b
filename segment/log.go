package segment

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"slices"
	"sync"
)

// Entry is one raft log entry of a group.
type Entry struct {
	Index uint64
	Term  uint64
	Data  []byte
}

// HardState is a group's persisted raft state.
type HardState struct {
	Term, Vote, Commit uint64
}

// Batch is what one group appends in one call: entries (contiguous
// indexes; an index at or below the group's last overwrites from there, as
// raft does after a leader change) and optionally a new hard state.
//
// As in raft, an index is only ever rewritten (after an overwrite or a
// Truncate) with a higher term than the entry it replaces: recovery keeps
// the highest-term copy of an index it finds in segment files.
type Batch struct {
	Group     uint64
	Entries   []Entry
	HardState *HardState
}

// Options configure a Log. The zero value is the default.
type Options struct {
	// Repair truncates at mid-file corruption (losing what follows, with an
	// error-level log line) instead of refusing to open.
	Repair bool
	Logger *slog.Logger
	// WALSize is the size at which the WAL file is sealed and a new one
	// started (default 64 MiB). Sealed WAL files are moved into segment
	// files and deleted.
	WALSize int64
	// SegmentSize is the size at which a group's segment file is sealed
	// (default 64 MiB).
	SegmentSize int64
	// CompactBelow: a sealed segment whose stored entries fall below this
	// fraction of those written into it is compacted (its stored entries
	// copied to the group's current segment, then it is deleted). Default
	// 0.5.
	CompactBelow float64
	// Manual turns the background worker off: the owner calls Maintain.
	// Tests use it to place maintenance deterministically.
	Manual bool
	// MaxSealedWALs bounds how far the worker may fall behind: while this
	// many sealed WAL files wait to be moved, appends wait (default 2). Disk
	// use stays bounded and the append rate is what the disk sustains with
	// the moves, not a burst. Not applied with Manual.
	MaxSealedWALs int
}

const maxFileSize = 1 << 30 // offsets in the index are uint32

func (o *Options) defaults() error {
	if o.Logger == nil {
		o.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if o.WALSize == 0 {
		o.WALSize = 64 << 20
	}
	if o.SegmentSize == 0 {
		o.SegmentSize = 64 << 20
	}
	if o.CompactBelow == 0 {
		o.CompactBelow = 0.5
	}
	if o.MaxSealedWALs == 0 {
		o.MaxSealedWALs = 2
	}
	if o.WALSize < 0 || o.WALSize > maxFileSize || o.SegmentSize < 0 || o.SegmentSize > maxFileSize {
		return fmt.Errorf("segment: WALSize and SegmentSize must be at most %d", maxFileSize)
	}
	if o.CompactBelow < 0 || o.CompactBelow > 1 {
		return errors.New("segment: CompactBelow must be within [0, 1]")
	}
	return nil
}

// Errors.
var (
	// ErrCorrupt is returned (wrapped, with the file, position and what is
	// lost) by Open when a record before the end of a file is damaged, or
	// when entries the log must hold are missing.
	ErrCorrupt = errors.New("segment: corrupt log")
	// ErrStopped: an fsync or write failed earlier; the engine refuses all
	// further work. The process must restart and recover.
	ErrStopped = errors.New("segment: stopped after an I/O failure; restart to recover")
	// ErrUnavailable: the requested index is compacted, dropped or not yet
	// written.
	ErrUnavailable = errors.New("segment: index not available")
	// ErrGap: an append would leave a hole after the group's last index.
	ErrGap = errors.New("segment: append leaves a gap")
	// ErrClosed: the log is closed.
	ErrClosed = errors.New("segment: log closed")
	// ErrVersion: a file was written in a format version this build does
	// not read.
	ErrVersion = errors.New("segment: unsupported format version")
)

const (
	fileHeader = 16 // magic [6], version u16, generation u32, reserved u32
	walMagic   = "WRNWAL"
	segMagic   = "WRNSEG"
	// formatVersion is written in every file header. A file of another
	// version is refused, never taken for damage.
	formatVersion = 1
)

// Log is a node's log for many raft groups: one WAL takes every group's
// appends, made durable together by one write and one fdatasync (group
// commit); a background worker moves sealed WAL files into per-group
// segment files and deletes them, and deletes or compacts segment files by
// the groups' live indexes. The package doc describes the layout, format
// and recovery.
type Log struct {
	fs   FS
	dir  string
	opts Options
	log  *slog.Logger

	mu      sync.Mutex
	cond    *sync.Cond
	groups  map[uint64]*groupIndex
	wal     *file   // the active WAL
	wals    []*file // sealed WAL files not yet moved, oldest first
	nextSeq uint64
	pending []byte
	updates []update // index changes to apply once pending is durable
	spare   []byte   // the other pending buffer (double buffering)
	spareU  []update
	ckpt    []byte // checkpoint records for a new WAL file
	seq     uint64 // batches queued so far
	done    uint64 // batches durable so far
	syncing bool
	failed  error
	closed  bool
	rotate  bool // seal the WAL at the next write (Rotate)
	// pend: each group's raft range once the pending records are durable,
	// so appends queued behind one another are checked for gaps; fly is
	// pend of the records being written right now.
	pend, fly map[uint64]span
	undo      []spanUndo
	dead      []*file // sealed segments with nothing stored, to delete

	maint sync.Mutex // one Maintain at a time
	work  chan struct{}
	quit  chan struct{}
	wg    sync.WaitGroup

	stats Stats

	queuedHook func() // tests: called (under l.mu) when an append is queued
}

// Stats are counters for benchmarks and metrics.
type Stats struct {
	Syncs          uint64 // WAL fdatasyncs
	Records        uint64 // WAL records written
	WALFiles       int    // WAL files on disk
	SegmentFiles   int    // segment files on disk
	Moved          uint64 // entries copied from the WAL into segments
	Compacted      uint64 // entries copied by segment compaction
	DeletedFiles   uint64
	StoredEntries  int
	SegmentsSealed uint64
}

type spanUndo struct {
	group uint64
	prev  span
	had   bool
}

// update is one change to the in-memory index, applied once the record
// that carries it is durable. Plain data, not closures: appends allocate
// nothing in steady state.
type update struct {
	kind  uint8 // a record type
	group uint64
	idx   uint64 // entries: index; truncate: from; compact: upTo
	off   int64  // entries: offset of the data within the pending buffer
	term  uint64 // compact: the term of upTo
	hs    HardState
}

// Open opens (creating if needed) the log in dir and recovers its state.
func Open(fs FS, dir string, opts Options) (*Log, error) {
	if err := opts.defaults(); err != nil {
		return nil, err
	}
	if err := fs.MkdirAll(dir); err != nil {
		return nil, err
	}
	l := &Log{fs: fs, dir: dir, opts: opts, log: opts.Logger, groups: map[uint64]*groupIndex{},
		pend: map[uint64]span{}, fly: map[uint64]span{}, work: make(chan struct{}, 1), quit: make(chan struct{}),
		// The two pending buffers are reused; they grow to the largest
		// group commit seen, and that growth is the only allocation an
		// append can cause.
		pending: make([]byte, 0, 256<<10), spare: make([]byte, 0, 256<<10)}
	l.cond = sync.NewCond(&l.mu)
	if err := l.recover(); err != nil {
		l.closeFiles()
		return nil, err
	}
	if !opts.Manual {
		l.wg.Add(1)
		go l.worker()
		l.kick()
	}
	return l, nil
}

func (l *Log) path(name string) string { return filepath.Join(l.dir, name) }

func (l *Log) grp(id uint64) *groupIndex {
	g := l.groups[id]
	if g == nil {
		g = newGroup(id)
		l.groups[id] = g
	}
	return g
}

// maybeDead schedules a sealed segment with nothing stored for deletion.
// Called with l.mu held (or during recovery).
func (l *Log) maybeDead(f *file) {
	if f.wal || !f.sealed || f.dead || f.refs != 0 {
		return
	}
	f.dead = true
	l.dead = append(l.dead, f)
	l.kick()
}

// kick wakes the background worker.
func (l *Log) kick() {
	select {
	case l.work <- struct{}{}:
	default:
	}
}

// shadow is a group's raft range as it will be once everything queued is
// durable.
func (l *Log) shadow(id uint64) span {
	if s, ok := l.pend[id]; ok {
		return s
	}
	if s, ok := l.fly[id]; ok {
		return s
	}
	if g := l.groups[id]; g != nil {
		return g.span
	}
	return span{first: 1}
}

func (l *Log) setShadow(id uint64, s span) {
	prev, had := l.pend[id]
	l.undo = append(l.undo, spanUndo{id, prev, had})
	l.pend[id] = s
}

func (l *Log) rollback() {
	for i := len(l.undo) - 1; i >= 0; i-- {
		u := l.undo[i]
		if u.had {
			l.pend[u.group] = u.prev
		} else {
			delete(l.pend, u.group)
		}
	}
	l.undo = l.undo[:0]
}

// Append makes batches durable: one write and one fsync cover them and
// whatever other goroutines appended meanwhile. It returns once they are
// on disk, or the error that stopped the engine.
func (l *Log) Append(batches ...Batch) error {
	l.mu.Lock()
	if err := l.usableLocked(); err != nil {
		l.mu.Unlock()
		return err
	}
	for l.failed == nil && !l.closed && ((len(l.pending) > maxPending && l.syncing) ||
		(!l.opts.Manual && len(l.wals) >= l.opts.MaxSealedWALs)) {
		// The next write takes what is pending: bound it. And let the
		// worker catch up when it is behind.
		l.cond.Wait()
	}
	if err := l.usableLocked(); err != nil {
		l.mu.Unlock()
		return err
	}
	l.undo = l.undo[:0]
	total := 0
	for i := range batches {
		b := &batches[i]
		if len(b.Entries) == 0 {
			continue
		}
		s := l.shadow(b.Group)
		for j := range b.Entries {
			if err := s.put(b.Entries[j].Index); err != nil || (j > 0 && b.Entries[j].Index != b.Entries[j-1].Index+1) {
				l.rollback()
				l.mu.Unlock()
				return ErrGap
			}
			if total += len(b.Entries[j].Data) + entryHeader; len(b.Entries[j].Data) > MaxEntry || total > maxPending {
				l.rollback()
				l.mu.Unlock()
				return fmt.Errorf("segment: an entry over %d bytes, or an append over %d bytes", MaxEntry, maxPending)
			}
		}
		l.setShadow(b.Group, s)
	}
	for i := range batches {
		l.encodeLocked(&batches[i])
	}
	l.seq++
	my := l.seq
	if l.queuedHook != nil {
		l.queuedHook()
	}
	return l.commitLocked(my)
}

func (l *Log) usableLocked() error {
	if l.failed != nil {
		return ErrStopped
	}
	if l.closed {
		return ErrClosed
	}
	return nil
}

// maxEntriesRecord bounds one entries record's payload; a batch larger
// than this is split over several records.
const maxEntriesRecord = 1 << 20

// MaxEntry bounds one entry's data.
const MaxEntry = MaxRecord / 2

// maxPending bounds what is queued for the next write (appenders wait
// while it is over) and one Append: with WAL files of at most
// maxFileSize, every offset fits the index's uint32.
const maxPending = 256 << 20

func (l *Log) encodeLocked(b *Batch) {
	for i := 0; i < len(b.Entries); {
		var start int
		l.pending, start = beginRecord(l.pending)
		l.pending = binary.LittleEndian.AppendUint64(l.pending, b.Group)
		countAt := len(l.pending)
		l.pending = binary.LittleEndian.AppendUint32(l.pending, 0)
		n, size := 0, 0
		for ; i < len(b.Entries) && (n == 0 || size+len(b.Entries[i].Data) <= maxEntriesRecord); i++ {
			e := &b.Entries[i]
			l.pending = binary.LittleEndian.AppendUint64(l.pending, e.Index)
			l.pending = binary.LittleEndian.AppendUint64(l.pending, e.Term)
			l.pending = binary.LittleEndian.AppendUint32(l.pending, uint32(len(e.Data)))
			l.updates = append(l.updates, update{kind: recEntries, group: b.Group, idx: e.Index, off: int64(len(l.pending))})
			l.pending = append(l.pending, e.Data...)
			n++
			size += len(e.Data) + entryHeader
		}
		binary.LittleEndian.PutUint32(l.pending[countAt:], uint32(n))
		l.pending = closeRecord(l.pending, start, recEntries)
		l.stats.Records++
	}
	if hs := b.HardState; hs != nil {
		var start int
		l.pending, start = beginRecord(l.pending)
		l.pending = binary.LittleEndian.AppendUint64(l.pending, b.Group)
		l.pending = binary.LittleEndian.AppendUint64(l.pending, hs.Term)
		l.pending = binary.LittleEndian.AppendUint64(l.pending, hs.Vote)
		l.pending = binary.LittleEndian.AppendUint64(l.pending, hs.Commit)
		l.pending = closeRecord(l.pending, start, recHardState)
		l.updates = append(l.updates, update{kind: recHardState, group: b.Group, hs: *hs})
		l.stats.Records++
	}
}

// applyLocked applies durable updates; base is the offset in f of the
// buffer they were encoded in.
func (l *Log) applyLocked(us []update, f *file, base int64) {
	for i := range us {
		u := &us[i]
		g := l.grp(u.group)
		switch u.kind {
		case recEntries:
			_ = g.put(u.idx, f, uint32(base+u.off)) // checked against the shadow when queued
		case recHardState:
			g.hs, g.hsSet = u.hs, true
		case recTruncate:
			g.truncate(u.idx)
		case recCompact:
			g.compact(u.idx, u.term)
		}
	}
}

// commitLocked waits until batch my is durable, becoming the writer if
// nobody is: the writer takes everything pending, writes it at the end of
// the WAL (or, when the WAL is full, into a new WAL file that starts with
// a checkpoint), fsyncs once, applies it to the index and wakes the
// waiters. l.mu is held on entry and released on return.
func (l *Log) commitLocked(my uint64) error {
	for l.done < my {
		if l.failed != nil {
			l.mu.Unlock()
			return ErrStopped
		}
		if l.syncing {
			l.cond.Wait()
			continue
		}
		buf, us, upTo := l.pending, l.updates, l.seq
		l.pending, l.updates = l.spare[:0], l.spareU[:0]
		l.spare, l.spareU = nil, nil
		l.pend, l.fly = l.fly, l.pend // fly was cleared after the last write
		f, base := l.wal, l.wal.size
		var head []byte // header and checkpoint of a new WAL file
		if base > f.head && (l.rotate || base+int64(len(buf)) > l.opts.WALSize) {
			l.rotate = false
			f = &file{seq: l.nextSeq, wal: true, owner: l}
			f.name = walName(f.seq)
			l.nextSeq++
			head = l.checkpointLocked(f.gen())
			base = int64(len(head))
			f.head = base
		}
		l.syncing = true
		l.mu.Unlock()
		seal(buf, f.gen())
		err := l.write(f, head, buf, base)
		l.mu.Lock()
		l.syncing = false
		l.stats.Syncs++
		if err != nil {
			// Any write or fsync failure stops the engine: the page cache
			// may have dropped the data, so continuing could lie.
			l.failLocked(err)
			l.mu.Unlock()
			return fmt.Errorf("%w: %v", ErrStopped, err)
		}
		if f != l.wal {
			old := l.wal
			old.sealed = true
			l.wals = append(l.wals, old)
			l.wal = f
			l.kick()
		}
		l.applyLocked(us, f, base)
		clear(l.fly)
		l.spare, l.spareU = buf[:0], us[:0]
		f.size = base + int64(len(buf))
		f.wsize = f.size
		l.done = upTo
		l.cond.Broadcast()
	}
	l.mu.Unlock()
	return nil
}

// write writes buf at base in f and syncs it. A new file (head != nil) is
// created with its header and checkpoint first, and the directory synced.
func (l *Log) write(f *file, head, buf []byte, base int64) error {
	if head != nil {
		h, err := l.fs.Open(l.path(f.name))
		if err != nil {
			return err
		}
		f.f = h
		if _, err := h.WriteAt(head, 0); err != nil {
			return err
		}
	}
	if _, err := f.f.WriteAt(buf, base); err != nil {
		return err
	}
	if err := f.f.Sync(); err != nil {
		return err
	}
	if head != nil {
		return l.fs.SyncDir(l.dir)
	}
	return nil
}

func (l *Log) failLocked(err error) {
	if l.failed == nil {
		l.failed = err
		l.log.Error("segment: I/O failure; the log is stopped", "err", err)
	}
	l.cond.Broadcast()
}

// checkpointLocked encodes a new WAL file's header and a checkpoint record
// per group: its raft range and hard state as of everything durable so
// far. With it, the WAL files before it are not needed once their entries
// are in segment files.
func (l *Log) checkpointLocked(gen uint32) []byte {
	b := appendFileHeader(l.ckpt[:0], walMagic, gen)
	for _, id := range l.groupIDsLocked() {
		g := l.groups[id]
		var start int
		b, start = beginRecord(b)
		b = binary.LittleEndian.AppendUint64(b, id)
		b = binary.LittleEndian.AppendUint64(b, g.first)
		b = binary.LittleEndian.AppendUint64(b, g.last)
		b = binary.LittleEndian.AppendUint64(b, g.prevTerm)
		b = binary.LittleEndian.AppendUint64(b, g.hs.Term)
		b = binary.LittleEndian.AppendUint64(b, g.hs.Vote)
		b = binary.LittleEndian.AppendUint64(b, g.hs.Commit)
		var flags uint64
		if g.hsSet {
			flags = 1
		}
		b = binary.LittleEndian.AppendUint64(b, flags)
		b = binary.LittleEndian.AppendUint64(b, uint64(len(g.segs)))
		for _, f := range g.segs {
			b = binary.LittleEndian.AppendUint64(b, f.seq)
			b = binary.LittleEndian.AppendUint64(b, uint64(f.size))
		}
		b = endRecord(b, start, gen, recCheckpoint)
	}
	l.ckpt = b
	return b
}

// writeOp appends one control record (truncate, compact) durably.
func (l *Log) writeOp(typ uint8, gid, arg uint64) error {
	l.mu.Lock()
	if err := l.usableLocked(); err != nil {
		l.mu.Unlock()
		return err
	}
	s := l.shadow(gid)
	var term uint64
	if typ == recTruncate {
		s.truncate(arg)
	} else {
		s.compact(arg)
		term = l.termLocked(gid, arg)
	}
	l.undo = l.undo[:0]
	l.setShadow(gid, s)
	var start int
	l.pending, start = beginRecord(l.pending)
	l.pending = binary.LittleEndian.AppendUint64(l.pending, gid)
	l.pending = binary.LittleEndian.AppendUint64(l.pending, arg)
	if typ == recCompact {
		l.pending = binary.LittleEndian.AppendUint64(l.pending, term)
	}
	l.pending = closeRecord(l.pending, start, typ)
	l.updates = append(l.updates, update{kind: typ, group: gid, idx: arg, term: term})
	l.stats.Records++
	l.seq++
	return l.commitLocked(l.seq)
}

// Rotate seals the current WAL file at the next write, if it holds any
// record beyond its checkpoint; the worker then moves it into segment
// files. For tests, benchmarks and operators who want the WAL emptied.
func (l *Log) Rotate() {
	l.mu.Lock()
	l.rotate = true
	l.mu.Unlock()
}

// promise records, durably, that the first size bytes of each segment
// file are synced (called by the mover after its sync, before the source
// of the copies is deleted).
func (l *Log) promise(fs []*file, sizes []int64) error {
	l.mu.Lock()
	if err := l.usableLocked(); err != nil {
		l.mu.Unlock()
		return err
	}
	for i, f := range fs {
		var start int
		l.pending, start = beginRecord(l.pending)
		l.pending = binary.LittleEndian.AppendUint64(l.pending, f.group)
		l.pending = binary.LittleEndian.AppendUint64(l.pending, f.seq)
		l.pending = binary.LittleEndian.AppendUint64(l.pending, uint64(sizes[i]))
		l.pending = closeRecord(l.pending, start, recPromise)
		l.stats.Records++
	}
	l.seq++
	return l.commitLocked(l.seq)
}

// Truncate removes a group's entries from index from on (raft overwrites
// uncommitted entries after a leader change).
func (l *Log) Truncate(group, from uint64) error {
	return l.writeOp(recTruncate, group, from)
}

// Compact moves the start of a group's raft log past upTo (durably: the
// record is synced before Compact returns), and tells storage which
// entries at or below its compaction point the owner still needs: live,
// sorted ascending, typically the indexes of messages not yet acked. Every
// other stored entry below the new first index is dropped, and files left
// with nothing stored are deleted or compacted in the background. Calling
// it again with the same upTo and a smaller live set drops more without
// writing anything.
//
// The live set is not persisted: after a restart, every entry below the
// compaction point still in a file is kept until the owner calls Compact
// with its live set again. That call also checks that every live entry is
// stored, so an entry lost to damage is reported (ErrCorrupt, naming the
// group) rather than missed at read time.
func (l *Log) Compact(group, upTo uint64, live []uint64) error {
	l.mu.Lock()
	if err := l.usableLocked(); err != nil {
		l.mu.Unlock()
		return err
	}
	if s := l.shadow(group); upTo >= s.first {
		l.mu.Unlock()
		if err := l.writeOp(recCompact, group, upTo); err != nil {
			return err
		}
		l.mu.Lock()
	}
	var missing []uint64
	if g := l.groups[group]; g != nil {
		missing = g.dropExcept(live)
	}
	l.mu.Unlock()
	if len(missing) > 0 {
		return fmt.Errorf("%w: group %d: %d live entries are not stored (first %d)", ErrCorrupt, group, len(missing), missing[0])
	}
	return nil
}

// FirstIndex and LastIndex give a group's raft log range; an empty log
// has LastIndex = FirstIndex-1.
func (l *Log) FirstIndex(group uint64) uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	if g := l.groups[group]; g != nil {
		return g.first
	}
	return 1
}

func (l *Log) LastIndex(group uint64) uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	if g := l.groups[group]; g != nil {
		return g.last
	}
	return 0
}

// HardState returns a group's last durable hard state.
func (l *Log) HardState(group uint64) (HardState, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if g := l.groups[group]; g != nil {
		return g.hs, g.hsSet
	}
	return HardState{}, false
}

// Term returns the term of an entry of a group's raft log, or of the
// entry just before it (first-1) when a compaction recorded it, as raft's
// Storage must.
func (l *Log) Term(group, index uint64) (uint64, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	g := l.groups[group]
	if l.closed || g == nil || index+1 < g.first || index > g.last {
		return 0, ErrUnavailable
	}
	if t := l.termLocked(group, index); t != 0 {
		return t, nil
	}
	return 0, ErrUnavailable
}

// termLocked is the term of a stored entry (at first-1: the recorded
// one), 0 when unknown.
func (l *Log) termLocked(group, index uint64) uint64 {
	g := l.groups[group]
	if g == nil {
		return 0
	}
	if index == g.first-1 && g.prevTerm != 0 {
		return g.prevTerm
	}
	f, off, ok := g.get(index)
	if !ok || index < g.first && index != g.first-1 {
		return 0
	}
	m, err := f.maps.acquire(f.f, f.size)
	if err != nil {
		return 0
	}
	_, term, _ := entryAt(m.data, off)
	f.maps.release(m)
	return term
}

// Entries returns a group's raft log entries lo..hi-1, their data copied
// into one fresh buffer (the caller owns it).
func (l *Log) Entries(group, lo, hi uint64) ([]Entry, error) {
	es, release, err := l.view(group, lo, hi, true)
	if err != nil {
		return nil, err
	}
	defer release()
	total := 0
	for _, e := range es {
		total += len(e.Data)
	}
	data := make([]byte, 0, total)
	for i := range es {
		o := len(data)
		data = append(data, es[i].Data...)
		es[i].Data = data[o:len(data):len(data)]
	}
	return es, nil
}

// EntriesView returns a group's stored entries lo..hi-1 (in its raft log,
// or kept live below it) without copying: their Data are views into
// read-only mappings of the files, valid until release is called (call
// it once; later calls do nothing). A mapping stays alive while any view
// of it is held, even when its file is deleted.
func (l *Log) EntriesView(group, lo, hi uint64) (entries []Entry, release func(), err error) {
	return l.view(group, lo, hi, false)
}

func (l *Log) view(group, lo, hi uint64, raftOnly bool) ([]Entry, func(), error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return nil, nil, ErrClosed
	}
	g := l.groups[group]
	if g == nil || lo > hi || (raftOnly && (lo < g.first || hi > g.last+1)) {
		return nil, nil, ErrUnavailable
	}
	out := make([]Entry, 0, hi-lo)
	h := &hold{}
	var m *mapping
	for k := lo; k < hi; k++ {
		f, off, ok := g.get(k)
		if !ok {
			h.release()
			return nil, nil, ErrUnavailable
		}
		if m = h.mapping(f); m == nil {
			var err error
			if m, err = f.maps.acquire(f.f, f.size); err != nil {
				h.release()
				return nil, nil, err
			}
			h.add(f, m)
		}
		idx, term, data := entryAt(m.data, off)
		if idx != k {
			h.release()
			return nil, nil, fmt.Errorf("%w: %s holds index %d where %d was expected", ErrCorrupt, f.name, idx, k)
		}
		out = append(out, Entry{Index: k, Term: term, Data: data})
	}
	return out, h.release, nil
}

// hold is the mappings one view holds: usually one file, sometimes two
// (a range that crosses from a segment file into the WAL), rarely more.
type hold struct {
	once  sync.Once
	n     int
	files [2]*file
	maps  [2]*mapping
	more  []struct {
		f *file
		m *mapping
	}
}

func (h *hold) mapping(f *file) *mapping {
	for i := 0; i < min(h.n, 2); i++ {
		if h.files[i] == f {
			return h.maps[i]
		}
	}
	for _, x := range h.more {
		if x.f == f {
			return x.m
		}
	}
	return nil
}

func (h *hold) add(f *file, m *mapping) {
	if h.n < 2 {
		h.files[h.n], h.maps[h.n] = f, m
	} else {
		h.more = append(h.more, struct {
			f *file
			m *mapping
		}{f, m})
	}
	h.n++
}

// release drops the view's mappings; later calls do nothing.
func (h *hold) release() {
	h.once.Do(func() {
		for i := 0; i < min(h.n, 2); i++ {
			h.files[i].maps.release(h.maps[i])
		}
		for _, x := range h.more {
			x.f.maps.release(x.m)
		}
	})
}

// Groups lists the groups the log knows.
func (l *Log) Groups() []uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make([]uint64, 0, len(l.groups))
	for id := range l.groups {
		out = append(out, id)
	}
	slices.Sort(out)
	return out
}

// Stats returns the counters.
func (l *Log) Stats() Stats {
	l.mu.Lock()
	defer l.mu.Unlock()
	s := l.stats
	s.WALFiles = 1 + len(l.wals)
	for _, g := range l.groups {
		s.StoredEntries += g.stored()
		s.SegmentFiles += len(g.segs)
	}
	return s
}

// Close stops the background worker and closes the files. Appends in
// flight must have returned.
func (l *Log) Close() error {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return nil
	}
	l.closed = true
	l.cond.Broadcast() // appends waiting for the worker give up
	l.mu.Unlock()
	close(l.quit)
	l.wg.Wait()
	l.maint.Lock()
	defer l.maint.Unlock()
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.closeFiles()
}

// closeFiles closes every open file (views keep their mappings until
// released).
func (l *Log) closeFiles() error {
	var first error
	closeOne := func(f *file) {
		if f == nil || f.f == nil {
			return
		}
		f.maps.close()
		if err := f.f.Close(); err != nil && first == nil {
			first = err
		}
		f.f = nil
	}
	seen := map[*file]bool{}
	for _, g := range l.groups {
		for i := range g.runs {
			if f := g.runs[i].f; !seen[f] {
				seen[f] = true
				closeOne(f)
			}
		}
		if g.seg != nil && !seen[g.seg] {
			seen[g.seg] = true
			closeOne(g.seg)
		}
	}
	for _, f := range l.wals {
		if !seen[f] {
			seen[f] = true
			closeOne(f)
		}
	}
	if l.wal != nil && !seen[l.wal] {
		closeOne(l.wal)
	}
	for _, f := range l.dead {
		if !seen[f] {
			seen[f] = true
			closeOne(f)
		}
	}
	return first
}
