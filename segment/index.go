package segment

import (
	"encoding/binary"
	"sort"
)

// The in-memory index: for every group, where each stored entry's data is.
// It costs 4 bytes per entry (an offset); an entry's index, term and
// length are read from the 20-byte entry header just before its data, in
// the file's mapping, so bodies and their metadata stay in the page cache.

// run is a stretch of a group's consecutive indexes stored in one file:
// offs[i] is the offset in f of index lo+i's data, 0 when that entry is
// dropped (0 is never a data offset: every file starts with its header).
type run struct {
	lo   uint64
	f    *file
	offs []uint32
	live int // nonzero offs
}

func (r *run) hi() uint64 { return r.lo + uint64(len(r.offs)) - 1 }

// groupIndex is one group's state. [first, last] is the raft log: every
// index in it is stored. Below first, entries the owner still needs (its
// live indexes) stay stored and readable; the rest are dropped. last =
// first-1 means the raft log is empty.
type groupIndex struct {
	id uint64
	span
	// prevTerm is the term of index first-1 (raft asks for it), when it
	// is known: set by a compaction whose point was stored; 0 otherwise.
	prevTerm uint64
	runs     []run // sorted by lo, disjoint, each with live > 0
	hs       HardState
	hsSet    bool
	seg      *file   // the segment file the worker appends this group's entries to (worker-owned)
	segs     []*file // every segment file of the group on disk, oldest first (under Log.mu)
	// damage: Open found this group's data damaged (Options.Quarantine);
	// it is quarantined unless a remove record drops it first.
	damage *DamagedGroup
}

// markDamage records d as the group's damage unless one is recorded.
func (g *groupIndex) markDamage(d DamagedGroup) {
	if g.damage == nil {
		d.Group = g.id
		g.damage = &d
	}
}

func newGroup(id uint64) *groupIndex { return &groupIndex{id: id, span: span{first: 1}} }

// span is a raft log's range [first, last]; last = first-1 when empty. Its
// rules are the index's, also used to check appends queued behind others.
type span struct{ first, last uint64 }

func (s span) empty() bool { return s.last < s.first }

// put extends the range with idx, raft's way: an index at or below last
// replaces everything from there on; an index above last+1 is a gap; an
// empty log (or an index below first, as after a snapshot is replaced)
// starts at idx.
func (s *span) put(idx uint64) error {
	switch {
	case s.empty() || idx < s.first:
		s.first = idx
	case idx > s.last+1:
		return ErrGap
	}
	s.last = idx
	return nil
}

// truncate removes from on; it reports whether anything was removed.
func (s *span) truncate(from uint64) bool {
	if from > s.last {
		return false
	}
	s.first = min(s.first, from)
	s.last = from - 1
	return true
}

// compact moves first past upTo.
func (s *span) compact(upTo uint64) {
	if upTo < s.first {
		return
	}
	s.first = upTo + 1
	s.last = max(s.last, upTo)
}

// find returns the position of the run holding idx, or where one would be
// inserted, and whether it holds idx.
func (g *groupIndex) find(idx uint64) (int, bool) {
	i := sort.Search(len(g.runs), func(i int) bool { return g.runs[i].hi() >= idx })
	return i, i < len(g.runs) && g.runs[i].lo <= idx
}

// get returns where idx is stored.
func (g *groupIndex) get(idx uint64) (*file, uint32, bool) {
	i, ok := g.find(idx)
	if !ok {
		return nil, 0, false
	}
	off := g.runs[i].offs[idx-g.runs[i].lo]
	return g.runs[i].f, off, off != 0
}

// cutFrom forgets every stored entry at or above idx.
func (g *groupIndex) cutFrom(idx uint64) {
	i, in := g.find(idx)
	keep := i
	if in {
		r := &g.runs[i]
		n := int(idx - r.lo)
		for _, o := range r.offs[n:] {
			if o != 0 {
				r.live--
				r.f.unref(1)
			}
		}
		r.offs = r.offs[:n:n] // no later append may write into the dropped tail
		if r.live > 0 {
			keep++
		}
	}
	for j := i; j < len(g.runs); j++ {
		if j == i && in {
			continue
		}
		g.runs[j].f.unref(g.runs[j].live)
	}
	clear(g.runs[keep:])
	g.runs = g.runs[:keep]
}

// appendAt stores idx, which is above every stored index, at off in f.
func (g *groupIndex) appendAt(idx uint64, f *file, off uint32) {
	if n := len(g.runs); n > 0 {
		r := &g.runs[n-1]
		if r.f == f && r.hi()+1 == idx {
			r.offs = append(r.offs, off)
			r.live++
			f.refs++
			return
		}
	}
	g.runs = append(g.runs, run{lo: idx, f: f, offs: []uint32{off}, live: 1})
	f.refs++
}

// put stores idx with raft's append semantics (span.put).
func (g *groupIndex) put(idx uint64, f *file, off uint32) error {
	first := g.first
	if err := g.span.put(idx); err != nil {
		return err
	}
	if g.first != first {
		g.prevTerm = 0
	}
	if n := len(g.runs); n > 0 && g.runs[n-1].hi() >= idx {
		g.cutFrom(idx) // a rewrite: drop the old suffix
	}
	g.appendAt(idx, f, off)
	return nil
}

// truncate removes the raft log from index from on, and anything kept
// below first at or above from.
func (g *groupIndex) truncate(from uint64) {
	first := g.first
	if g.span.truncate(from) {
		g.cutFrom(from)
	}
	if g.first != first {
		g.prevTerm = 0
	}
}

// compact moves the start of the raft log past upTo, whose term was term
// (0: unknown). Entries at or below upTo stay stored until dropExcept says
// they are not live.
func (g *groupIndex) compact(upTo, term uint64) {
	if upTo >= g.first {
		g.span.compact(upTo)
		g.prevTerm = term
	}
}

// dropExcept drops every stored entry below first that is not in live
// (sorted ascending), and returns the live indexes below first that are
// not stored: entries the owner needs and storage lost.
func (g *groupIndex) dropExcept(live []uint64) (missing []uint64) {
	for _, k := range live {
		if k >= g.first {
			break
		}
		if _, _, ok := g.get(k); !ok {
			missing = append(missing, k)
		}
	}
	w := 0
	for i := range g.runs {
		r := g.runs[i]
		if r.lo >= g.first {
			g.runs[w] = r
			w++
			continue
		}
		top := min(r.hi(), g.first-1)
		for k := r.lo; k <= top; k++ {
			j := k - r.lo
			if r.offs[j] == 0 {
				continue
			}
			for len(live) > 0 && live[0] < k {
				live = live[1:]
			}
			if len(live) > 0 && live[0] == k {
				continue
			}
			r.offs[j] = 0
			r.live--
			r.f.unref(1)
		}
		if r.live > 0 {
			g.runs[w] = r
			w++
		}
	}
	clear(g.runs[w:])
	g.runs = g.runs[:w]
	return missing
}

// stored counts the stored entries (for tests and stats).
func (g *groupIndex) stored() int {
	n := 0
	for i := range g.runs {
		n += g.runs[i].live
	}
	return n
}

// piece is a stretch of consecutive indexes written to one file by a move.
type piece struct {
	lo   uint64
	f    *file
	offs []uint32
}

// repoint moves every entry stored in src to where pieces (sorted, as
// written by the mover) put it. Entries dropped or cut since the mover
// read them are not in src any more, or are 0 in the run; they stay so.
func (g *groupIndex) repoint(src *file, pieces []piece) {
	out := make([]run, 0, len(g.runs)+len(pieces))
	p := 0
	for _, r := range g.runs {
		if r.f != src {
			out = append(out, r)
			continue
		}
		src.unref(r.live)
		for k := r.lo; k <= r.hi(); {
			for p < len(pieces) && pieces[p].lo+uint64(len(pieces[p].offs)) <= k {
				p++
			}
			if p == len(pieces) || pieces[p].lo > k {
				// Not moved: the mover saw it dropped. It must be 0 here too.
				k++
				continue
			}
			pc := pieces[p]
			end := min(r.hi(), pc.lo+uint64(len(pc.offs))-1)
			nr := run{lo: k, f: pc.f, offs: make([]uint32, 0, end-k+1)}
			for j := k; j <= end; j++ {
				o := uint32(0)
				if r.offs[j-r.lo] != 0 {
					o = pc.offs[j-pc.lo]
				}
				nr.offs = append(nr.offs, o)
				if o != 0 {
					nr.live++
				}
			}
			if nr.live > 0 {
				pc.f.refs += nr.live
				out = append(out, nr)
			}
			k = end + 1
		}
	}
	g.runs = out
}

// place stores idx (of term) at off in f unless a copy of at least that
// term is stored (recovery). Raft rewrites an index only with a higher
// term, so the highest term is the newest version, and two copies of one
// term are the same entry (the mover's and compaction's copies).
func (g *groupIndex) place(idx, term uint64, f *file, off uint32, termOf func(*file, uint32) uint64) {
	i, in := g.find(idx)
	if in && g.runs[i].offs[idx-g.runs[i].lo] != 0 && termOf(g.runs[i].f, g.runs[i].offs[idx-g.runs[i].lo]) >= term {
		return
	}
	if !in {
		if i > 0 && g.runs[i-1].f == f && g.runs[i-1].hi()+1 == idx {
			g.runs[i-1].offs = append(g.runs[i-1].offs, off)
			g.runs[i-1].live++
			f.refs++
			return
		}
		g.runs = append(g.runs, run{})
		copy(g.runs[i+1:], g.runs[i:])
		g.runs[i] = run{lo: idx, f: f, offs: []uint32{off}, live: 1}
		f.refs++
		return
	}
	r := &g.runs[i]
	j := idx - r.lo
	if r.f == f {
		if r.offs[j] == 0 {
			r.live++
			f.refs++
		}
		r.offs[j] = off
		return
	}
	if r.offs[j] != 0 {
		r.live--
		r.f.unref(1)
	}
	// Split r around idx.
	left := run{lo: r.lo, f: r.f, offs: r.offs[:j:j]}
	right := run{lo: idx + 1, f: r.f, offs: append([]uint32(nil), r.offs[j+1:]...)}
	for _, o := range left.offs {
		if o != 0 {
			left.live++
		}
	}
	right.live = r.live - left.live
	mid := run{lo: idx, f: f, offs: []uint32{off}, live: 1}
	f.refs++
	var repl []run
	for _, x := range []run{left, mid, right} {
		if x.live > 0 {
			repl = append(repl, x)
		}
	}
	g.runs = append(g.runs[:i], append(repl, g.runs[i+1:]...)...)
}

// entryHeader is the per-entry header inside an entries record: index u64,
// term u64, length u32, then the data.
const entryHeader = 20

// entryAt reads the entry whose data starts at off in a mapping.
func entryAt(m []byte, off uint32) (idx, term uint64, data []byte) {
	h := m[off-entryHeader : off]
	n := binary.LittleEndian.Uint32(h[16:])
	return binary.LittleEndian.Uint64(h), binary.LittleEndian.Uint64(h[8:]), m[off : off+n : off+n]
}

// firstHole finds the first index of the raft log [first, last] that is
// not stored; ok when there is none.
func (g *groupIndex) firstHole() (hole uint64, ok bool) {
	next := g.first
	i, _ := g.find(next)
	for ; i < len(g.runs) && next <= g.last; i++ {
		r := &g.runs[i]
		if r.lo > next {
			return next, false
		}
		for k := next; k <= min(r.hi(), g.last); k++ {
			if r.offs[k-r.lo] == 0 {
				return k, false
			}
		}
		next = r.hi() + 1
	}
	if next <= g.last {
		return next, false
	}
	return 0, true
}
