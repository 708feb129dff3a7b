package netio_test

import (
	"testing"

	"github.com/warren-mq/warren/client"
	"github.com/warren-mq/warren/netio/warrentest"
	"github.com/warren-mq/warren/wire"
)

// TestRetryLoopThroughRejectionIsNotACycle: the classic retry loop — a
// consumer rejects in "work", the message waits out a TTL in "wait" and is
// dead-lettered back to "work" — has a client decision in every lap, so it
// is not a dead-letter cycle (PROTOCOL.md §7.2, queue.DeadLetterCycle) and
// must go round as often as the consumer rejects.
func TestRetryLoopThroughRejectionIsNotACycle(t *testing.T) {
	s := warrentest.StartServer(t, nil)
	ctx := ctxT(t)
	ch := channel(t, dial(t, s))
	must(t, ch.DeclareExchange(ctx, "to-wait", "fanout", client.ExchangeOptions{}))
	must(t, ch.DeclareExchange(ctx, "to-work", "fanout", client.ExchangeOptions{}))
	_, err := ch.DeclareQueue(ctx, "work", client.QueueOptions{Args: wire.Table{{Key: "dead-letter-exchange", Value: wire.String("to-wait")}}})
	must(t, err)
	_, err = ch.DeclareQueue(ctx, "wait", client.QueueOptions{Args: wire.Table{
		{Key: "dead-letter-exchange", Value: wire.String("to-work")}, {Key: "message-ttl", Value: wire.Int(5)}}})
	must(t, err)
	must(t, ch.Bind(ctx, client.Binding{Source: "to-wait", Destination: "wait"}))
	must(t, ch.Bind(ctx, client.Binding{Source: "to-work", Destination: "work"}))

	must(t, ch.Publish(ctx, "", client.Message{RoutingKey: "work", Body: []byte("job")}))
	cs, err := ch.Consume(ctx, "work", client.ConsumeOptions{Prefetch: 1})
	must(t, err)
	for lap := 1; lap <= 3; lap++ {
		t.Logf("lap %d", lap)
		d := recv(t, cs)
		p, err := d.Props()
		must(t, err)
		rejected := 0
		if p != nil {
			for _, x := range p.Deaths {
				if x.Queue == "work" && x.Reason == wire.ReasonRejected {
					rejected = int(x.Count)
				}
			}
		}
		if string(d.Body) != "job" || rejected != lap-1 {
			t.Fatalf("lap %d: body %q, rejected %d times before, want %d", lap, d.Body, rejected, lap-1)
		}
		must(t, d.Reject())
	}
}
