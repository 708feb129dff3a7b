package segment

// The index footer of a sealed segment file (format version 3): the last
// record of the file, so that Open reads it instead of scanning and
// checksumming every record; each record is checksummed instead when it
// is first read.

import (
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"sort"
	"sync/atomic"
)

// recFooter is a sealed segment file's last record (version 3): group
// u64, nrec u64, nrun u64, nent u64; nrec × record offset u32; nrun ×
// (first index u64, term u64, count u64): runs of consecutive indexes of
// one term, in file order; nent × data offset u32 (the runs' entries in
// order); each u32 array zero-padded to 8 bytes; then the footer's own
// offset u64 and footerMagic u64. The payload is a multiple of 8, so the
// file ends with those last two words: Open finds the footer from the
// file's end.
const recFooter uint8 = 8

// footerMagic ends a file that has a footer ("WRNFOOT" and a zero).
const footerMagic = uint64(0x00544f4f464e5257)

// footerVersion is the first format version whose segment files may end
// with a footer.
const footerVersion = 3

// footerTrailer is the footer payload's tail: its record offset, the magic.
const footerTrailer = 16

// footEnt is one entry as written into a segment file.
type footEnt struct {
	idx, term uint64
	off       uint32
}

// footIndex is what has been written into a segment file not yet sealed,
// for its footer: 4 bytes per entry and 24 per run.
type footIndex struct {
	recs []uint32  // record offsets
	runs []footRun // consecutive indexes of one term, in file order
	offs []uint32  // each entry's data offset, in file order
}

type footRun struct{ lo, term, n uint64 }

func (x *footIndex) add(idx, term uint64, off uint32) {
	if n := len(x.runs); n > 0 && x.runs[n-1].term == term && x.runs[n-1].lo+x.runs[n-1].n == idx {
		x.runs[n-1].n++
	} else {
		x.runs = append(x.runs, footRun{lo: idx, term: term, n: 1})
	}
	x.offs = append(x.offs, off)
}

func pad4(n int) int { return (n + 1) &^ 1 } // u32 words, padded to 8 bytes

// footerPayload is the size of a footer's payload.
func footerPayload(nrec, nrun, nent int) int {
	return 32 + 4*pad4(nrec) + 24*nrun + 4*pad4(nent) + footerTrailer
}

// encodeFooter appends the footer record of f (its index x), which
// starts at start.
func encodeFooter(dst []byte, f *file, x *footIndex, start int64) []byte {
	le := binary.LittleEndian
	dst, s := beginRecord(dst)
	dst = le.AppendUint64(dst, f.group)
	dst = le.AppendUint64(dst, uint64(len(x.recs)))
	dst = le.AppendUint64(dst, uint64(len(x.runs)))
	dst = le.AppendUint64(dst, uint64(len(x.offs)))
	for _, r := range x.recs {
		dst = le.AppendUint32(dst, r)
	}
	if len(x.recs)%2 != 0 {
		dst = le.AppendUint32(dst, 0)
	}
	for _, r := range x.runs {
		dst = le.AppendUint64(dst, r.lo)
		dst = le.AppendUint64(dst, r.term)
		dst = le.AppendUint64(dst, r.n)
	}
	for _, o := range x.offs {
		dst = le.AppendUint32(dst, o)
	}
	if len(x.offs)%2 != 0 {
		dst = le.AppendUint32(dst, 0)
	}
	dst = le.AppendUint64(dst, uint64(start))
	dst = le.AppendUint64(dst, footerMagic)
	return endRecord(dst, s, f.gen(), recFooter)
}

var errNoFooter = errors.New("segment: no footer")

// readFooter reads the footer of a segment file of the given size: the
// record offsets and the entries, in file order, and where the footer
// starts. errNoFooter when the file has none that is intact (then it is
// scanned as a whole).
func readFooter(h File, f *file, size int64) (recs []uint32, ents []footEnt, start int64, err error) {
	le := binary.LittleEndian
	if size < fileHeader+recordHeader+32+footerTrailer {
		return nil, nil, 0, errNoFooter
	}
	var hdr [fileHeader]byte
	if _, err := h.ReadAt(hdr[:], 0); err != nil {
		return nil, nil, 0, err
	}
	if string(hdr[:6]) != segMagic || le.Uint16(hdr[6:]) < footerVersion ||
		le.Uint16(hdr[6:]) > formatVersion || le.Uint32(hdr[8:]) != f.gen() {
		return nil, nil, 0, errNoFooter
	}
	var tail [footerTrailer]byte
	if _, err := h.ReadAt(tail[:], size-footerTrailer); err != nil {
		return nil, nil, 0, err
	}
	start = int64(le.Uint64(tail[:]))
	if le.Uint64(tail[8:]) != footerMagic || start < fileHeader || start%align != 0 ||
		size-start < recordHeader+32+footerTrailer || size-start > recordHeader+MaxRecord {
		return nil, nil, 0, errNoFooter
	}
	buf := make([]byte, size-start)
	if _, err := h.ReadAt(buf, start); err != nil {
		return nil, nil, 0, err
	}
	typ, p, next, err := readRecord(buf, 0, f.gen())
	if err != nil || typ != recFooter || next != len(buf) || le.Uint64(p) != f.group {
		return nil, nil, 0, errNoFooter
	}
	nrec, nrun, nent := le.Uint64(p[8:]), le.Uint64(p[16:]), le.Uint64(p[24:])
	if nrec > uint64(len(p)) || nrun > uint64(len(p)) || nent > uint64(len(p)) || nrec == 0 ||
		len(p) != footerPayload(int(nrec), int(nrun), int(nent)) {
		return nil, nil, 0, errNoFooter
	}
	recs = make([]uint32, nrec)
	o := 32
	for i := range recs {
		r := le.Uint32(p[o:])
		if r < fileHeader || int64(r) >= start || r%align != 0 || (i > 0 && r <= recs[i-1]) {
			return nil, nil, 0, errNoFooter
		}
		recs[i] = r
		o += 4
	}
	o = 32 + 4*pad4(int(nrec))
	offs := o + 24*int(nrun)
	ents = make([]footEnt, 0, nent)
	for k := uint64(0); k < nrun; k++ {
		lo, term, n := le.Uint64(p[o:]), le.Uint64(p[o+8:]), le.Uint64(p[o+16:])
		o += 24
		if n == 0 || n > nent-uint64(len(ents)) {
			return nil, nil, 0, errNoFooter
		}
		for i := uint64(0); i < n; i++ {
			off := le.Uint32(p[offs+4*len(ents):])
			if off < recs[0]+recordHeader+12+entryHeader || int64(off) > start ||
				(len(ents) > 0 && off <= ents[len(ents)-1].off) {
				return nil, nil, 0, errNoFooter
			}
			ents = append(ents, footEnt{idx: lo + i, term: term, off: off})
		}
	}
	if uint64(len(ents)) != nent {
		return nil, nil, 0, errNoFooter
	}
	return recs, ents, start, nil
}

// lazyCheck tracks which records of a file loaded from its footer have
// been checksummed: each is checked on its first read.
type lazyCheck struct {
	recs []uint32        // record offsets, ascending
	done []atomic.Uint64 // bit i: record i verified
	end  uint32          // the footer's offset: no entry data past it
}

func newLazyCheck(recs []uint32, end int64) *lazyCheck {
	return &lazyCheck{recs: recs, done: make([]atomic.Uint64, (len(recs)+63)/64), end: uint32(end)}
}

// check verifies the record holding the entry whose data is at off, the
// first time it is read. m is a mapping of at least the file's size.
func (c *lazyCheck) check(f *file, m []byte, off uint32) error {
	// The record starting last before off (an empty entry's data may end
	// its record: off is then where the next record starts).
	i := sort.Search(len(c.recs), func(i int) bool { return c.recs[i] >= off }) - 1
	if i < 0 {
		return fmt.Errorf("%w: %s: no record holds offset %d", ErrCorrupt, f.name, off)
	}
	w, bit := &c.done[i/64], uint64(1)<<(i%64)
	if w.Load()&bit != 0 {
		return nil
	}
	rec := int(c.recs[i])
	typ, p, next, err := readRecord(m[:c.end], rec, f.gen())
	if err != nil || typ != recEntries || uint32(next) < off || (i+1 < len(c.recs) && next != int(c.recs[i+1])) ||
		binary.LittleEndian.Uint64(p) != f.group {
		return fmt.Errorf("%w: %s: the record at offset %d is damaged (found on first read; the file's footer was intact)", ErrCorrupt, f.name, rec)
	}
	for {
		old := w.Load()
		if w.CompareAndSwap(old, old|bit) {
			return nil
		}
	}
}

// loadFooter places a sealed segment file's entries in the index from its
// footer, as a scan would; false when it has no intact footer.
func (l *Log) loadFooter(g *groupIndex, f *file, termOf func(*file, uint32) uint64) (bool, error) {
	if f.f == nil {
		h, err := l.fs.Open(l.path(f.name))
		if err != nil {
			return false, err
		}
		f.f = h
	}
	size, err := f.f.Size()
	if err != nil {
		return false, err
	}
	recs, ents, start, err := readFooter(f.f, f, size)
	if errors.Is(err, errNoFooter) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	f.size, f.wsize = size, size
	f.lazy = newLazyCheck(recs, start)
	f.sealed, f.footed = true, true
	same := func(sf *file, off uint32) uint64 {
		if sf != f {
			return termOf(sf, off)
		}
		k, _ := slices.BinarySearchFunc(ents, off, func(e footEnt, o uint32) int { return int(e.off) - int(o) })
		if k < len(ents) && ents[k].off == off {
			return ents[k].term
		}
		return 0
	}
	for _, e := range ents {
		g.place(e.idx, e.term, f, e.off, same)
		f.written++
	}
	l.stats.FootersRead++
	return true, nil
}
