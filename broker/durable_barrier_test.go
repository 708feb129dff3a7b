package broker

import (
	"testing"
	"time"

	"github.com/warren-mq/warren/queue"
	"github.com/warren-mq/warren/segment"
)

// answerAt is a Sink for one barrier: it records how many deliveries k
// had received when the barrier was answered.
type answerAt struct {
	*durSink
	k  *durSink
	at chan int
}

func (a answerAt) Answer(uint64, Result) {
	a.k.mu.Lock()
	n := len(a.k.got)
	a.k.mu.Unlock()
	a.at <- n
}

// TestDurableBarrierWaitsForApply: a barrier naming a durable queue is
// answered only once everything submitted for the queue before it has
// been applied from the log, as it is for an in-memory queue once it has
// been applied at all. basic.get over AMQP (subscribe, barrier, cancel)
// and passive declares rely on it: on a durable queue the subscription is
// applied a log round later, and the barrier came back first, so a get
// found the queue empty.
func TestDurableBarrierWaitsForApply(t *testing.T) {
	n := openDurNode(t, segment.NewMemFS())
	defer n.close(t)
	b := n.b
	for _, durable := range []bool{false, true} {
		name := map[bool]string{false: "mem", true: "dur"}[durable]
		q := declareDurable(t, b, name, durable)
		k := newDurSink()
		batch := publish(b, q, k, false, "a", "b", "c")
		k.waitFor(t, "the confirm", func() bool { return k.confirmed(batch) })
		at := make(chan int, 1)
		b.Submit(Command{Kind: CmdSubscribe, Queue: q, Sink: k, Spec: queue.ConsumerSpec{ID: b.NewConsumerID(), Owner: 7, Prefetch: 1}, Req: 1})
		b.Submit(Command{Kind: CmdBarrier, Queue: q, Sink: answerAt{durSink: k, k: k, at: at}})
		select {
		case got := <-at:
			if got != 1 {
				t.Errorf("%s queue: the barrier after a subscribe (prefetch 1) to 3 ready messages was answered with %d deliveries made, want 1", name, got)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("%s queue: the barrier was never answered", name)
		}
	}
}

// A barrier waiting for a proposal of this node's is answered when the
// node stops leading the queue (stepDown): a proposal lost with the
// leadership never applies here, so the barrier waited until the node
// led the queue again, and an AMQP passive declare behind it held its
// whole connection.
func TestStepDownAnswersBarriers(t *testing.T) {
	n := openDurNode(t, segment.NewMemFS())
	defer n.close(t)
	q := declareDurable(t, n.b, "sd", true)
	at := make(chan int, 1)
	k := newDurSink()
	done := make(chan struct{})
	left := -1
	q.shard.submit(Command{Kind: cmdPost, post: func() {
		defer close(done)
		// As if a proposal of this node's were in flight: a barrier
		// waits for an apply that will not come.
		q.barriers = append(q.barriers, pendingBarrier{seq: q.applSeq + 1000, sink: answerAt{durSink: k, k: k, at: at}, req: 1})
		s := q.shard
		s.barrierQs = append(s.barrierQs, q)
		s.stepDown(q)
		left = len(q.barriers)
	}})
	<-done
	select {
	case <-at:
	case <-time.After(10 * time.Second):
		t.Fatal("a barrier waiting for a lost proposal was not answered when the node stepped down")
	}
	if left != 0 {
		t.Fatalf("%d barriers left on the queue", left)
	}
}
