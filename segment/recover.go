package segment

import (
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"strings"
)

// recover rebuilds the index from the files in the directory: every
// group's segment files (of two copies of an index, the higher term
// wins), then the WAL files in order (each opens with a checkpoint of
// every group's range, hard state and segment files; its records replay
// with raft's append semantics). Then every group's raft log must be
// wholly stored.
func (l *Log) recover() error {
	names, err := l.fs.List(l.dir)
	if err != nil {
		return err
	}
	var wals []*file
	segs := map[uint64][]*file{}
	for _, name := range names {
		seq, group, wal, ok := parseName(name)
		if !ok {
			continue // not ours
		}
		f := &file{name: name, seq: seq, wal: wal, group: group, owner: l}
		l.nextSeq = max(l.nextSeq, seq+1)
		if wal {
			wals = append(wals, f)
		} else {
			segs[group] = append(segs[group], f)
		}
	}
	l.nextSeq = max(l.nextSeq, 1)
	byseq := func(a, b *file) int { return cmp.Compare(a.seq, b.seq) }
	slices.SortFunc(wals, byseq)

	// What the WAL files promise of the segment files: damage before a
	// promised size is corruption, after it a torn tail.
	promised := map[uint64]int64{}
	for _, f := range wals {
		if err := l.promises(f, promised); err != nil {
			return err
		}
	}

	groupIDs := make([]uint64, 0, len(segs))
	for id := range segs {
		groupIDs = append(groupIDs, id)
	}
	slices.Sort(groupIDs)
	for _, id := range groupIDs {
		list := segs[id]
		slices.SortFunc(list, byseq)
		g := l.grp(id)
		for _, f := range list {
			f.promised = promised[f.seq]
			if err := l.loadSegment(g, f, promised[f.seq]); err != nil {
				return err
			}
		}
		// Until a checkpoint says otherwise, the raft log is what is stored.
		if n := len(g.runs); n > 0 {
			g.first, g.last = g.runs[0].lo, g.runs[n-1].hi()
		}
		for i, f := range list {
			if f.f == nil {
				continue // removed (nothing in it)
			}
			g.segs = append(g.segs, f)
			if i == len(list)-1 && f.wsize < l.opts.SegmentSize && !f.footed && f.version >= footerVersion && !f.damaged {
				g.seg = f
			} else {
				f.sealed = true
				f.foot = footIndex{}
			}
		}
	}

	for i, f := range wals {
		f.afterWAL = i > 0
		if err := l.loadWAL(f, i == len(wals)-1); err != nil {
			return err
		}
	}
	if err := l.validate(); err != nil {
		return err
	}
	// The active WAL: the last one, unless it had no usable header (then
	// it is gone, and a new one starts).
	lastGone := len(wals) == 0 || wals[len(wals)-1].f == nil
	wals = slices.DeleteFunc(wals, func(f *file) bool { return f.f == nil })
	if !lastGone {
		l.wal, wals = wals[len(wals)-1], wals[:len(wals)-1]
	}
	l.wals = wals
	for _, w := range l.wals {
		w.sealed = true
	}
	if check := l.opts.CheckDamage; check != nil {
		if err := check(l.damagedLocked()); err != nil {
			return err // nothing written yet
		}
	}
	// Only now is anything written: the torn tails found are cut.
	if err := l.applyCuts(); err != nil {
		return err
	}
	if !lastGone {
		// What was replayed from the active WAL file may be only in the
		// page cache (a process killed after a write's pwrite, before its
		// fdatasync): make it durable before anything counts on it. A
		// checkpoint written later (a new file's, the seal below) restates
		// the groups' last indexes, and the file it describes may never be
		// synced again.
		if err := l.wal.f.Sync(); err != nil {
			return err
		}
	}
	if !lastGone && (len(l.quarantined) > 0 || l.wal.partial) {
		// The quarantine must be durable before the worker deletes any WAL
		// file that holds the damage or a quarantined group's records: a
		// new WAL file opens with a checkpoint that marks each quarantined
		// group, and every later checkpoint carries the mark until the
		// group is removed.
		//
		// A WAL file whose last write is partial (a torn write's first
		// records kept) is sealed too: a write after it would seem to
		// follow damage in it (its last record, tagLast, is missing), and
		// a tear of that write and the next, in flight together, would be
		// taken for damage of a synced write (inFlightTail). The new file
		// opens with a complete checkpoint, synced alone.
		l.wal.sealed = true
		l.wals = append(l.wals, l.wal)
		l.wal, lastGone = nil, true
	}
	if lastGone {
		if err := l.newWAL(); err != nil {
			return err
		}
	} else if err := l.markLocked(); err != nil {
		// The active WAL file kept, its records now synced: a close mark
		// after them (a write of its own, after that sync) makes damage
		// found in them later corruption, not a torn tail. A file that
		// already ends with one (a clean Close) gets none.
		return err
	}
	// Segments left holding nothing go.
	for _, list := range segs {
		for _, f := range list {
			if f.f != nil {
				l.maybeDead(f)
			}
		}
	}
	return nil
}

// newWAL starts the first WAL file of a fresh log (or replaces one whose
// header never reached the disk), opening with a checkpoint of the state.
func (l *Log) newWAL() error {
	f := &file{seq: l.nextSeq, wal: true, owner: l}
	f.name = walName(f.seq)
	l.nextSeq++
	head := l.checkpointLocked(f.gen(), 1|tagAlone, true)
	f.wnum = 1
	h, err := l.fs.Open(l.path(f.name))
	if err != nil {
		return err
	}
	f.f = h
	if err := h.Truncate(0); err != nil {
		return err
	}
	if _, err := h.WriteAt(head, 0); err != nil {
		return err
	}
	if err := h.Sync(); err != nil {
		return err
	}
	if err := l.fs.SyncDir(l.dir); err != nil {
		return err
	}
	f.size, f.wsize, f.head = int64(len(head)), int64(len(head)), int64(len(head))
	l.wal = f
	return nil
}

// openAndMap opens f and maps its whole content for the scan.
func (l *Log) openAndMap(f *file) ([]byte, *mapping, error) {
	if f.f == nil {
		h, err := l.fs.Open(l.path(f.name))
		if err != nil {
			return nil, nil, err
		}
		f.f = h
	}
	h := f.f
	size, err := h.Size()
	if err != nil {
		return nil, nil, err
	}
	f.size, f.wsize = size, size
	if size == 0 {
		return nil, nil, nil
	}
	m, err := f.maps.acquire(h, size)
	if err != nil {
		return nil, nil, err
	}
	return m.data[:size], m, nil
}

// recoveryCut is a torn tail recovery found: f ends at end (0: f goes).
type recoveryCut struct {
	f    *file
	name string
	end  int64
}

// cut makes end the end of f: a torn tail is cut (the mapping is dropped
// first: a mapped file is never shrunk under a mapping). end 0 removes
// the file. Recovery only records it: the file is cut on disk once
// recovery has read the whole log and Open goes on (applyCuts), so an
// Open that refuses leaves every file as it found it.
func (l *Log) cut(f *file, end int64) error {
	if end >= f.size {
		return nil
	}
	f.maps.close()
	l.cuts = append(l.cuts, recoveryCut{f: f, name: f.name, end: end})
	if end == 0 {
		if err := f.f.Close(); err != nil {
			return err
		}
		f.f = nil
		return nil
	}
	f.size, f.wsize = end, end
	return nil
}

// applyCuts cuts on disk the torn tails recovery found (cut), in the
// order it found them, and removes the files with nothing usable.
func (l *Log) applyCuts() error {
	removed := false
	for _, c := range l.cuts {
		if c.end == 0 {
			if err := l.fs.Remove(l.path(c.name)); err != nil {
				return err
			}
			removed = true
			continue
		}
		if err := c.f.f.Truncate(c.end); err != nil {
			return err
		}
		if err := c.f.f.Sync(); err != nil {
			return err
		}
	}
	l.cuts = nil
	if removed {
		return l.fs.SyncDir(l.dir)
	}
	return nil
}

// scanDamage is the damage scan found, with Options.Quarantine: its
// caller decides whom it affects.
type scanDamage struct {
	off  int    // where the intact records end
	next int    // the first intact record after it; -1: none
	msg  string // the file, the offset, what follows
}

// scan replays the records of one file through fn and returns where the
// intact records end. A damaged record followed by intact ones is
// corruption: an error naming what follows, or with Options.Repair the
// end, or with Options.Quarantine the damage, for the caller. tornOK says
// whether a torn tail may be cut (otherwise damage at the tail is
// corruption too).
func (l *Log) scan(f *file, buf []byte, magic string, tornOK bool, promised int64, fn func(typ uint8, p []byte, off int) error) (int, *scanDamage, error) {
	gen := f.gen()
	prev, first := uint32(0), true // the last intact record's write tag; none yet
	if int64(len(buf)) < promised {
		if l.opts.Quarantine {
			return 0, &scanDamage{off: len(buf), next: -1,
				msg: fmt.Sprintf("%s has %d bytes, %d were synced", f.name, len(buf), promised)}, nil
		}
		if !l.opts.Repair {
			return 0, nil, fmt.Errorf("%w: %s has %d bytes, %d were synced", ErrCorrupt, f.name, len(buf), promised)
		}
		l.log.Error("segment: REPAIR: a file is shorter than what was synced; reading what is there",
			"file", f.name, "size", len(buf), "synced", promised)
		promised = int64(len(buf))
	}
	if len(buf) < fileHeader {
		return 0, nil, nil // the header never fully reached the disk: nothing in it was acknowledged
	}
	off := fileHeader
	v := binary.LittleEndian.Uint16(buf[6:])
	if string(buf[:6]) == magic && v > formatVersion {
		return 0, nil, fmt.Errorf("%w: %s is version %d; this build reads versions %d to %d", ErrVersion, f.name, v, minFormatVersion, formatVersion)
	}
	if string(buf[:6]) != magic || v < minFormatVersion || binary.LittleEndian.Uint32(buf[8:]) != gen {
		off = 0 // a damaged header: torn from the start, or corruption if records follow
	} else {
		f.old = v < formatVersion
		f.version = v
		mark := false // the last intact record is a close mark
		for {
			typ, payload, next, err := readRecord(buf, off, gen)
			if err != nil {
				break
			}
			if magic == walMagic {
				prev, first = recTag(buf, off), false
				f.wnum = prev & tagMask
				mark = emptyPromise(typ, payload) && prev&(tagAlone|tagLast) == tagAlone|tagLast
			}
			if err := fn(typ, payload, off); err != nil {
				if l.opts.Quarantine && magic == segMagic {
					// A group's own file: the group's damage.
					return off, &scanDamage{off: off, next: -1, msg: fmt.Sprintf("%s at offset %d: %v", f.name, off, err)}, nil
				}
				return 0, nil, fmt.Errorf("%w: %s at offset %d: %v", ErrCorrupt, f.name, off, err)
			}
			off = next
		}
		// Whether the last write kept is partial: its last record (tagLast)
		// is not among the intact ones.
		f.partial = magic == walMagic && v >= tagVersion && (first || prev&tagLast == 0)
		// Whether it ends with a close mark (markLocked), a write of its
		// own: the records before it need none.
		f.marked = magic == walMagic && v >= tagVersion && mark
	}
	if off == len(buf) {
		return off, nil, nil
	}
	nextValid, found := validAfter(buf, max(off, fileHeader-align), gen)
	if tornOK && int64(off) >= promised && (!found ||
		// Intact records after it, all of writes that may have been in
		// flight with the damaged one (none acknowledged): a torn tail too.
		// Untagged records (a file before version 5) never qualify: their
		// write is unknown.
		magic == walMagic && inFlightTail(buf, off, nextValid, gen, prev, first, f.afterWAL)) {
		return off, nil, nil
	}
	what := "no intact records after it"
	if found {
		what = describeFrom(buf, nextValid, gen)
	}
	if l.opts.Quarantine {
		d := &scanDamage{off: off, next: -1, msg: fmt.Sprintf("%s damaged at offset %d; %s", f.name, off, what)}
		if found {
			d.next = nextValid
		}
		return off, d, nil
	}
	if !l.opts.Repair {
		return 0, nil, fmt.Errorf("%w: %s damaged at offset %d; %s", ErrCorrupt, f.name, off, what)
	}
	l.log.Error("segment: REPAIR: truncating a file at damage; everything after it is lost",
		"file", f.name, "offset", off, "lost", what)
	return off, nil, nil
}

// describeFrom names the groups and index ranges of the intact entries
// records from off on, for the corruption report.
func describeFrom(buf []byte, off int, gen uint32) string {
	type rng struct{ lo, hi uint64 }
	ranges := map[uint64]rng{}
	for {
		typ, payload, next, err := readRecord(buf, off, gen)
		if err != nil {
			break
		}
		if typ == recEntries && len(payload) >= 12+entryHeader {
			g := binary.LittleEndian.Uint64(payload)
			n := uint64(binary.LittleEndian.Uint32(payload[8:]))
			lo := binary.LittleEndian.Uint64(payload[12:])
			r, ok := ranges[g]
			if !ok || lo < r.lo {
				r.lo = lo
			}
			r.hi = max(r.hi, lo+n-1)
			ranges[g] = r
		}
		off = next
	}
	if len(ranges) == 0 {
		return "intact records follow, with no entries"
	}
	ids := make([]uint64, 0, len(ranges))
	for g := range ranges {
		ids = append(ids, g)
	}
	slices.Sort(ids)
	var b strings.Builder
	b.WriteString("intact records follow: ")
	for i, g := range ids {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "group %d entries %d..%d", g, ranges[g].lo, ranges[g].hi)
	}
	return b.String()
}

// forEntries calls fn for each entry of an entries record payload, with
// the offset of its data within the payload.
func forEntries(p []byte, fn func(idx uint64, dataOff int) error) error {
	if len(p) < 12 {
		return errors.New("short entries record")
	}
	n := int(binary.LittleEndian.Uint32(p[8:]))
	o := 12
	for i := 0; i < n; i++ {
		if len(p)-o < entryHeader {
			return errors.New("truncated entry")
		}
		idx := binary.LittleEndian.Uint64(p[o:])
		dn := binary.LittleEndian.Uint32(p[o+16:])
		o += entryHeader
		if uint64(len(p)-o) < uint64(dn) {
			return errors.New("truncated entry data")
		}
		if err := fn(idx, o); err != nil {
			return err
		}
		o += int(dn)
	}
	if o != len(p) {
		return errors.New("trailing bytes in entries record")
	}
	return nil
}

// loadSegment places a segment file's entries in the index; a copy of an
// index replaces a stored one of a lower term.
func (l *Log) loadSegment(g *groupIndex, f *file, promised int64) error {
	var buf []byte
	termOf := func(sf *file, off uint32) uint64 {
		if sf == f {
			return binary.LittleEndian.Uint64(buf[off-entryHeader+8:])
		}
		sm, err := sf.maps.acquire(sf.f, sf.size)
		if err != nil {
			return 0 // unreadable: the new copy wins
		}
		defer sf.maps.release(sm)
		if sf.lazy != nil && sf.lazy.check(sf, sm.data, off) != nil {
			return 0 // damaged: the new copy wins (a read of the old one reports it)
		}
		return binary.LittleEndian.Uint64(sm.data[off-entryHeader+8:])
	}
	// A sealed file with an intact footer is not scanned: its records are
	// checked when first read.
	if ok, err := l.loadFooter(g, f, termOf); ok || err != nil {
		return err
	}
	buf, m, err := l.openAndMap(f)
	if err != nil {
		return err
	}
	end, dmg, err := l.scan(f, buf, segMagic, true, promised, func(typ uint8, p []byte, off int) error {
		if typ == recFooter && f.version >= footerVersion && binary.LittleEndian.Uint64(p) == g.id {
			f.footed = true // intact, though Open could not use it: sealed
			return nil
		}
		if typ != recEntries || binary.LittleEndian.Uint64(p) != g.id || f.footed {
			return fmt.Errorf("unexpected record type %d in a segment of group %d", typ, g.id)
		}
		f.foot.recs = append(f.foot.recs, uint32(off))
		return forEntries(p, func(idx uint64, dataOff int) error {
			term := binary.LittleEndian.Uint64(p[dataOff-entryHeader+8:])
			g.place(idx, term, f, uint32(off+recordHeader+dataOff), termOf)
			f.foot.add(idx, term, uint32(off+recordHeader+dataOff))
			f.written++
			return nil
		})
	})
	if m != nil {
		f.maps.release(m)
	}
	if err != nil {
		return err
	}
	if dmg != nil {
		// The group's own file: its damage. The file stays as it is (never
		// cut, never appended to); the group is quarantined unless a remove
		// record in the WAL drops it first (validate).
		f.damaged, f.sealed = true, true
		g.markDamage(DamagedGroup{File: f.name, Offset: int64(dmg.off), Why: dmg.msg})
		return nil
	}
	if end < fileHeader {
		end = 0 // nothing usable: remove it
		if f.refs != 0 {
			return fmt.Errorf("%w: %s: entries indexed from a file with no header", ErrCorrupt, f.name)
		}
	}
	return l.cut(f, int64(end))
}

// promises gathers what a WAL file's checkpoint and promise records say
// of segment files (the largest promise wins). Damage is left for loadWAL
// to report.
func (l *Log) promises(f *file, promised map[uint64]int64) error {
	buf, m, err := l.openAndMap(f)
	if err != nil || m == nil {
		return err
	}
	defer f.maps.release(m)
	if len(buf) < fileHeader {
		return nil
	}
	for off := fileHeader; ; {
		typ, p, next, err := readRecord(buf, off, f.gen())
		if err != nil {
			return nil
		}
		switch {
		case typ == recPromise && len(p) == 24:
			seq := binary.LittleEndian.Uint64(p[8:])
			promised[seq] = max(promised[seq], int64(binary.LittleEndian.Uint64(p[16:])))
		case typ == recCheckpoint && len(p) >= ckptFixed:
			n := binary.LittleEndian.Uint64(p[ckptFixed-8:])
			for i := uint64(0); i < n && ckptFixed+16*(i+1) <= uint64(len(p)); i++ {
				seq := binary.LittleEndian.Uint64(p[ckptFixed+16*i:])
				promised[seq] = max(promised[seq], int64(binary.LittleEndian.Uint64(p[ckptFixed+8+16*i:])))
			}
		}
		off = next
	}
}

// loadWAL replays a WAL file. Only the last may have a torn tail: every
// earlier one was synced whole before the next was started.
func (l *Log) loadWAL(f *file, last bool) error {
	buf, m, err := l.openAndMap(f)
	if err != nil {
		return err
	}
	// After a damaged WAL file: every group in this one's checkpoint was
	// alive when that one ended, so may have had records in its damage.
	marking := l.qCkpt
	l.qCkpt = nil
	end, dmg, err := l.scan(f, buf, walMagic, last, 0, func(typ uint8, p []byte, off int) error {
		if marking != nil && typ != recCheckpoint {
			marking = nil // past the checkpoint
		}
		if err := l.replay(f, typ, p, off); err != nil {
			return err
		}
		if marking != nil {
			l.grp(binary.LittleEndian.Uint64(p)).markDamage(*marking)
		}
		return nil
	})
	if err == nil && dmg != nil {
		err = l.damagedWAL(f, buf, dmg, last)
	}
	if err == nil && marking != nil && last && (end < len(buf) || end < fileHeader) {
		// The checkpoint that follows a damaged WAL file is torn: the
		// groups alive when that file ended are not all known.
		err = fmt.Errorf("%w: %w: %s (after %s, damaged: the checkpoint that lists the groups it held is torn)",
			ErrCorrupt, ErrUnattributable, f.name, marking.File)
	}
	if m != nil {
		f.maps.release(m)
	}
	if err != nil {
		return err
	}
	if dmg != nil {
		f.damaged, f.head = true, fileHeader
		return nil // kept whole: sealed, it goes once the quarantine is durable
	}
	if end < fileHeader {
		// A WAL whose header never reached the disk holds nothing.
		return l.cut(f, 0)
	}
	f.head = fileHeader
	return l.cut(f, int64(end))
}

// damagedWAL decides whom damage in a WAL file (shared by every group)
// affects, conservatively: every group alive while the file was written
// may have had a record in the damaged part. Those are the groups known
// when the damage is reached (the file's checkpoint lists every group
// alive when it started), those with intact records after the damage, and
// those in the next WAL file's checkpoint (alive when it ended). The
// active (last) WAL file has no next one: a group created since its
// checkpoint with records only in the damaged part would be missed, so
// its damage is unattributable and refuses the open.
func (l *Log) damagedWAL(f *file, buf []byte, d *scanDamage, last bool) error {
	if last {
		return fmt.Errorf("%w: %w: %s (the active WAL file: a group created since it started may have had records only in the damaged part)",
			ErrCorrupt, ErrUnattributable, d.msg)
	}
	dg := DamagedGroup{File: f.name, Offset: int64(d.off),
		Why: d.msg + "; a shared WAL file: every group alive while it was written is quarantined"}
	for _, g := range l.groups {
		g.markDamage(dg)
	}
	if d.next >= 0 {
		for off := d.next; ; {
			typ, p, next, err := readRecord(buf, off, f.gen())
			if err != nil {
				break
			}
			if len(p) >= 8 && !emptyPromise(typ, p) {
				l.grp(binary.LittleEndian.Uint64(p)).markDamage(dg)
			}
			off = next
		}
	}
	l.qCkpt = &dg
	return nil
}

// replay applies one WAL record to the index.
func (l *Log) replay(f *file, typ uint8, p []byte, recOff int) error {
	switch typ {
	case recEntries:
		if len(p) < 12 {
			return errors.New("short entries record")
		}
		g := l.grp(binary.LittleEndian.Uint64(p))
		return forEntries(p, func(idx uint64, dataOff int) error {
			err := g.put(idx, f, uint32(recOff+recordHeader+dataOff))
			if err != nil && l.opts.Quarantine {
				// Entries the group's earlier records do not lead to: its
				// log lost something. Its damage, not the log's.
				g.markDamage(DamagedGroup{File: f.name, Offset: int64(recOff),
					Why: fmt.Sprintf("%s at offset %d: entry %d does not follow the group's log (last %d)", f.name, recOff, idx, g.last)})
				return nil
			}
			return err
		})
	case recLive:
		if len(p) < 12 || f.version < liveVersion {
			return errors.New("bad live record")
		}
		g := l.grp(binary.LittleEndian.Uint64(p))
		return forEntries(p, func(idx uint64, dataOff int) error {
			term := binary.LittleEndian.Uint64(p[dataOff-entryHeader+8:])
			g.place(idx, term, f, uint32(recOff+recordHeader+dataOff), l.termAt)
			return nil
		})
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
		if len(p) != 24 {
			return errors.New("bad compact record")
		}
		l.grp(binary.LittleEndian.Uint64(p)).compact(binary.LittleEndian.Uint64(p[8:]), binary.LittleEndian.Uint64(p[16:]))
	case recPromise:
		if len(p) != 24 {
			return errors.New("bad promise record")
		}
	case recRemove:
		if len(p) != 8 || f.version < 2 {
			return errors.New("bad remove record")
		}
		l.removeLocked(binary.LittleEndian.Uint64(p))
	case recCheckpoint:
		if len(p) < ckptFixed || uint64(len(p)) != ckptFixed+16*binary.LittleEndian.Uint64(p[ckptFixed-8:]) {
			return errors.New("bad checkpoint record")
		}
		g := l.grp(binary.LittleEndian.Uint64(p))
		g.first, g.last = binary.LittleEndian.Uint64(p[8:]), binary.LittleEndian.Uint64(p[16:])
		g.prevTerm = binary.LittleEndian.Uint64(p[24:])
		g.cutFrom(g.last + 1)
		g.hs = HardState{Term: binary.LittleEndian.Uint64(p[32:]), Vote: binary.LittleEndian.Uint64(p[40:]), Commit: binary.LittleEndian.Uint64(p[48:])}
		flags := binary.LittleEndian.Uint64(p[56:])
		g.hsSet = flags&ckptHardState != 0
		if flags&ckptQuarantined != 0 {
			g.markDamage(DamagedGroup{File: f.name, Offset: int64(recOff),
				Why: "quarantined by an earlier open (its data was found damaged) and not removed since"})
		}
		f.head = int64(recOff + padded(recordHeader+len(p)))
	default:
		return fmt.Errorf("unknown record type %d", typ)
	}
	return nil
}

// validate checks that every group's raft log is wholly stored. A hole is
// corruption (a segment file lost or damaged); with Options.Repair the
// group's log is truncated at the hole. With Options.Quarantine, a group
// found damaged, with a hole, or whose hard state commits past its last
// stored entry is quarantined.
func (l *Log) validate() error {
	if l.opts.Quarantine {
		for _, id := range l.groupIDsLocked() {
			g := l.groups[id]
			if g.damage == nil && !g.empty() {
				if hole, ok := g.firstHole(); !ok {
					g.markDamage(DamagedGroup{Why: fmt.Sprintf("entries %d..%d of its raft log are missing", hole, g.last)})
				}
			}
			if g.damage == nil && g.hsSet && g.hs.Commit > g.last {
				g.markDamage(DamagedGroup{Why: fmt.Sprintf("its hard state commits entry %d, past its last stored entry %d", g.hs.Commit, g.last)})
			}
			if g.damage != nil {
				l.quarantine(g)
			}
		}
		return nil
	}
	for _, id := range l.groupIDsLocked() {
		g := l.groups[id]
		if g.damage != nil {
			return fmt.Errorf("%w: group %d: %s (open with Options.Quarantine)", ErrCorrupt, id, g.damage.Why)
		}
		if g.empty() {
			continue
		}
		hole, ok := g.firstHole()
		if ok {
			continue
		}
		if !l.opts.Repair {
			return fmt.Errorf("%w: group %d: entries %d..%d of its raft log are missing", ErrCorrupt, id, hole, g.last)
		}
		l.log.Error("segment: REPAIR: truncating a group's log at missing entries", "group", id, "from", hole, "last", g.last)
		g.truncate(hole)
	}
	return nil
}

// quarantine takes a damaged group out of the log: nothing of it is
// served or written until RemoveGroup. Its segment files stay on disk as
// they are (held: the worker deletes them only once the group is
// removed); its entries in WAL files are let go (those files are moved
// and deleted as usual once the quarantine is durable in a checkpoint).
func (l *Log) quarantine(g *groupIndex) {
	for _, f := range g.segs {
		f.held = true
	}
	for i := range g.runs {
		g.runs[i].f.unref(g.runs[i].live)
	}
	clear(g.runs)
	g.runs, g.seg = nil, nil
	delete(l.groups, g.id)
	l.quarantined[g.id] = g
	d := g.damage
	l.log.Error("segment: a group's stored data is damaged: quarantined (not opened, refused until removed; rebuild it from its replicas)",
		"group", g.id, "file", d.File, "offset", d.Offset, "damage", d.Why)
}
