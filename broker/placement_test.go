package broker

import (
	"bytes"
	"fmt"
	"maps"
	"slices"
	"testing"

	"github.com/warren-mq/warren/wire"
)

func durableDecl(name string, replicas int) MetaCommand {
	c := MetaCommand{Op: MetaDeclareQueue, Queue: wire.QueueDeclare{Name: name, Durable: true}}
	if replicas > 0 {
		c.Queue.Args = wire.Table{{Key: "replicas", Value: wire.Int(int64(replicas))}}
	}
	return c
}

func clusterMeta(nodes ...uint64) *Meta {
	m := NewMeta(2)
	m.SetNodes(nodes)
	return m
}

// TestPlacementSpreads: replicas go to the nodes holding the fewest, and
// preferred leaderships to the replicas preferred the fewest times, so a
// run of declares spreads both evenly; the effect and Queue carry them.
func TestPlacementSpreads(t *testing.T) {
	for _, tc := range []struct {
		nodes    []uint64
		replicas int // 0: the default
		queues   int
		perNode  int // replicas each node ends with
		prefEach int // preferred leaderships each node ends with
	}{
		{[]uint64{1, 2, 3}, 0, 30, 30, 10},
		{[]uint64{1, 2, 3, 4, 5}, 0, 30, 18, 6},
		{[]uint64{1, 2, 3, 4, 5}, 1, 30, 6, 6},
		{[]uint64{1, 2, 3, 4, 5}, 5, 10, 10, 2},
		{[]uint64{4, 9, 7}, 1, 9, 3, 3},
	} {
		t.Run(fmt.Sprint(tc.nodes, tc.replicas), func(t *testing.T) {
			m := clusterMeta(tc.nodes...)
			want := tc.replicas
			if want == 0 {
				want = min(DefaultReplicas, len(tc.nodes))
			}
			for i := range tc.queues {
				name := fmt.Sprintf("q%d", i)
				_, effs := metaDo(t, m, durableDecl(name, tc.replicas), wire.OK, "")
				mq := effs[len(effs)-1].Queue
				if len(mq.Replicas) != want || !slices.IsSorted(mq.Replicas) || !slices.Contains(mq.Replicas, mq.Leader) {
					t.Fatalf("%s placed on %v led by %d: want %d sorted replicas including the leader", name, mq.Replicas, mq.Leader, want)
				}
				if q, _ := m.Queue(name); !slices.Equal(q.Replicas, mq.Replicas) || q.Leader != mq.Leader {
					t.Fatalf("Queue(%s) = %v/%d, the effect said %v/%d", name, q.Replicas, q.Leader, mq.Replicas, mq.Leader)
				}
			}
			reps, prefs := m.ReplicaCounts()
			for _, n := range tc.nodes {
				if reps[n] != tc.perNode || prefs[n] != tc.prefEach {
					t.Fatalf("node %d holds %d replicas and %d preferred leaderships, want %d and %d (all: %v %v)", n, reps[n], prefs[n], tc.perNode, tc.prefEach, reps, prefs)
				}
			}
		})
	}
}

// TestPlacementRules: what is placed and what is refused.
func TestPlacementRules(t *testing.T) {
	m := clusterMeta(1, 2, 3)
	metaDo(t, m, durableDecl("five", 5), wire.PreconditionFailed, "replicas 5 is more than the cluster's 3 nodes")
	if m.HasQueue("five") {
		t.Fatal("a refused declare made the queue")
	}
	for _, c := range []MetaCommand{qDecl("transient"),
		{Op: MetaDeclareQueue, Conn: 7, Queue: wire.QueueDeclare{Name: "excl", Durable: true, Exclusive: true}}} {
		_, effs := metaDo(t, m, c, wire.OK, "")
		if mq := effs[len(effs)-1].Queue; len(mq.Replicas) != 0 || mq.Leader != 0 {
			t.Fatalf("%s placed on %v: only durable, non-exclusive queues are placed", mq.Name, mq.Replicas)
		}
	}
	// Deleting gives the counts back.
	_, effs := metaDo(t, m, durableDecl("d", 0), wire.OK, "")
	id := effs[len(effs)-1].Queue.ID
	metaDo(t, m, MetaCommand{Op: MetaDeleteQueue, Queue: wire.QueueDeclare{Name: "d"}, QueueID: id}, wire.OK, "")
	if reps, prefs := m.ReplicaCounts(); len(reps) != 0 || len(prefs) != 0 {
		t.Fatalf("after the delete the counts are %v %v", reps, prefs)
	}
	// A single node: every durable queue on node 1, whatever it asks.
	one := NewMeta(2)
	_, effs = metaDo(t, one, durableDecl("solo", 3), wire.OK, "")
	if mq := effs[len(effs)-1].Queue; !slices.Equal(mq.Replicas, []uint64{1}) || mq.Leader != 1 {
		t.Fatalf("on one node placed on %v led by %d, want [1] and 1", mq.Replicas, mq.Leader)
	}
}

// TestPlacementDeterministic: the same commands give the same placement
// and snapshot bytes on every node, a snapshot keeps the placement and the
// counts (declares after a restore place as they would have without it),
// and a version 4 snapshot (before placement) is placed as it is restored,
// alike on every node.
func TestPlacementDeterministic(t *testing.T) {
	a, b := clusterMeta(1, 2, 3, 4, 5), clusterMeta(5, 3, 1, 4, 2)
	for i := range 20 {
		c := durableDecl(fmt.Sprintf("q%d", i), []int{0, 1, 3, 5}[i%4])
		a.Apply(&c)
		b.Apply(&c)
	}
	if !bytes.Equal(a.Snapshot(), b.Snapshot()) {
		t.Fatal("two nodes applying the same declares differ")
	}
	r := clusterMeta(1, 2, 3, 4, 5)
	if err := r.Restore(a.Snapshot()); err != nil {
		t.Fatal(err)
	}
	ra, pa := a.ReplicaCounts()
	rr, pr := r.ReplicaCounts()
	if !maps.Equal(ra, rr) || !maps.Equal(pa, pr) {
		t.Fatalf("restored counts %v %v, want %v %v", rr, pr, ra, pa)
	}
	for i := 20; i < 30; i++ {
		c := durableDecl(fmt.Sprintf("q%d", i), 3)
		a.Apply(&c)
		r.Apply(&c)
	}
	if !bytes.Equal(a.Snapshot(), r.Snapshot()) {
		t.Fatal("declares after a restore placed otherwise than without it")
	}

	old := a.snapshotAt(4)
	x, y := clusterMeta(1, 2, 3, 4, 5), clusterMeta(1, 2, 3, 4, 5)
	if err := x.Restore(old); err != nil {
		t.Fatal(err)
	}
	if err := y.Restore(old); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(x.Snapshot(), y.Snapshot()) {
		t.Fatal("a version 4 snapshot was placed differently on two nodes")
	}
	for _, q := range x.Queues() {
		if len(q.Replicas) == 0 || !slices.Contains(q.Replicas, q.Leader) {
			t.Fatalf("queue %s of a version 4 snapshot not placed: %v/%d", q.Name, q.Replicas, q.Leader)
		}
	}
	// A damaged placement is refused.
	bad := a.Snapshot()
	if err := clusterMeta(1, 2, 3).Restore(bad[:len(bad)-3]); err == nil {
		t.Fatal("a truncated snapshot restored")
	}
}
