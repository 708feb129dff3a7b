package broker

import (
	"strconv"
	"sync"
	"testing"

	"github.com/warren-mq/warren/queue"
	"github.com/warren-mq/warren/wire"
)

// BenchmarkRouteTopic100k: what a publish costs in routing on the broker's
// read path, with 100,000 queues each bound to a topic exchange (key
// q.<i>): load the view, route one key, resolve the refs to queues (make
// bench-topology; the target is under 1 µs and no allocation).
func BenchmarkRouteTopic100k(b *testing.B) {
	br := routeBenchBroker(b)
	keys := make([][]byte, 1024)
	for i := range keys {
		keys[i] = []byte("q." + strconv.Itoa(i*97))
	}
	var dst []queue.QueueRef
	found := 0
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		v := br.View()
		dst, _ = v.Table.Route(dst[:0], "t", keys[i&1023], nil)
		for _, ref := range dst {
			if v.Queue(ref) != nil {
				found++
			}
		}
	}
	if found != b.N {
		b.Fatalf("%d of %d routed to their queue", found, b.N)
	}
}

var (
	routeBenchOnce sync.Once
	routeBench     *Broker
)

// routeBenchBroker is a broker with 100,000 queues bound to the topic
// exchange "t", built once per test binary (the benchmark function runs
// several times; the broker is never stopped).
func routeBenchBroker(b *testing.B) *Broker {
	routeBenchOnce.Do(func() {
		const n = 100_000
		br := New(Config{Shards: 4})
		br.Start()
		if err := br.DeclareExchange(wire.ExchangeDeclare{Name: "t", Kind: wire.ExchangeTopic}); err != nil {
			panic(err)
		}
		br.BeginControlRun()
		for i := 0; i < n; i++ {
			name := "q" + strconv.Itoa(i)
			if _, err := br.topo.declareQueue(&wire.QueueDeclare{Name: name}, 0, ""); err != nil {
				panic(err)
			}
			if err := br.topo.bind(&wire.Bind{Source: "t", Destination: name, RoutingKey: "q." + strconv.Itoa(i)}, Requester{Admin: true}); err != nil {
				panic(err)
			}
		}
		br.EndControlRun(0)
		routeBench = br
	})
	return routeBench
}
