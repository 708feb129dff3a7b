package broker

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/warren-mq/warren/segment"
)

// TestDeletedDurableQueuesAreClosedAtRunTime: deleting a durable queue
// closes its raft group on its shard's worker and removes its log (and
// snapshot) while the node runs, so declaring and deleting durable queues
// in a loop holds neither memory (open groups) nor disk (log groups) for
// the deleted ones.
func TestDeletedDurableQueuesAreClosedAtRunTime(t *testing.T) {
	n := openDurNode(t, segment.NewMemFS())
	defer n.close(t)
	const queues = 1000
	k := newDurSink()
	for i := range queues {
		name := fmt.Sprintf("dq%d", i)
		q := declareDurable(t, n.b, name, true)
		if i%10 == 0 { // some with entries (and bodies) in their log
			batch := publish(n.b, q, k, true, "a", "b")
			k.waitFor(t, "the confirm", func() bool { return k.confirmed(batch) })
		}
		if _, err := n.b.DeleteQueue(t.Context(), name, false, false); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	if err := n.b.waitGroupRemovals(ctx); err != nil {
		t.Fatal(err)
	}
	open := 0
	for _, sh := range n.b.shards {
		done := make(chan int, 1)
		sh.submit(Command{Kind: cmdPost, post: func() { done <- sh.rw.Groups() + len(sh.openedGrps) }})
		select {
		case c := <-done:
			open += c
		case <-ctx.Done():
			t.Fatal(ctx.Err())
		}
	}
	logged := 0
	for _, gid := range n.log.Groups() {
		if gid >= QueueGroupBase {
			logged++
		}
	}
	if open != 0 || logged != 0 {
		t.Fatalf("after declaring and deleting %d durable queues: %d groups still open on the workers, %d queue groups still in the log; want 0 and 0",
			queues, open, logged)
	}
}
