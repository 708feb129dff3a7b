package segment

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// CompactAt is Compact with the term of upTo given: the raft log starts
// after upTo, whose term is term, whether or not the entry at upTo is
// stored. A follower that installs a leader's snapshot of entry upTo
// (design/replication.md §6.7) usually never held that entry; raft still
// asks for its term, and the compact record keeps it (recovery hands it
// back as the term of FirstIndex-1). Entries above upTo stay in the raft
// log (Truncate them first when they must go); live is as for Compact,
// and a live index not stored is reported the same way (ErrCorrupt).
func (l *Log) CompactAt(group, upTo, term uint64, live []uint64) error {
	if term == 0 {
		return errors.New("segment: CompactAt: term 0")
	}
	return l.compact(group, upTo, term, live)
}

// AppendLive stores entries below a group's raft log, sparse: each index
// must be below FirstIndex, and the entries sorted by index, each at most
// once. They are kept as the entries Compact keeps live (a later Compact
// or CompactAt drops those its live set no longer names) and read with
// EntriesView; they are not part of the raft log (FirstIndex, LastIndex
// and Entries do not change). A follower installing a snapshot writes
// with it the snapshot's live entries it did not hold (design/
// replication.md §6.7), once CompactAt moved its raft log past them.
//
// An index already stored with a term at least the entry's keeps its
// copy (recovery's rule: raft rewrites an index only with a higher term,
// so of two copies the higher term is the newer); the caller picks the
// term accordingly (replication stores them under the installing
// leader's term, at least that of any stale copy). Like Append, it
// returns once they are durable (a live record, type 9, in the WAL: a
// file of format version 4 or later; an older WAL file is sealed first), in a
// group commit with whatever else is pending; the mover later copies
// them into the group's segment files like any stored entry.
func (l *Log) AppendLive(group uint64, entries []Entry) error {
	total := 0
	for i := range entries {
		e := &entries[i]
		switch {
		case e.Index == 0 || e.Term == 0:
			return errors.New("segment: AppendLive: index or term 0")
		case i > 0 && e.Index <= entries[i-1].Index:
			return errors.New("segment: AppendLive: entries must be sorted by index, each at most once")
		}
		if total += len(e.Data) + entryHeader; len(e.Data) > MaxEntry || total > maxPending {
			return fmt.Errorf("segment: AppendLive: an entry over %d bytes, or a call over %d bytes", MaxEntry, maxPending)
		}
	}
	if len(entries) == 0 {
		return nil
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
	if s := l.shadow(group); entries[len(entries)-1].Index >= s.first {
		l.mu.Unlock()
		return fmt.Errorf("segment: AppendLive: group %d: index %d is not below its raft log, which starts at %d", group, entries[len(entries)-1].Index, s.first)
	}
	if l.wal.old {
		l.rotate = true // a live record goes only into a version-4 (or later) file
	}
	l.undo = l.undo[:0]
	for i := 0; i < len(entries); {
		var start int
		l.pending, start = beginRecord(l.pending)
		l.pending = binary.LittleEndian.AppendUint64(l.pending, group)
		countAt := len(l.pending)
		l.pending = binary.LittleEndian.AppendUint32(l.pending, 0)
		n, size := 0, 0
		for ; i < len(entries) && (n == 0 || size+len(entries[i].Data) <= maxEntriesRecord); i++ {
			e := &entries[i]
			l.pending = binary.LittleEndian.AppendUint64(l.pending, e.Index)
			l.pending = binary.LittleEndian.AppendUint64(l.pending, e.Term)
			l.pending = binary.LittleEndian.AppendUint32(l.pending, uint32(len(e.Data)))
			l.updates = append(l.updates, update{kind: recLive, group: group, idx: e.Index, term: e.Term, off: int64(l.pos())})
			l.pending = append(l.pending, e.Data...)
			n++
			size += len(e.Data) + entryHeader
		}
		binary.LittleEndian.PutUint32(l.pending[countAt:], uint32(n))
		l.pending = closeRecord(l.pending, start, recLive)
		l.stats.Records++
	}
	return l.commitLocked()
}

// termAt is the term of the entry at off in f (0 when it cannot be read:
// the new copy wins). Called with l.mu held, or during recovery.
func (l *Log) termAt(f *file, off uint32) uint64 {
	m, err := f.maps.acquire(f.f, f.size)
	if err != nil {
		return 0
	}
	defer f.maps.release(m)
	if f.lazy != nil && f.lazy.check(f, m.data, off) != nil {
		return 0
	}
	_, term, _ := entryAt(m.data, off)
	return term
}
