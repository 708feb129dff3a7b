package netio_test

import (
	"fmt"
	"sync"
	"testing"

	"github.com/warren-mq/warren/client"
	"github.com/warren-mq/warren/netio"
	"github.com/warren-mq/warren/netio/warrentest"
)

// TestQueueDeletesWithMetaLog: with a data directory, QUEUE_DELETEs
// pipelined on one connection (several in one control run, whose end
// waits for each queue's shard to answer and then for the deletions to
// be on disk: the broker's TestMetaLogDeleteAnsweredAfterDurable holds
// the fsync) are each answered once, with the count of messages the
// queue held, and the queues are gone when they are.
func TestQueueDeletesWithMetaLog(t *testing.T) {
	s := warrentest.StartServer(t, &netio.Config{DataDir: t.TempDir()})
	ctx := ctxT(t)
	ch := channel(t, dial(t, s))
	const n = 16
	for i := range n {
		name := fmt.Sprintf("dd%d", i)
		_, err := ch.DeclareQueue(ctx, name, client.QueueOptions{Durable: true})
		must(t, err)
		for range i % 3 {
			must(t, ch.Publish(ctx, "", client.Message{RoutingKey: name, Persistent: true, Body: []byte("x")}))
		}
	}
	must(t, ch.WaitConfirms(ctx))
	var wg sync.WaitGroup
	errs := make([]error, n)
	counts := make([]uint64, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			counts[i], errs[i] = ch.DeleteQueue(ctx, fmt.Sprintf("dd%d", i), false, false)
		}()
	}
	wg.Wait()
	for i := range n {
		if errs[i] != nil || counts[i] != uint64(i%3) {
			t.Errorf("delete dd%d: %d messages, %v; want %d", i, counts[i], errs[i], i%3)
		}
		if s.Broker.LookupQueue(fmt.Sprintf("dd%d", i)) != nil {
			t.Errorf("queue dd%d still there after its delete was answered", i)
		}
	}
}
