package segment

// The read path: terms and entries by index, copied or as views into
// reference-counted mappings.

import (
	"fmt"
	"sync"
)

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
	if f.lazy != nil && f.lazy.check(f, m.data, off) != nil {
		f.maps.release(m)
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
		if f.lazy != nil {
			if err := f.lazy.check(f, m.data, off); err != nil {
				h.release()
				return nil, nil, err
			}
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
