package replication

import (
	"errors"
	"fmt"
	"sync"

	"github.com/warren-mq/warren/segment"
	"go.etcd.io/raft/v3/raftpb"
)

// SnapStoreGroup is the segment group that holds the node's snapshots
// (design §2.4; group 2 is the metadata group, queues from 3 up).
const SnapStoreGroup = 1

// SnapStore keeps the latest snapshot of every group as entries of segment
// group 1, so snapshots ride the group commit and create no files. A
// snapshot is written as chunks of at most snapChunk bytes, one entry
// each, appended together:
//
//	chunk := version u8 (=1) | reserved [3]u8 | conf_len u32 | gid u64 | index u64 | term u64
//	       | chunk u32 | chunks u32 | conf_state (chunk 0 only; raftpb.ConfState) | pad to 8 | data
//
// Recovery (OpenSnapStore) reads group 1's log once and keeps, per group,
// the last complete snapshot written. After each Put, group 1 is compacted
// up to just before the oldest snapshot still latest for some group, so
// every latest snapshot stays in group 1's raft range and nothing needs
// listing after a restart.
//
// Not built: a group that stops taking snapshots pins group 1 from its
// snapshot on (the design keeps such a snapshot as a live entry below the
// compaction point, which needs a way to list live entries after a
// restart, or a refresh that rewrites an old snapshot forward).
//
// Safe for concurrent use; Put blocks until the snapshot is durable (run it
// off the shard goroutine). Concurrent Puts and Forgets share their
// writes: one caller appends every snapshot queued meanwhile in one
// Append and compacts group 1 once for all of them (the others wait), so
// a node snapshotting many queues pays two group commits per batch of
// snapshots, not two per snapshot one after another.
type SnapStore struct {
	log *segment.Log

	mu      sync.Mutex
	cond    *sync.Cond // a batch was written (or writing ended)
	next    uint64     // the next index of group 1
	latest  map[uint64]*storedSnap
	queued  []*snapWrite // waiting for the next batch
	writing []*snapWrite // the batch being written (nil: none)
	buf     []byte
	ents    []segment.Entry

	queuedHook func() // tests: called (under mu) when a write is queued
}

// snapWrite is one Put (or Forget: meta.Index 0) waiting to be written.
type snapWrite struct {
	gid  uint64
	meta raftpb.SnapshotMetadata
	conf []byte
	data []byte
	done bool
	err  error
}

type storedSnap struct {
	at   uint64 // index of its first chunk in group 1
	meta raftpb.SnapshotMetadata
}

const (
	snapChunkVersion = 1
	snapChunkHeader  = 40
)

// snapChunk is the most snapshot bytes per entry (a variable so tests can
// make many chunks cheaply).
var snapChunk = 4 << 20

// ErrBadSnapStore: group 1 holds an entry that is no snapshot chunk this
// build reads.
var ErrBadSnapStore = errors.New("replication: malformed snapshot store entry")

// OpenSnapStore reads the snapshot store from log (recovery) and returns
// it with the latest complete snapshot of each group known.
func OpenSnapStore(log *segment.Log) (*SnapStore, error) {
	s := &SnapStore{log: log, latest: map[uint64]*storedSnap{}}
	s.cond = sync.NewCond(&s.mu)
	first, last := log.FirstIndex(SnapStoreGroup), log.LastIndex(SnapStoreGroup)
	s.next = last + 1
	var cur struct {
		gid, index uint64
		at         uint64
		n, got     uint32
		meta       raftpb.SnapshotMetadata
	}
	for lo := first; lo <= last; lo += 64 {
		hi := min(lo+64, last+1)
		es, release, err := log.EntriesView(SnapStoreGroup, lo, hi)
		if err != nil {
			return nil, fmt.Errorf("replication: reading the snapshot store (entries %d..%d): %w", lo, hi-1, err)
		}
		for _, e := range es {
			h, conf, _, err := parseChunk(e.Data)
			if err != nil {
				release()
				return nil, fmt.Errorf("%w: entry %d: %w", ErrBadSnapStore, e.Index, err)
			}
			if h.chunk == 0 {
				cur.gid, cur.index, cur.at, cur.n, cur.got = h.gid, h.index, e.Index, h.chunks, 0
				cur.meta = raftpb.SnapshotMetadata{Index: h.index, Term: h.term}
				if err := cur.meta.ConfState.Unmarshal(conf); err != nil {
					release()
					return nil, fmt.Errorf("%w: entry %d: conf state: %w", ErrBadSnapStore, e.Index, err)
				}
			}
			if h.gid != cur.gid || h.index != cur.index || h.chunk != cur.got || h.chunks != cur.n {
				cur.n = 0 // an incomplete snapshot (a torn Put): skip to the next chunk 0
				continue
			}
			if cur.got++; cur.got == cur.n {
				if cur.index == 0 {
					delete(s.latest, cur.gid) // Forget's tombstone
				} else {
					s.latest[cur.gid] = &storedSnap{at: cur.at, meta: cur.meta}
				}
			}
		}
		release()
	}
	return s, nil
}

type chunkHeader struct {
	gid, index, term uint64
	chunk, chunks    uint32
}

func parseChunk(b []byte) (h chunkHeader, conf, data []byte, err error) {
	if len(b) < snapChunkHeader {
		return h, nil, nil, fmt.Errorf("%d bytes, shorter than the header", len(b))
	}
	if b[0] != snapChunkVersion {
		return h, nil, nil, fmt.Errorf("version %d (this build reads %d; a newer Warren wrote it: upgrade this node)", b[0], snapChunkVersion)
	}
	if b[1]|b[2]|b[3] != 0 {
		return h, nil, nil, errors.New("reserved bytes are not zero")
	}
	cl := int(le.Uint32(b[4:]))
	h = chunkHeader{gid: le.Uint64(b[8:]), index: le.Uint64(b[16:]), term: le.Uint64(b[24:]), chunk: le.Uint32(b[32:]), chunks: le.Uint32(b[36:])}
	if h.chunks == 0 || h.chunk >= h.chunks {
		return h, nil, nil, fmt.Errorf("chunk %d of %d", h.chunk, h.chunks)
	}
	off := snapChunkHeader + cl
	off = (off + 7) &^ 7
	if cl > len(b)-snapChunkHeader || off > len(b) || (cl > 0 && h.chunk != 0) {
		return h, nil, nil, errors.New("bad conf state length")
	}
	return h, b[snapChunkHeader : snapChunkHeader+cl], b[off:], nil
}

// Latest returns the metadata of group gid's latest snapshot.
func (s *SnapStore) Latest(gid uint64) (raftpb.SnapshotMetadata, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if l := s.latest[gid]; l != nil {
		return l.meta, true
	}
	return raftpb.SnapshotMetadata{}, false
}

// Load returns group gid's latest snapshot: its metadata and its data (a
// copy), or ok false when it has none.
func (s *SnapStore) Load(gid uint64) (meta raftpb.SnapshotMetadata, data []byte, ok bool, err error) {
	s.mu.Lock()
	l := s.latest[gid]
	s.mu.Unlock()
	if l == nil {
		return meta, nil, false, nil
	}
	// The chunks stay in group 1's raft range while they are the latest
	// (see Put), so a plain read finds them.
	first, err := s.log.Entries(SnapStoreGroup, l.at, l.at+1)
	if err != nil {
		return meta, nil, false, err
	}
	h, _, d, err := parseChunk(first[0].Data)
	if err != nil {
		return meta, nil, false, fmt.Errorf("%w: entry %d: %w", ErrBadSnapStore, l.at, err)
	}
	data = append([]byte(nil), d...)
	if h.chunks > 1 {
		rest, err := s.log.Entries(SnapStoreGroup, l.at+1, l.at+uint64(h.chunks))
		if err != nil {
			return meta, nil, false, err
		}
		for _, e := range rest {
			_, _, d, err := parseChunk(e.Data)
			if err != nil {
				return meta, nil, false, fmt.Errorf("%w: entry %d: %w", ErrBadSnapStore, e.Index, err)
			}
			data = append(data, d...)
		}
	}
	return l.meta, data, true, nil
}

// Forget drops group gid's snapshot (its queue was deleted), durably: a
// tombstone entry (a snapshot of index 0) is appended, so a reopened store
// does not bring the old snapshot back, and group 1 is compacted past
// what no group needs any more.
func (s *SnapStore) Forget(gid uint64) error {
	s.mu.Lock()
	if s.latest[gid] == nil && !s.queuedFor(gid) {
		s.mu.Unlock()
		return nil
	}
	return s.writeLocked(&snapWrite{gid: gid})
}

// queuedFor reports whether a write for gid is queued or being written.
func (s *SnapStore) queuedFor(gid uint64) bool {
	for _, w := range s.queued {
		if w.gid == gid {
			return true
		}
	}
	for _, w := range s.writing {
		if w.gid == gid {
			return true
		}
	}
	return false
}

// compactTo is the group-1 index below which no group's latest snapshot
// lies (0: nothing to compact).
func (s *SnapStore) compactTo() uint64 {
	oldest := s.next
	for _, l := range s.latest {
		oldest = min(oldest, l.at)
	}
	if oldest > s.log.FirstIndex(SnapStoreGroup) {
		return oldest - 1
	}
	return 0
}

// Put makes data, group gid's snapshot described by meta, durable in the
// store, replacing the group's previous one, then lets segment drop what
// no group needs any more. It blocks for the write (one group commit) and
// the compaction record (one more), both shared with the Puts queued
// alongside it.
func (s *SnapStore) Put(gid uint64, meta raftpb.SnapshotMetadata, data []byte) error {
	conf, err := meta.ConfState.Marshal()
	if err != nil {
		return err
	}
	s.mu.Lock()
	if meta.Index == 0 {
		s.mu.Unlock()
		return fmt.Errorf("replication: group %d: a snapshot of entry 0", gid)
	}
	if l := s.latest[gid]; l != nil && l.meta.Index > meta.Index {
		s.mu.Unlock()
		return fmt.Errorf("replication: group %d: snapshot of entry %d is older than the stored one (%d)", gid, meta.Index, l.meta.Index)
	}
	return s.writeLocked(&snapWrite{gid: gid, meta: meta, conf: conf, data: data})
}

// writeLocked queues w and waits until it is written: the first waiter
// that finds no batch being written writes everything queued (w's and
// others'), then compacts group 1. s.mu is held on entry, released on
// return.
func (s *SnapStore) writeLocked(w *snapWrite) error {
	s.queued = append(s.queued, w)
	if s.queuedHook != nil {
		s.queuedHook()
	}
	for !w.done {
		if s.writing != nil {
			s.cond.Wait()
			continue
		}
		s.writeBatchLocked()
	}
	s.mu.Unlock()
	return w.err
}

// writeBatchLocked appends every queued write in one Append (in queue
// order: a later snapshot of a group replaces an earlier one), records
// them as the latest, and compacts group 1. s.mu is held; it is released
// while the log is written.
func (s *SnapStore) writeBatchLocked() {
	batch := s.queued
	s.queued = nil
	s.writing = batch
	at := s.next
	s.buf, s.ents = s.buf[:0], s.ents[:0]
	var ends []int
	firsts := make([]uint64, len(batch))
	for k, w := range batch {
		firsts[k] = at + uint64(len(ends))
		ends = s.encode(w, ends)
	}
	start := 0
	for i, end := range ends { // sliced once the buffer stopped moving
		s.ents = append(s.ents, segment.Entry{Index: at + uint64(i), Term: 1, Data: s.buf[start:end:end]})
		start = end
	}
	s.mu.Unlock()
	err := s.log.Append(segment.Batch{Group: SnapStoreGroup, Entries: s.ents})
	s.mu.Lock()
	if err == nil {
		s.next = at + uint64(len(ends))
		for k, w := range batch {
			if w.meta.Index == 0 {
				delete(s.latest, w.gid)
			} else if l := s.latest[w.gid]; l == nil || l.meta.Index <= w.meta.Index {
				s.latest[w.gid] = &storedSnap{at: firsts[k], meta: w.meta}
			}
		}
		if upTo := s.compactTo(); upTo > 0 {
			s.mu.Unlock()
			err = s.log.Compact(SnapStoreGroup, upTo, nil)
			s.mu.Lock()
		}
	}
	clear(s.ents)
	if cap(s.buf) > 1<<20 {
		// A deep queue's snapshot buffer is not kept between snapshots
		// (it would hold ~30 B per queued message on the heap for good).
		s.buf, s.ents = nil, nil
	}
	for _, w := range batch {
		w.done, w.err = true, err
	}
	s.writing = nil
	s.cond.Broadcast()
}

// encode appends w's chunks to s.buf (a Forget's tombstone: one chunk of
// a snapshot of index 0, no data) and their ends to ends.
func (s *SnapStore) encode(w *snapWrite, ends []int) []int {
	n := max(1, (len(w.data)+snapChunk-1)/snapChunk)
	for i := range n {
		start := len(s.buf)
		s.buf = append(s.buf, snapChunkVersion, 0, 0, 0)
		cl := 0
		if i == 0 {
			cl = len(w.conf)
		}
		s.buf = le.AppendUint32(s.buf, uint32(cl))
		s.buf = le.AppendUint64(s.buf, w.gid)
		s.buf = le.AppendUint64(s.buf, w.meta.Index)
		s.buf = le.AppendUint64(s.buf, w.meta.Term)
		s.buf = le.AppendUint32(s.buf, uint32(i))
		s.buf = le.AppendUint32(s.buf, uint32(n))
		if i == 0 {
			s.buf = append(s.buf, w.conf...)
		}
		for (len(s.buf)-start)%8 != 0 {
			s.buf = append(s.buf, 0)
		}
		s.buf = append(s.buf, w.data[min(i*snapChunk, len(w.data)):min((i+1)*snapChunk, len(w.data))]...)
		ends = append(ends, len(s.buf))
	}
	return ends
}
