package replication

import (
	"errors"
	"fmt"
	"slices"

	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
)

type snapReport struct {
	to uint64
	ok bool
}

// StepSnapshot hands the group a snapshot its leader sent (the
// transport's receiving side, for a MsgSnap): staged and stepped by the
// loop; raft then installs it, or answers that it is not needed.
func (g *MetaGroup) StepSnapshot(s *SnapshotMessage) {
	if s.Msg.Type != raftpb.MsgSnap || s.Msg.Snapshot == nil {
		return
	}
	g.inMu.Lock()
	g.snapsIn = append(g.snapsIn, s)
	g.inMu.Unlock()
	g.Kick()
}

// sendSnapshot sends the latest snapshot for raft's MsgSnap m (the
// descriptor only): the image from the store, streamed by the transport,
// which reports back.
func (g *MetaGroup) sendSnapshot(m raftpb.Message) {
	report := func(ok bool) {
		g.inMu.Lock()
		g.reports = append(g.reports, snapReport{to: m.To, ok: ok})
		g.inMu.Unlock()
		g.Kick()
	}
	if g.cfg.SendSnapshot == nil {
		g.rn.ReportSnapshot(m.To, raft.SnapshotFailure)
		return
	}
	meta, data, ok, err := g.cfg.Snapshots.Load(MetaGroupID)
	if err != nil || !ok || meta.Index < m.Snapshot.Metadata.Index {
		g.cfg.Logger.Warn("metadata group: no snapshot to send", "to", m.To, "err", err)
		g.rn.ReportSnapshot(m.To, raft.SnapshotFailure)
		return
	}
	if !slices.Contains(meta.ConfState.Voters, m.To) && !slices.Contains(meta.ConfState.Learners, m.To) {
		// raft refuses a snapshot whose configuration lacks the node (one
		// taken before it joined): take a new one, and raft asks again.
		g.snapDue = true
		g.rn.ReportSnapshot(m.To, raft.SnapshotFailure)
		return
	}
	s := &SnapshotMessage{Msg: m, Data: data}
	s.Msg.Snapshot = &raftpb.Snapshot{Metadata: meta}
	g.cfg.Logger.Info("metadata group: sending a snapshot to a node behind the log", "to", m.To, "entry", meta.Index, "bytes", len(data))
	g.cfg.SendSnapshot(MetaGroupID, s, report)
}

// install makes the leader's snapshot raft took durable and restores the
// state machine and members from it: the log's divergent suffix cut, the
// snapshot stored (a restart recovers to it from here), the log
// compacted to it.
func (g *MetaGroup) install(snap raftpb.Snapshot) error {
	meta := snap.Metadata
	s := g.staged
	if s == nil || s.Msg.Snapshot.Metadata.Index != meta.Index || s.Msg.Snapshot.Metadata.Term != meta.Term {
		return fmt.Errorf("replication: metadata group: raft installs snapshot %d (term %d), which was never staged", meta.Index, meta.Term)
	}
	g.staged = nil
	m, fsm, ok, err := splitMetaImage(s.Data)
	if err == nil && !ok {
		err = errors.New("an image without its membership")
	}
	if err != nil {
		return fmt.Errorf("replication: metadata group: the leader's snapshot %d: %w", meta.Index, err)
	}
	if g.st.last > meta.Index {
		if err := g.log.Truncate(MetaGroupID, meta.Index+1); err != nil {
			return err
		}
	}
	if err := g.cfg.Snapshots.Put(MetaGroupID, meta, s.Data); err != nil {
		return err
	}
	if err := g.log.CompactAt(MetaGroupID, meta.Index, meta.Term, nil); err != nil {
		return err
	}
	g.st.installed(meta)
	g.cfg.Lock.Lock()
	err = g.cfg.Machine.Restore(meta.Index, fsm)
	if ma, ok := g.cfg.Machine.(interface{ SetMembers([]uint64) }); ok && err == nil {
		ma.SetMembers(m.IDs())
	}
	g.cfg.Lock.Unlock()
	if err != nil {
		return fmt.Errorf("replication: metadata group: restoring the leader's snapshot %d: %w", meta.Index, err)
	}
	g.members, g.conf, g.applied = m, cloneConf(meta.ConfState), meta.Index
	g.entrySince, g.bytesSince = 0, 0
	// This node's proposals made in the snapshot's term or before may be
	// in it: their fate is unknown here (one made later is not in it).
	g.commitTerm = max(g.commitTerm, meta.Term)
	g.cfg.Lock.Lock()
	g.inflight = slices.DeleteFunc(g.inflight, func(p metaProposal) bool {
		if p.term == 0 || p.term > meta.Term {
			return false
		}
		if g.cfg.Done != nil {
			for i := range p.cmds {
				if p.gone == nil || !p.gone[i] {
					g.cfg.Done(p.first+uint64(i), ErrMetaOutcomeUnknown)
				}
			}
		}
		return true
	})
	g.cfg.Lock.Unlock()
	g.resolved(0)
	g.setMembersLocked()
	g.cfg.Logger.Info("metadata group: installed the leader's snapshot", "entry", meta.Index, "term", meta.Term,
		"voters", meta.ConfState.Voters, "learners", meta.ConfState.Learners)
	if g.cfg.OnMembers != nil {
		g.cfg.OnMembers(g.members.Clone(), g.conf)
	}
	if slices.Contains(m.Removed, g.cfg.NodeID) {
		g.removed = true
		if g.cfg.OnRemoved != nil {
			g.cfg.OnRemoved()
		}
	}
	return nil
}

// snapshotAt stores data, the state after every entry up to at (one
// voter: the last written, all applied at add; several: the last
// applied), and compacts the log to it.
func (g *MetaGroup) snapshotAt(at uint64, data []byte) error {
	term, err := g.st.Term(at)
	if err != nil {
		return fmt.Errorf("replication: metadata group: term of entry %d: %w", at, err)
	}
	meta := raftpb.SnapshotMetadata{Index: at, Term: term, ConfState: raftpb.ConfState{Voters: g.voters()}}
	if g.multi {
		meta.ConfState = cloneConf(g.conf)
		data = wrapMetaImage(g.members, data)
	}
	if err := g.cfg.Snapshots.Put(MetaGroupID, meta, data); err != nil {
		return err
	}
	// segment compacts only below a commit index it has on disk: write the
	// commit raft has (commit-only hard states are written lazily).
	if hs := g.rn.BasicStatus().HardState; hs.Commit > g.st.hs.Commit {
		b, err := g.st.batch(nil, hs)
		if err != nil {
			return err
		}
		if err := g.log.Append(b); err != nil {
			return err
		}
		if err := g.st.appended(nil, hs); err != nil {
			return err
		}
	}
	if err := g.log.Compact(MetaGroupID, at, nil); err != nil {
		return err
	}
	if err := g.st.compacted(meta); err != nil {
		return err
	}
	g.entrySince, g.bytesSince = 0, 0
	return nil
}
