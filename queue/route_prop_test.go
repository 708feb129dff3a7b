package queue

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/warren-mq/warren/wire"
)

// routeModel is the reference for Routes: a Topology compiled whole
// (Topology.Compile) plus the refs, changed by the same rules Routes
// documents (a binding needs its source and destination; deleting an
// exchange or a queue drops the bindings from and to it).
type routeModel struct {
	top  *Topology
	refs map[string]QueueRef
}

func newRouteModel() *routeModel {
	return &routeModel{top: NewTopology(), refs: map[string]QueueRef{}}
}

func sameBinding(a, b *Binding) bool {
	return a.Source == b.Source && a.Destination == b.Destination && a.ToExchange == b.ToExchange && a.Key == b.Key &&
		string(wire.AppendTable(nil, a.Args)) == string(wire.AppendTable(nil, b.Args))
}

func (m *routeModel) bind(b Binding) bool {
	if _, ok := m.top.Exchanges[b.Source]; !ok {
		return false
	}
	if b.ToExchange {
		if _, ok := m.top.Exchanges[b.Destination]; !ok {
			return false
		}
	} else if _, ok := m.top.Queues[b.Destination]; !ok {
		return false
	}
	if slices.ContainsFunc(m.top.Bindings, func(x Binding) bool { return sameBinding(&x, &b) }) {
		return false
	}
	m.top.Bindings = append(m.top.Bindings, b)
	return true
}

func (m *routeModel) unbind(b Binding) bool {
	i := slices.IndexFunc(m.top.Bindings, func(x Binding) bool { return sameBinding(&x, &b) })
	if i < 0 {
		return false
	}
	m.top.Bindings = slices.Delete(m.top.Bindings, i, i+1)
	return true
}

func (m *routeModel) deleteExchange(name string) {
	delete(m.top.Exchanges, name)
	m.top.Bindings = slices.DeleteFunc(m.top.Bindings, func(b Binding) bool {
		return b.Source == name || (b.ToExchange && b.Destination == name)
	})
}

func (m *routeModel) deleteQueue(name string) {
	delete(m.top.Queues, name)
	delete(m.refs, name)
	m.top.Bindings = slices.DeleteFunc(m.top.Bindings, func(b Binding) bool { return !b.ToExchange && b.Destination == name })
}

// compiled is the model's table with its refs (copied: the model changes on).
type compiledModel struct {
	tab  *CompiledTable
	refs map[string]QueueRef
}

func (m *routeModel) compile() compiledModel {
	refs := make(map[string]QueueRef, len(m.refs))
	for k, v := range m.refs {
		refs[k] = v
	}
	return compiledModel{m.top.Compile(), refs}
}

func (c compiledModel) route(exchange string, key, headers []byte) ([]QueueRef, bool) {
	names, ok := c.tab.Route(nil, exchange, key, headers)
	var out []QueueRef
	for _, n := range names {
		out = append(out, c.refs[n])
	}
	slices.Sort(out)
	return out, ok
}

// routeGen draws topology changes and messages over a small name space, so
// that names collide, bindings repeat and chains and cycles form.
type routeGen struct {
	r              *rand.Rand
	routes, routed int // messages checked, and those that reached a queue
}

var (
	propExchanges = []string{"e0", "e1", "e2", "e3", "e4"}
	propQueues    = []string{"q0", "q1", "q2", "q3", "q4", "q5"}
	propKinds     = []wire.ExchangeKind{wire.ExchangeDirect, wire.ExchangeFanout, wire.ExchangeTopic, wire.ExchangeHeaders, wire.ExchangeConsistentHash}
	// Binding keys: words, patterns and consistent-hash weights (valid and not).
	propBindKeys  = []string{"", "a", "b", "a.b", "a.*", "*.b", "#", "#.b", "a.#", "a.#.b", "*", "1", "2", "3", "0", "x"}
	propRouteKeys = []string{"", "a", "b", "a.b", "b.b", "a.b.c", "a.x.b", "1", "2", "user-7", "a..b"}
	propHdrKeys   = []string{"region", "tier", "user"}
)

func (g *routeGen) pick(s []string) string { return s[g.r.IntN(len(s))] }

func (g *routeGen) value() wire.Value {
	switch g.r.IntN(4) {
	case 0:
		return wire.String(g.pick([]string{"eu", "us"}))
	case 1:
		return wire.Int(int64(g.r.IntN(2)))
	case 2:
		return wire.Null()
	default:
		return wire.Bool(g.r.IntN(2) == 0)
	}
}

func (g *routeGen) exchange() Exchange {
	e := Exchange{Name: g.pick(propExchanges), Kind: propKinds[g.r.IntN(len(propKinds))], Internal: g.r.IntN(4) == 0}
	if g.r.IntN(3) == 0 {
		e.Alternate = g.pick(propExchanges)
	}
	if e.Kind == wire.ExchangeConsistentHash && g.r.IntN(2) == 0 {
		e.Args = wire.Table{{Key: "hash-header", Value: wire.String("user")}}
	}
	return e
}

func (g *routeGen) binding() Binding {
	b := Binding{Source: g.pick(propExchanges), Key: g.pick(propBindKeys)}
	if g.r.IntN(4) == 0 {
		b.ToExchange, b.Destination = true, g.pick(propExchanges)
	} else {
		b.Destination = g.pick(propQueues)
	}
	if n := g.r.IntN(4); n > 0 {
		if g.r.IntN(2) == 0 {
			b.Args = append(b.Args, wire.Field{Key: "x-match", Value: wire.String(g.pick([]string{"all", "any"}))})
		}
		for i := 1; i < n; i++ {
			b.Args = append(b.Args, wire.Field{Key: g.pick(propHdrKeys), Value: g.value()})
		}
	}
	return b
}

func (g *routeGen) headers() []byte {
	var h wire.Table
	for i := g.r.IntN(4); i > 0; i-- {
		h = append(h, wire.Field{Key: g.pick(propHdrKeys), Value: g.value()})
	}
	if h == nil {
		return nil
	}
	return wire.AppendTable(nil, h)[4:]
}

// checkRoutes compares tab with the model on every name and on random messages.
func checkRoutes(t *testing.T, g *routeGen, ctx func() string, tab *Table, want compiledModel) {
	t.Helper()
	for _, e := range propExchanges {
		if tab.HasExchange(e) != want.tab.HasExchange(e) || tab.IsInternal(e) != want.tab.IsInternal(e) {
			t.Fatalf("%s: exchange %s: HasExchange %v IsInternal %v, model %v %v", ctx(), e,
				tab.HasExchange(e), tab.IsInternal(e), want.tab.HasExchange(e), want.tab.IsInternal(e))
		}
	}
	for _, q := range propQueues {
		ref, ok := tab.Queue(q)
		wref, wok := want.refs[q]
		if ok != wok || ref != wref {
			t.Fatalf("%s: queue %s: %v %v, model %v %v", ctx(), q, ref, ok, wref, wok)
		}
	}
	dst := make([]QueueRef, 0, 8)
	for i := 0; i < 12; i++ {
		ex := g.pick(propExchanges)
		if i == 0 {
			ex = ""
		}
		key := []byte(g.pick(propRouteKeys))
		if i == 1 {
			key = []byte(g.pick(propQueues))
		}
		hdr := g.headers()
		got, ok := tab.Route(dst[:0], ex, key, hdr)
		got = slices.Clone(got)
		slices.Sort(got)
		exp, wok := want.route(ex, key, hdr)
		g.routes++
		if len(exp) > 0 {
			g.routed++
		}
		if ok != wok || !slices.Equal(got, exp) {
			t.Fatalf("%s: route %q key %q headers %x: got %v %v, model %v %v", ctx(), ex, key, hdr, got, ok, exp, wok)
		}
	}
}

// TestRoutesMatchModel: random sequences of changes over a small name
// space; after each, the Routes table routes random messages exactly as
// the whole-table compilation of the same state (Topology.Compile), and
// every older snapshot still routes as it did when it was taken.
func TestRoutesMatchModel(t *testing.T) {
	seeds, steps := 150, 300
	if raceEnabled {
		seeds = 30
	}
	routes, routed := 0, 0
	defer func() { t.Logf("%d messages checked, %d of them reached a queue", routes, routed) }()
	for seed := 0; seed < seeds; seed++ {
		g := &routeGen{r: rand.New(rand.NewPCG(uint64(seed), 12))}
		r, m := NewRoutes(), newRouteModel()
		type snap struct {
			step int
			tab  *Table
			want compiledModel
		}
		var snaps []snap
		for step := 0; step < steps; step++ {
			var op string
			switch n := g.r.IntN(20); {
			case n < 3:
				e := g.exchange()
				op = fmt.Sprintf("AddExchange(%+v)", e)
				r.AddExchange(e)
				m.top.Exchanges[e.Name] = e
			case n < 4:
				name := g.pick(propExchanges)
				op = "DeleteExchange(" + name + ")"
				r.DeleteExchange(name)
				m.deleteExchange(name)
			case n < 6:
				// Refs are distinct between queues (the caller's ids), and
				// a queue re-added may get a new one.
				qi := g.r.IntN(len(propQueues))
				name, ref := propQueues[qi], QueueRef(qi*1000+g.r.IntN(3))
				op = fmt.Sprintf("AddQueue(%s, %d)", name, ref)
				r.AddQueue(name, ref)
				m.top.Queues[name] = struct{}{}
				m.refs[name] = ref
			case n < 7:
				name := g.pick(propQueues)
				op = "DeleteQueue(" + name + ")"
				r.DeleteQueue(name)
				m.deleteQueue(name)
			case n < 15:
				b := g.binding()
				op = fmt.Sprintf("Bind(%+v)", b)
				if got, want := r.Bind(b), m.bind(b); got != want {
					t.Fatalf("seed %d step %d: %s = %v, model %v", seed, step, op, got, want)
				}
			default:
				b := g.binding()
				if len(m.top.Bindings) > 0 && g.r.IntN(4) > 0 {
					b = m.top.Bindings[g.r.IntN(len(m.top.Bindings))]
				}
				op = fmt.Sprintf("Unbind(%+v)", b)
				if got, want := r.Unbind(b), m.unbind(b); got != want {
					t.Fatalf("seed %d step %d: %s = %v, model %v", seed, step, op, got, want)
				}
			}
			if g.r.IntN(3) == 0 {
				continue // several changes between snapshots, too
			}
			tab, want := r.Table(), m.compile()
			checkRoutes(t, g, func() string {
				return fmt.Sprintf("seed %d step %d, after %s; exchanges %+v; bindings %+v", seed, step, op, m.top.Exchanges, m.top.Bindings)
			}, tab, want)
			if step%10 == 0 {
				snaps = append(snaps, snap{step, tab, want})
			}
		}
		routes, routed = routes+g.routes, routed+g.routed
		for _, s := range snaps {
			checkRoutes(t, g, func() string {
				return fmt.Sprintf("seed %d: the snapshot taken at step %d, after later changes", seed, s.step)
			}, s.tab, s.want)
		}
	}
}

// TestRoutesConcurrentReaders: readers route on published snapshots while
// the writer changes Routes (in place between snapshots) and publishes
// new ones through an atomic pointer, as the broker does. Under -race this
// shows the writer never writes what a reader can see.
func TestRoutesConcurrentReaders(t *testing.T) {
	g := &routeGen{r: rand.New(rand.NewPCG(7, 7))}
	r := NewRoutes()
	var cur atomic.Pointer[Table]
	cur.Store(r.Table())
	done := make(chan struct{})
	var wg sync.WaitGroup
	for range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			dst := make([]QueueRef, 0, 16)
			for i := 0; ; i++ {
				select {
				case <-done:
					return
				default:
				}
				tab := cur.Load()
				for _, ex := range propExchanges {
					dst, _ = tab.Route(dst[:0], ex, []byte(propRouteKeys[i%len(propRouteKeys)]), nil)
				}
			}
		}()
	}
	for step := 0; step < 3000; step++ {
		switch n := g.r.IntN(10); {
		case n < 2:
			r.AddExchange(g.exchange())
		case n < 3:
			qi := g.r.IntN(len(propQueues))
			r.AddQueue(propQueues[qi], QueueRef(qi*1000+g.r.IntN(3)))
		case n < 4:
			if g.r.IntN(4) == 0 {
				r.DeleteExchange(g.pick(propExchanges))
			} else {
				r.DeleteQueue(g.pick(propQueues))
			}
		case n < 8:
			r.Bind(g.binding())
		default:
			r.Unbind(g.binding())
		}
		if g.r.IntN(3) == 0 {
			cur.Store(r.Table())
		}
	}
	close(done)
	wg.Wait()
}
