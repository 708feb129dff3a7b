package broker

import (
	"maps"
	"slices"

	"github.com/warren-mq/warren/queue"
	"github.com/warren-mq/warren/wire"
	"go.etcd.io/raft/v3/raftpb"
)

func (s *shard) createQueue(q *Queue) {
	var early []raftpb.Message
	if s.clustered() {
		// Raft messages its group had before it opened here: stepped
		// into it once open, else dropped (raftpark.go).
		early = s.b.takeParked(queueGroup(q.id))
	}
	if q.homedElsewhere(s.nodeID()) {
		// It lives on another node: served from there (homed.go).
		q.remote, q.opened = true, true
		q.lead.Store(q.home)
		s.queues[q] = struct{}{}
		return
	}
	if q.home != 0 && q.homeInc != s.b.homeInc() {
		// It lived here in an earlier life of this node, and went with
		// it: its MetaDropHome is on its way (homed.go). Until then it
		// serves nothing: a publish forwarded to it is refused (its origin
		// nacks it), never confirmed into a copy about to go.
		q.opened = true
		s.queues[q] = struct{}{}
		return
	}
	if q.home != 0 {
		q.lead.Store(q.home)
	}
	if s.durableLogged(q) {
		s.queues[q] = struct{}{}
		s.openDurable(q)
		if g := q.grp; g != nil && !q.gone {
			for _, m := range early {
				if err := s.rw.Step(g.ID(), m); err != nil {
					s.b.log.Debug("replicated queue: raft message dropped", "group", g.ID(), "err", err)
				}
			}
		}
		return
	}
	q.m = queue.New(queue.ConfigFromArgs(q.args, q.autoDelete), s.now)
	q.cons = map[queue.ConsumerID]consumer{}
	s.queues[q] = struct{}{}
	if q.exclusive != 0 {
		s.conns.addExclusive(q.exclusive, q)
	}
	effs, _ := q.m.Apply(&queue.Tick{NowMs: s.now}) // arms the expiry timer, if any
	s.handle(q, effs)
}

// storeStats publishes the machine's counts for replies and metrics.
func (q *Queue) storeStats() {
	st := &q.m.Stats
	q.ready.Store(q.m.Ready())
	q.unacked.Store(int64(q.m.Unacked()))
	q.consumers.Store(int64(q.m.Consumers()))
	q.published.Store(st.Enqueued)
	q.delivered.Store(st.Delivered)
	q.acked.Store(st.Acked)
	q.redelivered.Store(st.Redelivered)
	if q.grp != nil {
		n, _ := q.m.HeldDeadLetters()
		q.dlHeld.Store(int64(n))
	}
}

func (s *shard) free(q *Queue, id uint64) {
	if msg := q.bodies.del(id); msg != nil {
		s.release(msg)
	}
}

// release lets go of one placement of msg; the last one uncounts its
// arena (see Arena).
func (s *shard) release(msg *StoredMsg) {
	if msg.Arena.Refs.Add(-1) == 0 {
		s.bytesDelta -= msg.Arena.Cost
	}
}

// deleteQueue drops a queue's state and tells its consumers.
func (s *shard) deleteQueue(q *Queue, reason string) int64 {
	if q.gone {
		return 0
	}
	q.gone = true
	s.timers.remove(q)
	s.conns.forget(q)
	if q.grp != nil && s.byGroup[q.grp.ID()] == q {
		delete(s.byGroup, q.grp.ID())
	}
	s.fwdQueueGone(q, reason)
	if q.m == nil { // a replicated queue with no replica here
		delete(s.queues, q)
		return 0
	}
	n := int64(q.m.Ready())
	// In consumer id order, not the map's: a replica applying the same
	// commands hands out the same effects in the same order.
	for _, id := range slices.Sorted(maps.Keys(q.cons)) {
		c := q.cons[id]
		c.sink.Cancelled(id, wire.NotFound, reason)
		c.sink.ConsumerGone(id)
	}
	q.bodies.each(func(_ uint64, m *StoredMsg) { s.release(m) })
	if q.grp != nil {
		s.failDurable(q)
		s.removeGroup(q)
	}
	q.bodies = bodyStore{}
	q.cons = nil
	s.releaseHeld(q)
	q.ready.Store(0)
	q.unacked.Store(0)
	q.consumers.Store(0)
	delete(s.queues, q)
	return n
}
