package segment

import (
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"path/filepath"
	"slices"
	"sync"
	"time"
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
	// Quarantine: damage Open can attribute to specific groups does not
	// refuse the whole log. Those groups are quarantined: left out of the
	// opened log (their files kept on disk, untouched), reported by
	// Damaged, refused by every write (ErrQuarantined) until RemoveGroup
	// removes them; the owner rebuilds them from elsewhere (raft peers).
	// Damage it cannot bound to a set of groups still refuses the open
	// (ErrCorrupt and ErrUnattributable). The package doc's "Damage"
	// section says which is which. Not with Repair.
	Quarantine bool
	// CheckDamage, if set, is asked by Open once recovery has read the
	// whole log, before Open writes anything to it (a torn tail cut, a
	// header-less file removed, the WAL file that marks a quarantine, the
	// background worker started), whether to go on with the damage found:
	// damaged is what Damaged would list (with Quarantine; none without).
	// An error refuses the open: Open returns it, and the directory is
	// left as it was found, for an operator or a later build to inspect or
	// repair. So does any other refusal of Open.
	CheckDamage func(damaged []DamagedGroup) error
	Logger      *slog.Logger
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
	// MaxSealedWALs bounds how far the worker may fall behind: appends
	// wait while the WAL files beyond MoveLag still to be moved come to
	// this many (default 2), counted in fractions: the one being moved
	// less how far its move is, and the current WAL file by how full it
	// is. So once the worker is that far behind, appends go at the pace of
	// its move, each waiting for a step of it (a group's copies, one
	// file's sync), not for the whole move of a WAL file. Disk use stays
	// bounded (at most MaxSealedWALs+1 sealed WAL files beyond MoveLag:
	// an append let through just under the bound may seal one more) and
	// the append
	// rate is what the disk sustains with the moves, not a burst. Not
	// applied with Manual.
	MaxSealedWALs int
	// MoveLag is how many of the newest sealed WAL files Maintain leaves
	// where they are: their entries are read from the WAL file meanwhile,
	// and those the owner compacts before the file's turn comes (consumed
	// messages, log covered by a snapshot) are never copied into segment
	// files. Without it a WAL file is moved as soon as it is sealed, and
	// every entry still live in its last few megabytes — messages in
	// flight, log not yet snapshotted — is written a second time. Costs:
	// up to MoveLag more WAL files on disk and replayed by Open. Default 4
	// (0 with Manual, where the owner places maintenance); negative: none.
	MoveLag int
}

const maxFileSize = 1 << 30 // offsets in the index are uint32

// defaultMoveLag: with 64 MiB WAL files, an entry is moved at the
// earliest 256 MiB of appends after it was written — a second or more at
// this machine's disk rate, longer than a consumer that keeps up takes to
// ack it and its queue to snapshot past it, also with 100 busy queues
// each freeing a megabyte per snapshot (BENCHMARKS.md: with 2, such a
// node still moved half of what it wrote).
const defaultMoveLag = 4

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
	switch {
	case o.MoveLag < 0:
		o.MoveLag = 0
	case o.MoveLag == 0 && !o.Manual:
		o.MoveLag = defaultMoveLag
	}
	if o.WALSize < 0 || o.WALSize > maxFileSize || o.SegmentSize < 0 || o.SegmentSize > maxFileSize {
		return fmt.Errorf("segment: WALSize and SegmentSize must be at most %d", maxFileSize)
	}
	if o.Repair && o.Quarantine {
		return errors.New("segment: Repair and Quarantine exclude each other")
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
	// ErrGap: an append would leave a hole after the group's last index
	// (or starts at index 0: raft's indexes start at 1).
	ErrGap = errors.New("segment: append leaves a gap")
	// ErrClosed: the log is closed.
	ErrClosed = errors.New("segment: log closed")
	// ErrVersion: a file was written in a format version this build does
	// not read.
	ErrVersion = errors.New("segment: unsupported format version")
	// ErrUnattributable (with ErrCorrupt, Options.Quarantine): damage Open
	// cannot bound to a set of groups (the active WAL file damaged with
	// intact records after it: a group created since its checkpoint may
	// have had records only there). The whole log is refused.
	ErrUnattributable = errors.New("damage that cannot be attributed to specific groups")
	// ErrQuarantined: a write to a group quarantined at Open
	// (Options.Quarantine): its stored data is damaged; RemoveGroup it,
	// then the id starts empty.
	ErrQuarantined = errors.New("segment: group quarantined: its stored data is damaged")
)

// DamagedGroup is a group Open quarantined (Options.Quarantine): where
// the damage was found and what it is. File and Offset name the first
// damage found; a group quarantined at an earlier Open and not removed
// since names the WAL file whose checkpoint carried the quarantine.
type DamagedGroup struct {
	Group  uint64
	File   string
	Offset int64
	Why    string
}

const (
	fileHeader = 16 // magic [6], version u16, generation u32, reserved u32
	walMagic   = "WRNWAL"
	segMagic   = "WRNSEG"
	// formatVersion is written in every file header. A file of a later
	// version is refused (ErrVersion), never taken for damage. Version 2
	// added the remove record; this build reads versions 1 and 2, and never
	// writes a remove record into a version-1 file (RemoveGroup starts a
	// new WAL file first), so a build that reads only version 1 refuses
	// every file that may hold one. Version 3 added the index footer
	// (segment files only: footer.go). Version 4 added the live record
	// (AppendLive; WAL files only). Version 5 added the write tag (record
	// header bytes 13..15, WAL files only; zero before): an older build
	// would take a tagged record for damage. This build reads versions 1
	// to 5, and tags writes only into a version-5 file.
	formatVersion    = 5
	liveVersion      = 4
	tagVersion       = 5 // write tags (WAL files)
	minFormatVersion = 1
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
	ckpt    []byte   // checkpoint records for a new WAL file
	// cur is the batches queued into pending; flying, the writes in
	// flight, oldest first. Up to maxInflight writes are in flight: one at
	// a time in pwrite (writing), their fdatasyncs overlapping; they are
	// applied in order (applyCond).
	cur       *batchGen
	flying    []*batchGen
	freeGens  []*batchGen
	applyCond *sync.Cond
	writing   bool
	inflight  int
	freeBufs  [][]byte // pending buffers not in use, reused
	ext       []extent // the pending write's entry data not copied into pending
	extBytes  int      // their bytes
	freeExt   []extent // the last write's extents, cleared, for reuse
	iov       [][]byte // the writer's pwritev scratch
	lastWrite int      // bytes of the last group commit's records
	freeUps   [][]update
	failed    error
	closed    bool
	rotate    bool // seal the WAL at the next write (Rotate)
	undo      []spanUndo
	dead      []*file // sealed segments with nothing stored, to delete
	// removed: groups removed (RemoveGroup, or replayed), whose segment
	// files the worker deletes before it deletes any WAL file.
	removed []*groupIndex
	// quarantined: groups Open found damaged (Options.Quarantine), out of
	// groups; their segment files are kept (held) until RemoveGroup.
	quarantined map[uint64]*groupIndex
	qCkpt       *DamagedGroup // recovery: the next WAL file's checkpoint groups are damaged so
	cuts        []recoveryCut // recovery: torn tails to cut once it is done (cut)

	// moving is the sealed WAL file the worker is moving out (Maintain),
	// nil when none; moveDone is how far that move is, from 0 to 1: half
	// for its copies, half for their syncs. Appenders pace themselves by
	// it (behindLocked).
	moving   *file
	moveDone float64

	maint sync.Mutex // one Maintain at a time
	work  chan struct{}
	quit  chan struct{}
	wg    sync.WaitGroup

	stats Stats

	queuedHook   func() // tests: called (under l.mu) when an append is queued
	promisedHook func() // tests: called by a move between its promise and its repoint
	progressHook func() // tests: called by a move of a WAL file (without l.mu) after each step it reports
	waitHook     func() // tests: called (under l.mu) when an append starts waiting for the mover
	compactHook  func() // tests: called by Maintain (without l.mu) before each segment file it compacts
}

// Stats are counters for benchmarks and metrics.
type Stats struct {
	Syncs        uint64 // WAL fdatasyncs
	Pipelined    uint64 // WAL writes started while an earlier one was in flight
	Records      uint64 // WAL records written
	WALFiles     int    // WAL files on disk
	SegmentFiles int    // segment files on disk
	Moved        uint64 // entries copied from the WAL into segments
	Compacted    uint64 // entries copied by segment compaction
	// WALBytes, MovedBytes, CompactedBytes: bytes written to WAL files
	// (records, headers and checkpoints), to segment files by moves out of
	// the WAL, and to segment files by compaction (records and footers).
	WALBytes, MovedBytes, CompactedBytes uint64
	DeletedFiles                         uint64
	StoredEntries                        int
	SegmentsSealed                       uint64
	FootersRead                          uint64 // sealed segment files Open loaded from their index footers
	// MoverWaits: appends that waited for the worker to catch up
	// (Options.MaxSealedWALs); MoverWaited, their waits added up;
	// MoverWaitMax, the longest.
	MoverWaits                uint64
	MoverWaited, MoverWaitMax time.Duration
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
	fs, opts = testHooks(fs, opts) // UsePowerLoss, UseTestSizes
	if err := opts.defaults(); err != nil {
		return nil, err
	}
	if err := fs.MkdirAll(dir); err != nil {
		return nil, err
	}
	l := &Log{fs: fs, dir: dir, opts: opts, log: opts.Logger, groups: map[uint64]*groupIndex{}, quarantined: map[uint64]*groupIndex{},
		work: make(chan struct{}, 1), quit: make(chan struct{}),
		// The pending buffers are reused; they grow to the largest group
		// commit seen, and that growth is the only allocation an append
		// can cause.
		pending: make([]byte, 0, minBuf)}
	l.cond = sync.NewCond(&l.mu)
	l.applyCond = sync.NewCond(&l.mu)
	l.cur = l.newGen()
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
	if f.wal || !f.sealed || f.dead || f.refs != 0 || f.held {
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

// Truncate removes a group's entries from index from on (raft overwrites
// uncommitted entries after a leader change).
func (l *Log) Truncate(group, from uint64) error {
	if from == 0 {
		return errors.New("segment: Truncate from index 0: raft's indexes start at 1")
	}
	return l.writeOp(recTruncate, group, from, 0)
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
	return l.compact(group, upTo, 0, live)
}

// compact is Compact and CompactAt; term 0: the stored entry's, if any.
func (l *Log) compact(group, upTo, term uint64, live []uint64) error {
	if !slices.IsSorted(live) {
		return errors.New("segment: Compact: live indexes must be sorted ascending")
	}
	if upTo == math.MaxUint64 {
		return errors.New("segment: Compact: index out of range")
	}
	l.mu.Lock()
	if err := l.usableLocked(); err != nil {
		l.mu.Unlock()
		return err
	}
	if err := l.quarantinedLocked(group); err != nil {
		l.mu.Unlock()
		return err
	}
	if s := l.shadow(group); upTo >= s.first {
		l.mu.Unlock()
		if err := l.writeOp(recCompact, group, upTo, term); err != nil {
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

// RemoveGroup removes a group for good (durably: the record is synced
// before it returns): its entries, hard state and range are gone, and the
// worker deletes its segment files. The id may be used again afterwards;
// it then starts empty, as a group never seen. Views already handed out
// stay readable until released.
func (l *Log) RemoveGroup(group uint64) error {
	l.mu.Lock()
	if err := l.usableLocked(); err != nil {
		l.mu.Unlock()
		return err
	}
	if l.wal.old {
		l.rotate = true // a version-1 file never holds a remove record
	}
	l.undo = l.undo[:0]
	l.setShadow(group, span{first: 1})
	var start int
	l.pending, start = beginRecord(l.pending)
	l.pending = binary.LittleEndian.AppendUint64(l.pending, group)
	l.pending = closeRecord(l.pending, start, recRemove)
	l.updates = append(l.updates, update{kind: recRemove, group: group})
	l.stats.Records++
	return l.commitLocked()
}

// removeLocked forgets a group: every stored entry is unreferenced, and
// its files are left to the worker (Maintain's dropRemoved).
func (l *Log) removeLocked(id uint64) {
	if q := l.quarantined[id]; q != nil {
		// A quarantined group's files go like a removed group's.
		delete(l.quarantined, id)
		for _, f := range q.segs {
			f.held = false
		}
		l.removed = append(l.removed, q)
		l.kick()
	}
	g := l.groups[id]
	if g == nil {
		return
	}
	delete(l.groups, id)
	for i := range g.runs {
		g.runs[i].f.unref(g.runs[i].live)
	}
	clear(g.runs)
	g.runs = nil
	l.removed = append(l.removed, g)
	l.kick()
}

// Damaged lists the groups Open quarantined (Options.Quarantine) and not
// removed since, by group id.
func (l *Log) Damaged() []DamagedGroup {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.damagedLocked()
}

func (l *Log) damagedLocked() []DamagedGroup {
	out := make([]DamagedGroup, 0, len(l.quarantined))
	for _, g := range l.quarantined {
		out = append(out, *g.damage)
	}
	slices.SortFunc(out, func(a, b DamagedGroup) int { return cmp.Compare(a.Group, b.Group) })
	return out
}

// Quarantined reports whether group is quarantined, and why.
func (l *Log) Quarantined(group uint64) (DamagedGroup, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if g := l.quarantined[group]; g != nil {
		return *g.damage, true
	}
	return DamagedGroup{}, false
}

// quarantinedLocked is the error for a write to a quarantined group; nil
// when it is not.
func (l *Log) quarantinedLocked(group uint64) error {
	if len(l.quarantined) == 0 {
		return nil
	}
	if g := l.quarantined[group]; g != nil {
		return fmt.Errorf("%w: group %d: %s", ErrQuarantined, group, g.damage.Why)
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

// Close stops the background worker, writes a close mark at the end of
// the active WAL file (markLocked; not after a failure, ErrStopped) and
// closes the files. Appends in flight must have returned.
func (l *Log) Close() error {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return nil
	}
	l.closed = true
	l.wakeAllLocked() // appends waiting for the worker give up
	l.mu.Unlock()
	close(l.quit)
	l.wg.Wait()
	l.maint.Lock()
	defer l.maint.Unlock()
	l.mu.Lock()
	defer l.mu.Unlock()
	err := l.markLocked()
	if cerr := l.closeFiles(); err == nil {
		err = cerr
	}
	return err
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
	for _, g := range l.quarantined {
		for _, f := range g.segs {
			if !seen[f] {
				seen[f] = true
				closeOne(f)
			}
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
