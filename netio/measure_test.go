package netio_test

import (
	"os"
	"testing"

	"github.com/warren-mq/warren/client"
	"github.com/warren-mq/warren/netio"
	"github.com/warren-mq/warren/netio/warrentest"
)

// TestMeasureMessageOverhead measures the Go heap a stored message costs
// beyond its bytes (WARREN_MEASURE=1; see StoredMsgOverhead).
func TestMeasureMessageOverhead(t *testing.T) {
	if os.Getenv("WARREN_MEASURE") == "" {
		t.Skip("WARREN_MEASURE=1 measures the per-message heap cost")
	}
	for _, tc := range []struct {
		name   string
		queues int
		batch  int
	}{{"1 queue, batches of 100", 1, 100}, {"2 queues, batches of 100", 2, 100}, {"1 queue, batches of 1", 1, 1}} {
		s := warrentest.StartServer(t, &netio.Config{QueueSoftLimit: -1})
		ctx := ctxT(t)
		ch := channel(t, dial(t, s))
		must(t, ch.DeclareExchange(ctx, "fan", "fanout", client.ExchangeOptions{}))
		for i := 0; i < tc.queues; i++ {
			name := string(rune('a' + i))
			ch.DeclareQueue(ctx, name, client.QueueOptions{})
			must(t, ch.Bind(ctx, client.Binding{Source: "fan", Destination: name}))
		}
		const n = 200_000
		msgs := make([]client.Message, tc.batch)
		for i := range msgs {
			msgs[i] = client.Message{RoutingKey: "k"}
		}
		must(t, ch.PublishBatch(ctx, "fan", msgs)) // warm up
		before := liveHeap()
		for i := 0; i < n/tc.batch; i++ {
			if tc.batch == 1 {
				if _, err := ch.PublishAsync(ctx, "fan", msgs[0]); err != nil {
					t.Fatal(err)
				}
				continue
			}
			must(t, ch.PublishBatch(ctx, "fan", msgs))
		}
		must(t, ch.WaitConfirms(ctx))
		after := liveHeap()
		t.Logf("%s: %d bytes of heap per message (%d messages)", tc.name, (after-before)/n, n)
	}
}
