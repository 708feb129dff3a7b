package broker

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/warren-mq/warren/wire"
	"go.etcd.io/raft/v3/raftpb"
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
	c.tagging() // a change lost so is proposed again only as a version 3 entry
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

// TestClusterChangeLostUnderSameLeader: a declare whose proposal is lost
// on its way to the metadata leader, which stays leader, is answered as
// not applied in time; the node's next declare does not wait behind it
// (it is answered with its queue), and the lost declare is never applied,
// not even after a change of leader (which used to propose it again: a
// queue the client was told may not exist, or deleted since, coming
// back). A queue deletion lost so is answered as not applied in time,
// holds up no later sync of the node's changes, and is proposed again
// at the change of leader.
func TestClusterChangeLostUnderSameLeader(t *testing.T) {
	lp := newLostProposal(t)
	c, lead, fb, cl := lp.c, lp.lead, lp.fb, lp.cl
	// The lost changes' answers. Read by this goroutine's requests and
	// by the shard a delete is handed to (after it is set).
	cl.timeout = 500 * time.Millisecond
	lp.dropping.Store(true)
	if _, err := fb.DeclareQueueAs(&wire.QueueDeclare{Name: "lost"}, 0, ""); err == nil || !strings.Contains(err.Error(), "may still be applied") {
		t.Fatalf("the lost declare: %v", err)
	}
	cl.timeout = 20 * time.Second
	start := time.Now()
	if q, err := fb.DeclareQueueAs(&wire.QueueDeclare{Name: "next"}, 0, ""); err != nil || q.Name() != "next" {
		t.Fatalf("the next declare: %v, %v", q, err)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Fatalf("the next declare answered after %v: it waited behind the lost one", d) // milliseconds when it does not
	}
	if _, err := fb.DeclareQueueAs(&wire.QueueDeclare{Name: "gone"}, 0, ""); err != nil {
		t.Fatal(err)
	}
	cl.timeout = 500 * time.Millisecond
	lp.dropping.Store(true)
	if _, err := fb.DeleteQueue(t.Context(), "gone", false, false); err == nil || !strings.Contains(err.Error(), "may still be applied") {
		t.Fatalf("the lost delete: %v", err)
	}
	cl.timeout = 20 * time.Second
	start = time.Now()
	if err := fb.MetaSync(t.Context()); err != nil {
		t.Fatalf("a sync after the lost delete: %v", err)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Fatalf("a sync after the lost delete answered after %v: it waited for it", d)
	}
	if st, _ := fb.MetaStatus(); st.Leader != lead.id {
		t.Fatalf("leader %d, want %d still", st.Leader, lead.id)
	}
	// A change of leader: the lost entries are known lost.
	to := c.nodes[(lead.id+1)%3]
	if _, err := lead.b.Load().MetaGroup().TransferLeadership(t.Context(), to.id); err != nil {
		t.Fatal(err)
	}
	c.waitFor("the node following the new leader", func() bool {
		st, _ := fb.MetaStatus()
		return st.Leader == to.id
	})
	// The node's next change comes after anything it proposes again.
	if _, err := fb.DeclareQueueAs(&wire.QueueDeclare{Name: "after"}, 0, ""); err != nil {
		t.Fatal(err)
	}
	for _, nd := range c.nodes {
		c.sees(nd, "queue next", "queue after")
		if s := topoSummary(nd.b.Load()); strings.Contains(s, "queue lost") {
			t.Fatalf("node %d applied the declare answered as lost:\n%s", nd.id, s)
		}
		c.waitFor(fmt.Sprintf("node %d applying the deletion proposed again", nd.id), func() bool {
			return !strings.Contains(topoSummary(nd.b.Load()), "queue gone")
		})
	}
}

// TestClusterMixedVersions: a cluster upgraded one node at a time. Node 3
// plays a build before metadata entry version 3 (its hello names no
// features, and such an entry sent to it fails the test, as that build
// stops at it): the other two write version 2 entries, and declares on
// every node are applied on every node. Restarted as this build (its
// hello says it reads them), the cluster writes version 3 entries, and
// keeps working.
func TestClusterMixedVersions(t *testing.T) {
	c := newTestClusterWith(t, 3, func(c *testCluster) { c.oldBuild[3].Store(true) })
	c.leader()
	n3 := c.nodes[2]
	c.waitFor("nodes 1 and 2 heard node 3's hello", func() bool {
		for _, nd := range c.nodes[:2] {
			if nd.b.Load().origins.known(3) == 0 {
				return false
			}
		}
		return true
	})
	for _, nd := range c.nodes {
		if _, err := nd.b.Load().DeclareQueueAs(&wire.QueueDeclare{Name: fmt.Sprintf("q%d", nd.id), Durable: true}, 0, ""); err != nil {
			t.Fatalf("declare on node %d: %v", nd.id, err)
		}
	}
	for _, nd := range c.nodes {
		c.sees(nd, "queue q1 durable=true", "queue q2 durable=true", "queue q3 durable=true")
	}
	if n := c.v3Entries.Load(); n != 0 {
		t.Fatalf("%d version 3 entries sent with an older build among the members", n)
	}

	c.stop(n3)
	c.oldBuild[3].Store(false)
	c.start(n3, nil)
	c.tagging()
	for _, nd := range c.nodes {
		if _, err := nd.b.Load().DeclareQueueAs(&wire.QueueDeclare{Name: fmt.Sprintf("r%d", nd.id), Durable: true}, 0, ""); err != nil {
			t.Fatalf("declare on node %d after the upgrade: %v", nd.id, err)
		}
	}
	for _, nd := range c.nodes {
		c.sees(nd, "queue q3 durable=true", "queue r1 durable=true", "queue r2 durable=true", "queue r3 durable=true")
	}
	if c.v3Entries.Load() == 0 {
		t.Fatal("no version 3 entry once every member reads them")
	}
}

// TestClusterLostDeletionHoldsUpOnlyItsRequester: a queue deletion whose
// proposal is lost on its way to a metadata leader that stays leader is
// waited for by the request that asked for it only. Another connection's
// control run on the node (a declare) ends at once and without an error
// (it used to wait until the lost deletion's time ran out and then fail,
// closing that connection); the asking connection's control run fails,
// saying the deletion may still be applied; a deletion no request asked
// for (auto-delete, expiry, an exclusive owner gone) holds up no one.
func TestClusterLostDeletionHoldsUpOnlyItsRequester(t *testing.T) {
	lp := newLostProposal(t)
	c, lead, fb, cl := lp.c, lp.lead, lp.fb, lp.cl
	// The lost deletions' time (read by the shard, which is handed the
	// delete after it is set).
	cl.timeout = 2 * time.Second
	for _, name := range []string{"gone", "auto"} {
		if _, err := fb.DeclareQueueAs(&wire.QueueDeclare{Name: name}, 0, ""); err != nil {
			t.Fatal(err)
		}
	}
	const asker, other = 1 << 40, 1<<40 + 1 // connection ids no test connection has
	otherRun := func() {
		t.Helper()
		fb.BeginControlRun()
		_, err := fb.DeclareQueueAs(&wire.QueueDeclare{Name: "other"}, 0, "")
		start := time.Now()
		if serr := fb.EndControlRun(other); err == nil {
			err = serr
		}
		if err != nil {
			t.Fatalf("another connection's control run: %v", err)
		}
		if d := time.Since(start); d > time.Second {
			t.Fatalf("another connection's control run ended after %v: it waited for the lost deletion", d) // milliseconds when it does not
		}
	}

	// A connection's delete, lost.
	lp.dropping.Store(true)
	q := fb.LookupQueue("gone")
	w := make(waitSink, 1)
	fb.Submit(Command{Kind: CmdDelete, Queue: q, Sink: w, Owner: asker, Reason: "queue deleted"})
	if r := <-w; r.Err() != nil {
		t.Fatal(r.Err())
	}
	<-lp.dropped
	otherRun()
	if err := fb.EndControlRun(asker); err == nil || !strings.Contains(err.Error(), "may still be applied") {
		t.Fatalf("the asking connection's control run: %v, want the deletion not applied in time, may still be", err)
	}

	// A deletion no request asked for, lost (as auto-delete, expiry and
	// an exclusive owner's close propose it).
	lp.dropping.Store(true)
	aq := fb.LookupQueue("auto")
	if !fb.topo.removeQueue(aq, 0) {
		t.Fatal("queue auto not removed")
	}
	<-lp.dropped
	otherRun()
	fb.BeginControlRun()
	if err := fb.EndControlRun(asker); err != nil {
		t.Fatalf("the asking connection's next control run: %v", err)
	}
	// Both are proposed again at the next change of leader.
	to := c.nodes[(lead.id+1)%3]
	if _, err := lead.b.Load().MetaGroup().TransferLeadership(t.Context(), to.id); err != nil {
		t.Fatal(err)
	}
	for _, nd := range c.nodes {
		c.waitFor(fmt.Sprintf("node %d applying the deletions proposed again", nd.id), func() bool {
			s := topoSummary(nd.b.Load())
			return !strings.Contains(s, "queue gone") && !strings.Contains(s, "queue auto")
		})
	}
}

// lostProposal is the setup of the tests of a lost change: a 3-node
// cluster writing version 3 metadata entries (tagging), its metadata
// leader lead, and a follower f whose next proposal (MsgProp) to lead is
// lost each time dropping is set; each loss is signalled on dropped
// (buffered 1; a signal nobody took leaves it full, and later ones go
// unsignalled).
type lostProposal struct {
	c        *testCluster
	lead, f  *clusterNode
	fb       *Broker // f's
	cl       *metaCluster
	dropping atomic.Bool // f's next proposal is lost
	dropped  chan struct{}
}

func newLostProposal(t *testing.T) *lostProposal {
	c := newTestCluster(t, 3)
	c.tagging()
	lead := c.leader()
	f := c.nodes[lead.id%3]
	fb := f.b.Load()
	lp := &lostProposal{c: c, lead: lead, f: f, fb: fb, cl: fb.topo.cl.Load(), dropped: make(chan struct{}, 1)}
	drop := func(to uint64, m raftpb.Message) bool {
		if to == lead.id && m.From == f.id && m.Type == raftpb.MsgProp && lp.dropping.CompareAndSwap(true, false) {
			select {
			case lp.dropped <- struct{}{}:
			default:
			}
			return true
		}
		return false
	}
	c.dropMeta.Store(&drop)
	return lp
}
