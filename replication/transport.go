package replication

import (
	"fmt"

	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
)

// Transport carries raft messages between the nodes of a cluster (design
// §6.1: framed TCP between nodes; replication/sim's seeded fake network in
// the simulation). A worker hands it each group's outgoing messages (m.To
// names the peer) through WorkerConfig.Send, on the shard goroutine: Send
// must not block, and may drop or delay messages (raft resends). On the
// receiving node the transport hands each message to the Worker that owns
// the group, with Worker.Step, on that worker's shard goroutine. Messages
// must not be shared between nodes: raft keeps slices of what it is given,
// so a transport marshals them (or copies them) on the way.
type Transport interface {
	Send(gid uint64, msgs []raftpb.Message)
}

// Step hands group gid a raft message from a peer (the transport's
// receiving side). The next Round handles what it caused. It fails for a
// group this worker does not have open and for a stopped group; the
// transport drops the message (a peer may still talk to a group deleted
// here, raft resends what mattered).
func (w *Worker) Step(gid uint64, m raftpb.Message) error {
	g := w.ids[gid]
	if g == nil {
		return fmt.Errorf("replication: a raft message for group %d, which is not open on this node", gid)
	}
	if g.err != nil {
		return g.err
	}
	if w.failed != nil {
		return ErrWorkerStopped
	}
	if m.Type == raftpb.MsgSnap {
		return fmt.Errorf("replication: group %d: a MsgSnap from %d without its data: snapshots come through StepSnapshot", gid, m.From)
	}
	switch {
	case m.Type == raftpb.MsgHeartbeat && m.Commit > g.st.last:
		g.commitPastLog(&m) // (raft would panic: lost.go)
	case m.Type == raftpb.MsgAppResp && m.Reject && g.leader && g.checkLost(m):
		return nil // (lost.go)
	}
	if err := g.rn.Step(m); err != nil {
		return fmt.Errorf("replication: group %d: %v from %d: %w", gid, m.Type, m.From, err)
	}
	if g.heard == nil {
		g.heard = map[uint64]uint64{}
	}
	g.heard[m.From] = w.ticks
	if m.Type == raftpb.MsgApp || m.Type == raftpb.MsgHeartbeat {
		g.ledAt = w.ticks
	}
	w.mark(g)
	return nil
}

// RaftTick advances the group's raft clock by one tick (design §3.7: every
// 100 ms; heartbeats every 2 ticks, elections after 10). A group whose only
// voter is this node needs none and takes none.
func (g *Group) RaftTick() {
	if g.err != nil || g.w.failed != nil {
		return
	}
	if v := g.conf.Voters; len(v) == 1 && v[0] == g.w.cfg.NodeID && len(g.conf.Learners) == 0 {
		return
	}
	g.rn.Tick()
	if g.rn.HasReady() {
		g.w.mark(g)
	}
}

// Status is raft's view of the group on this node: its state (leader,
// follower, candidate), term, the leader it knows, and its commit and
// applied indexes.
func (g *Group) Status() raft.BasicStatus { return g.rn.BasicStatus() }

// TransferLeadership asks the group's leader (this node) to hand
// leadership to voter to (design §6: before a graceful shutdown, and for
// balancing). The next rounds carry it out: the leader stops taking
// proposals while it brings to up to date, then tells it to campaign at
// once. It does nothing on a follower; raft abandons a transfer that has
// not finished within an election timeout.
func (g *Group) TransferLeadership(to uint64) {
	if g.err != nil || g.w.failed != nil {
		return
	}
	g.rn.TransferLeader(to)
	g.w.mark(g)
}

// RaftTick ticks every group with peers (RaftTick): call it every tick
// (100 ms in production) on the shard goroutine.
func (w *Worker) RaftTick() {
	w.ticks++
	for _, g := range w.ids {
		g.RaftTick()
	}
}

// Campaign makes this node stand for election in the group at once (the
// preferred leader of a new replicated group, design §6.2). With PreVote a
// node that cannot win (the others hear a leader) disrupts nothing.
func (g *Group) Campaign() error {
	if g.err != nil {
		return g.err
	}
	if err := g.rn.Campaign(); err != nil {
		return fmt.Errorf("replication: group %d: %w", g.id, err)
	}
	g.w.mark(g)
	return nil
}

// Lead is the group's leader as this node last heard (0: none known).
func (g *Group) Lead() uint64 { return g.lead }

// Indexes are the group's commit index as raft last reported it and the
// index its FSM has applied (snapshots included once applied entries
// follow). Safe for concurrent use (metrics, the admin API).
func (g *Group) Indexes() (commit, applied uint64) {
	return g.commitIdx.Load(), g.appliedIdx.Load()
}

// TransferToFollower asks the group's leader (this node) to hand
// leadership to its most caught-up voter heard from lately (design §6.6:
// before a graceful shutdown). It reports the voter chosen, or false on a
// follower or a group without another live voter.
func (g *Group) TransferToFollower() (uint64, bool) {
	if g.err != nil || g.w.failed != nil || !g.leader {
		return 0, false
	}
	var to, match uint64
	for id, pr := range g.rn.Status().Progress {
		if id == g.w.cfg.NodeID || pr.IsLearner {
			continue
		}
		// Heard from within an election timeout (as TransferToPreferred):
		// a voter that is down would take the whole shutdown deadline,
		// raft dropping proposals all the while.
		if h, ok := g.heard[id]; !ok || g.w.ticks-h > 10 {
			continue
		}
		if to == 0 || pr.Match > match || pr.Match == match && id < to {
			to, match = id, pr.Match
		}
	}
	if to == 0 {
		return 0, false
	}
	g.rn.TransferLeader(to)
	g.w.mark(g)
	return to, true
}

// TransferToPreferred asks the group's leader (this node) to hand
// leadership to voter to, its preferred leader (design §6.2, the leader
// balancer), if to is reachable and caught up (raft hears from it and it
// holds every committed entry). It reports whether it asked.
// (Group.heard: the worker's tick when each peer was last heard from.)
func (g *Group) TransferToPreferred(to uint64) bool {
	if g.err != nil || g.w.failed != nil || !g.leader || to == g.w.cfg.NodeID {
		return false
	}
	// Heard from within an election timeout (10 ticks): raft's own
	// RecentActive is cleared at every quorum check and may read false
	// on the tick the balancer runs.
	if h, ok := g.heard[to]; !ok || g.w.ticks-h > 10 {
		return false
	}
	st := g.rn.Status()
	pr, ok := st.Progress[to]
	if !ok || pr.IsLearner || pr.Match < st.Commit {
		return false
	}
	g.rn.TransferLeader(to)
	g.w.mark(g)
	return true
}
