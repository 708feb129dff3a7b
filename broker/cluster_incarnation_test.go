package broker

import (
	"testing"

	"github.com/warren-mq/warren/wire"
)

// TestClusterClockBackForwards: a node restarted with its clock an hour
// back (its data directory kept) has its forwarded publishes confirmed by
// the queue's leader at once: its incarnation is above its first life's
// (incarnation.go), so the leader does not take them for an earlier
// life's; and its non-durable queue of the first life is dropped, as at
// any restart, not left declared as one of a later life.
func TestClusterClockBackForwards(t *testing.T) {
	c, lead, other := rqCluster(t, 1)
	pub := func(what string) {
		t.Helper()
		ob := other.b.Load()
		c.sees(other, "queue rq durable=true")
		k := newDurSink()
		batch := publish(ob, ob.topo.lookupQueue("rq"), k, true, what+"1", what+"2")
		k.waitFor(t, what+"'s confirm", func() bool { return k.confirmed(batch) })
		for i, code := range batch.Codes {
			if code != 0 {
				t.Fatalf("%s: message %d nacked: %d", what, i, code)
			}
		}
	}
	pub("first life")
	if _, err := other.b.Load().DeclareQueueAs(&wire.QueueDeclare{Name: "nq"}, 0, ""); err != nil {
		t.Fatal(err)
	}
	for _, nd := range c.nodes {
		c.sees(nd, "queue nq ")
	}
	first := other.b.Load().IncarnationMs()
	c.stop(other)
	other.backMs = 3_600_000
	c.start(other, nil)
	if c.queueLeader("rq") != lead {
		t.Skip("the leadership moved as the node restarted")
	}
	if inc := other.b.Load().IncarnationMs(); inc <= first {
		t.Fatalf("incarnation %d after the clock went back, first life's %d", inc, first)
	}
	pub("second life")
	for _, nd := range c.nodes {
		c.waitFor("the first life's queue dropped", func() bool { return !hasQueue(nd, "nq") })
	}
}
