package queue

import (
	"fmt"
	"slices"
	"testing"

	"github.com/warren-mq/warren/wire"
)

func routeOf(t *testing.T, tab namedTable, ex, key string, headers wire.Table) []string {
	t.Helper()
	var raw []byte
	if headers != nil {
		raw = wire.AppendTable(nil, headers)[4:]
	}
	out, ok := tab.routeNames(nil, ex, []byte(key), raw)
	if !ok {
		return []string{"<no exchange>"}
	}
	slices.Sort(out)
	return out
}

func topicTable(patterns ...string) namedTable {
	top := NewTopology()
	top.Exchanges["t"] = Exchange{Name: "t", Kind: wire.ExchangeTopic}
	for _, p := range patterns {
		top.Queues[p] = struct{}{}
		top.Bindings = append(top.Bindings, Binding{Source: "t", Destination: p, Key: p})
	}
	return routesFrom(top)
}

func TestTopicMatching(t *testing.T) {
	cases := []struct {
		pattern string
		match   []string
		miss    []string
	}{
		{"a.b", []string{"a.b"}, []string{"a", "a.b.c", "a.c", ""}},
		{"a.*", []string{"a.b", "a."}, []string{"a", "a.b.c"}},
		{"*", []string{"a", ""}, []string{"a.b"}},
		{"#", []string{"", "a", "a.b.c"}, nil},
		{"#.#", []string{"", "a", "a.b.c"}, nil},
		{"a.#", []string{"a", "a.b", "a.b.c"}, []string{"b.a", ""}},
		{"#.b", []string{"b", "a.b", "x.y.b"}, []string{"b.a", "a.b.c"}},
		{"a.#.b", []string{"a.b", "a.x.b", "a.x.y.b"}, []string{"a", "b", "a.b.c"}},
		{"a.*.#", []string{"a.b", "a.b.c"}, []string{"a"}},
		{"*.#.*", []string{"a.b", "a.b.c"}, []string{"a"}},
		{"a..b", []string{"a..b"}, []string{"a.b"}},
		{"", []string{""}, []string{"a"}},
	}
	for _, c := range cases {
		tab := topicTable(c.pattern)
		for _, k := range c.match {
			if got := routeOf(t, tab, "t", k, nil); !slices.Equal(got, []string{c.pattern}) {
				t.Errorf("pattern %q should match key %q", c.pattern, k)
			}
		}
		for _, k := range c.miss {
			if got := routeOf(t, tab, "t", k, nil); len(got) != 0 {
				t.Errorf("pattern %q should not match key %q", c.pattern, k)
			}
		}
	}
	// A queue bound by several matching patterns gets the message once.
	top := NewTopology()
	top.Exchanges["t"] = Exchange{Name: "t", Kind: wire.ExchangeTopic}
	top.Queues["q"] = struct{}{}
	for _, p := range []string{"#", "a.*", "a.b", "#.b"} {
		top.Bindings = append(top.Bindings, Binding{Source: "t", Destination: "q", Key: p})
	}
	if got := routeOf(t, routesFrom(top), "t", "a.b", nil); !slices.Equal(got, []string{"q"}) {
		t.Fatalf("got %v", got)
	}
}

func TestDirectFanoutDefaultAlternate(t *testing.T) {
	top := NewTopology()
	for _, q := range []string{"q1", "q2", "lost"} {
		top.Queues[q] = struct{}{}
	}
	top.Exchanges["d"] = Exchange{Name: "d", Kind: wire.ExchangeDirect, Alternate: "ae"}
	top.Exchanges["f"] = Exchange{Name: "f", Kind: wire.ExchangeFanout}
	top.Exchanges["ae"] = Exchange{Name: "ae", Kind: wire.ExchangeFanout}
	top.Bindings = []Binding{
		{Source: "d", Destination: "q1", Key: "k1"},
		{Source: "d", Destination: "q2", Key: "k1"},
		{Source: "d", Destination: "q2", Key: "k2"},
		{Source: "f", Destination: "q1"},
		{Source: "f", Destination: "q2"},
		{Source: "ae", Destination: "lost"},
		{Source: "d", Destination: "missing-queue", Key: "k3"},
	}
	tab := routesFrom(top)
	check := func(ex, key string, want ...string) {
		t.Helper()
		if got := routeOf(t, tab, ex, key, nil); !slices.Equal(got, want) {
			t.Errorf("%s/%s: got %v, want %v", ex, key, got, want)
		}
	}
	check("d", "k1", "q1", "q2")
	check("d", "k2", "q2")
	check("d", "nope", "lost") // alternate exchange
	check("d", "k3", "lost")   // binding to a missing queue is skipped
	check("f", "anything", "q1", "q2")
	check("", "q1", "q1") // default exchange
	check("", "nope")
	check("nope", "k", "<no exchange>")
}

func TestExchangeToExchangeAndCycles(t *testing.T) {
	top := NewTopology()
	top.Queues["q"] = struct{}{}
	top.Queues["audit"] = struct{}{}
	top.Exchanges["a"] = Exchange{Name: "a", Kind: wire.ExchangeTopic}
	top.Exchanges["b"] = Exchange{Name: "b", Kind: wire.ExchangeFanout}
	top.Exchanges["c"] = Exchange{Name: "c", Kind: wire.ExchangeFanout}
	top.Bindings = []Binding{
		{Source: "a", Destination: "b", ToExchange: true, Key: "order.#"},
		{Source: "b", Destination: "c", ToExchange: true},
		{Source: "c", Destination: "a", ToExchange: true}, // cycle back
		{Source: "c", Destination: "q"},
		{Source: "b", Destination: "audit"},
	}
	tab := routesFrom(top)
	if got := routeOf(t, tab, "a", "order.created", nil); !slices.Equal(got, []string{"audit", "q"}) {
		t.Fatalf("got %v", got)
	}
	if got := routeOf(t, tab, "a", "user.created", nil); len(got) != 0 {
		t.Fatalf("got %v", got)
	}
}

func TestHeadersExchange(t *testing.T) {
	top := NewTopology()
	top.Queues["all"] = struct{}{}
	top.Queues["any"] = struct{}{}
	top.Queues["present"] = struct{}{}
	top.Exchanges["h"] = Exchange{Name: "h", Kind: wire.ExchangeHeaders}
	top.Bindings = []Binding{
		{Source: "h", Destination: "all", Args: wire.Table{{Key: "x-match", Value: wire.String("all")}, {Key: "region", Value: wire.String("eu")}, {Key: "tier", Value: wire.Int(1)}}},
		{Source: "h", Destination: "any", Args: wire.Table{{Key: "x-match", Value: wire.String("any")}, {Key: "region", Value: wire.String("eu")}, {Key: "tier", Value: wire.Int(1)}}},
		{Source: "h", Destination: "present", Args: wire.Table{{Key: "trace", Value: wire.Null()}}},
	}
	tab := routesFrom(top)
	cases := []struct {
		h    wire.Table
		want []string
	}{
		{wire.Table{{Key: "region", Value: wire.String("eu")}, {Key: "tier", Value: wire.Int(1)}}, []string{"all", "any"}},
		{wire.Table{{Key: "region", Value: wire.String("eu")}, {Key: "tier", Value: wire.Int(2)}}, []string{"any"}},
		{wire.Table{{Key: "region", Value: wire.String("us")}, {Key: "trace", Value: wire.Bool(true)}}, []string{"present"}},
		{wire.Table{{Key: "tier", Value: wire.String("1")}}, nil},
		{nil, nil},
	}
	for _, c := range cases {
		got := routeOf(t, tab, "h", "", c.h)
		if !slices.Equal(got, c.want) && !(len(got) == 0 && len(c.want) == 0) {
			t.Errorf("headers %v: got %v, want %v", c.h, got, c.want)
		}
	}
}

func hashTable(queues int, weights map[string]string, header string) namedTable {
	top := NewTopology()
	ex := Exchange{Name: "h", Kind: wire.ExchangeConsistentHash}
	if header != "" {
		ex.Args = wire.Table{{Key: "hash-header", Value: wire.String(header)}}
	}
	top.Exchanges["h"] = ex
	for i := 0; i < queues; i++ {
		q := fmt.Sprintf("q%d", i)
		top.Queues[q] = struct{}{}
		top.Bindings = append(top.Bindings, Binding{Source: "h", Destination: q, Key: weights[q]})
	}
	return routesFrom(top)
}

// TestConsistentHash: one queue per key, stable; adding a queue moves about
// 1/N of the keys; weights skew the split.
func TestConsistentHash(t *testing.T) {
	const keys = 20000
	before, after := hashTable(4, nil, ""), hashTable(5, nil, "")
	moved := 0
	counts := map[string]int{}
	for i := 0; i < keys; i++ {
		k := []byte(fmt.Sprintf("user-%d", i))
		a, _ := before.routeNames(nil, "h", k, nil)
		b, _ := after.routeNames(nil, "h", k, nil)
		if len(a) != 1 || len(b) != 1 {
			t.Fatalf("key %s routed to %v / %v", k, a, b)
		}
		if a[0] != b[0] {
			moved++
			if b[0] != "q4" {
				t.Fatalf("key %s moved between old queues %s → %s", k, a[0], b[0])
			}
		}
		counts[a[0]]++
	}
	frac := float64(moved) / keys
	if frac < 0.12 || frac > 0.28 { // ideal 1/5
		t.Fatalf("adding a 5th queue moved %.3f of keys, want about 0.2", frac)
	}
	for q, n := range counts {
		if share := float64(n) / keys; share < 0.18 || share > 0.32 {
			t.Errorf("%s got %.3f of keys with 4 equal queues", q, share)
		}
	}
	w := hashTable(2, map[string]string{"q0": "3", "q1": "1"}, "")
	n0 := 0
	for i := 0; i < keys; i++ {
		out, _ := w.routeNames(nil, "h", []byte(fmt.Sprintf("k%d", i)), nil)
		if out[0] == "q0" {
			n0++
		}
	}
	if share := float64(n0) / keys; share < 0.68 || share > 0.82 {
		t.Fatalf("weight 3:1 gave q0 %.3f of keys", share)
	}
	// Hashing a header instead of the key.
	hh := hashTable(4, nil, "user")
	hdr := wire.AppendTable(nil, wire.Table{{Key: "user", Value: wire.String("alice")}})[4:]
	a, _ := hh.routeNames(nil, "h", []byte("x"), hdr)
	b, _ := hh.routeNames(nil, "h", []byte("y"), hdr)
	if a[0] != b[0] {
		t.Fatalf("same header value went to %v and %v", a, b)
	}
}

// TestTableImmutable: a compiled table does not change when the topology
// it came from does, so a reader holding it routes consistently while the
// writer compiles the next one.
func TestTableImmutable(t *testing.T) {
	top := NewTopology()
	top.Exchanges["t"] = Exchange{Name: "t", Kind: wire.ExchangeTopic}
	top.Queues["qa"] = struct{}{}
	top.Bindings = append(top.Bindings, Binding{Source: "t", Destination: "qa", Key: "a.*"})
	old := routesFrom(top)
	top.Queues["qb"] = struct{}{}
	top.Bindings[0].Key = "zzz"
	top.Bindings = append(top.Bindings, Binding{Source: "t", Destination: "qb", Key: "a.#"})
	delete(top.Exchanges, "t")
	if got := routeOf(t, old, "t", "a.x", nil); !slices.Equal(got, []string{"qa"}) {
		t.Fatalf("the old table routes a.x to %v after the topology changed, want [qa]", got)
	}
	if got := routeOf(t, routesFrom(top), "t", "a.x", nil); !slices.Equal(got, []string{"<no exchange>"}) {
		t.Fatalf("the new table routes a.x to %v, want no exchange", got)
	}
}

// BenchmarkTopicRoute: 10,000 bindings of the shapes people use.
func BenchmarkTopicRoute(b *testing.B) {
	top := NewTopology()
	top.Exchanges["t"] = Exchange{Name: "t", Kind: wire.ExchangeTopic}
	for i := 0; i < 10000; i++ {
		q := fmt.Sprintf("q%d", i)
		top.Queues[q] = struct{}{}
		var p string
		switch i % 4 {
		case 0:
			p = fmt.Sprintf("order.region%d.created", i)
		case 1:
			p = fmt.Sprintf("order.*.tenant%d", i)
		case 2:
			p = fmt.Sprintf("audit%d.#", i)
		default:
			p = fmt.Sprintf("#.shard%d", i)
		}
		top.Bindings = append(top.Bindings, Binding{Source: "t", Destination: q, Key: p})
	}
	tab := routesFrom(top)
	key := []byte("order.region4.created")
	dst := make([]QueueRef, 0, 16)
	b.ReportAllocs()
	for b.Loop() {
		out, _ := tab.Route(dst[:0], "t", key, nil)
		if len(out) != 1 {
			b.Fatalf("routed to %v", out)
		}
	}
}

// TestAlternateIndependentOfBindingOrder: an exchange hands a message to
// its alternate when none of its bindings leads it to a queue. A binding
// to an exchange that leads the message to queues it already reached by
// another path still takes it, so the result does not depend on the order
// the bindings were made in (it did: e2's alternate was used only when
// e2 was routed after the queues it leads to were reached).
func TestAlternateIndependentOfBindingOrder(t *testing.T) {
	for _, e2First := range []bool{false, true} {
		top := NewTopology()
		for _, q := range []string{"q1", "q3", "lost"} {
			top.Queues[q] = struct{}{}
		}
		top.Exchanges["e3"] = Exchange{Name: "e3", Kind: wire.ExchangeFanout}
		top.Exchanges["e2"] = Exchange{Name: "e2", Kind: wire.ExchangeFanout, Alternate: "ae"}
		top.Exchanges["ae"] = Exchange{Name: "ae", Kind: wire.ExchangeFanout}
		toE2 := Binding{Source: "e3", Destination: "e2", ToExchange: true}
		top.Bindings = []Binding{
			{Source: "e3", Destination: "q1"}, {Source: "e3", Destination: "q3"},
			{Source: "e2", Destination: "q1"}, {Source: "e2", Destination: "q3"},
			{Source: "ae", Destination: "lost"},
		}
		if e2First {
			top.Bindings = append([]Binding{toE2}, top.Bindings...)
		} else {
			top.Bindings = append(top.Bindings, toE2)
		}
		for _, tab := range []struct {
			name  string
			route func() []string
		}{
			{"compiled", func() []string {
				out, _ := top.Compile().Route(nil, "e3", nil, nil)
				slices.Sort(out)
				return out
			}},
			{"routes", func() []string { return routeOf(t, routesFrom(top), "e3", "", nil) }},
		} {
			if got := tab.route(); !slices.Equal(got, []string{"q1", "q3"}) {
				t.Errorf("%s, binding to e2 made first %v: routed to %v, want [q1 q3] (e2 leads to both: its alternate is not used)", tab.name, e2First, got)
			}
		}
	}
}
