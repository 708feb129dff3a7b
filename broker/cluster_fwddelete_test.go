package broker

import (
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/warren-mq/warren/wire"
	"go.etcd.io/raft/v3/raftpb"
)

// TestClusterForwardedDeleteWaitsForApply: a client's delete of a queue
// that lives on another node is answered only once its deletion is
// applied on the node that proposed it. The metadata entries to that node
// are lost (it cannot apply anything) and its deletions' time is short: a
// delete answered without waiting for the apply ends its control run (or
// its forward) without an error; one that waits fails, saying the
// deletion may still be applied.
//   - done on the asking node for want of an answer from the queue's home
//     (its home lost the forwarded delete: ForwardTimeout ran out), and
//     with no home or leader known: the asking connection's control run
//     waits for it;
//   - forwarded to the queue's home, which proposes it: the home answers
//     once it applied it.
func TestClusterForwardedDeleteWaitsForApply(t *testing.T) {
	c := newTestCluster(t, 3) // ForwardTimeout 2 s
	lead := c.leader()
	f1, f2 := c.nodes[lead.id%3], c.nodes[(lead.id+1)%3] // followers
	for _, name := range []string{"lost", "nolead"} {
		c.declareOn(lead, wire.QueueDeclare{Name: name})
	}
	c.declareOn(f2, wire.QueueDeclare{Name: "athome"})
	for _, nd := range c.nodes {
		c.sees(nd, "queue lost ", "queue nolead ", "queue athome ")
	}
	var noApply atomic.Uint64 // metadata appends to this node are lost
	drop := func(to uint64, m raftpb.Message) bool { return to == noApply.Load() && m.Type == raftpb.MsgApp }
	c.dropMeta.Store(&drop)
	defer c.dropMeta.Store(nil)
	loseW := func(from, to uint64, p []byte) bool { return len(p) > 1 && p[0] == 'c' && p[1] == 'W' }

	// Done on f1: its control run waits for f1 to apply it.
	b1 := f1.b.Load()
	const conn = 1 << 40 // a connection id no test connection has
	for _, name := range []string{"lost", "nolead"} {
		q := b1.topo.lookupQueue(name)
		barrier(t, q.shard) // its shard created it (queued behind the apply sees waited for)
		if !q.remote {
			t.Fatalf("node %d holds a copy of %s", f1.id, name)
		}
		if name == "lost" {
			c.lose.Store(&loseW)
		} else {
			done := make(chan struct{})
			q.shard.submit(Command{Kind: cmdPost, post: func() { q.lead.Store(0); close(done) }})
			<-done // its home not known here
		}
		b1.topo.cl.Load().timeout = 300 * time.Millisecond // read by the shard, handed the delete after
		noApply.Store(f1.id)
		b1.BeginControlRun()
		answer := make(waitSink, 1)
		b1.Submit(Command{Kind: CmdDelete, Queue: q, Sink: answer, Owner: conn, Reason: "queue deleted"})
		err := b1.EndControlRun(conn)
		if r := <-answer; r.Code != wire.OK {
			t.Fatalf("%s: delete answered %+v", name, r)
		}
		if err == nil || !strings.Contains(err.Error(), "may still be applied") {
			t.Fatalf("%s: the control run ended with %v while the deletion could not be applied on its node; want it not applied in time", name, err)
		}
		noApply.Store(0)
		c.lose.Store(nil)
		c.waitFor(fmt.Sprintf("%s gone on node %d", name, f1.id), func() bool { return !hasQueue(f1, name) })
	}

	// Forwarded to f2, its home: answered once f2 applied it.
	hq := f2.b.Load().topo.lookupQueue("athome")
	done := make(chan struct{})
	hq.shard.submit(Command{Kind: cmdPost, post: func() {
		// Read by the shard and by its answer, after.
		f2.b.Load().topo.cl.Load().timeout = 300 * time.Millisecond // under ForwardTimeout: the asking node waits for the answer
		close(done)
	}})
	<-done
	noApply.Store(f2.id)
	q := b1.topo.lookupQueue("athome")
	answer := make(waitSink, 1)
	b1.Submit(Command{Kind: CmdDelete, Queue: q, Sink: answer, Owner: conn, Reason: "queue deleted"})
	if r := <-answer; r.Code != wire.PreconditionFailed || !strings.Contains(r.Reason, "may still be applied") {
		t.Fatalf("a delete forwarded to the queue's home answered %+v while the home could not apply it; want it not applied in time", r)
	}
	noApply.Store(0)
	c.waitFor("athome gone on its home", func() bool { return !hasQueue(f2, "athome") })
}
