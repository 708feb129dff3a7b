package broker

import (
	"slices"
	"strings"

	"github.com/warren-mq/warren/queue"
)

// connIndex is a shard's index from a connection id to the queues it uses
// on the shard: those where it has consumers the shard still tracks
// (Queue.cons: active, or cancelled and still holding deliveries) and the
// exclusive queues it owns. A Down looks at these and no other queue.
// Kept exact by subscribe, forgetIfGone, down and deleteQueue.
// Shard-owned.
type connIndex struct {
	consumers map[uint64]map[*Queue]int32 // connection → queue → its consumers in q.cons
	exclusive map[uint64]map[*Queue]struct{}
}

func (x *connIndex) addConsumer(conn uint64, q *Queue) {
	if x.consumers == nil {
		x.consumers = map[uint64]map[*Queue]int32{}
	}
	m := x.consumers[conn]
	if m == nil {
		m = map[*Queue]int32{}
		x.consumers[conn] = m
	}
	m[q]++
}

func (x *connIndex) dropConsumer(conn uint64, q *Queue) {
	m := x.consumers[conn]
	if m == nil {
		return
	}
	if m[q]--; m[q] <= 0 {
		delete(m, q)
		if len(m) == 0 {
			delete(x.consumers, conn)
		}
	}
}

func (x *connIndex) addExclusive(conn uint64, q *Queue) {
	if x.exclusive == nil {
		x.exclusive = map[uint64]map[*Queue]struct{}{}
	}
	m := x.exclusive[conn]
	if m == nil {
		m = map[*Queue]struct{}{}
		x.exclusive[conn] = m
	}
	m[q] = struct{}{}
}

func (x *connIndex) dropExclusive(conn uint64, q *Queue) {
	if m := x.exclusive[conn]; m != nil {
		delete(m, q)
		if len(m) == 0 {
			delete(x.exclusive, conn)
		}
	}
}

// forget drops a deleted queue from the index.
func (x *connIndex) forget(q *Queue) {
	for _, c := range q.cons {
		x.dropConsumer(c.owner, q)
	}
	if q.exclusive != 0 {
		x.dropExclusive(q.exclusive, q)
	}
}

// take removes a connection's entries and returns its queues, sorted by
// name: the order a Down handles them in is a function of the shard's
// commands alone, not of map iteration.
func (x *connIndex) take(conn uint64, out []*Queue) []*Queue {
	for q := range x.consumers[conn] {
		out = append(out, q)
	}
	for q := range x.exclusive[conn] {
		if _, dup := x.consumers[conn][q]; !dup {
			out = append(out, q)
		}
	}
	delete(x.consumers, conn)
	delete(x.exclusive, conn)
	slices.SortFunc(out, func(a, b *Queue) int { return strings.Compare(a.name, b.name) })
	return out
}

// down returns everything a closed connection held, drops its consumers
// and deletes the queues it owned exclusively: on the queues the index
// names for it, no other. The confirms backlogs hold back for its
// channels (ended: the connection set their PublishBatch.Ended before its
// Down) are released, for its sink to drop, rather than keep the
// connection in memory until their queues drain.
func (s *shard) down(connID uint64) {
	if len(s.holding) > 0 {
		s.releaseEnded()
	}
	if len(s.fc.byOwner) > 0 {
		s.fwdDown(connID)
	}
	s.due = s.conns.take(connID, s.due[:0])
	for i, q := range s.due {
		s.due[i] = nil
		s.visited.Add(1)
		if q.gone || q.m == nil {
			continue
		}
		if q.exclusive == connID {
			if s.b.topo.removeQueue(q, 0) {
				s.deleteQueue(q, "exclusive owner closed")
			}
			continue
		}
		for id, c := range q.cons {
			if c.owner == connID {
				delete(q.cons, id)
			}
		}
		if q.grp != nil {
			s.downCmd = queue.Down{NowMs: s.now, Owner: queue.OwnerID(connID)}
			_, _ = q.grp.Add(&s.downCmd)
			continue
		}
		effs, _ := q.m.Apply(&queue.Down{NowMs: s.now, Owner: queue.OwnerID(connID)})
		s.handle(q, effs)
	}
}
