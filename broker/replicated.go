package broker

import (
	"context"
	"errors"
	"maps"
	"slices"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/warren-mq/warren/queue"
	"github.com/warren-mq/warren/replication"
	"github.com/warren-mq/warren/wire"
	"go.etcd.io/raft/v3/raftpb"
)

// Replicated durable queues (issue 14, design replication.md §6.2): in a
// cluster (DurableConfig.NodeID set) a durable, non-exclusive queue is a
// raft group whose voters are its replicas, as the metadata group placed
// them. Every replica opens the group from the same metadata entry (a new
// group: no log, ConfState{Voters: replicas}); the preferred leader
// campaigns at once. Raft messages travel over the cluster transport,
// routed by group id (Broker.StepRaft), and every shard ticks its groups
// with the metadata group's ticker.
//
// Only the node leading a queue serves it: publishes, consumers, purges.
// Elsewhere a publish to it is forwarded to the leader (forward.go), and
// so are consumers, gets and purges (forward_consume.go). A persistent
// publish is confirmed once its entry is applied here, so committed on a
// majority of the replicas. Followers apply every entry (their state is
// the leader's) and carry out no effect that leaves the queue: no
// deliveries, no dead letters, no deletion on expiry.
//
// On becoming leader a node proposes a Down for every owner the queue's
// state holds: only the leader has consumers, and it had none before it
// led, so each belongs to a connection of an earlier leader (or an
// earlier incarnation); what they held becomes ready again, redelivered.
// On losing leadership it nacks the publishes still waiting for an apply
// (they may or may not be in the log: at-least-once, the publisher
// resends; a forwarded part is answered "resend to the new leader"
// instead, which applies it at most once: forward_enqueue.go), refuses the waiting subscribes and purges, and cancels its
// consumers of the queue (their unacked deliveries return to the queue
// through the next leader's Down).

// clustered reports whether durable queues are replicated groups.
func (s *shard) clustered() bool { return s.b.cfg.Durable != nil && s.b.cfg.Durable.NodeID != 0 }

// nodeID is this node's id (1 outside a cluster).
func (s *shard) nodeID() uint64 {
	if s.clustered() {
		return s.b.cfg.Durable.NodeID
	}
	return 1
}

// proposer is what this shard's entries carry as their proposer
// (replication.EntryHeader.Proposer).
func (s *shard) proposer() uint64 { return s.nodeID()<<48 | uint64(s.idx) }

// leads reports whether this node serves q: always for a queue that is
// not a replicated group, else while it leads the group.
func (q *Queue) leads() bool { return q.grp == nil || !q.replicated || q.grp.Leader() }

// notHere is the refusal of a request for a replicated queue this node
// does not lead and does not forward (a peek, a conditional delete), or
// cannot forward now (no leader known).
func (q *Queue) notHere() (wire.Code, string) {
	if q.home != 0 {
		return wire.PreconditionFailed, "queue " + strconv.Quote(LocalName(q.name)) + ": it lives on node " + strconv.FormatUint(q.home, 10) +
			" (a non-durable or exclusive queue has one copy, on the node it was declared on); connect to that node"
	}
	lead := "no leader is known yet: retry shortly"
	if l := q.lead.Load(); l != 0 {
		lead = "connect to node " + strconv.FormatUint(l, 10) + ", which leads it"
	}
	what := "this node does not lead it"
	if q.remote {
		what = "this node holds no replica of it"
	}
	return wire.PreconditionFailed, "queue " + strconv.Quote(LocalName(q.name)) + ": " + what + "; " + lead
}

// openReplicated opens q's group in a cluster: with its replicas as the
// voters when new. A node that is not a replica opens nothing (remote).
// It reports whether it handled q (false: not a cluster).
func (s *shard) openReplicated(q *Queue) (handled bool) {
	if !s.clustered() {
		return false
	}
	dc := s.b.cfg.Durable
	if !q.holdsReplica(dc.NodeID) {
		q.remote, q.opened = true, true
		q.lead.Store(q.prefLeader)
		return true
	}
	if slices.Contains(q.rebuild, dc.NodeID) {
		// Its copy here is damaged and being rebuilt: it opens once the
		// leader has taken it out of the group (reconcile.go).
		msg := "this node's copy is being rebuilt from the other replicas"
		if e := q.replicaErr.Load(); e != nil {
			msg = *e + " (" + msg + ")"
		}
		q.replicaErr.Store(&msg)
		q.remote, q.opened = false, true
		return true
	}
	if s.openedGrps != nil {
		if _, busy := s.openedGrps[queueGroup(q.id)]; busy {
			// A copy this node dropped is still being removed: opened
			// once that is done (reconcile.go).
			q.remote, q.opened = true, true
			return true
		}
	}
	q.remote = false
	gid := queueGroup(q.id)
	if s.openedGrps == nil {
		s.openedGrps = map[uint64]struct{}{}
	}
	s.openedGrps[gid] = struct{}{}
	cfg := queue.ConfigFromArgs(q.args, q.autoDelete)
	cfg.HoldDeadLetters = true
	now := s.now
	replayTo := dc.Log.LastIndex(gid)
	sink := func(a *replication.Applied) { s.applied(q, a) }
	var g *replication.Group
	var err error
	if d, bad := dc.Log.Quarantined(gid); bad {
		// Its data here is damaged (segment quarantine): never opened short
		// of what it acknowledged; rebuilt from the other replicas.
		err = errors.New(damagedQueueMsg(q, d))
		s.b.log.Error("replicated queue refused on this node: its data here is damaged; it serves nothing of it, and it is rebuilt from the other replicas, which serve the queue",
			queueLog(q.name), "group", gid, "file", d.File, "offset", d.Offset, "damage", d.Why)
	} else {
		g, err = s.rw.Recover(gid, dc.Snapshots, q.firstConf(), func() *queue.Machine { return queue.New(cfg, now) }, sink)
		if err != nil {
			s.b.log.Error("replicated queue not opened: this node's replica is damaged or unreadable; it serves nothing of it, and it is rebuilt from the other replicas, which serve the queue", queueLog(q.name), "group", gid, "err", err)
		}
	}
	if err != nil {
		msg := err.Error()
		q.replicaErr.Store(&msg)
		q.opened = true
		s.moves.failedOpen(q) // rebuilt from the other replicas (reconcile.go)
		return true
	}
	q.replicaErr.Store(nil)
	q.grp, q.m, q.replayTo, q.replicated, q.proposer = g, g.FSM().Machine(), replayTo, true, s.proposer()
	q.applSeq = g.LastSeq() // the seq base: nothing of this incarnation is waited for yet (barriers)
	q.group.Store(g)
	q.cons = map[queue.ConsumerID]consumer{}
	q.subs = map[queue.ConsumerID]pendingReq{}
	if s.byGroup == nil {
		s.byGroup = map[uint64]*Queue{}
	}
	s.byGroup[gid] = q
	// Recovered once what this node knew committed is applied (the
	// entries are in its own log).
	q.openCommit = g.Status().Commit
	q.opened = g.FSM().AppliedIndex() >= q.openCommit
	q.storeStats()
	s.moves.track(q)
	if q.prefLeader == dc.NodeID && q.target == nil && slices.Contains(q.firstConf().Voters, dc.NodeID) {
		// A new group's preferred leader (a replica moved here is no
		// voter yet: the balancer hands it the leadership later).
		if err := g.Campaign(); err != nil {
			s.b.log.Warn("replicated queue: campaign failed", queueLog(q.name), "err", err)
		}
	}
	return true
}

// leaderChanged is the worker's LeaderChanged: q's group has a new leader,
// or this node's part changed.
func (s *shard) leaderChanged(g *replication.Group, lead uint64, leader bool) {
	q := s.byGroup[g.ID()]
	if q == nil || q.gone || q.grp != g {
		return
	}
	q.lead.Store(lead)
	if len(s.streams) > 0 {
		s.leaderMoved(q, lead)
	}
	switch {
	case leader && !q.leading:
		q.leading = true
		var owners []queue.OwnerID
		q.m.EachOwner(func(o queue.OwnerID) { owners = append(owners, o) })
		slices.Sort(owners)
		for _, o := range slices.Compact(owners) {
			s.downCmd = queue.Down{NowMs: s.now, Owner: o}
			_, _ = g.Add(&s.downCmd)
		}
		// Arms the queue's timer once applied; the held dead letters are
		// sent again once the first entry of this term is applied here.
		_, _ = g.Add(&queue.Tick{NowMs: s.now})
		q.caughtUp, q.dlResent = false, false
		s.sweepEnqueuers(q) // of nodes removed before it led
		s.moves.track(q)    // a move or rebuild the last leader left unfinished
		s.b.log.Info("replicated queue: this node leads it", queueLog(q.name))
	case !leader && q.leading:
		q.leading = false
		s.stepDown(q)
	}
	s.fwdLeaderChanged(q, lead)
}

// stepDown ends what this node served of q as its leader.
func (s *shard) stepDown(q *Queue) {
	s.timers.remove(q)
	q.caughtUp = false
	for i := q.pendHead; i < len(q.pend); i++ {
		s.answerLost(q, &q.pend[i])
	}
	q.pend, q.pendHead = nil, 0
	code, reason := q.notHere()
	for id, p := range q.subs {
		p.sink.Subscribed(id, uint32(p.req), code, reason)
	}
	clear(q.subs)
	for _, p := range q.purges {
		p.sink.Answer(p.req, Result{Code: code, Reason: reason})
	}
	q.purges = nil
	for _, id := range slices.Sorted(maps.Keys(q.cons)) {
		c := q.cons[id]
		delete(q.cons, id)
		s.conns.dropConsumer(c.owner, q)
		c.sink.Cancelled(id, code, reason)
		c.sink.ConsumerGone(id)
	}
	s.flushEffects()
	// The barriers waiting for this node's proposals: those lost with the
	// leadership never apply here, and nothing proposed later is this
	// node's, so they waited until it led the queue again (an AMQP
	// passive declare behind one held its whole connection). Answered
	// now, as failDurable answers them: nothing more of this node's comes.
	for _, p := range q.barriers {
		p.sink.Answer(p.req, Result{})
	}
	q.barriers = nil
	s.b.log.Info("replicated queue: this node no longer leads it", queueLog(q.name), "leader", q.lead.Load())
}

// replicatedState is the part of a Queue a replicated group adds.
type replicatedState struct {
	inCluster  bool                              // a placed queue in a cluster (set before its shard sees it)
	replicated bool                              // a replicated group (a cluster's durable queue with a replica here)
	remote     bool                              // a cluster's durable queue with no replica on this node
	leading    bool                              // shard-owned: this node leads the group
	openCommit uint64                            // the commit index the group had on disk when opened
	lead       atomic.Uint64                     // the leader as this node last heard (0: none known)
	proposer   uint64                            // the proposer its entries from this node carry
	group      atomic.Pointer[replication.Group] // grp, for readers off the shard (raftStats)
	// placement beyond replicas (reconcile.go), shard-owned: the replicas
	// it is being moved to (nil: none pending) and its group's first voters
	target, origin []uint64
	rebuild        []uint64 // nodes whose copy is being rebuilt (moves.go)
	// shownReplicas: replicas, for readers off the shard (statsOf)
	shownReplicas atomic.Pointer[[]uint64]
	// replicaErr: why this node's replica did not open (damaged data),
	// for the admin API and /metrics; nil when it opened
	replicaErr atomic.Pointer[string]
	move       moveState // the leader's progress moving it (reconcile.go)
}

// raftStats fills the raft fields of a queue's stats: its role on this
// node, the commit index and what this node applied (a replicated queue
// in a cluster only).
func (q *Queue) raftStats(st *QueueStats) {
	if !q.inCluster {
		return
	}
	g := q.group.Load()
	if e := q.replicaErr.Load(); e != nil && g == nil {
		st.RaftRole, st.ReplicaError = "failed", *e
		return
	}
	if g == nil {
		st.RaftRole = "none" // no replica here
		return
	}
	st.RaftRole = "follower"
	if q.lead.Load() == q.shard.nodeID() {
		st.RaftRole = "leader"
	}
	st.RaftCommit, st.RaftApplied = g.Indexes()
	st.RaftVoters = g.Voters()
}

// sendSnapshot adapts the transport's SendSnapshot to the worker's (nil
// without one: raft hears that every snapshot failed).
func (s *shard) sendSnapshot(send func(uint64, *replication.SnapshotMessage, func(bool))) func(uint64, *replication.SnapshotMessage) {
	if send == nil {
		return nil
	}
	return func(gid uint64, m *replication.SnapshotMessage) {
		to := m.Msg.To
		send(gid, m, func(ok bool) {
			if m.Release != nil {
				m.Release() // (its entries are views of the log)
			}
			// Written (raft probes the follower, which asks again if it
			// did not install it) or dropped (raft retries).
			s.submit(Command{Kind: cmdPost, post: func() { s.rw.ReportSnapshot(gid, to, ok) }})
		})
	}
}

// installed is the worker's Installed: q's group jumped to a leader's
// snapshot, a new machine the queue now reads.
func (s *shard) installed(g *replication.Group, meta raftpb.SnapshotMetadata) {
	q := s.byGroup[g.ID()]
	if q == nil || q.gone || q.grp != g {
		return
	}
	q.m = g.FSM().Machine()
	q.opened = true
	q.storeStats()
	s.b.log.Info("replicated queue: installed the leader's snapshot", queueLog(q.name), "index", meta.Index)
}

// StepSnapshot hands a replicated queue's group a snapshot its leader sent
// (the cluster transport's DeliverSnapshot), on its shard.
func (b *Broker) StepSnapshot(gid uint64, m *replication.SnapshotMessage) {
	b.onQueueGroup(gid, func(s *shard, q *Queue) {
		if err := s.rw.StepSnapshot(gid, m); err != nil {
			s.b.log.Warn("replicated queue: a leader's snapshot not taken", queueLog(q.name), "err", err)
		}
	})
}

// SnapshotMessage is a snapshot a leader sends a follower to install
// (replication.SnapshotMessage; named here for netio and warrend).
type SnapshotMessage = replication.SnapshotMessage

// TransferLeaderships hands the leadership of every replicated queue this
// node leads to its most caught-up follower and waits until none is led
// here (design §6.6, a graceful shutdown: the queues fail over in a round
// trip instead of an election timeout), or ctx ends. From the call on the
// node takes no queue's leadership back (it is leaving). Publishes still
// waiting for their confirm are nacked as leadership goes (stepDown).
func (b *Broker) TransferLeaderships(ctx context.Context) error {
	if b.cfg.Durable == nil || b.cfg.Durable.NodeID == 0 {
		return nil
	}
	b.leaving.Store(true)
	ask := func(transfer bool) int {
		n := make(chan int, len(b.shards))
		for _, s := range b.shards {
			s.submit(Command{Kind: cmdPost, post: func() {
				k := 0
				for _, q := range s.byGroup {
					if !q.leading || q.gone {
						continue
					}
					if transfer {
						q.grp.TransferToFollower()
					}
					k++
				}
				n <- k
			}})
		}
		total := 0
		for range b.shards {
			select {
			case k := <-n:
				total += k
			case <-ctx.Done():
				return -1
			}
		}
		return total
	}
	left := ask(true)
	if left > 0 {
		b.log.Info("handing over the leadership of replicated queues", "queues", left)
	}
	tk := time.NewTicker(20 * time.Millisecond)
	defer tk.Stop()
	for asked := time.Now(); left > 0; left = ask(time.Since(asked) > time.Second) {
		// raft abandons a transfer after an election timeout: asked
		// again each round after a second.
		select {
		case <-tk.C:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	if left < 0 {
		return ctx.Err()
	}
	return nil
}

// maxBalancePerShard bounds the transfers one balancer pass asks of a
// shard (design §6.2: at most about 10 per second).
const maxBalancePerShard = 10

// balanceLeaders is the leader balancer (design §6.2): each replicated
// queue this node leads whose preferred leader is another node, reachable
// and caught up, is handed to it, so leaderships spread as placement
// spread them once failed nodes are back.
func (b *Broker) balanceLeaders() {
	for _, s := range b.shards {
		s.submit(Command{Kind: cmdPost, post: func() {
			n := 0
			for _, q := range s.byGroup {
				if n == maxBalancePerShard {
					return
				}
				if q.leading && !q.gone && q.prefLeader != s.nodeID() && q.grp.TransferToPreferred(q.prefLeader) {
					n++
				}
			}
		}})
	}
}

// answerLost answers pending part p of q as lost with its entry: its
// publishes nacked, a dead letter dropped (counted), its source told.
func (s *shard) answerLost(q *Queue, p *pendingPart) {
	s.bytesDelta -= p.bytes
	if p.w != nil {
		if k, ok := p.w.batch.Sink.(*fwdSink); ok {
			// A forwarded part: its origin sends it to the next leader,
			// which applies it unless this entry was applied after all.
			k.redirect, k.lead = true, q.lead.Load()
		} else {
			for _, k := range p.idx {
				p.w.batch.Nack(k, wire.InternalNack)
			}
		}
		s.partRelease(p.w)
	}
	if p.dl {
		s.dropDeadLetter(nil, q.name, dlTargetRefused)
	}
	if p.dlw != nil {
		p.dlw.done()
	}
}

// failPart nacks pending part i of q (an entry lost with a change of
// leader) and drops it from the head.
func (s *shard) failPart(q *Queue, i int) {
	s.answerLost(q, &q.pend[i])
	q.pend[i] = pendingPart{}
	if q.pendHead++; q.pendHead == len(q.pend) {
		q.pend, q.pendHead = q.pend[:0], 0
	}
}
