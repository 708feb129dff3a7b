package broker

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/warren-mq/warren/segment"
	"github.com/warren-mq/warren/wire"
)

// holdSink holds its shard in Answer until release is closed.
type holdSink struct {
	waitSink
	entered chan struct{}
	release chan struct{}
}

func (k holdSink) Answer(uint64, Result) {
	close(k.entered)
	<-k.release
}

// TestMetaLogDeleteAnsweredAfterDurable: a queue delete's answer (the
// shard's, given once it has proposed the deletion) is given while the
// control run is open, and the run's end (after which a connection sends
// its replies) waits for that answer and then for the deletion to be on
// disk: it does not end while the deletion's fsync is held, and a crash
// right after it ends keeps the queue deleted. The shard is held while
// the run goes to its end, so the run has to wait for the shard's answer
// (found by reading: the end only waited for what had been proposed
// when it began, so a delete-ok could go out before the deletion reached
// the disk). The shard answers while the fsync is held: it does not
// wait for the disk.
func TestMetaLogDeleteAnsweredAfterDurable(t *testing.T) {
	mem := segment.NewMemFS()
	hfs := newHoldFS(mem)
	n := openMetaNode(t, hfs, 0)
	var released bool
	unhold := func() {
		if !released {
			released = true
			hfs.held.Store(false)
			close(hfs.release)
		}
	}
	defer func() {
		unhold()
		n.close(t)
	}()
	if _, err := n.b.DeclareQueue(wire.QueueDeclare{Name: "dq", Durable: true}); err != nil {
		t.Fatal(err)
	}
	q := n.b.LookupQueue("dq")
	hold := holdSink{waitSink: make(waitSink, 1), entered: make(chan struct{}), release: make(chan struct{})}
	n.b.Submit(Command{Kind: CmdBarrier, Queue: q, Sink: hold})
	<-hold.entered // the queue's shard is held

	hfs.held.Store(true)
	const conn = 7
	n.b.BeginControlRun()
	answer := make(waitSink, 1)
	n.b.Submit(Command{Kind: CmdDelete, Queue: q, Sink: answer, Owner: conn, Reason: "queue deleted"})
	ended := make(chan error, 1)
	go func() { ended <- n.b.EndControlRun(conn) }()
	close(hold.release)

	<-hfs.entered // an fsync (the deletion's) is held
	var r Result
	select {
	case r = <-answer:
	case <-time.After(10 * time.Second):
		t.Fatal("the shard did not answer the delete while the fsync was held")
	}
	if r.Code != wire.OK {
		t.Fatalf("delete answered %+v", r)
	}
	select {
	case err := <-ended:
		t.Fatalf("the control run ended (%v) while the deletion's fsync was held: its delete-ok would go out before the deletion is durable", err)
	default:
	}
	unhold()
	if err := <-ended; err != nil {
		t.Fatal(err)
	}
	crashed := mem.Crash(0)
	n.close(t)
	n = openMetaNode(t, crashed, 0)
	if got := topoSummary(n.b); strings.Contains(got, "queue dq") {
		t.Fatalf("a queue whose delete was answered came back after a crash:\n%s", got)
	}
}

// TestEndControlRunNotHeldByStoppedShards: a run's end does not wait for
// the answer to a delete its shard will never run (the broker stopped).
func TestEndControlRunNotHeldByStoppedShards(t *testing.T) {
	b := New(Config{Shards: 1})
	b.Start()
	if _, err := b.DeclareQueue(wire.QueueDeclare{Name: "q"}); err != nil {
		t.Fatal(err)
	}
	q := b.LookupQueue("q")
	if err := b.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	b.BeginControlRun()
	b.Submit(Command{Kind: CmdDelete, Queue: q, Sink: make(waitSink, 1), Owner: 7})
	if err := b.EndControlRun(7); err != nil {
		t.Fatal(err)
	}
}

// TestClusterDeleteRunEndsOnceApplied: in a cluster, a connection's
// control run that deleted a queue ends (and its delete-ok goes out) only
// once the deletion is applied on its node, though the queue's shard
// proposed it only after the run went to its end.
func TestClusterDeleteRunEndsOnceApplied(t *testing.T) {
	c := newTestCluster(t, 3)
	lead := c.leader()
	f := c.nodes[lead.id%3] // a follower
	fb := f.b.Load()
	if _, err := fb.DeclareQueueAs(&wire.QueueDeclare{Name: "gone"}, 0, ""); err != nil {
		t.Fatal(err)
	}
	q := fb.LookupQueue("gone")
	hold := holdSink{waitSink: make(waitSink, 1), entered: make(chan struct{}), release: make(chan struct{})}
	fb.Submit(Command{Kind: CmdBarrier, Queue: q, Sink: hold})
	<-hold.entered // the queue's shard is held

	const conn = 1 << 40 // a connection id no test connection has
	fb.BeginControlRun()
	answer := make(waitSink, 1)
	fb.Submit(Command{Kind: CmdDelete, Queue: q, Sink: answer, Owner: conn, Reason: "queue deleted"})
	ended := make(chan error, 1)
	go func() { ended <- fb.EndControlRun(conn) }()
	close(hold.release)
	if err := <-ended; err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-answer:
		if r.Code != wire.OK {
			t.Fatalf("delete answered %+v", r)
		}
	default:
		t.Fatal("the control run ended before the queue's shard answered its delete")
	}
	if s := topoSummary(fb); strings.Contains(s, "queue gone") {
		t.Fatalf("the control run ended before its deletion was applied on its node:\n%s", s)
	}
}
