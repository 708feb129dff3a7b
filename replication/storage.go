package replication

import (
	"errors"
	"fmt"
	"sort"

	"github.com/warren-mq/warren/segment"
	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
)

// raftStorage is raft.Storage for one group over the node's segment.Log
// (design/replication.md §2.5). It is a mirror of what is durable: its
// owner (the shard that drives the group's RawNode) changes it only once
// segment has made a change durable, and before it calls Advance:
//
//	Ready → log.Append(batch(rd.Entries, rd.HardState)) → appended(...) → apply → Advance
//	applied(i) after applying; compacted(meta) once segment.Compact returned.
//
// raft then reads through it: Term from an in-memory list of term runs
// (never touching segment), Entries from the tail cache (the very entries
// raft handed out in Ready, no copy) when it covers the range, else copied
// out of segment. segment holds the whole raft log [first, last] at all
// times; the tail is only a cache.
//
// The invariant first == snap.Index+1 always holds: the log starts right
// after the latest snapshot. Not safe for concurrent use, like the
// RawNode it serves.
type raftStorage struct {
	log  *segment.Log
	gid  uint64
	hs   raftpb.HardState
	snap raftpb.SnapshotMetadata
	// first, last: the raft log's range (empty: last = first-1).
	first, last uint64
	// durable: the last entry segment has made durable (≤ last). They
	// differ only for a pipelined group (Worker: a single node's solo
	// leader), whose entries raft is told are stable once their write is
	// submitted (staged), before its fdatasync; hs is always what is
	// durable.
	durable uint64
	// terms: runs of equal term over [first, last], ascending by start;
	// the term of first-1 is snap.Term. 16 bytes per term change.
	terms []termRun
	// tail: a suffix of the log, ending at last, as raft gave it (Data
	// aliases raft's proposals); tailBytes of data. Trimmed by applied
	// and past maxTail bytes. Never written in place: raft holds slices
	// of it (Entries hands them out without a copy).
	tail      []raftpb.Entry
	tailBytes int
	maxTail   int
	// conv is scratch for batch.
	conv []segment.Entry
}

type termRun struct{ start, term uint64 }

var _ raft.Storage = (*raftStorage)(nil)

// defaultMaxTail caps a group's tail cache (design §2.2: 16 MiB).
const defaultMaxTail = 16 << 20

// errStorage marks a group whose log and snapshot disagree at recovery.
var errStorage = errors.New("replication: raft log and snapshot disagree")

// openRaftStorage builds a group's storage from what segment recovered and
// the group's latest snapshot (its metadata: index, term, ConfState; for a
// group that never took one, index 0, term 0 and the group's voters). It
// refuses a log that lost entries after the snapshot, and a hard state
// whose commit index lies beyond the log, rather than let raft panic on
// them.
func openRaftStorage(log *segment.Log, gid uint64, snap raftpb.SnapshotMetadata) (*raftStorage, error) {
	s := &raftStorage{log: log, gid: gid, snap: snap, maxTail: defaultMaxTail}
	segFirst, segLast := log.FirstIndex(gid), log.LastIndex(gid)
	if segFirst > snap.Index+1 {
		return nil, fmt.Errorf("%w: group %d: the log starts at entry %d but the latest snapshot is of entry %d: entries %d..%d are lost",
			errStorage, gid, segFirst, snap.Index, snap.Index+1, segFirst-1)
	}
	s.first = snap.Index + 1
	s.last = max(segLast, snap.Index)
	s.durable = s.last
	if hs, ok := log.HardState(gid); ok {
		s.hs = raftpb.HardState{Term: hs.Term, Vote: hs.Vote, Commit: hs.Commit}
	}
	if s.hs.Commit < snap.Index {
		s.hs.Commit = snap.Index // a snapshot holds only committed entries
	}
	if s.hs.Commit > s.last {
		return nil, fmt.Errorf("%w: group %d: commit index %d beyond the last entry %d", errStorage, gid, s.hs.Commit, s.last)
	}
	// Terms of [first, last], read from the entry headers (views: no copy).
	const chunk = 1024
	for lo := s.first; lo <= segLast; lo += chunk {
		hi := min(lo+chunk, segLast+1)
		es, release, err := log.EntriesView(gid, lo, hi)
		if err != nil {
			return nil, fmt.Errorf("replication: group %d: reading the terms of entries %d..%d: %w", gid, lo, hi-1, err)
		}
		for _, e := range es {
			s.noteTerm(e.Index, e.Term)
		}
		release()
	}
	if n := len(s.terms); n > 0 && s.terms[0].term < snap.Term {
		return nil, fmt.Errorf("%w: group %d: entry %d has term %d, below the snapshot's term %d", errStorage, gid, s.first, s.terms[0].term, snap.Term)
	}
	return s, nil
}

func (s *raftStorage) noteTerm(idx, term uint64) {
	if n := len(s.terms); n == 0 || s.terms[n-1].term != term {
		s.terms = append(s.terms, termRun{start: idx, term: term})
	}
}

// InitialState implements raft.Storage.
func (s *raftStorage) InitialState() (raftpb.HardState, raftpb.ConfState, error) {
	return s.hs, s.snap.ConfState, nil
}

// FirstIndex implements raft.Storage.
func (s *raftStorage) FirstIndex() (uint64, error) { return s.first, nil }

// LastIndex implements raft.Storage.
func (s *raftStorage) LastIndex() (uint64, error) { return s.last, nil }

// Snapshot implements raft.Storage: the latest snapshot's descriptor. Its
// bytes are not in it; they are streamed to a follower by the transport
// (cluster step, design §6.7).
func (s *raftStorage) Snapshot() (raftpb.Snapshot, error) {
	return raftpb.Snapshot{Metadata: s.snap}, nil
}

// Term implements raft.Storage: valid for [first-1, last].
func (s *raftStorage) Term(i uint64) (uint64, error) {
	switch {
	case i < s.first-1:
		return 0, raft.ErrCompacted
	case i > s.last:
		return 0, raft.ErrUnavailable
	case i == s.first-1:
		return s.snap.Term, nil
	}
	if n := len(s.terms); n > 0 && s.terms[n-1].start <= i {
		return s.terms[n-1].term, nil
	}
	k := sort.Search(len(s.terms), func(k int) bool { return s.terms[k].start > i }) - 1
	if k < 0 {
		return 0, raft.ErrUnavailable // no run covers i: a bug, raft stops the group
	}
	return s.terms[k].term, nil
}

// Entries implements raft.Storage: [lo, hi), at least one entry if any,
// at most maxSize bytes (raft's measure: the entries' encoded sizes).
// From the tail cache without a copy when it covers lo; otherwise copied
// out of segment. The slice is capped (raft may append to it).
func (s *raftStorage) Entries(lo, hi, maxSize uint64) ([]raftpb.Entry, error) {
	if lo < s.first {
		return nil, raft.ErrCompacted
	}
	if hi > s.last+1 {
		return nil, raft.ErrUnavailable
	}
	if lo >= hi {
		return nil, nil
	}
	if len(s.tail) > 0 && lo >= s.tail[0].Index {
		t0 := s.tail[0].Index
		es := limitSize(s.tail[lo-t0:hi-t0], maxSize)
		return es[:len(es):len(es)], nil
	}
	segHi := hi
	if len(s.tail) > 0 && s.tail[0].Index < hi {
		segHi = s.tail[0].Index
	}
	var out []raftpb.Entry
	size := uint64(0)
	const chunk = 256
	for k := lo; k < segHi; {
		n := min(segHi, k+chunk)
		es, release, err := s.log.EntriesView(s.gid, k, n)
		if err != nil {
			if errors.Is(err, segment.ErrUnavailable) {
				return nil, raft.ErrUnavailable
			}
			return nil, err
		}
		// Decide what fits maxSize on the views first, then copy only
		// that: a chunk of large entries can be many times the limit.
		take, total, full := 0, 0, false
		for _, e := range es {
			re, err := raftEntry(e.Index, e.Term, e.Data)
			if err != nil {
				release()
				return nil, fmt.Errorf("replication: group %d: %w", s.gid, err)
			}
			if sz := uint64(re.Size()); len(out)+take > 0 && size+sz > maxSize {
				full = true
				break
			} else {
				size += sz
			}
			take++
			total += len(e.Data)
		}
		buf := make([]byte, 0, total)
		for _, e := range es[:take] {
			o := len(buf)
			buf = append(buf, e.Data...)
			re, _ := raftEntry(e.Index, e.Term, buf[o:len(buf):len(buf)]) // checked above
			out = append(out, re)
		}
		release()
		if full {
			return out[:len(out):len(out)], nil
		}
		k = n
	}
	if segHi < hi {
		for _, e := range s.tail[:hi-segHi] {
			if sz := uint64(e.Size()); size+sz > maxSize {
				break
			} else {
				size += sz
			}
			out = append(out, e)
		}
	}
	return out[:len(out):len(out)], nil
}

// limitSize is raft's rule: the longest prefix within maxSize, and at
// least one entry.
func limitSize(es []raftpb.Entry, maxSize uint64) []raftpb.Entry {
	if len(es) == 0 {
		return es
	}
	size := uint64(es[0].Size())
	for k := 1; k < len(es); k++ {
		size += uint64(es[k].Size())
		if size > maxSize {
			return es[:k]
		}
	}
	return es
}

// batch converts a Ready's entries and hard state into the group's
// segment batch (nil Entries and HardState when there is nothing to
// write: check len(Entries) and HardState). The entries' Data alias
// raft's (conf changes excepted, which get their marker); the Entries
// slice is scratch, valid until the next batch.
func (s *raftStorage) batch(ents []raftpb.Entry, hs raftpb.HardState) (segment.Batch, error) {
	b, conv, err := s.batchTo(s.conv[:0], ents, hs)
	s.conv = conv
	return b, err
}

// batchTo is batch with the entries converted into dst (returned grown:
// the caller's to keep until the write is done, for a write that may
// be in flight beside the group's next ones).
func (s *raftStorage) batchTo(dst []segment.Entry, ents []raftpb.Entry, hs raftpb.HardState) (segment.Batch, []segment.Entry, error) {
	b := segment.Batch{Group: s.gid}
	for k := range ents {
		d, err := raftData(&ents[k])
		if err != nil {
			return b, dst, fmt.Errorf("replication: group %d: %w", s.gid, err)
		}
		dst = append(dst, segment.Entry{Index: ents[k].Index, Term: ents[k].Term, Data: d})
	}
	if len(dst) > 0 {
		b.Entries = dst
	}
	if !raft.IsEmptyHardState(hs) && hs != s.hs {
		b.HardState = &segment.HardState{Term: hs.Term, Vote: hs.Vote, Commit: hs.Commit}
	}
	return b, dst, nil
}

// appended mirrors a batch segment has made durable: ents (contiguous,
// starting at or below last+1: an overwrite cuts what follows, as raft
// requires) and hs (ignored when empty).
func (s *raftStorage) appended(ents []raftpb.Entry, hs raftpb.HardState) error {
	// The batch is written: its conversion must not keep the entries'
	// data (the bodies) reachable until the group's next write.
	clear(s.conv[:cap(s.conv)])
	if err := s.stage(ents); err != nil {
		return err
	}
	s.persisted(s.last, hs)
	return nil
}

// persisted records that segment made the log durable up to entry last
// (staged before) and hs (ignored when empty).
func (s *raftStorage) persisted(last uint64, hs raftpb.HardState) {
	s.durable = max(s.durable, min(last, s.last))
	if !raft.IsEmptyHardState(hs) {
		s.hs = hs
	}
	s.trimTail(0)
}

// stage mirrors entries whose write is submitted and not yet durable
// (a pipelined group: raft takes them as stable now), as appended does,
// but durable stays where it is: the tail keeps them until they are.
func (s *raftStorage) stage(ents []raftpb.Entry) error {
	if len(ents) > 0 {
		i0 := ents[0].Index
		if i0 < s.first || i0 > s.last+1 {
			return fmt.Errorf("replication: group %d: entries from %d appended to a log of %d..%d", s.gid, i0, s.first, s.last)
		}
		if i0 <= s.last {
			// Overwrite: drop the cached entries and term runs from i0 on.
			if len(s.tail) > 0 {
				t0 := s.tail[0].Index
				cut := 0
				if i0 > t0 {
					cut = int(i0 - t0)
				}
				for _, e := range s.tail[cut:] {
					s.tailBytes -= len(e.Data)
				}
				// Capped: the appends below must not write over the cut
				// entries, which raft may still hold.
				s.tail = s.tail[:cut:cut]
			}
			k := sort.Search(len(s.terms), func(k int) bool { return s.terms[k].start >= i0 })
			s.terms = s.terms[:k]
		}
		for _, e := range ents {
			s.noteTerm(e.Index, e.Term)
			s.tail = append(s.tail, e)
			s.tailBytes += len(e.Data)
		}
		s.last = ents[len(ents)-1].Index
		s.durable = min(s.durable, i0-1) // an overwrite: what follows i0-1 is not durable yet
	}
	return nil
}

// applied lets the tail drop entries up to i (single voter: nobody else
// needs them from memory; a cluster passes min(applied, every follower's
// match)).
func (s *raftStorage) applied(i uint64) { s.trimTail(i) }

// trimTail drops cached entries at or below upTo, and older ones while
// the cache holds more than maxTail bytes (they stay in segment). It only
// reslices: raft may still hold the dropped entries (Ready, Entries), so
// they are never moved or cleared in place. But the array's dropped
// prefix would keep their data reachable (the bodies of every entry since
// the array was made: a durable queue's heap must not hold its backlog's
// bodies), so once the dropped part outweighs what is left, what is left
// is copied to a new array (entry headers only) and the old one goes when
// raft lets go of it.
func (s *raftStorage) trimTail(upTo uint64) {
	k := 0
	for k < len(s.tail) && (s.tail[k].Index <= upTo || s.tailBytes > s.maxTail && s.tail[k].Index <= s.durable) {
		s.tailBytes -= len(s.tail[k].Data)
		k++
	}
	switch rest := s.tail[k:]; {
	case len(rest) == 0:
		s.tail = nil
	case k > 0 && (cap(s.tail)-cap(rest)) >= len(rest):
		s.tail = append([]raftpb.Entry(nil), rest...)
	default:
		s.tail = rest
	}
}

// compacted records that segment.Compact(gid, meta.Index, live) returned:
// the log now starts after the snapshot meta describes.
func (s *raftStorage) compacted(meta raftpb.SnapshotMetadata) error {
	if meta.Index < s.snap.Index || meta.Index > s.last {
		return fmt.Errorf("replication: group %d: compaction to %d outside the log %d..%d", s.gid, meta.Index, s.first, s.last)
	}
	if t, err := s.Term(meta.Index); err != nil || t != meta.Term {
		return fmt.Errorf("replication: group %d: compaction to %d at term %d, but the entry's term is %d (%v)", s.gid, meta.Index, meta.Term, t, err)
	}
	s.snap = meta
	s.first = meta.Index + 1
	k := sort.Search(len(s.terms), func(k int) bool { return s.terms[k].start > s.first }) - 1
	if k > 0 {
		s.terms = append(s.terms[:0], s.terms[k:]...)
	}
	if len(s.terms) > 0 && s.terms[0].start < s.first {
		s.terms[0].start = s.first
	}
	s.trimTail(meta.Index)
	return nil
}

// installed records that a leader's snapshot described by meta is
// installed (segment compacted to it, what followed cut): the log now
// starts right after it and is empty.
func (s *raftStorage) installed(meta raftpb.SnapshotMetadata) {
	s.snap = meta
	s.first, s.last = meta.Index+1, meta.Index
	s.durable = s.last
	s.terms = s.terms[:0]
	clear(s.conv[:cap(s.conv)])
	s.tail, s.tailBytes = nil, 0
	s.hs.Commit = max(s.hs.Commit, meta.Index) // as a restart would find it
}
