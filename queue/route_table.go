package queue

import (
	"reflect"
	"slices"
)

// QueueRef is the caller's id for a queue: Routes stores it and Route
// returns it, so the caller finds the queue without a lookup by name.
type QueueRef uint32

// Routes is the routing topology (exchanges, queues, bindings) kept by one
// writer; the caller serialises its methods. Readers route against the
// immutable snapshots Table returns, any number at once and without locks.
type Routes struct {
	top  *Topology
	refs map[string]QueueRef
	cur  *Table // nil when a change is not in a snapshot yet
}

// NewRoutes returns a topology with no exchanges and no queues.
func NewRoutes() *Routes {
	return &Routes{top: NewTopology(), refs: map[string]QueueRef{}}
}

// AddExchange adds an exchange, or replaces the one of that name (its
// bindings stay).
func (r *Routes) AddExchange(e Exchange) {
	r.top.Exchanges[e.Name] = e
	r.cur = nil
}

// DeleteExchange removes an exchange and the bindings from and to it.
func (r *Routes) DeleteExchange(name string) {
	if _, ok := r.top.Exchanges[name]; !ok {
		return
	}
	delete(r.top.Exchanges, name)
	r.dropBindings(func(b *Binding) bool { return b.Source == name || (b.ToExchange && b.Destination == name) })
}

// AddQueue adds a queue, or gives the one of that name a new ref (its
// bindings stay).
func (r *Routes) AddQueue(name string, ref QueueRef) {
	r.top.Queues[name] = struct{}{}
	r.refs[name] = ref
	r.cur = nil
}

// DeleteQueue removes a queue and the bindings to it.
func (r *Routes) DeleteQueue(name string) {
	if _, ok := r.top.Queues[name]; !ok {
		return
	}
	delete(r.top.Queues, name)
	delete(r.refs, name)
	r.dropBindings(func(b *Binding) bool { return !b.ToExchange && b.Destination == name })
}

func (r *Routes) dropBindings(drop func(*Binding) bool) {
	r.top.Bindings = slices.DeleteFunc(r.top.Bindings, func(b Binding) bool { return drop(&b) })
	r.cur = nil
}

func (r *Routes) exists(b *Binding) bool {
	if _, ok := r.top.Exchanges[b.Source]; !ok {
		return false
	}
	if b.ToExchange {
		_, ok := r.top.Exchanges[b.Destination]
		return ok
	}
	_, ok := r.top.Queues[b.Destination]
	return ok
}

func (r *Routes) find(b *Binding) int {
	return slices.IndexFunc(r.top.Bindings, func(x Binding) bool {
		return x.Source == b.Source && x.Destination == b.Destination && x.ToExchange == b.ToExchange && x.Key == b.Key && reflect.DeepEqual(x.Args, b.Args)
	})
}

// Bind adds a binding. It returns false, changing nothing, when the same
// binding (source, destination, kind, key, args) is there already, or when
// its source or destination does not exist (the caller checks those first).
func (r *Routes) Bind(b Binding) bool {
	if !r.exists(&b) || r.find(&b) >= 0 {
		return false
	}
	r.top.Bindings = append(r.top.Bindings, b)
	r.cur = nil
	return true
}

// Unbind removes a binding; false: there is no such binding.
func (r *Routes) Unbind(b Binding) bool {
	i := r.find(&b)
	if i < 0 {
		return false
	}
	r.top.Bindings = slices.Delete(r.top.Bindings, i, i+1)
	r.cur = nil
	return true
}

// Table returns an immutable snapshot of the routing table, safe for any
// number of concurrent readers; later changes make new snapshots.
func (r *Routes) Table() *Table {
	if r.cur == nil {
		refs := make(map[string]QueueRef, len(r.refs))
		for k, v := range r.refs {
			refs[k] = v
		}
		r.cur = &Table{c: r.top.Compile(), refs: refs}
	}
	return r.cur
}

// Table is an immutable snapshot of Routes.
type Table struct {
	c    *CompiledTable
	refs map[string]QueueRef
}

// Route appends to dst the queues a message published to exchange with
// routingKey and headers (raw table entries, as in wire.Properties.Headers)
// goes to, each once, and returns it. ok is false when the exchange does
// not exist. An empty result means unroutable (the caller returns
// mandatory messages). The default exchange "" routes to the queue named
// by the key.
func (t *Table) Route(dst []QueueRef, exchange string, routingKey, headers []byte) ([]QueueRef, bool) {
	var buf [16]string
	names, ok := t.c.Route(buf[:0], exchange, routingKey, headers)
	for _, n := range names {
		dst = append(dst, t.refs[n])
	}
	return dst, ok
}

// HasExchange reports whether exchange exists (the default always does).
func (t *Table) HasExchange(name string) bool { return t.c.HasExchange(name) }

// IsInternal reports whether exchange is internal (fed only by
// exchange-to-exchange bindings, not by publishers).
func (t *Table) IsInternal(name string) bool { return t.c.IsInternal(name) }

// Queue returns the ref of the queue called name.
func (t *Table) Queue(name string) (QueueRef, bool) {
	ref, ok := t.refs[name]
	return ref, ok
}
