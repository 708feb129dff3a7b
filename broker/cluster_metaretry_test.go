package broker

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/warren-mq/warren/wire"
)

// TestClusterChangeSentAsLeaderDies: the newcomer trial's case. The
// metadata leader dies while the followers still take it for the leader
// (their raft clocks held, so no election can start): a queue declared
// on a follower is forwarded to the dead leader and lost there, and a
// queue deleted on the other follower (clusterRemove: proposed without
// waiting) too. Once the two elect a new leader, both changes are
// proposed again and applied: the declare is answered with its queue
// (not refused after the cluster timeout, 20 s here), the deletion is
// applied on both nodes up, and the delete is answered.
func TestClusterChangeSentAsLeaderDies(t *testing.T) {
	c := newTestCluster(t, 3)
	lead := c.leader()
	f1, f2 := c.nodes[lead.id%3], c.nodes[(lead.id+1)%3]
	if _, err := f2.b.Load().DeclareQueueAs(&wire.QueueDeclare{Name: "old"}, 0, ""); err != nil {
		t.Fatal(err)
	}
	c.sees(f2, "queue old")
	for _, nd := range []*clusterNode{f1, f2} {
		nd.b.Load().topo.cl.Load().stopTick()
	}
	c.stop(lead)
	type answer struct {
		q   *Queue
		err error
		in  time.Duration
	}
	declared := make(chan answer, 1)
	go func() {
		start := time.Now()
		q, err := f1.b.Load().DeclareQueueAs(&wire.QueueDeclare{Name: "q4", Durable: true}, 0, "")
		declared <- answer{q, err, time.Since(start)}
	}()
	deleted := make(chan error, 1)
	go func() {
		// The shard proposes the deletion (clusterRemove), then waits for
		// every change of this node's to apply (MetaSync).
		_, err := f2.b.Load().DeleteQueue(context.Background(), "old", false, false)
		deleted <- err
	}()
	for _, nd := range []*clusterNode{f1, f2} {
		if st, _ := nd.b.Load().MetaStatus(); st.Leader != lead.id {
			t.Fatalf("node %d took node %d for the leader, want the dead %d", nd.id, st.Leader, lead.id)
		}
	}
	// Their clocks run again: an election, then the lost changes again.
	for _, nd := range []*clusterNode{f1, f2} {
		cl := nd.b.Load().topo.cl.Load()
		cl.stop, cl.stopped = make(chan struct{}), make(chan struct{})
		go cl.tick(10 * time.Millisecond)
	}
	a := <-declared
	if a.err != nil || a.q == nil || a.q.Name() != "q4" {
		t.Fatalf("declare on node %d as its leader died: %v, %v (after %v)", f1.id, a.q, a.err, a.in)
	}
	if a.in > 10*time.Second {
		t.Fatalf("declare answered after %v", a.in)
	}
	if err := <-deleted; err != nil {
		t.Fatalf("delete on node %d as its leader died: %v", f2.id, err)
	}
	for _, nd := range []*clusterNode{f1, f2} {
		b := nd.b.Load()
		c.sees(nd, "queue q4 durable=true")
		c.waitFor("queue old deleted on the nodes up", func() bool { return !strings.Contains(topoSummary(b), "queue old") })
	}
}
