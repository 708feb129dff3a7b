package replication

import (
	"fmt"
	"time"

	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
)

// Step hands the group a raft message from a peer (several voters; the
// transport's reader). Safe for concurrent use; the loop steps it.
func (g *MetaGroup) Step(m raftpb.Message) {
	g.inMu.Lock()
	g.inbox = append(g.inbox, m)
	g.inMu.Unlock()
	g.Kick()
}

// Tick advances the group's raft clock by one tick (several voters:
// every 100 ms). Safe for concurrent use.
func (g *MetaGroup) Tick() {
	if !g.multi {
		return
	}
	g.inMu.Lock()
	g.ticks++
	g.inMu.Unlock()
	g.Kick()
}

// Voters is how many voters the group has.
func (g *MetaGroup) Voters() int {
	if !g.multi {
		return 1
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	return len(g.view.conf.Voters)
}

// HeardAt is when the loop last stepped a raft message from node (a
// heartbeat's answer, a vote, an append): the zero time if never since
// this node started. On the leader, a live peer is heard every heartbeat
// (a node's liveness, as broker's homes judge it).
func (g *MetaGroup) HeardAt(node uint64) time.Time {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.heardAt[node]
}

// Status is raft's view of the group as of the loop's last round.
func (g *MetaGroup) Status() raft.BasicStatus {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.status
}

// roundMulti is round for several voters: step what peers sent and the
// ticks, propose what was added (once a leader is known: raft forwards a
// follower's proposal to it) and, on the leader, the membership changes
// and transfers asked for, then drive.
func (g *MetaGroup) roundMulti() error {
	g.inMu.Lock()
	msgs, ticks, reqs, transfers, snaps, reports, gaveUp := g.inbox, g.ticks, g.reqs, g.transfers, g.snapsIn, g.reports, g.gaveUp
	g.inbox, g.ticks, g.reqs, g.transfers, g.snapsIn, g.reports, g.gaveUp = nil, 0, nil, nil, nil, nil, nil
	g.inMu.Unlock()
	for range ticks {
		g.rn.Tick()
	}
	g.clock += uint64(ticks)
	for _, r := range reports {
		st := raft.SnapshotFinish
		if !r.ok {
			st = raft.SnapshotFailure
		}
		g.rn.ReportSnapshot(r.to, st)
	}
	if len(msgs) > 0 {
		now := time.Now()
		g.mu.Lock()
		if g.heardAt == nil {
			g.heardAt = map[uint64]time.Time{}
		}
		for _, m := range msgs {
			g.heardAt[m.From] = now
		}
		g.mu.Unlock()
	}
	for _, m := range msgs {
		if g.heard == nil {
			g.heard = map[uint64]uint64{}
		}
		g.heard[m.From] = g.clock
		if err := g.rn.Step(m); err != nil {
			g.cfg.Logger.Debug("replication: metadata group: a peer's message refused", "type", m.Type, "from", m.From, "err", err)
		}
	}
	for _, sm := range snaps {
		if g.staged == nil || g.staged.Msg.Snapshot.Metadata.Index <= sm.Msg.Snapshot.Metadata.Index {
			g.staged = sm
		}
		if err := g.rn.Step(sm.Msg); err != nil {
			g.cfg.Logger.Debug("replication: metadata group: a snapshot refused", "from", sm.Msg.From, "err", err)
		}
	}
	// Collected even with no leader known, so that a request giving up
	// meanwhile (Abandon) finds its command, and it is never proposed.
	g.cfg.Lock.Lock()
	cmds := g.pending
	g.pending = nil
	seq := g.added.Load()
	g.cfg.Lock.Unlock()
	if len(cmds) > 0 {
		first := seq - uint64(len(cmds)) + 1
		for _, run := range metaChunks(cmds) { // an entry each
			g.inflight = append(g.inflight, metaProposal{first: first, cmds: run})
			first += uint64(len(run))
		}
		g.collected = seq
	}
	if len(gaveUp) > 0 {
		g.giveUp(gaveUp)
	}
	if len(cmds) > 0 || len(gaveUp) > 0 {
		g.publishOpen()
	}
	bs := g.rn.BasicStatus()
	if bs.Lead != raft.None {
		g.proposeLost(bs.Term)
	}
	leader := bs.RaftState == raft.StateLeader
	for _, r := range reqs {
		g.proposeChange(r, leader)
	}
	for _, t := range transfers {
		t.done <- g.transfer(t.to, leader)
	}
	if leader && len(g.conf.Learners) > 0 && len(g.conf.Voters) < MaxMetaVoters && g.confFree() {
		g.promoteCaughtUp()
	}
	if err := g.driveMulti(); err != nil {
		return err
	}
	st := g.rn.BasicStatus()
	g.mu.Lock()
	if st.Lead != g.status.Lead {
		close(g.leadCh)
		g.leadCh = make(chan struct{})
	}
	g.status = st
	g.mu.Unlock()
	if st.RaftState != raft.StateLeader && len(g.changeW) > 0 {
		for seq, r := range g.changeW {
			r.done <- fmt.Errorf("%w: this node lost the leadership before the change was applied; it may still be applied", ErrNotMetaLeader)
			delete(g.changeW, seq)
		}
	}
	if g.removed {
		return ErrRemoved
	}
	// The first snapshot comes as soon as anything is applied: it keeps
	// the configuration and members, and with the log compacted past
	// entry 1 a node that joins gets the snapshot (never the log from
	// its start, whose first configuration is in no entry).
	if g.entrySince >= g.cfg.SnapshotEntries || g.bytesSince >= metaSnapBytes || (g.st.snap.Index == 0 && g.applied > 0) ||
		(g.snapDue && g.applied > g.st.snap.Index) {
		g.snapDue = false
		g.cfg.Lock.Lock()
		snap := g.cfg.Snapshot()
		g.cfg.Lock.Unlock()
		return g.snapshotAt(g.applied, snap)
	}
	return nil
}

// driveMulti handles Readys until raft has none: installs a leader's
// snapshot, writes the entries and hard state (one Append each,
// synchronous), then sends the messages (after the write: nothing goes
// out that the disk does not have yet; a snapshot raft wants sent is
// loaded and streamed), then applies the committed entries through
// Machine under Lock (conf changes through applyConf), tells Done of
// this node's commands, and moves the waiters' seq past them.
func (g *MetaGroup) driveMulti() error {
	for g.rn.HasReady() {
		rd := g.rn.Ready()
		if rd.SoftState != nil {
			if lead := rd.SoftState.RaftState == raft.StateLeader; lead && !g.leading {
				g.leadFrom = max(g.st.last, g.applied)
			}
			g.leading = rd.SoftState.RaftState == raft.StateLeader
		}
		if !raft.IsEmptySnap(rd.Snapshot) {
			if err := g.install(rd.Snapshot); err != nil {
				return err
			}
		}
		if len(rd.Entries) > 0 || rd.MustSync {
			b, err := g.st.batch(rd.Entries, rd.HardState)
			if err != nil {
				return err
			}
			if err := g.log.Append(b); err != nil {
				return err
			}
			if err := g.st.appended(rd.Entries, rd.HardState); err != nil {
				return err
			}
		}
		for _, e := range rd.Entries {
			g.entrySince++
			g.bytesSince += len(e.Data)
			if e.Type == raftpb.EntryConfChange {
				g.confIndex = max(g.confIndex, e.Index)
			}
		}
		if len(rd.Messages) > 0 {
			msgs := rd.Messages[:0:0]
			for _, m := range rd.Messages {
				if m.Type == raftpb.MsgSnap {
					g.sendSnapshot(m)
					continue
				}
				msgs = append(msgs, m)
			}
			if len(msgs) > 0 {
				g.cfg.Send(MetaGroupID, msgs)
			}
		}
		if len(rd.CommittedEntries) > 0 {
			for _, e := range rd.CommittedEntries {
				g.commitTerm = max(g.commitTerm, e.Term)
				if e.Type == raftpb.EntryConfChange {
					g.applyConf(e)
					g.applied = e.Index
					continue
				}
				if e.Type != raftpb.EntryNormal || len(e.Data) == 0 {
					continue
				}
				node, epoch, seq, term := metaOrigin(e.Data)
				if term != 0 && term != e.Term {
					// Proposed in another term (a forwarded proposal raft
					// appended late): it counts as nothing; its origin
					// proposes it again once it knows it lost.
					g.cfg.Logger.Debug("metadata group: an entry proposed in another term applied as nothing",
						"entry", e.Index, "term", e.Term, "proposed in", term, "node", node)
					continue
				}
				mine := node == g.cfg.NodeID && epoch == g.epoch
				first := seq
				g.cfg.Lock.Lock()
				err := eachMetaCommand(e.Data, func(cmd []byte) error {
					res, err := g.cfg.Machine.Apply(e.Index, cmd)
					if err == nil && mine {
						if g.cfg.Done != nil {
							g.cfg.Done(seq, res)
						}
						seq++
					}
					return err
				})
				g.cfg.Lock.Unlock()
				if err != nil {
					return fmt.Errorf("replication: metadata group: entry %d: %w", e.Index, err)
				}
				if mine {
					g.resolved(first)
				}
			}
			last := rd.CommittedEntries[len(rd.CommittedEntries)-1].Index
			g.st.applied(last)
			g.applied = last
			g.resolved(0)
		}
		g.rn.Advance(rd)
	}
	return nil
}
