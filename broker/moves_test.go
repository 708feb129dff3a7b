package broker

import (
	"bytes"
	"fmt"
	"maps"
	"slices"
	"testing"

	"github.com/warren-mq/warren/wire"
)

// checkSpread fails unless every placed queue of m wants n distinct
// replicas on nodes, with its preferred leader among them, and the nodes
// hold counts at most one apart.
func checkSpread(t *testing.T, m *Meta, n int, nodes ...uint64) {
	t.Helper()
	for _, q := range m.Queues() {
		w := q.Replicas
		if q.Target != nil {
			w = q.Target
		}
		if len(w) != n || !nodeSet(w) || !slices.Contains(w, q.Leader) {
			t.Fatalf("queue %s wants %v led by %d: want %d distinct replicas with the leader", q.Name, w, q.Leader, n)
		}
		for _, r := range w {
			if !slices.Contains(nodes, r) {
				t.Fatalf("queue %s wants a replica on node %d, not one of %v", q.Name, r, nodes)
			}
		}
	}
	reps, _ := m.ReplicaCounts()
	lo, hi := -1, 0
	for _, nd := range nodes {
		if lo < 0 || reps[nd] < lo {
			lo = reps[nd]
		}
		hi = max(hi, reps[nd])
	}
	if hi-lo > 1 {
		t.Fatalf("replicas per node %v: more than one apart", reps)
	}
}

// settleMoves reports every pending move done (MetaReplicasMoved), as the
// queues' group leaders would.
func settleMoves(t *testing.T, ms ...*Meta) {
	t.Helper()
	for _, q := range ms[0].Queues() {
		if q.Target == nil {
			continue
		}
		for _, m := range ms {
			_, effs := metaDo(t, m, replicasMovedCommand(q.Name, q.ID, q.Target), wire.OK, "")
			if len(effs) != 1 || effs[0].Kind != EffQueueReplicas || !slices.Equal(effs[0].Queue.Replicas, q.Target) || effs[0].Queue.Target != nil {
				t.Fatalf("queue %s moved: effects %+v", q.Name, effs)
			}
		}
	}
}

// TestPlaceReplicasOnMembershipChange: a node joins and replicas move to
// it until the nodes hold counts at most one apart; a node removed, or
// drained, has its replicas re-placed on the others so every queue keeps
// its replica count; two nodes applying the same commands agree to the
// byte, through a snapshot too; a stale report changes nothing.
func TestPlaceReplicasOnMembershipChange(t *testing.T) {
	a, b := clusterMeta(1, 2, 3), clusterMeta(3, 2, 1)
	both := func(c MetaCommand) []MetaEffect {
		_, ea := metaDo(t, a, c, wire.OK, "")
		metaDo(t, b, c, wire.OK, "")
		return ea
	}
	for i := range 12 {
		both(durableDecl(fmt.Sprintf("q%02d", i), 3))
	}
	if effs := both(MetaCommand{Op: MetaPlaceReplicas}); len(effs) != 0 {
		t.Fatalf("a balanced cluster moved replicas: %+v", effs)
	}
	// Node 4 joins: 36 replicas over 4 nodes, 9 each.
	a.SetNodes([]uint64{1, 2, 3, 4})
	b.SetNodes([]uint64{1, 2, 3, 4})
	effs := both(MetaCommand{Op: MetaPlaceReplicas})
	if len(effs) == 0 {
		t.Fatal("no replica moved to the joined node")
	}
	checkSpread(t, a, 3, 1, 2, 3, 4)
	if reps, _ := a.ReplicaCounts(); reps[4] != 9 {
		t.Fatalf("the joined node is to hold %d replicas, want 9 (%v)", reps[4], reps)
	}
	if !bytes.Equal(a.Snapshot(), b.Snapshot()) {
		t.Fatal("two nodes placed differently")
	}
	// The placement survives a snapshot, targets and counts included.
	r := clusterMeta(1, 2, 3, 4)
	if err := r.Restore(a.Snapshot()); err != nil {
		t.Fatal(err)
	}
	ra, pa := a.ReplicaCounts()
	rr, pr := r.ReplicaCounts()
	if !maps.Equal(ra, rr) || !maps.Equal(pa, pr) || !bytes.Equal(r.Snapshot(), a.Snapshot()) {
		t.Fatalf("restored counts %v %v, want %v %v", rr, pr, ra, pa)
	}
	// A report for another target, or an unknown queue, changes nothing.
	q, _ := a.Queue("q00")
	metaDo(t, a, replicasMovedCommand("q00", q.ID, []uint64{1, 2}), wire.OK, "")
	metaDo(t, a, replicasMovedCommand("nope", 99, []uint64{1, 2, 3}), wire.OK, "")
	if !bytes.Equal(a.Snapshot(), b.Snapshot()) {
		t.Fatal("a stale report changed the state")
	}
	settleMoves(t, a, b)
	pending, _ := a.Moving(0)
	if pending != 0 {
		t.Fatalf("%d moves pending after every one was reported", pending)
	}

	// Node 2 is removed: its replicas go to the other three.
	a.SetNodes([]uint64{1, 3, 4})
	b.SetNodes([]uint64{1, 3, 4})
	both(MetaCommand{Op: MetaPlaceReplicas})
	checkSpread(t, a, 3, 1, 3, 4)
	settleMoves(t, a, b)

	// Decommissioning: node 5 joins, node 3 drains.
	a.SetNodes([]uint64{1, 3, 4, 5})
	b.SetNodes([]uint64{1, 3, 4, 5})
	both(MetaCommand{Op: MetaPlaceReplicas, Replicas: []uint64{3}})
	checkSpread(t, a, 3, 1, 4, 5)
	if _, on := a.Moving(3); on == 0 {
		t.Fatal("node 3 holds no replica before the moves are done")
	}
	settleMoves(t, a, b)
	if _, on := a.Moving(3); on != 0 {
		t.Fatalf("node 3 still holds %d replicas after draining", on)
	}
	if !slices.Equal(a.Draining(), []uint64{3}) {
		t.Fatalf("draining %v", a.Draining())
	}
	// Declares after place nothing on a draining node.
	both(durableDecl("late", 3))
	if q, _ := a.Queue("late"); slices.Contains(q.Replicas, 3) {
		t.Fatalf("a declare placed a replica on draining node 3: %v", q.Replicas)
	}
	metaDo(t, a, MetaCommand{Op: MetaPlaceReplicas, Replicas: []uint64{7}}, wire.NotFound, "not a member")
	if !bytes.Equal(a.Snapshot(), b.Snapshot()) {
		t.Fatal("two nodes differ after decommissioning")
	}
	c := clusterMeta(1, 2)
	metaDo(t, c, durableDecl("x", 1), wire.OK, "")
	metaDo(t, c, MetaCommand{Op: MetaPlaceReplicas, Replicas: []uint64{1}}, wire.OK, "")
	metaDo(t, c, MetaCommand{Op: MetaPlaceReplicas, Replicas: []uint64{2}}, wire.PreconditionFailed, "last node")
	// Fewer nodes than a queue asks for: it keeps what there are, and
	// gets its count back when a node joins.
	g := clusterMeta(1, 2, 3)
	for i := range 4 {
		metaDo(t, g, durableDecl(fmt.Sprintf("g%d", i), 3), wire.OK, "")
	}
	g.SetNodes([]uint64{1, 2})
	metaDo(t, g, MetaCommand{Op: MetaPlaceReplicas}, wire.OK, "")
	checkSpread(t, g, 2, 1, 2)
	settleMoves(t, g)
	g.SetNodes([]uint64{1, 2, 5})
	if !g.NeedsPlacement() {
		t.Fatal("queues short of replicas with a node to hold them: no placement needed?")
	}
	metaDo(t, g, MetaCommand{Op: MetaPlaceReplicas}, wire.OK, "")
	checkSpread(t, g, 3, 1, 2, 5)
	settleMoves(t, g)
	if g.NeedsPlacement() {
		t.Fatal("placement still needed once every queue has its count")
	}
	// A damaged copy is rebuilt (kept in snapshots); the last copy not
	// being rebuilt cannot be.
	r1, _ := g.Queue("g1")
	rb := func(op MetaOp, n uint64) MetaCommand {
		return MetaCommand{Op: op, Queue: wire.QueueDeclare{Name: "g1"}, QueueID: r1.ID, Replicas: []uint64{n}}
	}
	metaDo(t, g, rb(MetaRebuildReplica, r1.Replicas[0]), wire.OK, "")
	metaDo(t, g, rb(MetaRebuildReplica, r1.Replicas[1]), wire.OK, "")
	metaDo(t, g, rb(MetaRebuildReplica, r1.Replicas[2]), wire.PreconditionFailed, "no undamaged replica")
	gr := clusterMeta(1, 2, 5)
	if err := gr.Restore(g.Snapshot()); err != nil || !bytes.Equal(gr.Snapshot(), g.Snapshot()) {
		t.Fatalf("a snapshot with copies being rebuilt: %v", err)
	}
	if q, _ := gr.Queue("g1"); !slices.Equal(q.Rebuild, r1.Replicas[:2]) {
		t.Fatalf("rebuilding %v, want %v", q.Rebuild, r1.Replicas[:2])
	}
	metaDo(t, g, rb(MetaRebuildDone, r1.Replicas[0]), wire.OK, "")
	metaDo(t, g, rb(MetaRebuildDone, r1.Replicas[1]), wire.OK, "")
	if q, _ := g.Queue("g1"); q.Rebuild != nil {
		t.Fatalf("rebuilding %v after both were done", q.Rebuild)
	}
	// Commands round-trip.
	for _, cmd := range []MetaCommand{{Op: MetaPlaceReplicas, Replicas: []uint64{3, 4}}, replicasMovedCommand("q", 5, []uint64{1, 2, 3}),
		{Op: MetaRebuildReplica, Queue: wire.QueueDeclare{Name: "q"}, QueueID: 5, Replicas: []uint64{2}}} {
		got, err := DecodeMetaCommand(AppendMetaCommand(nil, &cmd))
		if err != nil || got.Op != cmd.Op || !slices.Equal(got.Replicas, cmd.Replicas) || got.QueueID != cmd.QueueID || got.Queue.Name != cmd.Queue.Name {
			t.Fatalf("%+v decoded as %+v, %v", cmd, got, err)
		}
	}
}
