package segment

// The write path: appends queued into a shared buffer, group commit,
// WAL rotation with checkpoints, control records.

import (
	"encoding/binary"
	"fmt"
	"slices"
	"sync"
	"time"
)

// shadow is a group's raft range as it will be once everything queued is
// durable.
func (l *Log) shadow(id uint64) span {
	if s, ok := l.cur.spans[id]; ok {
		return s
	}
	for i := len(l.flying) - 1; i >= 0; i-- {
		if s, ok := l.flying[i].spans[id]; ok {
			return s
		}
	}
	if g := l.groups[id]; g != nil {
		return g.span
	}
	return span{first: 1}
}

func (l *Log) setShadow(id uint64, s span) {
	prev, had := l.cur.spans[id]
	l.undo = append(l.undo, spanUndo{id, prev, had})
	l.cur.spans[id] = s
}

func (l *Log) rollback() {
	for i := len(l.undo) - 1; i >= 0; i-- {
		u := l.undo[i]
		if u.had {
			l.cur.spans[u.group] = u.prev
		} else {
			delete(l.cur.spans, u.group)
		}
	}
	l.undo = l.undo[:0]
}

// Append makes batches durable: one write and one fsync cover them and
// whatever other goroutines appended meanwhile. It returns once they are
// on disk, or the error that stopped the engine.
func (l *Log) Append(batches ...Batch) error {
	return l.AppendThen(nil, batches...)
}

// AppendThen is Append, and calls queued (if not nil) once the batches
// have their place in the log, before it waits for the write: an Append
// that starts after that is written after them. queued runs under the
// log's lock (it must not call the Log, nor block); it is not called
// when Append fails before the batches are queued.
func (l *Log) AppendThen(queued func(), batches ...Batch) error {
	l.mu.Lock()
	if err := l.usableLocked(); err != nil {
		l.mu.Unlock()
		return err
	}
	var waited time.Time // when this append started waiting for the worker
	for l.failed == nil && !l.closed && ((l.pos() > maxPending && l.inflight > 0) || l.behindLocked()) {
		// The next write takes what is pending: bound it. And let the
		// worker catch up when it is behind.
		if waited.IsZero() && l.behindLocked() {
			waited = time.Now()
		}
		if l.waitHook != nil {
			l.waitHook()
		}
		l.cond.Wait()
	}
	if !waited.IsZero() {
		d := time.Since(waited)
		l.stats.MoverWaits++
		l.stats.MoverWaited += d
		l.stats.MoverWaitMax = max(l.stats.MoverWaitMax, d)
	}
	if err := l.usableLocked(); err != nil {
		l.mu.Unlock()
		return err
	}
	l.undo = l.undo[:0]
	total, copied := 0, 0
	for i := range batches {
		b := &batches[i]
		if err := l.quarantinedLocked(b.Group); err != nil {
			l.rollback()
			l.mu.Unlock()
			return err
		}
		if len(b.Entries) == 0 {
			continue
		}
		s := l.shadow(b.Group)
		for j := range b.Entries {
			idx := b.Entries[j].Index
			if err := s.put(idx); err != nil || idx == 0 || (j > 0 && idx != b.Entries[j-1].Index+1) {
				l.rollback()
				l.mu.Unlock()
				return ErrGap
			}
			if total += len(b.Entries[j].Data) + entryHeader; len(b.Entries[j].Data) > MaxEntry || total > maxPending {
				l.rollback()
				l.mu.Unlock()
				return fmt.Errorf("segment: an entry over %d bytes, or an append over %d bytes", MaxEntry, maxPending)
			}
			copied += entryHeader
			if len(b.Entries[j].Data) < minExtent {
				copied += len(b.Entries[j].Data)
			}
		}
		l.setShadow(b.Group, s)
	}
	l.growPending(copied, len(batches))
	for i := range batches {
		l.encodeLocked(&batches[i])
	}
	if l.queuedHook != nil {
		l.queuedHook()
	}
	if queued != nil {
		queued()
	}
	return l.commitLocked()
}

// behindLocked reports whether the worker is Options.MaxSealedWALs WAL
// files behind: the sealed files beyond MoveLag, less how far the move of
// the first one is, plus how full the current file is (its written and
// pending bytes). The count changes by steps of the move, not by whole
// files: a move's end takes its file off as its progress drops back to
// zero, and a new WAL file adds one as the current one, full, starts
// empty. So an appender waits for the next step of the move, not for the
// rest of it.
func (l *Log) behindLocked() bool {
	n := len(l.wals) - l.opts.MoveLag
	if l.opts.Manual || n <= 0 {
		return false
	}
	behind := float64(n)
	if l.moving != nil && l.moving == l.wals[0] {
		behind -= l.moveDone
	}
	behind += min(1, float64(l.wal.wsize+int64(l.pos()))/float64(l.opts.WALSize))
	return behind >= float64(l.opts.MaxSealedWALs)
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

// minExtent: entry data this large is not copied into the pending buffer
// but written from the caller's slice (an extent: pwritev), which
// Append's contract keeps unchanged until it returns. Copied, a busy
// queue's entries cost a memmove of every body (a tenth of
// BenchmarkDurablePersistent1K's CPU); a small entry is cheaper copied
// than as an iovec of its own.
const minExtent = 4 << 10

// extent is entry data written from the caller's slice: in the write, at
// offset at of the pending buffer (before the byte there), come data.
type extent struct {
	at   int
	data []byte
}

// pos is the pending write's length: its buffer and its extents.
func (l *Log) pos() int { return len(l.pending) + l.extBytes }

func (l *Log) encodeLocked(b *Batch) {
	for i := 0; i < len(b.Entries); {
		var start int
		recStart := l.pos()
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
			l.updates = append(l.updates, update{kind: recEntries, group: b.Group, idx: e.Index, off: int64(l.pos())})
			if len(e.Data) >= minExtent {
				l.ext = append(l.ext, extent{at: len(l.pending), data: e.Data})
				l.extBytes += len(e.Data)
			} else {
				l.pending = append(l.pending, e.Data...)
			}
			n++
			size += len(e.Data) + entryHeader
		}
		binary.LittleEndian.PutUint32(l.pending[countAt:], uint32(n))
		l.pending = closeRecordN(l.pending, start, l.pos()-recStart-recordHeader, recEntries)
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
		var g *groupIndex
		if u.kind != recRemove {
			g = l.grp(u.group)
		}
		switch u.kind {
		case recEntries:
			_ = g.put(u.idx, f, uint32(base+u.off)) // checked against the shadow when queued
		case recHardState:
			g.hs, g.hsSet = u.hs, true
		case recTruncate:
			g.truncate(u.idx)
		case recCompact:
			g.compact(u.idx, u.term)
		case recRemove:
			l.removeLocked(u.group)
		case recLive:
			g.place(u.idx, u.term, f, uint32(base+u.off), l.termAt)
		}
	}
}

// maxInflight is how many group commits may be in flight at once: the
// next one is written while the previous one's fdatasync runs, and a disk
// completes overlapping flushes faster than one after another.
const maxInflight = 2

// batchGen is the batches queued into one pending buffer: they go out in
// one write. Their appenders sleep on its cond, woken when it is durable
// (or the engine stops) or, while it is still pending, when a write may
// start (one of them, with Signal): a commit wakes the appenders it
// covered, not every appender.
type batchGen struct {
	cond sync.Cond
	done bool
	// spans: each group's raft range once these batches are durable, so
	// appends queued behind them are checked for gaps.
	spans   map[uint64]span
	waiters int // appenders in commitLocked for it; the last one out recycles it
}

func (l *Log) newGen() *batchGen {
	if n := len(l.freeGens); n > 0 {
		g := l.freeGens[n-1]
		l.freeGens = l.freeGens[:n-1]
		g.done = false
		return g
	}
	g := &batchGen{spans: map[uint64]span{}}
	g.cond.L = &l.mu
	return g
}

// commitLocked waits until the batches just queued (into l.cur) are
// durable, becoming the writer when they are still pending and a write
// may start: the writer takes everything pending, writes it at the end of
// the WAL (or, when the WAL is full, into a new WAL file that starts with
// a checkpoint), lets the next writer start, fsyncs, and once every
// earlier write is applied, applies its own to the index and wakes its
// waiters. l.mu is held on entry and released on return.
func (l *Log) commitLocked() error {
	g := l.cur
	g.waiters++
	for !g.done {
		if l.failed != nil {
			return l.leaveLocked(g, ErrStopped)
		}
		if g != l.cur || l.writing || l.inflight >= maxInflight {
			g.cond.Wait() // in a write already, or no write may start now
			continue
		}
		f, base := l.wal, l.wal.wsize
		rotate := (base > f.head || f.old) && (l.rotate || base+int64(l.pos()) > l.opts.WALSize)
		if rotate && l.inflight > 0 {
			g.cond.Wait() // a checkpoint must follow everything before it
			continue
		}
		buf, ext, us, size := l.pending, l.ext, l.updates, int64(l.pos())
		l.pending, l.updates = l.freeBuf(), l.freeUpdates()
		l.ext, l.extBytes = l.freeExt, 0
		l.freeExt = nil
		l.flying = append(l.flying, g)
		l.cur = l.newGen()
		var head []byte // header and checkpoint of a new WAL file
		if rotate {
			l.rotate = false
			nf := &file{seq: l.nextSeq, wal: true, owner: l}
			nf.name = walName(nf.seq)
			l.nextSeq++
			head = l.checkpointLocked(nf.gen(), 1|tagAlone, size == 0)
			nf.head = int64(len(head))
			f.sealed = true
			l.wals = append(l.wals, f)
			l.wal, f, base = nf, nf, nf.head
		}
		f.wsize = base + size
		f.marked = false
		var tag uint32 // the write's tag in f (none in an older file)
		if !f.old {
			f.wnum = nextWrite(f.wnum)
			if tag = f.wnum; l.inflight == 0 {
				tag |= tagAlone
			}
		}
		if l.inflight > 0 {
			l.stats.Pipelined++
		}
		l.writing = true
		l.inflight++
		l.mu.Unlock()
		seal(buf, ext, f.gen(), tag, !f.old) // an older file's records carry no tag at all: an older build reads them
		err := l.write(f, head, buf, ext, base)
		l.mu.Lock()
		l.writing = false
		l.cur.cond.Signal() // the next write may start
		if err == nil {
			l.mu.Unlock()
			err = l.sync(f, head != nil)
			l.mu.Lock()
		}
		for err == nil && l.failed == nil && l.flying[0] != g {
			l.applyCond.Wait() // apply in order
		}
		l.stats.Syncs++
		l.stats.WALBytes += uint64(int64(len(head)) + size)
		if err != nil {
			// Any write or fsync failure stops the engine: the page cache
			// may have dropped the data, so continuing could lie.
			l.failLocked(err)
			return l.leaveLocked(g, fmt.Errorf("%w: %w", ErrStopped, err))
		}
		if l.failed != nil { // an earlier write failed: this one is not acknowledged
			return l.leaveLocked(g, ErrStopped)
		}
		if rotate {
			l.kick() // the sealed WAL file can be moved
		}
		l.applyLocked(us, f, base)
		clear(g.spans)
		l.flying = append(l.flying[:0], l.flying[1:]...)
		l.lastWrite = len(buf)
		l.releaseBuf(buf)
		clear(ext) // the callers' data
		l.freeExt = ext[:0]
		l.freeUps = append(l.freeUps, us[:0])
		f.size = base + size
		l.inflight--
		g.done = true
		g.cond.Broadcast()      // its appenders
		l.applyCond.Broadcast() // the next write in order
		l.cur.cond.Signal()     // a write may start
		l.cond.Broadcast()      // appenders waiting for the pending buffer to shrink
	}
	return l.leaveLocked(g, nil)
}

// leaveLocked is an appender leaving commitLocked with err: the last one
// out of a durable generation returns it to the pool. It unlocks l.mu.
func (l *Log) leaveLocked(g *batchGen, err error) error {
	if g.waiters--; g.waiters == 0 && g.done {
		l.freeGens = append(l.freeGens, g)
	}
	l.mu.Unlock()
	return err
}

func (l *Log) freeBuf() []byte {
	if n := len(l.freeBufs); n > 0 {
		b := l.freeBufs[n-1]
		l.freeBufs = l.freeBufs[:n-1]
		return b
	}
	return make([]byte, 0, minBuf)
}

func (l *Log) freeUpdates() []update {
	if n := len(l.freeUps); n > 0 {
		u := l.freeUps[n-1]
		l.freeUps = l.freeUps[:n-1]
		return u
	}
	return nil
}

// write writes buf with its extents at base in f. A new file (head !=
// nil) is created with its header and checkpoint first.
func (l *Log) write(f *file, head, buf []byte, ext []extent, base int64) error {
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
	if len(ext) == 0 {
		_, err := f.f.WriteAt(buf, base)
		return err
	}
	// One writer at a time (l.writing): the iovec scratch is its own.
	iov, at := l.iov[:0], 0
	for _, x := range ext {
		if x.at > at {
			iov = append(iov, buf[at:x.at])
		}
		iov, at = append(iov, x.data), x.at
	}
	if at < len(buf) {
		iov = append(iov, buf[at:])
	}
	err := writevAt(f.f, iov, base)
	clear(iov)
	l.iov = iov[:0]
	return err
}

// sync makes f durable, and its directory entry when it is new.
func (l *Log) sync(f *file, created bool) error {
	// The error names the file: fdatasync's errno alone does not.
	if err := f.f.Sync(); err != nil {
		return fmt.Errorf("fdatasync %s: %w", l.path(f.name), err)
	}
	if created {
		if err := l.fs.SyncDir(l.dir); err != nil {
			return fmt.Errorf("fsync of the directory %s: %w", l.dir, err)
		}
	}
	return nil
}

func (l *Log) failLocked(err error) {
	if l.failed == nil {
		l.failed = err
		l.log.Error("segment: I/O failure; the log is stopped", "err", err)
	}
	l.wakeAllLocked()
}

// wakeAllLocked wakes every waiter: the engine stopped or closed.
func (l *Log) wakeAllLocked() {
	l.cond.Broadcast()
	l.applyCond.Broadcast()
	l.cur.cond.Broadcast()
	for _, g := range l.flying {
		g.cond.Broadcast()
	}
}

// checkpointLocked encodes a new WAL file's header and a checkpoint record
// per group: its raft range and hard state as of everything durable so
// far. With it, the WAL files before it are not needed once their entries
// are in segment files.
// Checkpoint flags.
const (
	ckptHardState   = 1 // the hard state is set
	ckptQuarantined = 2 // the group is quarantined (Options.Quarantine): it opens quarantined until removed
)

// Its records are sealed as part of write tag of the new file (the
// last of it if last).
func (l *Log) checkpointLocked(gen, tag uint32, last bool) []byte {
	b := appendFileHeader(l.ckpt[:0], walMagic, gen)
	ids := l.groupIDsLocked()
	if len(l.quarantined) > 0 {
		for id := range l.quarantined {
			ids = append(ids, id)
		}
		slices.Sort(ids)
	}
	for _, id := range ids {
		g, quarantined := l.groups[id], false
		if g == nil {
			g, quarantined = l.quarantined[id], true
		}
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
			flags |= ckptHardState
		}
		if quarantined {
			flags |= ckptQuarantined
		}
		b = binary.LittleEndian.AppendUint64(b, flags)
		b = binary.LittleEndian.AppendUint64(b, uint64(len(g.segs)))
		for _, f := range g.segs {
			b = binary.LittleEndian.AppendUint64(b, f.seq)
			// A damaged file keeps the promise it broke.
			b = binary.LittleEndian.AppendUint64(b, uint64(max(f.size, f.promised)))
		}
		b = closeRecord(b, start, recCheckpoint)
	}
	if len(ids) == 0 {
		// No group: the checkpoint is one empty promise, so the file's
		// first write always holds a record. Recovery then tells damage
		// in it (synced before the next write, unless an earlier WAL file
		// is still there) from damage in the next write, which may be
		// torn (record.go: inFlightTail).
		b = appendEmptyPromise(b)
	}
	seal(b[fileHeader:], nil, gen, tag, last)
	l.ckpt = b
	return b
}

// writeOp appends one control record (truncate, compact) durably.
// For a compaction, term is that of arg (0: the stored entry's, if any).
func (l *Log) writeOp(typ uint8, gid, arg, term uint64) error {
	l.mu.Lock()
	if err := l.usableLocked(); err != nil {
		l.mu.Unlock()
		return err
	}
	if err := l.quarantinedLocked(gid); err != nil {
		l.mu.Unlock()
		return err
	}
	s := l.shadow(gid)
	if typ == recTruncate {
		s.truncate(arg)
	} else {
		s.compact(arg)
		if term == 0 {
			term = l.termLocked(gid, arg)
		}
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
	return l.commitLocked()
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
	return l.commitLocked()
}

// markLocked writes a close mark at the end of the active WAL file: an
// empty promise (which every reader of version 5 replays as nothing:
// appendEmptyPromise), written alone as a write of its own, tagged its
// write's last, and synced. Recovery takes damage in one of the last two
// writes of the active WAL file for a torn tail (inFlightTail): the mark,
// a write that started with nothing in flight, proves every write before
// it synced, so damage found there later is reported (ErrCorrupt, or a
// quarantine), and only damage in the mark itself, which holds nothing, is
// cut. Close writes one, and Open after it synced the active WAL file it
// kept. It writes nothing when the log is stopped (a failed write or
// fsync: the process must restart and recover), when a write is in
// flight or pending (Close's callers must have let their appends return),
// into a WAL file of an older version (no tags), or when the file already
// ends with a mark (repeated opens and closes add nothing). A mark that
// cannot be written (a full disk) is taken back and left out; one whose
// fsync fails stops the log, as any fsync failure does. Called with
// l.mu held and no write in flight; it holds l.mu over the write.
func (l *Log) markLocked() error {
	f := l.wal
	if f == nil || f.f == nil || f.old || f.marked || f.damaged || l.failed != nil || l.writing || l.inflight > 0 || l.pos() > 0 {
		return nil
	}
	buf := appendEmptyPromise(make([]byte, 0, recordHeader+24))
	base, wnum := f.wsize, f.wnum
	f.wnum = nextWrite(f.wnum)
	seal(buf, nil, f.gen(), f.wnum|tagAlone, true)
	if _, err := f.f.WriteAt(buf, base); err != nil {
		// A full disk (ENOSPC) must not keep the node from starting or
		// stopping cleanly for 40 bytes that hold nothing: take back what
		// was written and go on without a mark (the tail's last two writes
		// are then judged as before it: damage there is cut).
		if terr := f.f.Truncate(base); terr != nil {
			l.failLocked(terr)
			return fmt.Errorf("%w: the close mark: %w (and taking it back: %w)", ErrStopped, err, terr)
		}
		f.wnum = wnum
		l.log.Warn("segment: no close mark written", "file", f.name, "err", err)
		return nil
	}
	err := l.sync(f, false)
	l.stats.Syncs++
	l.stats.Records++
	l.stats.WALBytes += uint64(len(buf))
	if err != nil {
		l.failLocked(err)
		return fmt.Errorf("%w: the close mark: %w", ErrStopped, err)
	}
	f.size, f.wsize = base+int64(len(buf)), base+int64(len(buf))
	f.marked = true
	return nil
}
