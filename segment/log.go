package segment

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
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
type Batch struct {
	Group     uint64
	Entries   []Entry
	HardState *HardState
}

// Options configure a Log.
type Options struct {
	// Repair truncates the log at mid-log corruption (losing what follows,
	// with an error-level log line) instead of refusing to open.
	Repair bool
	Logger *slog.Logger
}

// Errors.
var (
	// ErrCorrupt is returned (wrapped, with the position and what follows)
	// by Open when a record before the end of the log is damaged.
	ErrCorrupt = errors.New("segment: corrupt record before the end of the log")
	// ErrStopped: an fsync or write failed earlier; the engine refuses all
	// further work. The process must restart and recover.
	ErrStopped = errors.New("segment: stopped after an I/O failure; restart to recover")
	// ErrUnavailable: the requested index is compacted or not yet written.
	ErrUnavailable = errors.New("segment: index not available")
	// ErrGap: an append would leave a hole after the group's last index.
	ErrGap = errors.New("segment: append leaves a gap")
)

const (
	walName    = "wal-000001.log"
	fileHeader = 16 // magic "WRNSEG01", generation u32, reserved u32
	magic      = "WRNSEG01"
)

// loc is where an entry's data lives in the log file.
type loc struct {
	term uint64
	off  int64
	n    uint32
}

type groupIndex struct {
	first uint64 // first available index (after compaction); last = first+len(locs)-1
	locs  []loc
	hs    HardState
	hsSet bool
}

func (g *groupIndex) last() uint64 { return g.first + uint64(len(g.locs)) - 1 }

// Log is a node's log: every group's entries and hard state in one
// append-only file of framed, checksummed records. Appends from many
// goroutines share writes and fsyncs (group commit): each caller's records
// are durable when Append returns. The entry index is kept in memory and
// rebuilt by Open.
//
// Not built yet (see the package doc): per-group segment files, the
// background flusher, WAL file rotation and deletion, mmap'd reads and
// compaction of files by live indexes.
type Log struct {
	fs  FS
	f   File
	gen uint32
	log *slog.Logger

	mu      sync.Mutex
	cond    *sync.Cond
	groups  map[uint64]*groupIndex
	size    int64 // end of durable (and written) data
	pending []byte
	updates []update // index changes to apply once pending is durable
	spare   []byte   // the other pending buffer (double buffering)
	spareU  []update
	seq     uint64 // batches queued so far
	done    uint64 // batches durable so far
	syncing bool
	failed  error
	// pendLast: each group's last index once the pending records are
	// durable, so appends queued behind one another are checked for gaps.
	pendLast map[uint64]uint64
	// flyLast is pendLast of the records being written right now.
	flyLast map[uint64]uint64

	// Stats: syncs and records written, for benchmarks.
	Syncs, Records uint64

	queuedHook func() // tests: called (under l.mu) when an append is queued

	maps mappings
}

// update is one change to the in-memory index, applied once the record
// that carries it is durable. Plain data, not closures: appends allocate
// nothing in steady state.
type update struct {
	kind  uint8 // a record type
	group uint64
	idx   uint64 // entries: index; truncate: from; compact: upTo
	term  uint64
	off   int64 // entries: offset of the data within the pending buffer
	n     uint32
	hs    HardState
}

// Open opens (creating if needed) the log in dir and recovers its state.
func Open(fs FS, dir string, opts Options) (*Log, error) {
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if err := fs.MkdirAll(dir); err != nil {
		return nil, err
	}
	f, err := fs.Open(filepath.Join(dir, walName))
	if err != nil {
		return nil, err
	}
	l := &Log{fs: fs, f: f, log: opts.Logger, groups: map[uint64]*groupIndex{}, pendLast: map[uint64]uint64{}, flyLast: map[uint64]uint64{}}
	l.cond = sync.NewCond(&l.mu)
	if err := l.recover(opts.Repair); err != nil {
		f.Close()
		return nil, err
	}
	return l, nil
}

func (l *Log) recover(repair bool) error {
	size, err := l.f.Size()
	if err != nil {
		return err
	}
	if size < fileHeader {
		// New (or torn before its header was synced): start generation 1.
		l.gen = 1
		hdr := make([]byte, fileHeader)
		copy(hdr, magic)
		binary.LittleEndian.PutUint32(hdr[8:], l.gen)
		if err := l.f.Truncate(0); err != nil {
			return err
		}
		if _, err := l.f.WriteAt(hdr, 0); err != nil {
			return err
		}
		if err := l.f.Sync(); err != nil {
			return err
		}
		l.size = fileHeader
		return nil
	}
	buf := make([]byte, size)
	if _, err := l.f.ReadAt(buf, 0); err != nil && !errors.Is(err, io.EOF) {
		return err
	}
	if string(buf[:8]) != magic {
		return fmt.Errorf("%w: bad file header in %s", ErrCorrupt, walName)
	}
	l.gen = binary.LittleEndian.Uint32(buf[8:])
	off := fileHeader
	for {
		typ, payload, next, err := readRecord(buf, off, l.gen)
		if err == nil {
			if err := l.replay(typ, payload, int64(off)); err != nil {
				return fmt.Errorf("%w: at offset %d: %v", ErrCorrupt, off, err)
			}
			off = next
			continue
		}
		if nextValid, found := validAfter(buf, off, l.gen); found && (errors.Is(err, errBadRec) || errors.Is(err, errEnd)) {
			what := describeFrom(buf, nextValid, l.gen)
			if !repair {
				return fmt.Errorf("%w: %s at offset %d; intact records follow (%s)", ErrCorrupt, walName, off, what)
			}
			l.log.Error("segment: REPAIR: truncating the log at mid-log corruption; everything after it is lost",
				"file", walName, "offset", off, "lost", what)
		}
		// The end: a torn or zeroed tail is cut here.
		break
	}
	if int64(off) < size {
		if err := l.f.Truncate(int64(off)); err != nil {
			return err
		}
		if err := l.f.Sync(); err != nil {
			return err
		}
	}
	l.size = int64(off)
	return nil
}

// describeFrom names the groups and index ranges of the intact records
// from off on, for the corruption report.
func describeFrom(buf []byte, off int, gen uint32) string {
	ranges := map[uint64][2]uint64{}
	for {
		typ, payload, next, err := readRecord(buf, off, gen)
		if err != nil {
			break
		}
		if typ == recEntries && len(payload) >= 12 {
			g := binary.LittleEndian.Uint64(payload)
			if len(payload) >= 20 {
				idx := binary.LittleEndian.Uint64(payload[12:])
				r, ok := ranges[g]
				if !ok || idx < r[0] {
					r[0] = idx
				}
				if idx > r[1] {
					r[1] = idx
				}
				ranges[g] = r
			}
		}
		off = next
	}
	s := ""
	for g, r := range ranges {
		s += fmt.Sprintf("group %d entries from %d; ", g, r[0])
	}
	if s == "" {
		return "no entries"
	}
	return s
}

func (l *Log) grp(id uint64) *groupIndex {
	g := l.groups[id]
	if g == nil {
		g = &groupIndex{first: 1}
		l.groups[id] = g
	}
	return g
}

// replay applies one recovered record to the index.
func (l *Log) replay(typ uint8, p []byte, recOff int64) error {
	switch typ {
	case recEntries:
		if len(p) < 12 {
			return errors.New("short entries record")
		}
		g := l.grp(binary.LittleEndian.Uint64(p))
		n := int(binary.LittleEndian.Uint32(p[8:]))
		o := 12
		for i := 0; i < n; i++ {
			if len(p)-o < 20 {
				return errors.New("truncated entry")
			}
			idx, term := binary.LittleEndian.Uint64(p[o:]), binary.LittleEndian.Uint64(p[o+8:])
			dn := binary.LittleEndian.Uint32(p[o+16:])
			o += 20
			if uint64(len(p)-o) < uint64(dn) {
				return errors.New("truncated entry data")
			}
			if err := g.put(idx, loc{term: term, off: recOff + recordHeader + int64(o), n: dn}); err != nil {
				return err
			}
			o += int(dn)
		}
	case recHardState:
		if len(p) != 32 {
			return errors.New("bad hard state record")
		}
		g := l.grp(binary.LittleEndian.Uint64(p))
		g.hs = HardState{Term: binary.LittleEndian.Uint64(p[8:]), Vote: binary.LittleEndian.Uint64(p[16:]), Commit: binary.LittleEndian.Uint64(p[24:])}
		g.hsSet = true
	case recTruncate:
		if len(p) != 16 {
			return errors.New("bad truncate record")
		}
		l.grp(binary.LittleEndian.Uint64(p)).truncate(binary.LittleEndian.Uint64(p[8:]))
	case recCompact:
		if len(p) != 16 {
			return errors.New("bad compact record")
		}
		l.grp(binary.LittleEndian.Uint64(p)).compact(binary.LittleEndian.Uint64(p[8:]))
	default:
		return fmt.Errorf("unknown record type %d", typ)
	}
	return nil
}

// put records entry idx, overwriting from idx if it is at or below last.
func (g *groupIndex) put(idx uint64, lc loc) error {
	if len(g.locs) == 0 {
		g.first = idx
		g.locs = append(g.locs, lc)
		return nil
	}
	switch {
	case idx == g.last()+1:
	case idx >= g.first && idx <= g.last():
		g.locs = g.locs[:idx-g.first]
	case idx < g.first:
		g.first, g.locs = idx, g.locs[:0]
	default:
		return ErrGap
	}
	g.locs = append(g.locs, lc)
	return nil
}

func (g *groupIndex) truncate(from uint64) {
	switch {
	case len(g.locs) == 0 || from > g.last():
	case from <= g.first:
		g.locs = g.locs[:0]
		g.first = from
	default:
		g.locs = g.locs[:from-g.first]
	}
}

func (g *groupIndex) compact(upTo uint64) {
	if len(g.locs) == 0 || upTo < g.first {
		if len(g.locs) == 0 && upTo >= g.first {
			g.first = upTo + 1
		}
		return
	}
	if upTo >= g.last() {
		g.first, g.locs = upTo+1, g.locs[:0]
		return
	}
	n := copy(g.locs, g.locs[upTo+1-g.first:])
	g.locs = g.locs[:n]
	g.first = upTo + 1
}

// Append makes batches durable: one write and one fsync cover them and
// whatever other goroutines appended meanwhile. It returns once they are
// on disk, or the error that stopped the engine.
func (l *Log) Append(batches ...Batch) error {
	l.mu.Lock()
	if l.failed != nil {
		l.mu.Unlock()
		return ErrStopped
	}
	for i := range batches {
		if err := l.checkLocked(&batches[i]); err != nil {
			l.mu.Unlock()
			return err
		}
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

// checkLocked refuses an append that would leave a hole.
func (l *Log) checkLocked(b *Batch) error {
	if len(b.Entries) == 0 {
		return nil
	}
	for i := 1; i < len(b.Entries); i++ {
		if b.Entries[i].Index != b.Entries[i-1].Index+1 {
			return ErrGap
		}
	}
	// Pending (not yet durable) appends count: look at the index as it will be.
	g := l.groups[b.Group]
	if g == nil || len(g.locs) == 0 {
		return nil
	}
	if b.Entries[0].Index > l.pendingLast(b.Group, g.last())+1 {
		return ErrGap
	}
	return nil
}

// pendingLast is the last index a group will have once pending records are
// durable (tracked through the encoded batches).
func (l *Log) pendingLast(id, last uint64) uint64 {
	if p, ok := l.pendLast[id]; ok {
		return p
	}
	if p, ok := l.flyLast[id]; ok {
		return p
	}
	return last
}

func (l *Log) encodeLocked(b *Batch) {
	if len(b.Entries) > 0 {
		var start int
		l.pending, start = beginRecord(l.pending)
		l.pending = binary.LittleEndian.AppendUint64(l.pending, b.Group)
		l.pending = binary.LittleEndian.AppendUint32(l.pending, uint32(len(b.Entries)))
		for _, e := range b.Entries {
			l.pending = binary.LittleEndian.AppendUint64(l.pending, e.Index)
			l.pending = binary.LittleEndian.AppendUint64(l.pending, e.Term)
			l.pending = binary.LittleEndian.AppendUint32(l.pending, uint32(len(e.Data)))
			l.updates = append(l.updates, update{kind: recEntries, group: b.Group, idx: e.Index, term: e.Term,
				off: int64(len(l.pending)), n: uint32(len(e.Data))})
			l.pending = append(l.pending, e.Data...)
		}
		l.pending = endRecord(l.pending, start, l.gen, recEntries)
		l.pendLast[b.Group] = b.Entries[len(b.Entries)-1].Index
		l.Records++
	}
	if hs := b.HardState; hs != nil {
		var start int
		l.pending, start = beginRecord(l.pending)
		l.pending = binary.LittleEndian.AppendUint64(l.pending, b.Group)
		l.pending = binary.LittleEndian.AppendUint64(l.pending, hs.Term)
		l.pending = binary.LittleEndian.AppendUint64(l.pending, hs.Vote)
		l.pending = binary.LittleEndian.AppendUint64(l.pending, hs.Commit)
		l.pending = endRecord(l.pending, start, l.gen, recHardState)
		l.updates = append(l.updates, update{kind: recHardState, group: b.Group, hs: *hs})
		l.Records++
	}
}

// applyLocked applies durable updates; base is the file offset of the
// pending buffer they were encoded in.
func (l *Log) applyLocked(us []update, base int64) {
	for i := range us {
		u := &us[i]
		g := l.grp(u.group)
		switch u.kind {
		case recEntries:
			_ = g.put(u.idx, loc{term: u.term, off: base + u.off, n: u.n})
		case recHardState:
			g.hs, g.hsSet = u.hs, true
		case recTruncate:
			g.truncate(u.idx)
		case recCompact:
			g.compact(u.idx)
		}
	}
}

// commitLocked waits until batch my is durable, becoming the writer if
// nobody is: the writer takes everything pending, writes it at the end of
// the file, fsyncs once, applies it to the index, and wakes the waiters.
// l.mu is held on entry and released on return.
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
		buf, us, upTo, base := l.pending, l.updates, l.seq, l.size
		l.pending, l.updates = l.spare[:0], l.spareU[:0]
		l.spare, l.spareU = nil, nil
		l.pendLast, l.flyLast = l.flyLast, l.pendLast // flyLast was cleared after the last write
		l.syncing = true
		l.mu.Unlock()
		_, err := l.f.WriteAt(buf, base)
		if err == nil {
			err = l.f.Sync()
		}
		l.mu.Lock()
		l.syncing = false
		l.Syncs++
		if err != nil {
			// Any write or fsync failure stops the engine: the page cache
			// may have dropped the data, so continuing could lie.
			l.failed = err
			l.log.Error("segment: I/O failure; the log is stopped", "err", err)
			l.cond.Broadcast()
			l.mu.Unlock()
			return fmt.Errorf("%w: %v", ErrStopped, err)
		}
		l.applyLocked(us, base)
		clear(l.flyLast)
		l.spare, l.spareU = buf[:0], us[:0]
		l.size = base + int64(len(buf))
		l.done = upTo
		l.cond.Broadcast()
	}
	l.mu.Unlock()
	return nil
}

// writeOp appends one control record (truncate, compact) durably.
func (l *Log) writeOp(typ uint8, gid, arg uint64) error {
	l.mu.Lock()
	if l.failed != nil {
		l.mu.Unlock()
		return ErrStopped
	}
	var start int
	l.pending, start = beginRecord(l.pending)
	l.pending = binary.LittleEndian.AppendUint64(l.pending, gid)
	l.pending = binary.LittleEndian.AppendUint64(l.pending, arg)
	l.pending = endRecord(l.pending, start, l.gen, typ)
	l.updates = append(l.updates, update{kind: typ, group: gid, idx: arg})
	if typ == recTruncate {
		l.pendLast[gid] = arg - 1
	}
	l.seq++
	return l.commitLocked(l.seq)
}

// Truncate removes a group's entries from index from on (raft overwrites
// uncommitted entries after a leader change).
func (l *Log) Truncate(group, from uint64) error {
	return l.writeOp(recTruncate, group, from)
}

// Compact discards a group's entries up to and including upTo.
func (l *Log) Compact(group, upTo uint64) error {
	return l.writeOp(recCompact, group, upTo)
}

// FirstIndex and LastIndex give a group's available range; an empty group
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
		return g.last()
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

// Term returns the term of a group's entry.
func (l *Log) Term(group, index uint64) (uint64, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	g := l.groups[group]
	if g == nil || len(g.locs) == 0 || index < g.first || index > g.last() {
		return 0, ErrUnavailable
	}
	return g.locs[index-g.first].term, nil
}

// Entries returns a group's entries lo..hi-1, their data read into one
// fresh buffer (the caller owns it).
func (l *Log) Entries(group, lo, hi uint64) ([]Entry, error) {
	l.mu.Lock()
	g := l.groups[group]
	if g == nil || lo < g.first || hi > g.last()+1 || lo > hi {
		l.mu.Unlock()
		return nil, ErrUnavailable
	}
	locs := append([]loc(nil), g.locs[lo-g.first:hi-g.first]...)
	l.mu.Unlock()
	total := 0
	for _, lc := range locs {
		total += int(lc.n)
	}
	data := make([]byte, total)
	out := make([]Entry, len(locs))
	o := 0
	for i, lc := range locs {
		if lc.n > 0 {
			if _, err := l.f.ReadAt(data[o:o+int(lc.n)], lc.off); err != nil && !errors.Is(err, io.EOF) {
				return nil, err
			}
		}
		out[i] = Entry{Index: lo + uint64(i), Term: lc.term, Data: data[o : o+int(lc.n) : o+int(lc.n)]}
		o += int(lc.n)
	}
	return out, nil
}

var errNoMap = errors.New("segment: file cannot be mapped")

// EntriesView returns a group's entries lo..hi-1 without copying: their
// Data are views into a read-only mapping of the log, valid until release
// is called (call it exactly once). The mapping stays alive while any view
// of it is held, even when the log grows and is remapped.
func (l *Log) EntriesView(group, lo, hi uint64) (entries []Entry, release func(), err error) {
	l.mu.Lock()
	g := l.groups[group]
	if g == nil || lo < g.first || hi > g.last()+1 || lo > hi {
		l.mu.Unlock()
		return nil, nil, ErrUnavailable
	}
	locs := g.locs[lo-g.first : hi-g.first]
	out := make([]Entry, len(locs))
	size := l.size
	m, err := l.maps.acquire(l.f, size)
	if err != nil {
		l.mu.Unlock()
		return nil, nil, err
	}
	for i, lc := range locs {
		out[i] = Entry{Index: lo + uint64(i), Term: lc.term, Data: m.data[lc.off : lc.off+int64(lc.n) : lc.off+int64(lc.n)]}
	}
	l.mu.Unlock()
	var once sync.Once
	return out, func() { once.Do(func() { l.maps.release(m) }) }, nil
}

// Groups lists the groups the log knows.
func (l *Log) Groups() []uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make([]uint64, 0, len(l.groups))
	for id := range l.groups {
		out = append(out, id)
	}
	return out
}

// Close closes the file. Pending appends have all returned by then only if
// the caller waited for them.
func (l *Log) Close() error {
	l.maps.close()
	return l.f.Close()
}
