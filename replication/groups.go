package replication

// A group's life on a worker: Open (a new group, or one restored from a
// snapshot), Recover after a restart (from the snapshot store, redoing an
// interrupted install), and Remove for a deleted queue (maybeRemove runs
// the removal once nothing of the group is in flight).

import (
	"errors"
	"fmt"

	"github.com/warren-mq/warren/queue"
	"github.com/warren-mq/warren/segment"
	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
)

// Open opens group gid over the log: its storage from what segment holds
// and snap (the latest snapshot's metadata, ConfState included; for a new
// group index 0 and the voters), its FSM (fsm, restored to snap.Index by
// the caller, or new), and its RawNode, which campaigns at once when this
// node is the only voter. Entries after snap.Index are replayed through
// the FSM by the rounds that follow, with the sink the FSM has (set it to
// nil to drop replayed effects, then SetSink once caught up).
func (w *Worker) Open(gid uint64, snap raftpb.SnapshotMetadata, fsm *QueueFSM) (*Group, error) {
	if w.ids[gid] != nil {
		return nil, fmt.Errorf("replication: group %d is already open", gid)
	}
	if fsm.AppliedIndex() != snap.Index {
		return nil, fmt.Errorf("replication: group %d: the FSM is at entry %d, the snapshot at %d", gid, fsm.AppliedIndex(), snap.Index)
	}
	st, err := openRaftStorage(w.log, gid, snap)
	if err != nil {
		return nil, err
	}
	rc := groupConfig(w.cfg.NodeID, st, snap.Index, w.cfg.Logger)
	rc.MaxUncommittedEntriesSize = uint64(w.cfg.MaxUncommittedBytes)
	rn, err := raft.NewRawNode(rc)
	if err != nil {
		return nil, fmt.Errorf("replication: group %d: %w", gid, err)
	}
	// ledAt starts at the open: LedWithin's quiet window is counted from
	// then, not taken as long past (a copy just opened has not heard from
	// its leader yet, and must not be dropped for that: reconcile.go).
	g := &Group{w: w, id: gid, rn: rn, st: st, fsm: fsm, seq: w.cfg.SeqBase, ledAt: w.ticks}
	g.setConf(snap.ConfState)
	g.appliedIdx.Store(snap.Index)
	g.commitIdx.Store(rn.BasicStatus().Commit)
	if v := snap.ConfState.Voters; len(v) == 1 && v[0] == w.cfg.NodeID && len(snap.ConfState.Learners) == 0 {
		if err := rn.Campaign(); err != nil {
			return nil, fmt.Errorf("replication: group %d: %w", gid, err)
		}
	}
	w.ids[gid] = g
	w.mark(g)
	return g, nil
}

// Recover opens group gid after a restart: its FSM restored from its
// latest snapshot in store (or, without one, a new FSM over newMachine()
// with the voters given), its storage and RawNode over the log, and then
// the one Compact segment requires after a restart, which also checks
// that every entry still holding a message is stored (segment.ErrCorrupt
// names the group otherwise). The entries after the snapshot are replayed
// by the following rounds, through sink (nil while replaying is usual;
// SetSink when caught up).
func (w *Worker) Recover(gid uint64, store *SnapStore, voters raftpb.ConfState, newMachine func() *queue.Machine, sink Sink) (*Group, error) {
	meta, data, ok, err := store.Load(gid)
	if err != nil {
		return nil, fmt.Errorf("replication: group %d: loading its snapshot: %w", gid, err)
	}
	var fsm *QueueFSM
	var install []segment.Entry
	if ok {
		if data, install, err = splitInstall(data); err != nil {
			return nil, fmt.Errorf("replication: group %d: %w", gid, err)
		}
		if fsm, err = RestoreQueueFSM(meta.Index, data, sink); err != nil {
			return nil, fmt.Errorf("replication: group %d: %w", gid, err)
		}
	} else {
		meta = raftpb.SnapshotMetadata{ConfState: voters}
		fsm = NewQueueFSM(newMachine(), 0, sink)
	}
	g, err := w.Open(gid, meta, fsm)
	if err != nil {
		return nil, err
	}
	if meta.Index > 0 {
		live := fsm.LiveEntries(nil, meta.Index)
		if install != nil {
			// A leader's snapshot: redo what a crash may have left undone
			// of its install (install.go), then the same check.
			err = completeInstall(w.log, gid, meta, live, install)
		} else {
			err = w.log.Compact(gid, meta.Index, live)
		}
		if err != nil {
			g.fail(err)
			delete(w.ids, gid)
			return nil, fmt.Errorf("replication: group %d: %w", gid, err)
		}
	}
	return g, nil
}

// ErrGroupRemoved: the group was removed (its queue deleted); it takes no
// more commands.
var ErrGroupRemoved = errors.New("replication: the group was removed (its queue was deleted)")

// Remove closes group g for good and then removes its snapshot from store
// (if store is not nil) and its log from segment (Log.RemoveGroup), for a
// deleted queue, after before (if not nil) returned nil: the caller's way
// to wait until the deletion itself is durable (the metadata entry), so a
// crash never leaves a queue whose log is gone. From the call on the group has no more rounds, ticks or
// snapshots, Add refuses with ErrGroupRemoved, what it buffered and did
// not propose is dropped (the caller answers those commands' requests:
// they will never be applied), a snapshot waiting to be compacted is
// abandoned (its done hears ErrGroupRemoved), and nothing it had
// proposed is applied any more. The removal waits until nothing of the
// group is in flight (a write with the appender, a snapshot being
// written or compacted), so nothing writes to the group after it, and
// runs on the pool (it syncs); done (optional) is then posted to the
// shard with its outcome. The group id may be opened again once done ran.
func (w *Worker) Remove(g *Group, store *SnapStore, before func() error, done func(error)) {
	if g.removed {
		return
	}
	g.removed = true
	if g.err == nil {
		g.err = ErrGroupRemoved
	}
	if w.ids[g.id] == g {
		delete(w.ids, g.id)
	}
	clear(g.full)
	g.full, g.enc, g.held = nil, EntryEncoder{}, nil
	g.handed, g.spent = nil, nil
	g.dropStaged()
	g.pendingHS, g.forceHS = raftpb.HardState{}, false
	if p := g.compactAfter; p != nil {
		g.compactAfter, g.snapping = nil, false
		p.done(p.meta, ErrGroupRemoved)
	}
	gid := g.id
	g.removing = func() {
		w.cfg.Pool.Go(func() {
			var err error
			if before != nil {
				err = before()
			}
			if err == nil && store != nil {
				err = store.Forget(gid)
			}
			if err == nil {
				err = w.log.RemoveGroup(gid)
			}
			if err != nil {
				err = fmt.Errorf("replication: removing group %d: %w", gid, err)
			}
			if done != nil {
				w.cfg.Post(func() { done(err) })
			}
		})
	}
	g.maybeRemove()
}

// maybeRemove starts a removed group's removal once nothing of it is in
// flight.
func (g *Group) maybeRemove() {
	if !g.removed || g.removing == nil || g.inflight || g.flights > 0 || g.snapping {
		return
	}
	f := g.removing
	g.removing = nil
	f()
}
