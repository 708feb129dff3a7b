package replication

import (
	"fmt"
	"slices"

	"go.etcd.io/raft/v3/raftpb"
)

// Moving a queue group's replicas (design/replication.md §6.7): its leader
// changes the group's configuration one step at a time toward the set the
// metadata group wants (broker/reconcile.go decides the steps). These are
// the group's parts of it.
//
// Every replica opens the group, when it has no copy of its own, in the
// configuration the group started with (its first voters): what the log
// from entry 1 changes is then applied to the configuration it was
// written against, whether the new replica is sent the log or a snapshot.
// A snapshot taken before the replica was added is not sent to it (raft
// would refuse one whose configuration lacks the node): a new one is
// taken, and raft asks again (sendSnapshot).

// setConf sets the group's configuration (worker-owned).
func (g *Group) setConf(c raftpb.ConfState) {
	g.conf = c
	v := slices.Clone(c.Voters)
	g.shownVoters.Store(&v)
}

// Voters is the group's voters as this node applied them last; safe to
// call anywhere (the admin API's raft_voters).
func (g *Group) Voters() []uint64 {
	if v := g.shownVoters.Load(); v != nil {
		return *v
	}
	return nil
}

// Conf is the group's configuration as this node last applied it: its
// voters, learners and, while joint, the outgoing voters.
func (g *Group) Conf() raftpb.ConfState {
	c := g.conf
	return raftpb.ConfState{Voters: slices.Clone(c.Voters), Learners: slices.Clone(c.Learners),
		VotersOutgoing: slices.Clone(c.VotersOutgoing), LearnersNext: slices.Clone(c.LearnersNext), AutoLeave: c.AutoLeave}
}

// ProposeConf proposes a change of the group's configuration (the leader
// only). raft takes one at a time: a change proposed while another is
// neither applied nor abandoned is dropped (an empty entry), so the
// caller proposes the next one once Conf shows the last. A change of
// several steps enters a joint configuration that raft leaves on its own
// (the leader proposes the leaving entry once the first is applied).
func (g *Group) ProposeConf(cc raftpb.ConfChangeV2) error {
	if g.err != nil {
		return g.err
	}
	if g.w.failed != nil {
		return ErrWorkerStopped
	}
	if !g.leader {
		return ErrNotLeader
	}
	if err := g.rn.ProposeConfChange(cc); err != nil {
		return fmt.Errorf("replication: group %d: %w", g.id, err)
	}
	g.w.mark(g)
	return nil
}

// PeerCaughtUp reports whether node id holds the group's log up to its
// commit index less lag entries and was heard from within an election
// timeout (the leader's view; false on a follower).
func (g *Group) PeerCaughtUp(id, lag uint64) bool {
	if !g.leader {
		return false
	}
	if h, ok := g.heard[id]; !ok || g.w.ticks-h > 10 {
		return false
	}
	st := g.rn.Status()
	pr, ok := st.Progress[id]
	return ok && pr.Match+lag >= st.Commit
}

// inConf reports whether node id is in configuration c.
func inConf(c raftpb.ConfState, id uint64) bool {
	return slices.Contains(c.Voters, id) || slices.Contains(c.Learners, id) ||
		slices.Contains(c.VotersOutgoing, id) || slices.Contains(c.LearnersNext, id)
}

// Member reports whether this node is in the group's configuration as it
// last applied it (a voter, a learner, or joint).
func (g *Group) Member() bool { return inConf(g.conf, g.w.cfg.NodeID) }

// LedWithin reports whether a leader sent the group an append, a
// heartbeat or a snapshot within the last ticks raft ticks, or the group
// opened within them: a node a leader still counts as a member hears one
// every heartbeat.
func (g *Group) LedWithin(ticks uint64) bool {
	return g.leader || g.w.ticks-g.ledAt <= ticks
}
