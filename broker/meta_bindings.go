package broker

import (
	"strconv"

	"github.com/warren-mq/warren/queue"
	"github.com/warren-mq/warren/wire"
)

// bindSet is the bindings of one exchange or queue: a short list (most
// queues have one or two), a map by key once it grows, so removing one
// costs O(1) however many there are.
type bindSet struct {
	list []*metaBinding
	m    map[string]*metaBinding
}

const bindSetListMax = 8

func (s *bindSet) add(b *metaBinding) {
	if s.m == nil && len(s.list) < bindSetListMax {
		s.list = append(s.list, b)
		return
	}
	if s.m == nil {
		s.m = make(map[string]*metaBinding, 2*bindSetListMax)
		for _, x := range s.list {
			s.m[x.key] = x
		}
		s.list = nil
	}
	s.m[b.key] = b
}

func (s *bindSet) remove(key string) {
	if s.m != nil {
		delete(s.m, key)
		return
	}
	for i, x := range s.list {
		if x.key == key {
			last := len(s.list) - 1
			s.list[i], s.list[last] = s.list[last], nil
			s.list = s.list[:last]
			return
		}
	}
}

func (s *bindSet) len() int { return len(s.list) + len(s.m) }

// all copies the set (its members are unlinked while it is walked).
func (s *bindSet) all() []*metaBinding {
	out := append([]*metaBinding(nil), s.list...)
	for _, b := range s.m {
		out = append(out, b)
	}
	return out
}

func (m *Meta) bind(c *MetaCommand) (MetaResult, []MetaEffect) {
	b := &c.Bind
	src, ok := m.exchanges[b.Source]
	if !ok {
		if LocalName(b.Source) == "" {
			return refuse(wire.NotAllowed, "the default exchange cannot be bound"), nil
		}
		return refuse(wire.NotFound, "no exchange "+strconv.Quote(b.Source)), nil
	}
	if b.ToExchange {
		if _, ok := m.exchanges[b.Destination]; !ok {
			return refuse(wire.NotFound, "no exchange "+strconv.Quote(b.Destination)), nil
		}
	} else if _, ok := m.queues[b.Destination]; !ok {
		return refuse(wire.NotFound, "no queue "+strconv.Quote(b.Destination)), nil
	}
	if !b.Unbind && src.decl.Kind == wire.ExchangeHeaders {
		if err := checkXMatch(b.Args); err != nil {
			return refuseErr(err), nil
		}
	}
	nb := queue.Binding{Source: b.Source, Destination: b.Destination, ToExchange: b.ToExchange, Key: b.RoutingKey, Args: normArgs(b.Args)}
	key := bindKey(nb)
	old := m.bindings[key]
	if b.Unbind {
		if old == nil {
			return refuse(wire.NotFound, "no such binding"), nil
		}
		if r, ok := allowed(c, old.by, "unbind", "the binding from "+strconv.Quote(nb.Source)+" to "+strconv.Quote(nb.Destination)); !ok {
			return r, nil
		}
		m.unlink(old)
		return MetaResult{}, []MetaEffect{{Kind: EffBindingRemoved, Binding: old.b}}
	}
	if old != nil {
		return MetaResult{}, nil
	}
	if len(m.bindings) >= m.limits.MaxBindings {
		return limitReason("binding", len(m.bindings), "max_bindings", "max-bindings"), nil
	}
	m.link(&metaBinding{key: key, b: nb, by: c.User})
	return MetaResult{}, []MetaEffect{{Kind: EffBindingAdded, Binding: nb}}
}

func (m *Meta) destIndex(b *queue.Binding) map[string]*bindSet {
	if b.ToExchange {
		return m.byExDest
	}
	return m.byQueue
}

func addIndex(ix map[string]*bindSet, name string, b *metaBinding) {
	s := ix[name]
	if s == nil {
		s = &bindSet{}
		ix[name] = s
	}
	s.add(b)
}

func dropIndex(ix map[string]*bindSet, name, key string) {
	if s := ix[name]; s != nil {
		s.remove(key)
		if s.len() == 0 {
			delete(ix, name)
		}
	}
}

// unlinkAll unlinks every binding of a set (nil: none).
func (m *Meta) unlinkAll(s *bindSet) {
	if s == nil {
		return
	}
	for _, b := range s.all() {
		m.unlink(b)
	}
}

func (m *Meta) link(b *metaBinding) {
	m.bindings[b.key] = b
	addIndex(m.bySource, b.b.Source, b)
	addIndex(m.destIndex(&b.b), b.b.Destination, b)
}

func (m *Meta) unlink(b *metaBinding) {
	delete(m.bindings, b.key)
	dropIndex(m.bySource, b.b.Source, b.key)
	dropIndex(m.destIndex(&b.b), b.b.Destination, b.key)
}
