package queue

import (
	"fmt"
	"strconv"
	"testing"

	"github.com/warren-mq/warren/wire"
)

// bigTopic returns Routes with a topic exchange "t" and n queues "q.<i>"
// (ref i), each bound with its own name as key, plus a few pattern
// bindings: "q.*" and "#.audit" to queue q.0, "#.7" to q.1.
func bigTopic(n int) *Routes {
	r := NewRoutes()
	r.AddExchange(Exchange{Name: "t", Kind: wire.ExchangeTopic})
	for i := 0; i < n; i++ {
		q := "q." + strconv.Itoa(i)
		r.AddQueue(q, QueueRef(i))
		r.Bind(Binding{Source: "t", Destination: q, Key: q})
	}
	r.Bind(Binding{Source: "t", Destination: "q.0", Key: "q.*"})
	r.Bind(Binding{Source: "t", Destination: "q.0", Key: "#.audit"})
	r.Bind(Binding{Source: "t", Destination: "q.1", Key: "#.7"})
	return r
}

// TestRoutesChangeCostIndependentOfSize: on a topic exchange and a
// consistent-hash exchange with 100,000 bindings each (20,000 under
// -race), one change and the Table() after it
// allocate a bounded number of objects (what a path through the persistent
// maps copies), not one per binding or queue as a whole recompilation does.
func TestRoutesChangeCostIndependentOfSize(t *testing.T) {
	n := 100_000
	if raceEnabled {
		n = 20_000
	}
	r := bigTopic(n)
	// And a consistent-hash exchange over all the queues (before Routes, a
	// binding there rebuilt its whole list of destinations).
	r.AddExchange(Exchange{Name: "h", Kind: wire.ExchangeConsistentHash})
	for q := 0; q < n; q++ {
		r.Bind(Binding{Source: "h", Destination: "q." + strconv.Itoa(q)})
	}
	const maxAllocs = 64 // O(log n) nodes per change; a recompilation is O(n)
	i := 0
	for _, c := range []struct {
		what   string
		change func()
	}{
		{"bind", func() { i++; r.Bind(Binding{Source: "t", Destination: "q.5", Key: "new." + strconv.Itoa(i)}) }},
		{"unbind", func() { i--; r.Unbind(Binding{Source: "t", Destination: "q.5", Key: "new." + strconv.Itoa(i+1)}) }},
		{"add queue and bind it", func() {
			i++
			q := "extra." + strconv.Itoa(i)
			r.AddQueue(q, QueueRef(n+i))
			r.Bind(Binding{Source: "t", Destination: q, Key: q})
		}},
		{"delete queue", func() { r.DeleteQueue("extra." + strconv.Itoa(i)); i-- }},
		{"add exchange and bind it", func() {
			i++
			r.AddExchange(Exchange{Name: "x." + strconv.Itoa(i), Kind: wire.ExchangeFanout})
			r.Bind(Binding{Source: "x." + strconv.Itoa(i), Destination: "q.3"})
			r.Bind(Binding{Source: "t", Destination: "x." + strconv.Itoa(i), ToExchange: true, Key: "x." + strconv.Itoa(i)})
		}},
		{"delete exchange", func() { r.DeleteExchange("x." + strconv.Itoa(i)); i-- }},
		{"bind to the consistent-hash exchange", func() {
			i++
			q := "extra." + strconv.Itoa(i)
			r.AddQueue(q, QueueRef(n+i))
			r.Bind(Binding{Source: "h", Destination: q, Key: "2"})
		}},
		{"unbind from the consistent-hash exchange", func() {
			r.Unbind(Binding{Source: "h", Destination: "extra." + strconv.Itoa(i), Key: "2"})
			r.DeleteQueue("extra." + strconv.Itoa(i))
			i--
		}},
	} {
		allocs := testing.AllocsPerRun(20, func() {
			c.change()
			r.Table()
		})
		t.Logf("%s + Table() at %d bindings: %.0f allocations", c.what, n, allocs)
		if allocs > maxAllocs {
			t.Errorf("%s + Table() at %d bindings: %.0f allocations, want at most %d (independent of the number of bindings)", c.what, n, allocs, maxAllocs)
		}
	}
	// The table still routes: the changes above were undone.
	out, _ := r.Table().Route(nil, "t", []byte("q.77"), nil)
	if len(out) != 2 {
		t.Fatalf("q.77 routed to %v, want q.77 and q.0 (q.*)", out)
	}
}

// bigTopicModel is bigTopic's state as a Topology (the compiled table's
// input, and what the broker recompiled on every change before Routes).
func bigTopicModel(n int) *Topology {
	top := NewTopology()
	top.Exchanges["t"] = Exchange{Name: "t", Kind: wire.ExchangeTopic}
	for i := 0; i < n; i++ {
		q := "q." + strconv.Itoa(i)
		top.Queues[q] = struct{}{}
		top.Bindings = append(top.Bindings, Binding{Source: "t", Destination: q, Key: q})
	}
	top.Bindings = append(top.Bindings, Binding{Source: "t", Destination: "q.0", Key: "q.*"},
		Binding{Source: "t", Destination: "q.0", Key: "#.audit"}, Binding{Source: "t", Destination: "q.1", Key: "#.7"})
	return top
}

// BenchmarkTopicRoute100k: a publish through a topic exchange with 100,000
// bindings (one per queue, plus "*" and "#" patterns), two queues matched;
// Routes and the compiled table in the same run (benchstat -col /impl).
func BenchmarkTopicRoute100k(b *testing.B) {
	key := []byte("q.12345")
	b.Run("impl=compiled", func(b *testing.B) {
		tab := bigTopicModel(100_000).Compile()
		dst := make([]string, 0, 16)
		b.ReportAllocs()
		for b.Loop() {
			if out, _ := tab.Route(dst[:0], "t", key, nil); len(out) != 2 {
				b.Fatalf("routed to %v", out)
			}
		}
	})
	b.Run("impl=routes", func(b *testing.B) {
		tab := bigTopic(100_000).Table()
		dst := make([]QueueRef, 0, 16)
		b.ReportAllocs()
		for b.Loop() {
			if out, _ := tab.Route(dst[:0], "t", key, nil); len(out) != 2 {
				b.Fatalf("routed to %v", out)
			}
		}
	})
}

// BenchmarkBind100k: one new binding on a topic exchange with 100,000
// bindings, and the table that publishes it: Routes.Bind + Table(), and
// before Routes, appending to the Topology + Compile() (what the broker's
// publishLocked did on every change).
func BenchmarkBind100k(b *testing.B) {
	b.Run("impl=compiled", func(b *testing.B) {
		top := bigTopicModel(100_000)
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			i++
			top.Bindings = append(top.Bindings, Binding{Source: "t", Destination: "q.5", Key: "new." + strconv.Itoa(i)})
			top.Compile()
		}
	})
	b.Run("impl=routes", func(b *testing.B) {
		r := bigTopic(100_000)
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			i++
			if !r.Bind(Binding{Source: "t", Destination: "q.5", Key: "new." + strconv.Itoa(i)}) {
				b.Fatal("not bound")
			}
			r.Table()
		}
	})
}

// BenchmarkRoute compares Routes with the whole compiled table (the
// reference model, and what the broker used before) on the same run:
// benchstat -col /impl. Each exchange kind at a typical size.
func BenchmarkRoute(b *testing.B) {
	type setup struct {
		name    string
		top     *Topology
		ex, key string
		headers []byte
		want    int
	}
	mk := func(kind wire.ExchangeKind, queues int, bind func(i int, q string) Binding) *Topology {
		top := NewTopology()
		top.Exchanges["x"] = Exchange{Name: "x", Kind: kind}
		for i := 0; i < queues; i++ {
			q := fmt.Sprintf("queue-%d", i)
			top.Queues[q] = struct{}{}
			top.Bindings = append(top.Bindings, bind(i, q))
		}
		return top
	}
	hdr := wire.AppendTable(nil, wire.Table{{Key: "region", Value: wire.String("eu")}, {Key: "tier", Value: wire.Int(3)}})[4:]
	setups := []setup{
		{name: "direct", top: mk(wire.ExchangeDirect, 100, func(i int, q string) Binding {
			return Binding{Source: "x", Destination: q, Key: fmt.Sprintf("key-%d", i)}
		}), ex: "x", key: "key-42", want: 1},
		{name: "fanout", top: mk(wire.ExchangeFanout, 10, func(i int, q string) Binding {
			return Binding{Source: "x", Destination: q}
		}), ex: "x", key: "k", want: 10},
		{name: "headers", top: mk(wire.ExchangeHeaders, 10, func(i int, q string) Binding {
			return Binding{Source: "x", Destination: q, Args: wire.Table{{Key: "region", Value: wire.String("eu")}, {Key: "tier", Value: wire.Int(int64(i))}}}
		}), ex: "x", headers: hdr, want: 1},
		{name: "hash", top: mk(wire.ExchangeConsistentHash, 10, func(i int, q string) Binding {
			return Binding{Source: "x", Destination: q}
		}), ex: "x", key: "user-42", want: 1},
		{name: "hash-weighted", top: mk(wire.ExchangeConsistentHash, 10, func(i int, q string) Binding {
			return Binding{Source: "x", Destination: q, Key: strconv.Itoa(1 + i%3)}
		}), ex: "x", key: "user-42", want: 1},
		{name: "topic", top: mk(wire.ExchangeTopic, 100, func(i int, q string) Binding {
			return Binding{Source: "x", Destination: q, Key: fmt.Sprintf("order.%d.*", i)}
		}), ex: "x", key: "order.42.created", want: 1},
		{name: "default", top: mk(wire.ExchangeDirect, 100, func(i int, q string) Binding {
			return Binding{Source: "x", Destination: q}
		}), ex: "", key: "queue-42", want: 1},
	}
	for _, s := range setups {
		key := []byte(s.key)
		b.Run("kind="+s.name+"/impl=compiled", func(b *testing.B) {
			tab := s.top.Compile()
			dst := make([]string, 0, 16)
			b.ReportAllocs()
			for b.Loop() {
				if out, _ := tab.Route(dst[:0], s.ex, key, s.headers); len(out) != s.want {
					b.Fatalf("routed to %v", out)
				}
			}
		})
		b.Run("kind="+s.name+"/impl=routes", func(b *testing.B) {
			tab := routesFrom(s.top).Table
			dst := make([]QueueRef, 0, 16)
			b.ReportAllocs()
			for b.Loop() {
				if out, _ := tab.Route(dst[:0], s.ex, key, s.headers); len(out) != s.want {
					b.Fatalf("routed to %v", out)
				}
			}
		})
	}
}
