package broker

import (
	"runtime"
	"strconv"
	"testing"

	"github.com/warren-mq/warren/wire"
)

// TestTopologyChangeCostIsLocal: a declare and a bind cost what they
// touch, not the whole topology (issue 12 item 4). Each pair publishes a
// new routing view; the bytes it allocates must not grow with the number
// of queues and bindings already there (a view rebuilt from scratch copies
// every queue and recompiles every binding: 20 times the topology, 20
// times the bytes).
func TestTopologyChangeCostIsLocal(t *testing.T) {
	b := startBroker(t, Config{Shards: 1})
	must := mustFunc(t)
	grow := func(from, to int) {
		// Set up inside one control run: the view is published once.
		b.BeginControlRun()
		for i := from; i < to; i++ {
			name := "q" + strconv.Itoa(i)
			_, err := b.topo.declareQueue(&wire.QueueDeclare{Name: name}, 0, "")
			must(err)
			must(b.topo.bind(&wire.Bind{Source: "amq.topic", Destination: name, RoutingKey: "q." + strconv.Itoa(i)}, Requester{Admin: true}))
		}
		b.EndControlRun(0)
	}
	perPair := func(from int) float64 {
		const pairs = 200
		must(b.Barrier(t.Context()))
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		before := ms.TotalAlloc
		for i := from; i < from+pairs; i++ {
			name := "q" + strconv.Itoa(i)
			_, err := b.DeclareQueue(wire.QueueDeclare{Name: name})
			must(err)
			must(b.Bind(wire.Bind{Source: "amq.topic", Destination: name, RoutingKey: "q." + strconv.Itoa(i)}))
		}
		must(b.Barrier(t.Context())) // the shard's share (the queue machines) counts too
		runtime.ReadMemStats(&ms)
		return float64(ms.TotalAlloc-before) / pairs
	}
	const small, large = 500, 10000
	grow(0, small)
	costSmall := perPair(small)
	grow(small+200, large)
	costLarge := perPair(large + 200)
	t.Logf("bytes allocated per declare+bind: %.0f with %d queues, %.0f with %d", costSmall, small, costLarge, large)
	if costLarge > 2*costSmall+4096 {
		t.Fatalf("a declare+bind allocates %.0f bytes with %d queues bound, %.0f with %d: it costs the whole topology, not what it touches",
			costLarge, large, costSmall, small)
	}
}
