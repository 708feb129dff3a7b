package replication

import (
	"go.etcd.io/raft/v3/raftpb"
)

// A copy that lost what it acknowledged. raft assumes a node never loses
// an entry it acknowledged: its leader's progress for it (Match) only
// grows, and the leader's heartbeat carries the commit index up to
// Match. A node whose copy of a group was deleted while a leader still
// counted it (the broker deletes a copy the metadata moved away only
// once no leader has sent it anything for a while, reconcile.go dropDue,
// but a partition can make a leader that counts it silent that long)
// and opened empty again (moved back) breaks that: the leader's
// heartbeat then names a commit past the new copy's log, on which raft
// panics (`tocommit(3) is out of range [lastIndex(0)]`), and the
// leader, which takes any rejection below Match for a stale one, would
// never send it the entries again.
//
// So, on the follower, a heartbeat of the follower's term whose commit
// is past this copy's log is stepped with its commit cut to the log (what
// the log holds stays uncommitted until the leader sends the entries
// again: nothing is applied on a leader's word for entries this copy does
// not have), and the leader is told with a rejection that names the
// heartbeat's commit in its Commit field (raft sets none on a
// MsgAppResp): one made here, and raft's own rejections in that term
// while the log is short of that commit (send). The leader, in that term, takes such a rejection for a lost
// copy (PeerLostLog, WorkerConfig.PeerLost) and steps it not: its owner
// takes the peer out of the group and adds it back as a new learner,
// whose progress starts at nothing, so the copy gets the log (or a
// snapshot) from the start as a replica moved to a new node does
// (broker/reconcile.go). The peer's other rejections are not stepped
// either until then: raft, which never probes below Match, would answer
// each with the same append at once, a storm. (A rejection alone is no
// proof: raft's own, delayed, may name a log end below Match and is
// stale.) A voter that lost what it acknowledged must not stay a voter
// anyway: its acknowledgement counted toward a commit.

// commitPastLog cuts a heartbeat's commit past this copy's log to the
// log, and tells the leader that this copy lacks entries it counts.
func (g *Group) commitPastLog(m *raftpb.Message) {
	if m.Term < g.rn.BasicStatus().Term {
		return // stale: raft drops it
	}
	last := g.st.last
	if g.lostTerm != m.Term {
		g.w.cfg.Logger.Warn("replication: the group's leader counts entries this copy does not have (it was deleted and opened again while the leader counted it); the leader is told to add it back as a new replica",
			"group", g.id, "leader", m.From, "commit", m.Commit, "last", last)
	}
	g.lostTerm, g.lostCommit = m.Term, m.Commit
	rej := raftpb.Message{Type: raftpb.MsgAppResp, To: m.From, From: g.w.cfg.NodeID, Term: m.Term,
		Index: m.Commit, Reject: true, RejectHint: last, Commit: m.Commit}
	m.Commit = last
	// Nothing may go out at a term not yet durable here (the heartbeat may
	// raise it): raft's own rejection, or the next heartbeat's, tells the
	// leader then.
	if g.st.hs.Term >= rej.Term && g.w.cfg.Send != nil {
		g.w.cfg.Send(g.id, []raftpb.Message{rej})
	}
}

// checkLost takes, on the leader, a rejecting MsgAppResp m: it reports
// whether m's sender lost entries it acknowledged (it said so, or said
// so before), which the leader then does not step.
func (g *Group) checkLost(m raftpb.Message) bool {
	if g.lost[m.From] {
		return true
	}
	if m.Commit == 0 || m.Term != g.rn.BasicStatus().Term {
		return false // raft's own
	}
	pr, ok := g.rn.Status().Progress[m.From]
	if !ok || pr.Match < m.Commit || m.RejectHint >= pr.Match {
		return false // (its progress was reset since)
	}
	if g.lost == nil {
		g.lost = map[uint64]bool{}
	}
	g.lost[m.From] = true
	g.w.cfg.Logger.Warn("replication: a replica lost entries it had acknowledged (its copy deleted and opened empty); it is taken out of the group and added back as a new replica",
		"group", g.id, "peer", m.From, "acknowledged", pr.Match, "its_last", m.RejectHint)
	if g.w.cfg.PeerLost != nil {
		g.w.cfg.PeerLost(g, m.From)
	}
	return true
}

// PeerLostLog reports whether this node leads the group and peer id lost
// entries it had acknowledged to it: it is to be taken out of the group
// (and added back as a new learner).
func (g *Group) PeerLostLog(id uint64) bool { return g.leader && g.lost[id] }

// forgetLost forgets the lost peers the configuration no longer has
// (applied a conf change): one added back starts from nothing.
func (g *Group) forgetLost() {
	for id := range g.lost {
		if !inConf(g.conf, id) {
			delete(g.lost, id)
		}
	}
}
