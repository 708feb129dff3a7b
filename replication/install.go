package replication

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"

	"github.com/warren-mq/warren/segment"
	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
)

// Snapshot install (design/replication.md §6.7): a follower that needs
// entries its leader has compacted away gets the leader's latest snapshot
// and, with it, only the live entries (those still holding a message)
// above the follower's Match: the follower already holds every live entry
// at or below it (an entry live at the snapshot was live at every earlier
// point, so the follower's own compactions kept it). raft's MsgSnap
// carries only the descriptor (raftStorage.Snapshot); the worker attaches
// the bytes and entries and hands the whole to the transport
// (WorkerConfig.SendSnapshot), which streams it and hands it on the other
// side to Worker.StepSnapshot.
//
// The receiver stages it and steps the MsgSnap. When raft takes it (a
// Ready with the snapshot: raft ignores one the follower does not need),
// the group installs it before anything else of that Ready, off the
// shard (Pool), in an order that a crash at any point leaves safe:
//
//  1. Truncate the follower's divergent suffix: from the first live entry
//     it holds with another term, and above the snapshot's index. raft
//     took the snapshot, so the follower's entry at the snapshot's index
//     is not the leader's (or is missing): what follows is divergent and
//     never committed, and cutting it is what raft does on any conflict.
//  2. Put the snapshot into the SnapStore, wrapped with the live entries
//     the follower must still write (an install record). From here a
//     restart recovers to the snapshot (Worker.Recover redoes 3 and 4).
//  3. CompactAt the snapshot's index and term, keeping the live entries
//     the follower holds.
//  4. AppendLive the others, below the new start of the log, under the
//     leader's term (at least that of any stale copy a crash could leave
//     in a segment file: segment keeps the higher-term copy).
//
// Then, back on the shard, the storage starts after the snapshot, the FSM
// is restored from it, WorkerConfig.Installed hears it, and the rest of
// the Ready (its messages, among them the answer to the leader) goes as
// usual. The install record keeps the entries a second time in the store
// until the group's next snapshot replaces it: what a restart between 2
// and 4 needs.
//
// A snapshot whose entries stayed in the transport's spool file (over
// cluster.Config.SnapshotMemBytes: SnapshotMessage.ReadEntry) is
// installed with an install record without them, the entries read and
// stored a batch at a time after step 3 (installSnapshot): memory stays
// bounded whatever the snapshot's size, and a crash before the last
// batch leaves a copy that does not open (rebuilt from the others).

// SnapshotMessage is a raft MsgSnap with what the transport streams with
// it: the snapshot's data (the FSM image) and the live entries above the
// follower's Match, in index order. On the leader their Data are views of
// its log (Release releases them: the transport's sender calls it once
// sent or dropped); on the follower, a big snapshot's entries stay in the
// transport's spool file, read with ReadEntry as they are installed
// (Release removes the file: the group calls it once it installed,
// refused or replaced the snapshot). The fields match cluster.Snapshot's.
type SnapshotMessage struct {
	Msg     raftpb.Message
	Data    []byte
	Entries []segment.Entry
	// ReadEntry, when set, reads the data of Entries[i] (whose Data is
	// then nil) into dst's space.
	ReadEntry func(i int, dst []byte) ([]byte, error)
	// Release, when set, frees what the message holds; call it once.
	Release func()
}

// release calls s.Release, if any (s may be nil).
func (s *SnapshotMessage) release() {
	if s != nil && s.Release != nil {
		s.Release()
	}
}

// SnapshotTransport is the part of a Transport that carries snapshots:
// SendSnapshot streams s to node s.Msg.To, where it goes to the group's
// Worker.StepSnapshot; once it is delivered, or lost, the transport tells
// the sending worker (Worker.ReportSnapshot), or raft keeps the follower
// waiting for it. Like Send, it runs on the shard goroutine and must not
// block.
type SnapshotTransport interface {
	SendSnapshot(gid uint64, s *SnapshotMessage)
}

// ErrNoSnapshotData: raft asked to send a snapshot the node cannot send
// (no store, or its latest snapshot is older than the one raft named).
var ErrNoSnapshotData = errors.New("replication: no snapshot to send")

// sendSnapshot handles a MsgSnap raft wants sent: the data and the live
// entries above the follower's Match are read off the shard, then handed
// to the transport. On failure raft hears SnapshotFailure and retries.
func (g *Group) sendSnapshot(m raftpb.Message) {
	w := g.w
	store := w.cfg.Snapshots
	if w.cfg.SendSnapshot == nil || store == nil {
		g.rn.ReportSnapshot(m.To, raft.SnapshotFailure)
		w.mark(g)
		return
	}
	if !inConf(m.Snapshot.Metadata.ConfState, m.To) {
		// Taken before the node was added (a replica being moved here,
		// move.go): raft would refuse it. A new one includes the node,
		// and raft asks again once it hears of the failure.
		if !g.snapping {
			g.autoSnapshot()
		}
		g.rn.ReportSnapshot(m.To, raft.SnapshotFailure)
		w.mark(g)
		return
	}
	match := uint64(0)
	if pr, ok := g.rn.Status().Progress[m.To]; ok {
		match = pr.Match
	}
	gid := g.id
	w.cfg.Pool.Go(func() {
		s, err := loadSnapshotMessage(w.log, store, gid, m, match)
		w.cfg.Post(func() {
			if g.removed || g.err != nil || w.failed != nil {
				s.release()
				return
			}
			if err != nil {
				w.cfg.Logger.Warn("replication: snapshot not sent", "group", gid, "to", m.To, "err", err)
				g.rn.ReportSnapshot(m.To, raft.SnapshotFailure)
				w.mark(g)
				return
			}
			w.stats.SnapshotsSent++
			w.cfg.SendSnapshot(gid, s)
		})
	})
}

// loadSnapshotMessage reads the group's latest snapshot and the live
// entries above match. A snapshot newer than the one raft named is sent
// instead (raft takes the follower's answer to it as usual).
func loadSnapshotMessage(log *segment.Log, store *SnapStore, gid uint64, m raftpb.Message, match uint64) (*SnapshotMessage, error) {
	meta, data, ok, err := store.Load(gid)
	if err != nil {
		return nil, err
	}
	if !ok || meta.Index < m.Snapshot.Metadata.Index {
		return nil, fmt.Errorf("%w: group %d: raft named entry %d, the store has %d", ErrNoSnapshotData, gid, m.Snapshot.Metadata.Index, meta.Index)
	}
	fsmData, _, err := splitInstall(data)
	if err != nil {
		return nil, err
	}
	fsm, err := RestoreQueueFSM(meta.Index, fsmData, nil)
	if err != nil {
		return nil, err
	}
	s := &SnapshotMessage{Msg: m, Data: fsmData}
	s.Msg.Snapshot = &raftpb.Snapshot{Metadata: meta}
	// The entries are views of the log's files (mapped: not on the heap),
	// held until the transport has sent them.
	var views []func()
	s.Release = func() {
		for _, r := range views {
			r()
		}
		views = nil
	}
	for _, idx := range fsm.LiveEntries(nil, meta.Index) {
		if idx <= match {
			continue
		}
		es, release, err := log.EntriesView(gid, idx, idx+1)
		if err != nil {
			s.Release()
			return nil, fmt.Errorf("replication: group %d: live entry %d of snapshot %d: %w", gid, idx, meta.Index, err)
		}
		s.Entries = append(s.Entries, segment.Entry{Index: idx, Term: es[0].Term, Data: es[0].Data})
		views = append(views, release)
	}
	return s, nil
}

// ReportSnapshot tells group gid's leader whether the snapshot it sent to
// node to arrived (the transport's report; raft resumes replicating to
// the follower, or retries).
func (w *Worker) ReportSnapshot(gid, to uint64, delivered bool) {
	g := w.ids[gid]
	if g == nil || g.err != nil || w.failed != nil {
		return
	}
	st := raft.SnapshotFinish
	if !delivered {
		st = raft.SnapshotFailure
	}
	g.rn.ReportSnapshot(to, st)
	w.mark(g)
}

// StepSnapshot hands group gid a snapshot from its leader (the
// transport's receiving side, in place of Step for a MsgSnap): it is
// staged and its MsgSnap stepped; raft then either takes it (the group
// installs it in its next rounds) or answers that the follower does not
// need it.
func (w *Worker) StepSnapshot(gid uint64, s *SnapshotMessage) error {
	g := w.ids[gid]
	if g == nil {
		s.release()
		return fmt.Errorf("replication: a snapshot for group %d, which is not open on this node", gid)
	}
	if g.err != nil {
		s.release()
		return g.err
	}
	if w.failed != nil {
		s.release()
		return ErrWorkerStopped
	}
	if s.Msg.Type != raftpb.MsgSnap || s.Msg.Snapshot == nil {
		s.release()
		return fmt.Errorf("replication: group %d: StepSnapshot of a %v", gid, s.Msg.Type)
	}
	if !slices.IsSortedFunc(s.Entries, func(a, b segment.Entry) int { return cmpIndex(a.Index, b.Index) }) {
		s.release()
		return fmt.Errorf("replication: group %d: a snapshot's live entries out of order", gid)
	}
	g.ledAt = w.ticks
	if prev := g.staged; prev == nil || prev.Msg.Snapshot.Metadata.Index <= s.Msg.Snapshot.Metadata.Index {
		if prev != s {
			prev.release()
		}
		g.staged = s
	} else {
		defer s.release() // (stepped below: raft keeps none of it)
	}
	if err := g.rn.Step(s.Msg); err != nil {
		return fmt.Errorf("replication: group %d: %v from %d: %w", gid, s.Msg.Type, s.Msg.From, err)
	}
	w.mark(g)
	return nil
}

func cmpIndex(a, b uint64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// install starts installing the snapshot of rd (raft took it): off the
// shard, then the rest of rd once it is durable (Group.resume).
func (g *Group) install(rd raft.Ready) {
	meta := rd.Snapshot.Metadata
	s := g.staged
	if s == nil || s.Msg.Snapshot.Metadata.Index != meta.Index || s.Msg.Snapshot.Metadata.Term != meta.Term {
		g.dropStaged()
		g.fail(fmt.Errorf("replication: group %d: raft installs snapshot %d (term %d), which was never staged", g.id, meta.Index, meta.Term))
		return
	}
	g.staged = nil
	if g.snapping {
		if p := g.compactAfter; p != nil {
			// This node's own snapshot is stored and waits to compact:
			// the leader's, newer, supersedes it (its compaction would
			// run after the install's).
			g.compactAfter, g.snapping = nil, false
			p.done(p.meta, ErrSnapshotSuperseded)
		} else {
			// Being stored or compacted: the install waits for it to end
			// (snapshotEnded), the group's rounds with it.
			g.deferred = &deferredInstall{rd: rd, s: s}
			g.inflight = true
			return
		}
	}
	g.startInstall(rd, s)
}

// deferredInstall is a snapshot install waiting for the group's own
// snapshot to end (Group.deferred).
type deferredInstall struct {
	rd raft.Ready
	s  *SnapshotMessage
}

// snapshotEnded runs when the group's own snapshot has ended (stored and
// compacted, or failed): a leader's snapshot deferred meanwhile is
// installed now.
func (g *Group) snapshotEnded() {
	d := g.deferred
	if d == nil {
		return
	}
	g.deferred, g.inflight = nil, false
	if g.removed || g.err != nil || g.w.failed != nil {
		d.s.release()
		g.maybeRemove()
		return
	}
	g.startInstall(d.rd, d.s)
}

// startInstall installs s, the staged snapshot of rd, off the shard.
func (g *Group) startInstall(rd raft.Ready, s *SnapshotMessage) {
	w := g.w
	meta := rd.Snapshot.Metadata
	store := w.cfg.Snapshots
	if store == nil {
		s.release()
		g.fail(fmt.Errorf("replication: group %d: a snapshot to install and no SnapStore (WorkerConfig.Snapshots)", g.id))
		return
	}
	fsm, err := RestoreQueueFSM(meta.Index, s.Data, nil)
	if err != nil {
		s.release()
		g.fail(fmt.Errorf("replication: group %d: the leader's snapshot %d: %w", g.id, meta.Index, err))
		return
	}
	live := fsm.LiveEntries(nil, meta.Index)
	g.inflight, g.installing = true, true
	gid, first, last, term := g.id, g.st.first, g.st.last, s.Msg.Term
	w.cfg.Pool.Go(func() {
		err := installSnapshot(w.log, store, gid, meta, s.Data, s.Entries, s.ReadEntry, live, first, last, term)
		s.release() // (the entries are stored, or the install failed)
		w.cfg.Post(func() { g.installed(rd, meta, s.Data, err) })
	})
}

// installed runs on the shard once installSnapshot returned.
func (g *Group) installed(rd raft.Ready, meta raftpb.SnapshotMetadata, data []byte, err error) {
	w := g.w
	g.inflight, g.installing = false, false
	if g.removed {
		g.maybeRemove()
		return
	}
	if err != nil {
		if errors.Is(err, segment.ErrStopped) {
			w.stop(err)
			return
		}
		g.fail(fmt.Errorf("replication: group %d: installing snapshot %d: %w", g.id, meta.Index, err))
		return
	}
	if err := g.fsm.Restore(meta.Index, data); err != nil {
		g.fail(fmt.Errorf("replication: group %d: restoring snapshot %d: %w", g.id, meta.Index, err))
		return
	}
	g.st.installed(meta)
	clear(g.waiting) // (none: a write was in flight while any waited) the log restarts after meta.Index
	g.waiting = g.waiting[:0]
	g.appliedIdx.Store(meta.Index)
	g.setConf(meta.ConfState)
	g.lastSnapSize, g.lastSnapAt = 0, w.now
	g.deadAt, g.bytesAt = g.fsm.DeadBytes(), g.fsm.AppliedBytes()
	w.stats.SnapshotsInstalled++
	if w.cfg.Installed != nil {
		w.cfg.Installed(g, meta)
	}
	rd.Snapshot = raftpb.Snapshot{}
	g.resume = &rd
	w.mark(g)
}

// dropStaged releases the staged snapshot, if any, and forgets it.
func (g *Group) dropStaged() {
	g.staged.release()
	g.staged = nil
}

// installBatchBytes: a big install (its entries read from the transport's
// spool file) stores them in AppendLive batches of about this size.
const installBatchBytes = 16 << 20

// installSnapshot makes the install durable (steps 1 to 4 above); first
// and last are the group's raft log before it, term the leader's. With
// read (the entries' data in the transport's spool file, not in memory:
// a snapshot over cluster.Config.SnapshotMemBytes) the entries are not
// put in the install record, which would hold them all in memory, but
// read and stored a batch at a time after the compaction: a crash before
// the last batch is durable leaves live entries missing, which Recover
// reports (segment's Compact check), and the copy is rebuilt from the
// other replicas (the broker's rebuild: it leaves the group first).
func installSnapshot(log *segment.Log, store *SnapStore, gid uint64, meta raftpb.SnapshotMetadata, data []byte, ents []segment.Entry, read func(int, []byte) ([]byte, error), live []uint64, first, last, term uint64) error {
	// 1. The divergent suffix.
	cut := meta.Index + 1
	write := make([]segment.Entry, 0, len(ents))
	var from []int // with read: the message's entry each of write is
	for i, e := range ents {
		switch {
		case e.Index >= first && e.Index <= last && e.Index < cut:
			if t, err := log.Term(gid, e.Index); err == nil && t == e.Term {
				continue // held: the same entry (log matching)
			}
			cut = e.Index
		case e.Index < first:
			// Held below its raft log (kept live by its own compactions)?
			if es, release, err := log.EntriesView(gid, e.Index, e.Index+1); err == nil {
				held := es[0].Term >= e.Term
				release()
				if held {
					continue
				}
			}
		}
		write = append(write, segment.Entry{Index: e.Index, Term: max(e.Term, term), Data: e.Data})
		from = append(from, i)
	}
	if cut <= last {
		if err := log.Truncate(gid, cut); err != nil {
			return err
		}
	}
	if read == nil {
		// 2. The snapshot, with what is still to write.
		if err := store.Put(gid, meta, wrapInstall(data, write)); err != nil {
			return err
		}
		// 3 and 4.
		return completeInstall(log, gid, meta, live, write)
	}
	// 2, without the entries.
	if err := store.Put(gid, meta, wrapInstall(data, nil)); err != nil {
		return err
	}
	keep, missing := installSplit(log, gid, live, write)
	if err := log.CompactAt(gid, meta.Index, meta.Term, keep); err != nil {
		return err
	}
	// 4, a batch at a time, each entry read from the spool file.
	var batch []segment.Entry
	size := 0
	for j, k := range missing {
		d, err := read(from[k], nil)
		if err != nil {
			return err
		}
		batch = append(batch, segment.Entry{Index: write[k].Index, Term: write[k].Term, Data: d})
		if size += len(d); size >= installBatchBytes || j == len(missing)-1 {
			if err := log.AppendLive(gid, batch); err != nil {
				return err
			}
			clear(batch)
			batch, size = batch[:0], 0
		}
	}
	return log.Compact(gid, meta.Index, live)
}

// installSplit sorts the live entries into those the log holds (keep)
// and the positions in ents of those it must store (missing).
func installSplit(log *segment.Log, gid uint64, live []uint64, ents []segment.Entry) (keep []uint64, missing []int) {
	keep = make([]uint64, 0, len(live))
	k := 0
	for _, idx := range live {
		for k < len(ents) && ents[k].Index < idx {
			k++
		}
		if k < len(ents) && ents[k].Index == idx {
			if es, release, err := log.EntriesView(gid, idx, idx+1); err == nil {
				ok := es[0].Term >= ents[k].Term
				release()
				if ok {
					keep = append(keep, idx)
					continue
				}
			}
			missing = append(missing, k)
			continue
		}
		keep = append(keep, idx)
	}
	return keep, missing
}

// completeInstall compacts the group's log to the snapshot keeping the
// live entries it holds, stores the install's entries it lacks, and
// checks that every live entry is then stored. Idempotent: Recover runs
// it again after a crash.
func completeInstall(log *segment.Log, gid uint64, meta raftpb.SnapshotMetadata, live []uint64, ents []segment.Entry) error {
	keep, miss := installSplit(log, gid, live, ents)
	missing := make([]segment.Entry, 0, len(miss))
	for _, k := range miss {
		missing = append(missing, ents[k])
	}
	if err := log.CompactAt(gid, meta.Index, meta.Term, keep); err != nil {
		return err
	}
	if err := log.AppendLive(gid, missing); err != nil {
		return err
	}
	return log.Compact(gid, meta.Index, live)
}

// The install record: what Put stores for an installed snapshot, the FSM
// data and the live entries the install writes (design §6.7, step 2):
//
//	magic "WRNINST\x01" | data_len u64 | data | n u64 | n × (index u64, term u64, len u32, pad to 8, data, pad to 8)
//
// A QueueFSM snapshot starts with its version byte (1 or 2) and zeros, so
// the two never look alike.
var installMagic = []byte("WRNINST\x01")

func wrapInstall(data []byte, ents []segment.Entry) []byte {
	n := len(installMagic) + 8 + len(data) + 8 + 8
	for _, e := range ents {
		n += 24 + len(e.Data) + 8
	}
	b := make([]byte, 0, n)
	b = append(b, installMagic...)
	b = binary.LittleEndian.AppendUint64(b, uint64(len(data)))
	b = append(b, data...)
	b = pad8(b)
	b = binary.LittleEndian.AppendUint64(b, uint64(len(ents)))
	for _, e := range ents {
		b = binary.LittleEndian.AppendUint64(b, e.Index)
		b = binary.LittleEndian.AppendUint64(b, e.Term)
		b = binary.LittleEndian.AppendUint32(b, uint32(len(e.Data)))
		b = pad8(b)
		b = append(b, e.Data...)
		b = pad8(b)
	}
	return b
}

func pad8(b []byte) []byte {
	for len(b)%8 != 0 {
		b = append(b, 0)
	}
	return b
}

// splitInstall returns the FSM data of a stored snapshot and, for an
// install record, its entries (views into data).
func splitInstall(data []byte) ([]byte, []segment.Entry, error) {
	if !bytes.HasPrefix(data, installMagic) {
		return data, nil, nil
	}
	bad := func(why string) ([]byte, []segment.Entry, error) {
		return nil, nil, fmt.Errorf("%w: install record: %s", ErrBadFSMSnapshot, why)
	}
	b := data[len(installMagic):]
	if len(b) < 8 {
		return bad("short")
	}
	n := binary.LittleEndian.Uint64(b)
	b = b[8:]
	if n > uint64(len(b)) {
		return bad("data length")
	}
	fsm := b[:n:n]
	b = b[(n+7)&^7:]
	if len(b) < 8 {
		return bad("short")
	}
	count := binary.LittleEndian.Uint64(b)
	b = b[8:]
	if count > uint64(len(b))/24 {
		return bad("entry count")
	}
	ents := make([]segment.Entry, 0, count)
	for range count {
		if len(b) < 24 {
			return bad("short entry")
		}
		e := segment.Entry{Index: binary.LittleEndian.Uint64(b), Term: binary.LittleEndian.Uint64(b[8:])}
		dn := uint64(binary.LittleEndian.Uint32(b[16:]))
		b = b[24:]
		if dn > uint64(len(b)) {
			return bad("entry length")
		}
		e.Data = b[:dn:dn]
		b = b[min((dn+7)&^7, uint64(len(b))):]
		ents = append(ents, e)
	}
	return fsm, ents, nil
}
