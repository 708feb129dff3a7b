package broker

import (
	"slices"

	"github.com/warren-mq/warren/replication"
	"github.com/warren-mq/warren/wire"

	"go.etcd.io/raft/v3/raftpb"
)

// Moving replicas, the queue half (design replication.md §6.7; the
// metadata half is moves.go). When the metadata group gives a replicated
// queue a target, every node hears it (EffQueueReplicas): a node in the
// target without a copy opens the group in the configuration it started
// with (firstConf) and gets the log, or the leader's snapshot, as any
// follower behind does; the group's leader changes the group's
// configuration toward the target one step at a time, on its shard's
// raft ticks:
//
//  1. a learner the target does not want is removed;
//  2. a learner that has caught up (it holds the log to within
//     moveLagEntries of the commit index) becomes a voter, and in the
//     same change (joint consensus, left by raft on its own) a voter the
//     target does not want is removed;
//  3. a target node not in the group is added as a learner;
//  4. a voter the target does not want is removed; if that is the leader
//     itself, it first hands its leadership to a caught-up voter the
//     target wants;
//  5. once the voters are the target, the leader reports it to the
//     metadata group (MetaReplicasMoved), which makes the target the
//     queue's replicas. A node then no longer holding a replica closes
//     the group and deletes its copy (its log and snapshot) once no
//     leader has sent it anything for dropQuietTicks (dropDue: a copy
//     deleted while a leader still counts what it acknowledged, were it
//     added back, would get a commit index past its log).
//
// A member that lost what it acknowledged (its copy deleted and opened
// empty while this leader counted it: replication/lost.go) is first
// taken out of the group; step 3 then adds it back as a new learner.
//
// A change proposed and not seen applied within moveRetryTicks (lost with
// a change of leader, or dropped by raft) is proposed again, as is a
// report the metadata group has not applied. At most one step is in
// flight per queue: raft takes one configuration change at a time.

const (
	// moveLagEntries: a learner this close to the commit index is caught
	// up (it gets the rest as any follower does).
	moveLagEntries = 64
	// moveRetryTicks: a step not seen done after this many ticks (5 s at
	// the production tick) is taken again.
	moveRetryTicks = 50
)

// shardMoves are the replicated queues of a shard with a move pending.
type shardMoves struct {
	ticks  uint64 // the shard's raft ticks (the moves' clock)
	queues map[*Queue]struct{}
	// failed: queues whose copy here did not open, whose rebuild this
	// node asks for (rebuild.go)
	failed map[*Queue]uint64 // → the tick it last asked
}

// failedOpen notes that q's copy here did not open.
func (m *shardMoves) failedOpen(q *Queue) {
	if m.failed == nil {
		m.failed = map[*Queue]uint64{}
	}
	m.failed[q] = 0
}

// moveState is a queue's leader's memory of its last step.
type moveState struct {
	at       uint64           // the tick it was taken (0: none yet)
	conf     raftpb.ConfState // the configuration it was taken in
	reported uint64           // the tick MetaReplicasMoved was last proposed
	drop     bool             // this node's copy is to go (placementChanged, dropDue)
}

// track notes whether q has a move pending.
func (m *shardMoves) track(q *Queue) {
	if q.grp == nil || q.gone || q.target == nil && !q.move.drop && len(q.rebuild) == 0 && !(q.leading && !slices.Equal(q.grp.Conf().Voters, q.replicas)) && lostPeer(q) == 0 {
		delete(m.queues, q)
		return
	}
	if m.queues == nil {
		m.queues = map[*Queue]struct{}{}
	}
	m.queues[q] = struct{}{}
}

// holdsReplica reports whether node holds (or is to hold) a replica of q.
func (q *Queue) holdsReplica(node uint64) bool {
	return slices.Contains(q.replicas, node) || slices.Contains(q.target, node)
}

// firstConf is the configuration a node opens q's group in when it has
// no copy of it: the group's first voters, for a replica moved here too.
// The log from entry 1 (or a snapshot, which carries its own) then takes
// it to the group's configuration now, as it took every first replica. A
// replica moved here is none of the first voters, or was removed from
// the group before its copy was deleted: it is no voter until the leader
// promotes it, caught up.
func (q *Queue) firstConf() raftpb.ConfState {
	if q.origin != nil {
		return raftpb.ConfState{Voters: q.origin}
	}
	return raftpb.ConfState{Voters: q.replicas}
}

// replicasChangedLocked hands a queue's new placement to its shard (mu
// held: an EffQueueReplicas).
func (t *topology) replicasChangedLocked(mq *MetaQueue) {
	q := t.queues[mq.ID]
	if q == nil {
		return
	}
	replicas := mq.Replicas
	q.shownReplicas.Store(&replicas)
	p := *mq
	q.shard.submit(Command{Kind: cmdPost, post: func() { q.shard.placementChanged(q, &p) }})
}

// placementChanged takes q's new placement on its shard: a copy opened
// here if this node is to hold one, dropped if it no longer does.
func (s *shard) placementChanged(q *Queue, mq *MetaQueue) {
	if q.gone || !q.inCluster {
		return
	}
	me := s.nodeID()
	wasRebuilt := slices.Contains(q.rebuild, me)
	q.replicas, q.target, q.origin, q.prefLeader, q.rebuild = mq.Replicas, mq.Target, mq.Origin, mq.Leader, mq.Rebuild
	if wasRebuilt && !slices.Contains(q.rebuild, me) && q.grp == nil && q.holdsReplica(me) {
		// The leader took the damaged copy out of the group: it goes,
		// and the group opens new here, as a replica moved here does.
		s.rebuildFresh(q)
		return
	}
	switch {
	case q.holdsReplica(me) && q.grp == nil && q.remote:
		s.b.log.Info("replicated queue: a replica moves to this node; it catches up from the leader", queueLog(q.name), "target", q.target)
		q.remote = false
		s.openReplicated(q)
	}
	// Its copy goes once the move is done (moveTick, dropDue).
	q.move.drop = !q.holdsReplica(me) && q.grp != nil && q.target == nil
	s.moves.track(q)
}

// dropQuietTicks: a replica the metadata moved away is deleted once no
// leader has sent it anything for this many ticks (3 election timeouts).
const dropQuietTicks = 30

// dropDue reports whether this node's copy of q, which the metadata moved
// away, may go now: not while a leader of the group still counts it. The
// metadata says a move is done once the reporting leader's configuration
// had this node no more, but this node may read that late (a restart
// replays its metadata log) while a leader has since added it back, or
// another leader has not applied its removal yet; and the configuration
// this node applied is no better a witness: it may have applied its
// removal and not yet the entry that added it back, while the leader
// already counts the entries it acknowledged after that removal (CI's
// `tocommit(3) is out of range [lastIndex(0)]`: the copy was deleted
// then, opened empty once the metadata caught up, and raft panicked on
// the leader's next heartbeat; replication.TestCopyDeletedWhileCounted).
// So the copy goes only once no leader has sent it anything for
// dropQuietTicks: a leader that counts a node sends it a heartbeat every
// two ticks. A leader that counts it and was cut off from it that long
// (a partition) no longer breaks raft either: the empty copy tells it,
// and it takes the node out and adds it back new (replication/lost.go,
// reconcile).
func (s *shard) dropDue(q *Queue) bool {
	return !q.grp.LedWithin(dropQuietTicks)
}

// lostPeer is a member of q's group, as its leader here sees it, that lost
// entries it had acknowledged (0: none): it is taken out of the group and
// added back as a new learner (replication/lost.go).
func lostPeer(q *Queue) uint64 {
	g := q.grp
	if g == nil || !q.leading {
		return 0
	}
	c := g.Conf()
	for _, set := range [][]uint64{c.Voters, c.Learners, c.VotersOutgoing, c.LearnersNext} {
		for _, n := range set {
			if g.PeerLostLog(n) {
				return n
			}
		}
	}
	return 0
}

// peerLost is the worker's PeerLost: q's leader here found that peer lost
// what it acknowledged; reconcile takes it out and adds it back.
func (s *shard) peerLost(g *replication.Group, peer uint64) {
	if q := s.byGroup[g.ID()]; q != nil && q.grp == g {
		s.moves.track(q)
	}
}

// dropReplica closes this node's copy of q, which the metadata moved to
// other nodes, and deletes it: q is then served as a queue with no
// replica here (forwarded to its leader).
func (s *shard) dropReplica(q *Queue) {
	g := q.grp
	gid := g.ID()
	if q.leading { // (a leader hands its leadership on before it leaves: rare)
		q.leading = false
		s.stepDown(q)
		s.fwdLeaderChanged(q, 0)
	}
	s.failDurable(q)
	s.timers.remove(q)
	s.conns.forget(q)
	delete(s.byGroup, gid)
	delete(s.moves.queues, q)
	q.move = moveState{}
	q.bodies.each(func(_ uint64, m *StoredMsg) { s.release(m) })
	q.bodies = bodyStore{}
	s.releaseHeld(q)
	q.grp, q.m, q.cons, q.replicated, q.leading = nil, nil, nil, false, false
	q.group.Store(nil)
	q.remote, q.opened = true, true
	q.ready.Store(0)
	q.unacked.Store(0)
	q.consumers.Store(0)
	s.removing++
	s.b.log.Info("replicated queue: this node's replica moved to other nodes; deleting it", queueLog(q.name), "replicas", q.replicas)
	s.rw.Remove(g, s.b.cfg.Durable.Snapshots, nil, func(err error) {
		s.removing--
		delete(s.openedGrps, gid)
		if err != nil {
			s.b.log.Error("replicated queue: the replica moved away was not deleted now; the next start deletes it", queueLog(q.name), "group", gid, "err", err)
		}
		s.checkRemovals()
		if !q.gone && q.grp == nil && q.holdsReplica(s.nodeID()) {
			// Moved back here meanwhile.
			q.remote = false
			s.openReplicated(q)
		}
	})
}

// moveTick runs the moves of the queues this node leads (the shard's raft
// tick).
func (s *shard) moveTick() {
	s.moves.ticks++
	for q, at := range s.moves.failed {
		s.askRebuild(q, at)
	}
	for q := range s.moves.queues {
		switch {
		case q.gone || q.grp == nil:
			delete(s.moves.queues, q)
		case q.move.drop:
			if s.dropDue(q) {
				s.dropReplica(q)
			}
		case q.leading:
			s.reconcile(q)
		}
	}
}

// reconcile takes the next step of q's move, as its group's leader.
func (s *shard) reconcile(q *Queue) {
	g, mv, now := q.grp, &q.move, s.moves.ticks
	target := q.target
	if target == nil {
		target = q.replicas
	}
	if len(q.rebuild) > 0 {
		// Copies being rebuilt leave the group first (rebuild.go).
		target = slices.DeleteFunc(slices.Clone(target), func(n uint64) bool { return slices.Contains(q.rebuild, n) })
	}
	conf := g.Conf()
	if len(conf.VotersOutgoing) > 0 {
		return // joint: raft leaves it on its own
	}
	if mv.at != 0 && now-mv.at < moveRetryTicks && sameConf(conf, mv.conf) {
		return // the last step is in flight
	}
	me := s.nodeID()
	step := func(what string, node uint64, cc ...raftpb.ConfChangeSingle) {
		if err := g.ProposeConf(raftpb.ConfChangeV2{Changes: cc}); err != nil {
			s.b.log.Warn("replicated queue: a replica move not proposed", queueLog(q.name), "step", what, "node", node, "err", err)
			return
		}
		mv.at, mv.conf = now, conf
		s.b.log.Info("replicated queue: moving replicas", queueLog(q.name), "step", what, "node", node, "voters", conf.Voters, "learners", conf.Learners, "target", target)
	}
	if n := lostPeer(q); n != 0 && n != me {
		// It lost what it acknowledged: out, then back as a new learner
		// (below, in a later step), whose progress starts from nothing.
		step("remove a replica that lost its log", n, raftpb.ConfChangeSingle{Type: raftpb.ConfChangeRemoveNode, NodeID: n})
		return
	}
	for _, l := range conf.Learners {
		if !slices.Contains(target, l) {
			step("remove learner", l, raftpb.ConfChangeSingle{Type: raftpb.ConfChangeRemoveNode, NodeID: l})
			return
		}
	}
	for _, l := range conf.Learners {
		if !g.PeerCaughtUp(l, moveLagEntries) {
			return // it catches up first
		}
		cc := []raftpb.ConfChangeSingle{{Type: raftpb.ConfChangeAddNode, NodeID: l}}
		for _, v := range conf.Voters {
			if !slices.Contains(target, v) && v != me {
				cc = append(cc, raftpb.ConfChangeSingle{Type: raftpb.ConfChangeRemoveNode, NodeID: v})
				break
			}
		}
		step("promote", l, cc...)
		return
	}
	for _, n := range target {
		if !slices.Contains(conf.Voters, n) {
			step("add learner", n, raftpb.ConfChangeSingle{Type: raftpb.ConfChangeAddLearnerNode, NodeID: n})
			return
		}
	}
	for _, v := range conf.Voters {
		if slices.Contains(target, v) {
			continue
		}
		if v != me {
			step("remove voter", v, raftpb.ConfChangeSingle{Type: raftpb.ConfChangeRemoveNode, NodeID: v})
			return
		}
		// This node leaves the group: its leadership goes first, to a
		// voter the target wants (it then takes the step).
		for _, n := range target {
			if g.TransferToPreferred(n) {
				mv.at, mv.conf = now, conf
				s.b.log.Info("replicated queue: handing its leadership on before leaving the group", queueLog(q.name), "to", n)
				return
			}
		}
		return
	}
	// The voters are the target.
	switch {
	case len(q.rebuild) > 0:
		if mv.reported == 0 || now-mv.reported >= moveRetryTicks {
			mv.reported = now
			for _, n := range q.rebuild {
				s.b.topo.reportReplica(q, MetaRebuildDone, n)
			}
		}
	case q.target != nil:
		if mv.reported == 0 || now-mv.reported >= moveRetryTicks {
			mv.reported = now
			s.b.topo.reportMoved(q, slices.Clone(target))
		}
	default:
		delete(s.moves.queues, q) // settled
	}
}

// reportMoved proposes MetaReplicasMoved for q without waiting (a shard
// asks): every node applies it in log order.
func (t *topology) reportMoved(q *Queue, voters []uint64) {
	cl := t.cl.Load()
	if cl == nil || cl.removed.Load() {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	t.proposeLocked(cl, replicasMovedCommand(q.name, uint64(q.id), voters))
}

// reportReplica proposes a rebuild command (MetaRebuildReplica or
// MetaRebuildDone) of node's copy of q without waiting.
func (t *topology) reportReplica(q *Queue, op MetaOp, node uint64) {
	cl := t.cl.Load()
	if cl == nil || cl.removed.Load() {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	t.proposeLocked(cl, MetaCommand{Op: op, Queue: wire.QueueDeclare{Name: q.name}, QueueID: uint64(q.id), Replicas: []uint64{node}})
}

// proposeLocked adds c to the metadata group's next proposal (mu held).
func (t *topology) proposeLocked(cl *metaCluster, c MetaCommand) {
	c.NowMs = t.now()
	t.mbuf = AppendMetaCommand(t.mbuf[:0], &c)
	cl.g.Add(t.mbuf)
	cl.g.Kick()
}

func sameConf(a, b raftpb.ConfState) bool {
	return slices.Equal(a.Voters, b.Voters) && slices.Equal(a.Learners, b.Learners) && slices.Equal(a.VotersOutgoing, b.VotersOutgoing)
}
