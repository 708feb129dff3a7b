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
			if i == len(list)-1 && f.wsize < l.opts.SegmentSize && !f.footed && f.version >= footerVersion {
				g.seg = f
			} else {
				f.sealed = true
				f.foot = footIndex{}
			}
		}
	}

	for i, f := range wals {
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
	if lastGone {
		if err := l.newWAL(); err != nil {
			return err
		}
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
	head := l.checkpointLocked(f.gen())
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

// cut makes end the end of f: a torn tail is cut (the mapping is dropped
// first: a mapped file is never shrunk under a mapping). end 0 removes
// the file.
func (l *Log) cut(f *file, end int64) error {
	if end >= f.size {
		return nil
	}
	f.maps.close()
	if end == 0 {
		if err := f.f.Close(); err != nil {
			return err
		}
		f.f = nil
		if err := l.fs.Remove(l.path(f.name)); err != nil {
			return err
		}
		return l.fs.SyncDir(l.dir)
	}
	if err := f.f.Truncate(end); err != nil {
		return err
	}
	if err := f.f.Sync(); err != nil {
		return err
	}
	f.size, f.wsize = end, end
	return nil
}

// scan replays the records of one file through fn and returns where the
// intact records end. A damaged record followed by intact ones is
// corruption: an error naming what follows, or with Options.Repair the
// end. tornOK says whether a torn tail may be cut (otherwise damage at
// the tail is corruption too).
func (l *Log) scan(f *file, buf []byte, magic string, tornOK bool, promised int64, fn func(typ uint8, p []byte, off int) error) (int, error) {
	gen := f.gen()
	if int64(len(buf)) < promised {
		if !l.opts.Repair {
			return 0, fmt.Errorf("%w: %s has %d bytes, %d were synced", ErrCorrupt, f.name, len(buf), promised)
		}
		l.log.Error("segment: REPAIR: a file is shorter than what was synced; reading what is there",
			"file", f.name, "size", len(buf), "synced", promised)
		promised = int64(len(buf))
	}
	if len(buf) < fileHeader {
		return 0, nil // the header never fully reached the disk: nothing in it was acknowledged
	}
	off := fileHeader
	v := binary.LittleEndian.Uint16(buf[6:])
	if string(buf[:6]) == magic && v > formatVersion {
		return 0, fmt.Errorf("%w: %s is version %d; this build reads versions %d to %d", ErrVersion, f.name, v, minFormatVersion, formatVersion)
	}
	if string(buf[:6]) != magic || v < minFormatVersion || binary.LittleEndian.Uint32(buf[8:]) != gen {
		off = 0 // a damaged header: torn from the start, or corruption if records follow
	} else {
		f.old = v < formatVersion
		f.version = v
		for {
			typ, payload, next, err := readRecord(buf, off, gen)
			if err != nil {
				break
			}
			if err := fn(typ, payload, off); err != nil {
				return 0, fmt.Errorf("%w: %s at offset %d: %v", ErrCorrupt, f.name, off, err)
			}
			off = next
		}
	}
	if off == len(buf) {
		return off, nil
	}
	nextValid, found := validAfter(buf, max(off, fileHeader-align), gen)
	if !found && tornOK && int64(off) >= promised {
		return off, nil
	}
	what := "no intact records after it"
	if found {
		what = describeFrom(buf, nextValid, gen)
	}
	if !l.opts.Repair {
		return 0, fmt.Errorf("%w: %s damaged at offset %d; %s", ErrCorrupt, f.name, off, what)
	}
	l.log.Error("segment: REPAIR: truncating a file at damage; everything after it is lost",
		"file", f.name, "offset", off, "lost", what)
	return off, nil
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
	end, err := l.scan(f, buf, segMagic, true, promised, func(typ uint8, p []byte, off int) error {
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
	end, err := l.scan(f, buf, walMagic, last, 0, func(typ uint8, p []byte, off int) error {
		return l.replay(f, typ, p, off)
	})
	if m != nil {
		f.maps.release(m)
	}
	if err != nil {
		return err
	}
	if end < fileHeader {
		// A WAL whose header never reached the disk holds nothing.
		return l.cut(f, 0)
	}
	f.head = fileHeader
	return l.cut(f, int64(end))
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
			return g.put(idx, f, uint32(recOff+recordHeader+dataOff))
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
		g.hsSet = binary.LittleEndian.Uint64(p[56:])&1 != 0
		f.head = int64(recOff + padded(recordHeader+len(p)))
	default:
		return fmt.Errorf("unknown record type %d", typ)
	}
	return nil
}

// validate checks that every group's raft log is wholly stored. A hole is
// corruption (a segment file lost or damaged); with Options.Repair the
// group's log is truncated at the hole.
func (l *Log) validate() error {
	for _, id := range l.groupIDsLocked() {
		g := l.groups[id]
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
