package segment

import (
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
)

// worker runs Maintain whenever there is work: a WAL file sealed, a
// segment file emptied.
func (l *Log) worker() {
	defer l.wg.Done()
	for {
		select {
		case <-l.quit:
			return
		case <-l.work:
		}
		if err := l.Maintain(); err != nil {
			return // the engine is stopped or closed; every caller sees it
		}
	}
}

// Maintain does the background work now (the worker calls it; with
// Options.Manual the owner does): it moves the entries still stored in
// each sealed WAL file into their groups' segment files, syncs those, and
// deletes the WAL file; it compacts sealed segment files whose stored
// entries fell below Options.CompactBelow of those written (copying them
// to the group's current segment file); and it deletes segment files left
// with nothing stored. An I/O failure stops the engine.
func (l *Log) Maintain() error {
	l.maint.Lock()
	defer l.maint.Unlock()
	if err := l.dropRemoved(); err != nil {
		return l.fail(err)
	}
	for {
		yielded, err := l.maintainPass()
		if err != nil || !yielded {
			return err
		}
	}
}

// maintainPass is one pass of Maintain: the WAL files due moved, then the
// segment files due compacted, then the files left empty deleted. Appends
// wait for WAL moves (Options.MaxSealedWALs), not for compaction, so a
// pass goes back to the WAL files as soon as one is due again, between two
// compacted files (after one at least, so compaction is not starved):
// yielded says it did, and the caller runs another pass. Without that a
// long compaction pass (many groups, each copying up to half of its 64 MiB
// files) held every appender waiting that the mover was behind.
func (l *Log) maintainPass() (yielded bool, err error) {
	for {
		l.mu.Lock()
		if err := l.usableLocked(); err != nil {
			l.mu.Unlock()
			return false, err
		}
		if len(l.wals) <= l.opts.MoveLag {
			l.mu.Unlock()
			break
		}
		w := l.wals[0]
		l.moving, l.moveDone = w, 0
		l.mu.Unlock()
		if err := l.moveOut(w); err != nil {
			return false, l.fail(err)
		}
		l.mu.Lock()
		refs := w.refs
		l.mu.Unlock()
		if refs != 0 {
			return false, l.fail(fmt.Errorf("segment: %s still holds %d entries after they were moved", w.name, refs))
		}
		l.progress(1) // what is left is deleting it: appenders need not wait for that
		// Its successor opens with a checkpoint of everything in it, and its
		// entries are synced in segment files: it can go. A removed group's
		// files go first: the remove record may be in it.
		if err := l.dropRemoved(); err != nil {
			return false, l.fail(err)
		}
		if err := l.fs.Remove(l.path(w.name)); err != nil {
			return false, l.fail(err)
		}
		if err := l.fs.SyncDir(l.dir); err != nil {
			return false, l.fail(err)
		}
		l.mu.Lock()
		l.wals = l.wals[1:]
		l.moving, l.moveDone = nil, 0
		l.stats.DeletedFiles++
		l.cond.Broadcast() // appenders waiting for the worker to catch up
		l.mu.Unlock()
		l.closeFile(w)
	}

	l.mu.Lock()
	var compact []*file
	for _, id := range l.groupIDsLocked() {
		g := l.groups[id]
		for i := range g.runs {
			f := g.runs[i].f
			if !f.wal && f.sealed && !f.dead && f.refs > 0 && float64(f.refs) < l.opts.CompactBelow*float64(f.written) &&
				!slices.Contains(compact, f) {
				compact = append(compact, f)
			}
		}
	}
	l.mu.Unlock()
	for i, f := range compact {
		if l.compactHook != nil {
			l.compactHook()
		}
		l.mu.Lock()
		due := len(l.wals) > l.opts.MoveLag
		l.mu.Unlock()
		if i > 0 && due {
			yielded = true
			break
		}
		if err := l.moveOut(f); err != nil {
			return false, l.fail(err)
		}
	}

	l.mu.Lock()
	dead := l.dead
	l.dead = nil
	l.mu.Unlock()
	if len(dead) == 0 {
		return yielded, nil
	}
	for _, f := range dead {
		if err := l.fs.Remove(l.path(f.name)); err != nil {
			return false, l.fail(err)
		}
	}
	if err := l.fs.SyncDir(l.dir); err != nil {
		return false, l.fail(err)
	}
	l.mu.Lock()
	for _, f := range dead {
		if g := l.groups[f.group]; g != nil {
			g.segs = slices.DeleteFunc(g.segs, func(x *file) bool { return x == f })
		}
	}
	l.stats.DeletedFiles += uint64(len(dead))
	l.mu.Unlock()
	for _, f := range dead {
		l.closeFile(f)
	}
	return yielded, nil
}

// dropRemoved deletes the segment files of removed groups (every one,
// including those a move wrote after the removal), durably, before the
// caller deletes any WAL file: a WAL file's remove record must outlive
// the files it removes, or recovery would find the group again. Called
// under l.maint.
func (l *Log) dropRemoved() error {
	l.mu.Lock()
	gs := l.removed
	l.removed = nil
	var files []*file
	for _, g := range gs {
		for _, f := range g.segs {
			if f.dead {
				// Still on the dead list: delete it here, not again later.
				// Off it: Maintain deleted it already (it took the list
				// before the group was removed, then found no group to
				// forget the file in); deleting it again would fail.
				n := len(l.dead)
				l.dead = slices.DeleteFunc(l.dead, func(x *file) bool { return x == f })
				if len(l.dead) == n {
					continue
				}
			}
			f.dead, f.sealed = true, true
			files = append(files, f)
		}
		g.segs, g.seg = nil, nil
	}
	l.mu.Unlock()
	if len(files) == 0 {
		return nil
	}
	for _, f := range files {
		if err := l.fs.Remove(l.path(f.name)); err != nil {
			return err
		}
	}
	if err := l.fs.SyncDir(l.dir); err != nil {
		return err
	}
	l.mu.Lock()
	l.stats.DeletedFiles += uint64(len(files))
	l.mu.Unlock()
	for _, f := range files {
		l.closeFile(f)
	}
	return nil
}

func (l *Log) fail(err error) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if errors.Is(err, ErrStopped) || errors.Is(err, ErrClosed) {
		return err
	}
	l.failLocked(err)
	return fmt.Errorf("%w: %w", ErrStopped, err)
}

// closeFile closes a deleted file; views still held keep its mapping.
func (l *Log) closeFile(f *file) {
	f.maps.close()
	if f.f != nil {
		_ = f.f.Close()
		f.f = nil
	}
}

func (l *Log) groupIDsLocked() []uint64 {
	ids := make([]uint64, 0, len(l.groups))
	for id := range l.groups {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return ids
}

// progress records how far the move of l.moving is (done, from 0 to 1)
// and wakes the appenders waiting for it (behindLocked).
func (l *Log) progress(done float64) {
	l.mu.Lock()
	if done > l.moveDone {
		l.moveDone = done
		l.cond.Broadcast()
	}
	l.mu.Unlock()
	if l.progressHook != nil {
		l.progressHook()
	}
}

// moveJob is a run of src as the mover found it.
type moveJob struct {
	g    *groupIndex
	lo   uint64
	offs []uint32
}

// moveOut copies every entry stored in src (a sealed WAL file, or a
// segment file being compacted) to the end of its group's segment file,
// syncs what it wrote, and points the index at the copies. Entries cut or
// dropped meanwhile are left as they are; src ends with nothing stored.
func (l *Log) moveOut(src *file) error {
	l.mu.Lock()
	var jobs []moveJob
	ids := []uint64{src.group}
	if src.wal {
		ids = l.groupIDsLocked()
	}
	for _, id := range ids {
		g := l.groups[id]
		if g == nil {
			continue
		}
		for i := range g.runs {
			if r := &g.runs[i]; r.f == src {
				jobs = append(jobs, moveJob{g, r.lo, slices.Clone(r.offs)})
			}
		}
	}
	if len(jobs) == 0 {
		l.mu.Unlock()
		return nil
	}
	w := segWriter{l: l}
	if src == l.moving {
		// Report the move's progress to the appenders: half of it is
		// copying the stored entries, half syncing the files written.
		w.report = true
		for _, j := range jobs {
			for _, o := range j.offs {
				if o != 0 {
					w.total++
				}
			}
		}
	}
	m, err := src.maps.acquire(src.f, src.size)
	l.mu.Unlock()
	if err != nil {
		return err
	}
	defer src.maps.release(m)

	var moved [][]piece
	for start := 0; start < len(jobs); {
		end := start
		for end < len(jobs) && jobs[end].g == jobs[start].g {
			end++
		}
		ps, err := w.group(jobs[start].g, jobs[start:end], src, m.data)
		if err != nil {
			return err
		}
		moved = append(moved, ps)
		start = end
	}
	for _, f := range w.touched {
		f.touched = false
	}
	if err := w.sync(); err != nil {
		return err
	}
	files := slices.Clip(w.touched)
	for _, f := range w.sealed {
		if !slices.Contains(files, f) {
			files = append(files, f)
		}
	}
	sizes := make([]int64, len(files))
	l.mu.Lock()
	for i, f := range files {
		// Synced: from now on a checkpoint lists the new size, so the
		// promise outlives the WAL file the promise record goes into.
		f.size = f.wsize
		sizes[i] = f.wsize
	}
	l.mu.Unlock()
	if len(files) > 0 {
		if err := l.promise(files, sizes); err != nil {
			return err
		}
	}
	if l.promisedHook != nil {
		l.promisedHook()
	}

	l.mu.Lock()
	defer l.mu.Unlock()
	for _, s := range w.sealed {
		s.sealed = true
		l.stats.SegmentsSealed++
	}
	n := 0
	for i, start := 0, 0; start < len(jobs); i++ {
		end := start
		for end < len(jobs) && jobs[end].g == jobs[start].g {
			end++
		}
		jobs[start].g.repoint(src, moved[i])
		for _, p := range moved[i] {
			n += len(p.offs)
		}
		start = end
	}
	if src.wal {
		l.stats.Moved += uint64(n)
		l.stats.MovedBytes += w.bytes
	} else {
		l.stats.Compacted += uint64(n)
		l.stats.CompactedBytes += w.bytes
	}
	for _, s := range w.sealed {
		l.maybeDead(s)
	}
	return nil
}

// segWriter appends groups' entries to their segment files: records of up
// to maxEntriesRecord, one pwrite per record, a new file when one is full.
type segWriter struct {
	l       *Log
	buf     []byte
	touched []*file // files written, to sync
	sealed  []*file // files filled up (sealed once the copies are synced)
	created bool
	bytes   uint64 // written, headers and footers included
	// report: the move's progress goes to l.progress (a WAL file's move);
	// total entries to copy, copied so far.
	report        bool
	total, copied int
}

// group writes the entries of jobs (one group's) and returns where each
// went.
func (w *segWriter) group(g *groupIndex, jobs []moveJob, srcFile *file, src []byte) ([]piece, error) {
	var pieces []piece
	recStart, count := -1, 0
	flush := func() error {
		if recStart < 0 {
			return nil
		}
		binary.LittleEndian.PutUint32(w.buf[recStart+recordHeader+8:], uint32(count))
		w.buf = endRecord(w.buf, recStart, g.seg.gen(), recEntries)
		if _, err := g.seg.f.WriteAt(w.buf, g.seg.wsize); err != nil {
			return err
		}
		w.bytes += uint64(len(w.buf))
		g.seg.foot.recs = append(g.seg.foot.recs, uint32(g.seg.wsize))
		g.seg.wsize += int64(len(w.buf))
		g.seg.written += count
		if w.report {
			w.copied += count
			w.l.progress(0.5 * float64(w.copied) / float64(max(w.total, 1)))
		}
		w.buf, recStart, count = w.buf[:0], -1, 0
		return nil
	}
	for _, j := range jobs {
		for i, o := range j.offs {
			if o == 0 {
				continue // dropped before the move
			}
			idx := j.lo + uint64(i)
			if srcFile.lazy != nil {
				// Never copy an unchecked record under a fresh checksum.
				if err := srcFile.lazy.check(srcFile, src, o); err != nil {
					return nil, err
				}
			}
			got, term, data := entryAt(src, o)
			if got != idx {
				return nil, fmt.Errorf("segment: moving group %d: index %d found where %d was expected", g.id, got, idx)
			}
			need := int64(recordHeader + 12 + entryHeader + len(data) + align)
			if recStart >= 0 && len(w.buf)+entryHeader+len(data) > maxEntriesRecord {
				if err := flush(); err != nil {
					return nil, err
				}
			}
			if used := g.seg != nil && g.seg.wsize+int64(len(w.buf)) > fileHeader; g.seg == nil ||
				(used && g.seg.wsize+int64(len(w.buf))+need > w.l.opts.SegmentSize) {
				if err := flush(); err != nil {
					return nil, err
				}
				if g.seg != nil {
					if err := w.footer(g.seg); err != nil {
						return nil, err
					}
					w.sealed = append(w.sealed, g.seg)
				}
				if err := w.newSegment(g); err != nil {
					return nil, err
				}
			}
			if recStart < 0 {
				w.buf, recStart = beginRecord(w.buf)
				w.buf = binary.LittleEndian.AppendUint64(w.buf, g.id)
				w.buf = binary.LittleEndian.AppendUint32(w.buf, 0)
			}
			w.buf = binary.LittleEndian.AppendUint64(w.buf, idx)
			w.buf = binary.LittleEndian.AppendUint64(w.buf, term)
			w.buf = binary.LittleEndian.AppendUint32(w.buf, uint32(len(data)))
			off := uint32(g.seg.wsize) + uint32(len(w.buf))
			w.buf = append(w.buf, data...)
			g.seg.foot.add(idx, term, off)
			count++
			if n := len(pieces); n > 0 && pieces[n-1].f == g.seg && pieces[n-1].lo+uint64(len(pieces[n-1].offs)) == idx {
				pieces[n-1].offs = append(pieces[n-1].offs, off)
			} else {
				pieces = append(pieces, piece{lo: idx, f: g.seg, offs: []uint32{off}})
			}
			if !g.seg.touched {
				g.seg.touched = true
				w.touched = append(w.touched, g.seg)
			}
		}
	}
	return pieces, flush()
}

// footer ends a segment file being sealed with its index (footer.go), so
// that Open need not scan it. One too large for a record is left out:
// the file is scanned instead.
func (w *segWriter) footer(f *file) error {
	ix := f.foot
	f.foot = footIndex{}
	if f.version < footerVersion || len(ix.recs) == 0 ||
		footerPayload(len(ix.recs), len(ix.runs), len(ix.offs)) > MaxRecord {
		return nil
	}
	w.buf = encodeFooter(w.buf[:0], f, &ix, f.wsize)
	if _, err := f.f.WriteAt(w.buf, f.wsize); err != nil {
		return err
	}
	w.bytes += uint64(len(w.buf))
	f.wsize += int64(len(w.buf))
	f.footed = true
	w.buf = w.buf[:0]
	return nil
}

// newSegment starts a group's next segment file.
func (w *segWriter) newSegment(g *groupIndex) error {
	l := w.l
	l.mu.Lock()
	f := &file{seq: l.nextSeq, group: g.id, owner: l, version: formatVersion}
	l.nextSeq++
	l.mu.Unlock()
	f.name = segName(g.id, f.seq)
	h, err := l.fs.Open(l.path(f.name))
	if err != nil {
		return err
	}
	f.f = h
	if _, err := h.WriteAt(appendFileHeader(nil, segMagic, f.gen()), 0); err != nil {
		return err
	}
	w.bytes += fileHeader
	f.wsize = fileHeader
	g.seg = f
	w.created = true
	l.mu.Lock()
	g.segs = append(g.segs, f)
	l.mu.Unlock()
	return nil
}

// syncParallel is how many fdatasyncs the mover keeps in flight: on a
// journaling filesystem concurrent syncs share journal commits and device
// flushes, so a move touching many groups' files does not pay one flush
// per file in turn.
const syncParallel = 16

// sync makes everything written durable: the files, several at once,
// then the directory if files were created.
func (w *segWriter) sync() error {
	files := slices.Clip(w.touched)
	for _, f := range w.sealed {
		if !slices.Contains(files, f) {
			files = append(files, f)
		}
	}
	var next, synced atomic.Int64
	var wg sync.WaitGroup
	errs := make([]error, min(syncParallel, len(files)))
	for i := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				k := int(next.Add(1)) - 1
				if k >= len(files) {
					return
				}
				if err := files[k].f.Sync(); err != nil {
					errs[i] = err
					return
				}
				if w.report {
					w.l.progress(0.5 + 0.5*float64(synced.Add(1))/float64(len(files)))
				}
			}
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return err
	}
	if w.created {
		return w.l.fs.SyncDir(w.l.dir)
	}
	return nil
}
