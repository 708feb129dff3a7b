package replication

// Snapshots (design §2.4): Group.Snapshot stores the FSM's snapshot off
// the shard and then compacts the log to it (maybeCompact), and the
// snapshot policy (SnapshotDue, after each apply and in MaybeSnapshot's
// idle rule).

import (
	"errors"
	"fmt"

	"go.etcd.io/raft/v3/raftpb"
)

// ErrSnapshotLater: a snapshot of the group is still in progress; try
// again after it finished.
var ErrSnapshotLater = errors.New("replication: a snapshot is in progress; retry once it is done")

// ErrSnapshotSuperseded: the group's snapshot was stored but not
// compacted to, a leader's newer snapshot being installed instead.
var ErrSnapshotSuperseded = errors.New("replication: a snapshot superseded by the leader's, installed instead")

type pendingCompact struct {
	meta raftpb.SnapshotMetadata
	live []uint64
	done func(raftpb.SnapshotMetadata, error)
}

// Snapshot snapshots the group at its applied index S into store and then
// compacts its log to S, keeping the entries that still hold messages
// (design §2.4). The snapshot is taken now, on the shard (O(held
// messages)); the store's write runs on a goroutine of its own, and once
// it is durable and the group's commit index ≥ S is on disk too (segment
// and raft require it before a compaction: the next round writes a
// pending commit-only hard state for it), the compaction runs on another.
// done is posted back to the shard with the outcome, after the storage
// knows the log starts at S+1. It returns ErrSnapshotLater while a
// snapshot is in progress, and nil without calling done when nothing was
// applied since the last one.
func (g *Group) Snapshot(store *SnapStore, done func(meta raftpb.SnapshotMetadata, err error)) error {
	if g.err != nil {
		return g.err
	}
	if g.w.failed != nil {
		return ErrWorkerStopped
	}
	if g.snapping || g.installing || g.deferred != nil {
		// (while a leader's snapshot is installed the FSM is the one from
		// before it, and the log may already start after it)
		return ErrSnapshotLater
	}
	at := g.fsm.AppliedIndex()
	if at <= g.st.snap.Index {
		return nil
	}
	term, err := g.st.Term(at)
	if err != nil {
		return fmt.Errorf("replication: group %d: term of applied entry %d: %w", g.id, at, err)
	}
	meta := raftpb.SnapshotMetadata{Index: at, Term: term, ConfState: g.conf}
	data, err := g.fsm.Snapshot()
	if err != nil {
		return err
	}
	p := &pendingCompact{meta: meta, live: g.fsm.LiveEntries(nil, at), done: done}
	g.snapping = true
	g.lastSnapSize, g.lastSnapAt = len(data), g.w.now
	g.deadAt, g.bytesAt = g.fsm.DeadBytes(), g.fsm.AppliedBytes()
	w := g.w
	w.cfg.Pool.Go(func() {
		err := store.Put(g.id, meta, data)
		w.cfg.Post(func() {
			if err == nil && g.removed {
				err = ErrGroupRemoved
			}
			if err == nil && g.deferred != nil {
				err = ErrSnapshotSuperseded // a leader's snapshot waits to be installed
			}
			if err != nil {
				g.snapping = false
				done(meta, err)
				g.maybeRemove()
				g.snapshotEnded()
				return
			}
			g.compactAfter = p
			g.maybeCompact()
		})
	})
	return nil
}

// SnapshotDue applies the snapshot policy of design §2.4 at time now (ms):
// a snapshot is due when it frees much more log than it writes (the log
// bytes that died since the last one reach max(1 MiB, snapReclaimFactor
// times its size)), when
// enough log was applied since to bound a replay (max(64 MiB, four times
// its size)), or when some log is reclaimable and the last snapshot is 5 s
// old (idle clean-up).
func (g *Group) SnapshotDue(now int64) bool {
	if g.lastSnapAt == 0 {
		g.lastSnapAt = now // the idle clock starts at the first check
	}
	reclaim := g.fsm.DeadBytes() - g.deadAt
	since := g.fsm.AppliedBytes() - g.bytesAt
	last := uint64(g.lastSnapSize)
	return reclaim >= max(1<<20, snapReclaimFactor*last) ||
		since >= max(64<<20, 4*last) ||
		(reclaim > 0 && now-g.lastSnapAt >= 5000)
}

// snapReclaimFactor: a snapshot is taken once the log it frees is this
// many times its size. Every snapshot is written in full (48 B per held
// message), so the factor bounds what snapshots add to the log's writes:
// with 2, a queue holding 20,000 messages in flight wrote a 1 MB snapshot
// per 2 MB of bodies consumed, a quarter more than the bodies themselves
// (BENCHMARKS.md, durable queues). The dead log waits longer for its
// snapshot; it is still freed before its WAL file is moved into segment
// files (segment.Options.MoveLag: 256 MiB of appends later) unless the
// snapshot is over 32 MiB (some 700,000 held messages).
const snapReclaimFactor = 8

// maybeAutoSnapshot takes a snapshot if entries were applied since
// the FSM was at entry before and the policy asks for one.
func (g *Group) maybeAutoSnapshot(before uint64, now int64) {
	if g.fsm.AppliedIndex() > before && g.w.cfg.Snapshots != nil && !g.snapping && !g.installing && g.deferred == nil && g.err == nil && g.SnapshotDue(now) {
		g.autoSnapshot()
	}
}

// autoSnapshot takes a snapshot the policy asked for.
func (g *Group) autoSnapshot() {
	w := g.w
	err := g.Snapshot(w.cfg.Snapshots, func(meta raftpb.SnapshotMetadata, err error) {
		if err != nil && !errors.Is(err, ErrGroupRemoved) && !errors.Is(err, ErrSnapshotSuperseded) { // a queue deleted meanwhile, a leader's snapshot installed instead: nothing failed
			w.cfg.Logger.Error("replication: snapshot failed", "group", g.id, "index", meta.Index, "err", err)
		}
		if w.cfg.SnapshotDone != nil {
			w.cfg.SnapshotDone(g, meta, err)
		}
	})
	if err != nil && !errors.Is(err, ErrSnapshotLater) {
		w.cfg.Logger.Error("replication: snapshot not started", "group", g.id, "err", err)
	}
}

// MaybeSnapshot applies the snapshot policy to every group (the idle
// rule needs a clock: call it from a periodic timer, every few seconds).
// O(groups).
func (w *Worker) MaybeSnapshot(now int64) {
	if w.cfg.Snapshots == nil || w.failed != nil {
		return
	}
	w.now = max(w.now, now)
	for _, g := range w.ids {
		if g.err == nil && !g.snapping && !g.installing && g.deferred == nil && g.SnapshotDue(now) {
			g.autoSnapshot()
		}
	}
}

// maybeCompact starts the compaction of a stored snapshot once the
// group's commit index on disk covers it, or asks the next round to write
// the commit.
func (g *Group) maybeCompact() {
	p := g.compactAfter
	if p == nil {
		return
	}
	if g.st.hs.Commit < p.meta.Index {
		g.forceHS = true
		g.w.mark(g)
		return
	}
	g.compactAfter = nil
	w := g.w
	// The storage starts after the snapshot from now on, before segment
	// drops anything: raft must never ask segment for an entry the
	// compaction may have dropped (a leader sending to a follower;
	// ErrUnavailable there panics raft). The snapshot is durable in the
	// store already, and raft sends it instead.
	if err := g.st.compacted(p.meta); err != nil {
		g.snapping = false
		p.done(p.meta, err)
		g.maybeRemove()
		g.snapshotEnded()
		return
	}
	w.cfg.Pool.Go(func() {
		err := w.log.Compact(g.id, p.meta.Index, p.live)
		w.cfg.Post(func() {
			g.snapping = false
			if err == nil && g.removed {
				err = ErrGroupRemoved
			}
			p.done(p.meta, err)
			g.maybeRemove()
			g.snapshotEnded()
		})
	})
}
