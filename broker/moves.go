package broker

import (
	"slices"
	"strconv"
	"strings"

	"github.com/cespare/xxhash/v2"
	"github.com/warren-mq/warren/wire"
)

// Replica movement (design replication.md §6.7), the metadata half. A
// placed queue has replicas (the voters of its raft group as the metadata
// last heard) and, while a move is pending, a target: the replicas it is
// to have. Only the metadata group decides targets, at apply, the same on
// every node (MetaPlaceReplicas, proposed by the metadata leader after a
// node joins or is removed, and by its balancer when it finds a queue on
// a node that is gone or nodes more than one replica apart). The queue's
// group leader reconciles its raft configuration toward the target one
// change at a time (reconcile.go), then proposes MetaReplicasMoved, which
// makes the target the replicas; a node whose replica is then no longer
// wanted closes the group and deletes its copy. The replica counts that
// placement balances count targets, so queues declared during a move are
// placed as if it were done.
//
// A queue's origin is the voter set its group started with: a replica
// with no copy of its own opens the group there (reconcile.go, firstConf).

// want is the replica set q is to have: its target while a move is
// pending, else its replicas.
func (q *metaQueue) want() []uint64 {
	if q.target != nil {
		return q.target
	}
	return q.replicas
}

// setWant makes ns (sorted) what q is to have: its target, or no target
// when ns are its replicas.
func (q *metaQueue) setWant(ns []uint64) {
	if slices.Equal(ns, q.replicas) {
		q.target = nil
		return
	}
	q.target = ns
}

// movesOK checks a restored queue's origin and target against its
// replicas and preferred leader.
func movesOK(replicas, origin, target []uint64, leader uint64) bool {
	if len(replicas) == 0 {
		return len(origin) == 0 && target == nil && leader == 0
	}
	want := replicas
	if target != nil {
		want = target
	}
	return len(origin) > 0 && nodeSet(origin) && nodeSet(target) && slices.Contains(want, leader)
}

// replicaCount is how many replicas q asks for (its replicas argument,
// DefaultReplicas when it does not say).
func (q *metaQueue) replicaCount() int {
	if args, err := wire.ParseQueueArgs(q.decl.Args); err == nil && args.Replicas > 0 {
		return int(args.Replicas)
	}
	return DefaultReplicas
}

// placedNames are the placed queues' names, sorted (the order moves are
// decided in).
func (m *Meta) placedNames() []string {
	var names []string
	for name, q := range m.queues {
		if len(q.replicas) > 0 {
			names = append(names, name)
		}
	}
	slices.SortFunc(names, strings.Compare)
	return names
}

// leastLoaded is the member not in skip holding the fewest replicas
// (ties by tieKey under h), 0 if none.
func (m *Meta) leastLoaded(h uint64, skip []uint64) uint64 {
	var best uint64
	for _, n := range m.placeable() {
		if slices.Contains(skip, n) {
			continue
		}
		if best == 0 || m.replicaN[n] < m.replicaN[best] || m.replicaN[n] == m.replicaN[best] && tieKey(h, n) < tieKey(h, best) {
			best = n
		}
	}
	return best
}

// repick sets q's wanted replicas to ns (sorted here) with a preferred
// leader among them, keeping the counts.
func (m *Meta) repick(q *metaQueue, ns []uint64) {
	m.count(q, -1)
	slices.Sort(ns)
	q.setWant(ns)
	if !slices.Contains(ns, q.leader) {
		h := xxhash.Sum64String(q.decl.Name)
		q.leader = ns[0]
		for _, n := range ns[1:] {
			if c := m.prefN[n] - m.prefN[q.leader]; c < 0 || c == 0 && tieKey(h, n) < tieKey(h, q.leader) {
				q.leader = n
			}
		}
	}
	m.count(q, 1)
}

// placeable are the members replicas may be placed on: not draining.
func (m *Meta) placeable() []uint64 {
	if len(m.draining) == 0 {
		return m.Nodes()
	}
	var ns []uint64
	for _, n := range m.Nodes() {
		if !slices.Contains(m.draining, n) {
			ns = append(ns, n)
		}
	}
	return ns
}

// canHold reports whether node n may hold replicas: a member, not
// draining.
func (m *Meta) canHold(n uint64) bool {
	return slices.Contains(m.Nodes(), n) && !slices.Contains(m.draining, n)
}

// Draining are the nodes being decommissioned.
func (m *Meta) Draining() []uint64 { return m.draining }

// placeCommand is MetaPlaceReplicas: the nodes it names drain from now
// on (members only, and never every member), then every queue is placed
// again.
func (m *Meta) placeCommand(c *MetaCommand) (MetaResult, []MetaEffect) {
	for _, n := range c.Replicas {
		if !slices.Contains(m.Nodes(), n) {
			return refuse(wire.NotFound, "node "+strconv.FormatUint(n, 10)+" is not a member of the cluster"), nil
		}
		if !slices.Contains(m.draining, n) {
			if len(m.placeable()) <= 1 {
				return refuse(wire.PreconditionFailed, "node "+strconv.FormatUint(n, 10)+" is the last node that can hold replicas: add a node before decommissioning it"), nil
			}
			m.draining = append(m.draining, n)
			slices.Sort(m.draining)
		}
	}
	return MetaResult{}, m.placeReplicas()
}

// placeReplicas is MetaPlaceReplicas: in name order, each placed queue's
// wanted replicas on nodes that are no longer members go to the least
// loaded members, and a queue with fewer replicas than it asks for (the
// cluster had fewer nodes) gets more, as far as there are nodes; then each replica on a node
// holding more than one above the least loaded member not holding the
// queue moves there. It returns an EffQueueReplicas for every queue
// whose placement changed.
func (m *Meta) placeReplicas() []MetaEffect {
	if len(m.nodes) < 2 {
		return nil // a single node: nothing to move
	}
	changed := map[string]bool{}
	names := m.placedNames()
	for _, name := range names {
		q := m.queues[name]
		w := q.want()
		ns := make([]uint64, 0, len(w))
		for _, n := range w {
			if m.canHold(n) {
				ns = append(ns, n)
			}
		}
		size := min(q.replicaCount(), len(m.placeable()))
		if len(ns) == len(w) && len(ns) >= size {
			continue
		}
		h := xxhash.Sum64String(name)
		for len(ns) < size {
			n := m.leastLoaded(h, ns)
			if n == 0 {
				break
			}
			ns = append(ns, n)
		}
		if len(ns) == 0 {
			continue // no member left to hold it (it cannot be reached anyway)
		}
		m.repick(q, ns)
		changed[name] = true
	}
	for _, name := range names {
		q := m.queues[name]
		h := xxhash.Sum64String(name)
		ns := slices.Clone(q.want())
		// Its replica on the most loaded node moves to the least loaded
		// member not holding it, if they are more than one apart.
		hi := -1
		for i, n := range ns {
			if hi < 0 || m.replicaN[n] > m.replicaN[ns[hi]] || m.replicaN[n] == m.replicaN[ns[hi]] && tieKey(h, n) < tieKey(h, ns[hi]) {
				hi = i
			}
		}
		lo := m.leastLoaded(h, ns)
		if hi < 0 || lo == 0 || m.replicaN[ns[hi]] <= m.replicaN[lo]+1 {
			continue
		}
		ns[hi] = lo
		m.repick(q, ns)
		changed[name] = true
	}
	var effs []MetaEffect
	for _, name := range names {
		if changed[name] {
			effs = append(effs, MetaEffect{Kind: EffQueueReplicas, Queue: m.queues[name].parsed()})
		}
	}
	return effs
}

// replicasMoved is MetaReplicasMoved: the queue's group has its target
// as its voters, which become its replicas. A report that no longer
// matches (the queue deleted, or its target changed since) changes
// nothing.
func (m *Meta) replicasMoved(c *MetaCommand) (MetaResult, []MetaEffect) {
	q, ok := m.queues[c.Queue.Name]
	if !ok || q.id != c.QueueID || q.target == nil || !slices.Equal(q.target, c.Replicas) {
		return MetaResult{}, nil
	}
	q.replicas, q.target = q.target, nil
	return MetaResult{}, []MetaEffect{{Kind: EffQueueReplicas, Queue: q.parsed()}}
}

// NeedsPlacement reports whether a MetaPlaceReplicas would move anything:
// a queue wants a replica on a node that is not a member, or two members
// hold more than one replica apart while some queue could move between
// them (the metadata leader's balancer asks).
func (m *Meta) NeedsPlacement() bool {
	if len(m.nodes) < 2 {
		return false
	}
	for _, name := range m.placedNames() {
		q := m.queues[name]
		if len(q.want()) < min(q.replicaCount(), len(m.placeable())) {
			return true
		}
		for _, n := range q.want() {
			if !m.canHold(n) {
				return true
			}
			if lo := m.leastLoaded(0, q.want()); lo != 0 && m.replicaN[n] > m.replicaN[lo]+1 {
				return true
			}
		}
	}
	return false
}

// Moving counts the placed queues with a move pending, and those holding
// or to hold a replica on node (0: any).
func (m *Meta) Moving(node uint64) (pending, onNode int) {
	for _, q := range m.queues {
		if q.target != nil {
			pending++
		}
		if node != 0 && (slices.Contains(q.replicas, node) || slices.Contains(q.target, node)) {
			onNode++
		}
	}
	return pending, onNode
}

// replicasMovedCommand is the report a queue's group leader proposes.
func replicasMovedCommand(name string, id uint64, voters []uint64) MetaCommand {
	return MetaCommand{Op: MetaReplicasMoved, Queue: wire.QueueDeclare{Name: name}, QueueID: id, Replicas: voters}
}

// placeIfNeeded proposes MetaPlaceReplicas, without waiting, if this node
// leads the metadata group and a queue is to move (a node joined or was
// removed and the proposal after it was lost, or queues were deleted
// unevenly).
func (t *topology) placeIfNeeded() {
	cl := t.cl.Load()
	if cl == nil || cl.removed.Load() {
		return
	}
	if st := cl.g.Status(); st.Lead != st.ID {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if !t.meta.NeedsPlacement() {
		return
	}
	c := MetaCommand{Op: MetaPlaceReplicas, NowMs: t.now()}
	t.mbuf = AppendMetaCommand(t.mbuf[:0], &c)
	cl.g.Add(t.mbuf)
	cl.g.Kick()
}

// rebuildOK checks a restored queue's copies to rebuild: nodes it wants.
func rebuildOK(replicas, target, rebuild []uint64) bool {
	want := replicas
	if target != nil {
		want = target
	}
	if !nodeSet(rebuild) {
		return false
	}
	for _, n := range rebuild {
		if !slices.Contains(want, n) {
			return false
		}
	}
	return true
}

// rebuildReplica is MetaRebuildReplica (a node's copy is damaged: it is
// to be removed from the group and added back new) and MetaRebuildDone
// (the group's leader removed it). A rebuild of the last copy not being
// rebuilt is refused: there is nothing to rebuild it from. Reports that
// no longer match change nothing.
func (m *Meta) rebuildReplica(c *MetaCommand) (MetaResult, []MetaEffect) {
	q, ok := m.queues[c.Queue.Name]
	if !ok || q.id != c.QueueID || len(c.Replicas) != 1 {
		return MetaResult{}, nil
	}
	n := c.Replicas[0]
	if c.Op == MetaRebuildDone {
		i := slices.Index(q.rebuild, n)
		if i < 0 {
			return MetaResult{}, nil
		}
		q.rebuild = slices.Delete(slices.Clone(q.rebuild), i, i+1)
		if len(q.rebuild) == 0 {
			q.rebuild = nil
		}
		return MetaResult{}, []MetaEffect{{Kind: EffQueueReplicas, Queue: q.parsed()}}
	}
	if !slices.Contains(q.want(), n) || slices.Contains(q.rebuild, n) {
		return MetaResult{}, nil
	}
	if len(q.want())-len(q.rebuild) < 2 {
		return refuse(wire.PreconditionFailed, "queue "+strconv.Quote(c.Queue.Name)+": no undamaged replica to rebuild node "+strconv.FormatUint(n, 10)+"'s copy from"), nil
	}
	q.rebuild = append(slices.Clone(q.rebuild), n)
	slices.Sort(q.rebuild)
	return MetaResult{}, []MetaEffect{{Kind: EffQueueReplicas, Queue: q.parsed()}}
}
