package broker

import (
	"encoding/binary"
	"maps"
	"slices"
	"strconv"

	"github.com/cespare/xxhash/v2"
	"github.com/warren-mq/warren/wire"
)

// Placement (design replication.md §6.2): the metadata state machine
// assigns each durable, non-exclusive queue its replica set when the
// declare is applied, on every node alike, so the placement is part of
// the replicated state (and of snapshots, version 5) and never a node's
// local decision. The replicas are the nodes holding the fewest replicas,
// ties broken by a hash of the queue's name, so queues declared in the
// same order on a fresh cluster spread evenly; the preferred leader is
// the replica that is preferred leader of the fewest queues (the same tie
// rule). The node set is configuration (--peers), the same on every node;
// on a single node it is {1}, and every durable queue lives there.
//
// Non-durable and exclusive queues get no replicas: in a cluster each
// lives on one node, its home (homed.go).

// DefaultReplicas is how many replicas a durable queue gets when its
// declare does not say (capped at the cluster's size).
const DefaultReplicas = 3

// SetNodes sets the cluster's node ids (configuration, like the shard
// count: the same on every node; nil or empty means a single node, id 1).
// Call it before any command is applied or snapshot restored.
func (m *Meta) SetNodes(ids []uint64) {
	m.nodes = slices.Clone(ids)
	slices.Sort(m.nodes)
	m.nodes = slices.Compact(m.nodes)
}

// Nodes are the node ids queues are placed on, sorted.
func (m *Meta) Nodes() []uint64 {
	if len(m.nodes) == 0 {
		return []uint64{1}
	}
	return m.nodes
}

// placed reports whether a queue of this declaration gets replicas.
func placed(d *wire.QueueDeclare) bool { return d.Durable && !d.Exclusive }

// checkReplicas refuses a replica count the cluster cannot hold (only in
// a cluster: a single node keeps one copy whatever a declare asks, as
// before placement existed).
func (m *Meta) checkReplicas(name string, args wire.QueueArgs) (MetaResult, bool) {
	n := len(m.Nodes())
	if n > 1 && int(args.Replicas) > n {
		return refuse(wire.PreconditionFailed, "queue "+strconv.Quote(name)+": replicas "+strconv.Itoa(int(args.Replicas))+
			" is more than the cluster's "+strconv.Itoa(n)+" nodes (declare it with fewer replicas, or add nodes)"), false
	}
	return MetaResult{}, true
}

// place assigns q its replicas and preferred leader and counts them.
func (m *Meta) place(q *metaQueue, want int) {
	nodes := m.placeable()
	if want <= 0 {
		want = DefaultReplicas
	}
	want = min(want, len(nodes))
	h := xxhash.Sum64String(q.decl.Name)
	order := slices.Clone(nodes)
	slices.SortStableFunc(order, func(a, b uint64) int {
		if c := m.replicaN[a] - m.replicaN[b]; c != 0 {
			return c
		}
		return cmpU64(tieKey(h, a), tieKey(h, b))
	})
	q.replicas = order[:want:want]
	q.leader = q.replicas[0]
	for _, n := range q.replicas[1:] {
		if c := m.prefN[n] - m.prefN[q.leader]; c < 0 || c == 0 && tieKey(h, n) < tieKey(h, q.leader) {
			q.leader = n
		}
	}
	slices.Sort(q.replicas)
	q.origin = q.replicas
	m.count(q, 1)
}

// count adds d to the per-node counts of q's placement, as wanted (its
// target while a move is pending; derived state: rebuilt by Restore, not
// in snapshots).
func (m *Meta) count(q *metaQueue, d int) {
	if q.home != 0 {
		k := homeKey{q.home, q.homeInc}
		if m.homes[k] += d; m.homes[k] <= 0 {
			delete(m.homes, k)
		}
	}
	if len(q.replicas) == 0 {
		return
	}
	for _, n := range q.want() {
		if m.replicaN[n] += d; m.replicaN[n] <= 0 {
			delete(m.replicaN, n)
		}
	}
	if m.prefN[q.leader] += d; m.prefN[q.leader] <= 0 {
		delete(m.prefN, q.leader)
	}
}

// tieKey orders nodes with equal counts, differently for each queue name.
func tieKey(h, node uint64) uint64 {
	var b [16]byte
	binary.LittleEndian.PutUint64(b[:], h)
	binary.LittleEndian.PutUint64(b[8:], node)
	return xxhash.Sum64(b[:])
}

func cmpU64(a, b uint64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// ReplicaCounts is how many replicas and preferred leaderships each node
// holds (for tests and inspection).
func (m *Meta) ReplicaCounts() (replicas, preferred map[uint64]int) {
	return maps.Clone(m.replicaN), maps.Clone(m.prefN)
}

// maxReplicas bounds a snapshot's replica list (the argument allows 5).
const maxReplicas = 5

// placedOK checks a restored queue's placement: a placed queue of a
// version-5 snapshot has sorted, distinct, non-zero replicas and its
// preferred leader among them; any other queue has none.
func placedOK(d *wire.QueueDeclare, replicas []uint64, leader uint64, version byte) bool {
	if version < 5 || !placed(d) {
		return len(replicas) == 0 && leader == 0
	}
	return len(replicas) > 0 && nodeSet(replicas)
}

// nodeSet reports whether ns is sorted, distinct and has no 0.
func nodeSet(ns []uint64) bool {
	for i, n := range ns {
		if n == 0 || i > 0 && n <= ns[i-1] {
			return false
		}
	}
	return true
}

// leaderID is the node leading the queue as this node knows it: on one
// node, this one; in a cluster, what its raft group last said (on a node
// without a replica, its preferred leader).
func (q *Queue) leaderID() uint64 {
	if q.home != 0 {
		return q.home // the node it lives on (homed.go)
	}
	if q.inCluster {
		return q.lead.Load()
	}
	return q.prefLeader
}
