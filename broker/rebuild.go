package broker

import (
	"slices"
)

// Rebuilding a damaged replica from its peers (issue 14). A node whose copy
// of a replicated queue does not open (its data damaged or unreadable:
// replication.Worker.Recover's error, which names the file or entry; or
// its group quarantined as the node's log opened, segment.Options.
// Quarantine, naming the file and offset: never opened at all) serves
// nothing of it, says so naming the queue (log, admin API raft_role
// "failed", /metrics), and asks the metadata group to rebuild it
// (MetaRebuildReplica; again every moveRetryTicks until it is applied). The
// group's leader then treats the copy as one to move away (reconcile.go):
// the node leaves the group's configuration, and the leader reports it
// (MetaRebuildDone). Only then does the node delete its damaged copy: while
// it was still a voter a restart must not find it empty (it would vote
// without the entries it had acknowledged). It then opens the group new, in
// its first voters' configuration as a replica moved here does, and the
// leader adds it back as a learner, sends it the log or its snapshot, and
// promotes it once it has caught up: the replica count is restored, with
// the state of the leader. A queue whose only undamaged copy is the one
// asking cannot be rebuilt (refused: nothing to rebuild it from).

// askRebuild asks the metadata group to rebuild this node's damaged copy
// of q (at most every moveRetryTicks), until the rebuild has started.
func (s *shard) askRebuild(q *Queue, at uint64) {
	me := s.nodeID()
	switch {
	case q.gone || !q.holdsReplica(me) || q.grp != nil:
		delete(s.moves.failed, q)
	case slices.Contains(q.rebuild, me):
		// Under way: the leader takes the copy out of the group.
	case at == 0 || s.moves.ticks-at >= moveRetryTicks:
		s.moves.failed[q] = s.moves.ticks
		s.b.log.Warn("replicated queue: asking the cluster to rebuild this node's damaged copy from the other replicas", queueLog(q.name))
		s.b.topo.reportReplica(q, MetaRebuildReplica, me)
	}
}

// rebuildFresh deletes this node's damaged copy of q (its log and
// snapshots), now out of the group, and opens the group new.
func (s *shard) rebuildFresh(q *Queue) {
	dc := s.b.cfg.Durable
	gid := queueGroup(q.id)
	delete(s.moves.failed, q)
	s.removing++
	s.b.log.Info("replicated queue: the leader took this node's damaged copy out of the group; deleting it and joining again as a new replica", queueLog(q.name), "group", gid)
	go func() {
		err := dc.Snapshots.Forget(gid)
		if err == nil {
			err = dc.Log.RemoveGroup(gid)
		}
		s.submit(Command{Kind: cmdPost, post: func() {
			s.removing--
			s.checkRemovals()
			if err != nil {
				s.b.log.Error("replicated queue: the damaged copy was not deleted; a restart tries again", queueLog(q.name), "group", gid, "err", err)
				return
			}
			delete(s.openedGrps, gid)
			if q.gone || q.grp != nil || !q.holdsReplica(s.nodeID()) {
				return
			}
			q.replicaErr.Store(nil)
			q.remote = false
			s.openReplicated(q)
		}})
	}()
}
