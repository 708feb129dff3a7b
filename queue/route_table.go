package queue

import (
	"encoding/binary"
	"slices"
	"strconv"
	"strings"

	"github.com/warren-mq/warren/wire"
)

// QueueRef is the caller's id for a queue: Routes stores it and Route
// returns it, so the caller finds the queue without a lookup by name.
type QueueRef uint32

// Routes is the routing topology (exchanges, queues, bindings) kept by one
// writer; the caller serialises its methods. Readers route against the
// immutable snapshots Table returns, any number at once and without locks.
//
// Every change costs what it touches: the routing structures are
// persistent maps (pmap) whose updates copy O(log n) nodes, and bindings
// between exchanges and alternates are followed by name when routing, so
// changing an exchange never touches the exchanges that lead to it.
// Deleting a queue or an exchange costs O(log n) per binding it drops.
// Table is O(1).
//
// A binding needs its source and its destination: Bind refuses one whose
// source or destination does not exist, and deleting an exchange or a
// queue drops the bindings from and to it. "" is the default exchange:
// routing to it goes to the queue named by the routing key, and an
// Alternate of "" means none.
type Routes struct {
	tab Table  // the current version
	cur *Table // the last snapshot handed out; nil after a change
	// edit marks what was made since the last snapshot: changed in place
	// by the next changes (no reader has it), frozen by Table.
	edit *pedit
	exs  map[string]*exBook
	qs   map[string]*qBook
}

// exBook is the writer's record of an exchange: its current routing
// structure and its bindings, by identity (bindingID).
type exBook struct {
	rx  *rex
	out map[string]*bindRec // bindings from this exchange
	in  inList              // exchange-to-exchange bindings to it
	// weights counts, for a consistent-hash exchange, the destinations
	// with each summed weight (so hashEqual is len(weights) ≤ 1).
	weights map[float64]int
}

type qBook struct {
	ref QueueRef
	in  inList // bindings to this queue
}

// inList lists the bindings to a queue or exchange: a slice, not a map
// (most queues have one or two bindings, and a map costs hundreds of
// bytes); each binding knows its index, so removal is O(1).
type inList []*bindRec

func (l *inList) add(rec *bindRec) {
	rec.inIdx = len(*l)
	*l = append(*l, rec)
}

func (l *inList) remove(rec *bindRec) {
	s := *l
	last := s[len(s)-1]
	s[rec.inIdx], last.inIdx = last, rec.inIdx
	s[len(s)-1] = nil
	*l = s[:len(s)-1]
}

type bindRec struct {
	b     Binding
	id    string
	inIdx int // in its destination's inList
}

// NewRoutes returns a topology with no exchanges and no queues.
func NewRoutes() *Routes {
	return &Routes{exs: map[string]*exBook{}, qs: map[string]*qBook{}, edit: &pedit{}}
}

// AddExchange adds an exchange, or replaces the one of that name: its
// bindings stay (re-read under the new kind if the kind changed, which
// costs O(its bindings)).
func (r *Routes) AddExchange(e Exchange) {
	r.cur = nil
	bk := r.exs[e.Name]
	if bk == nil {
		bk = &exBook{rx: newRex(e, r.edit), out: map[string]*bindRec{}}
		r.exs[e.Name] = bk
		r.putEx(bk)
		return
	}
	if bk.rx.Kind == e.Kind {
		rx := r.editable(bk.rx)
		rx.Exchange, rx.hashHdr = e, hashHeader(e)
		bk.rx = rx
		r.putEx(bk)
		return
	}
	bk.rx, bk.weights = newRex(e, r.edit), nil
	for _, rec := range bk.out {
		r.apply(bk, rec, r.destOf(&rec.b), true)
	}
	r.putEx(bk)
}

// DeleteExchange removes an exchange and the bindings from and to it.
func (r *Routes) DeleteExchange(name string) {
	bk := r.exs[name]
	if bk == nil {
		return
	}
	r.cur = nil
	for _, rec := range bk.out {
		r.inOf(&rec.b).remove(rec) // those to itself too
	}
	for _, rec := range bk.in {
		src := r.exs[rec.b.Source]
		r.apply(src, rec, dest{name: name, ex: true}, false)
		delete(src.out, rec.id)
		r.putEx(src)
	}
	delete(r.exs, name)
	r.tab.exchanges = r.tab.exchanges.del(r.edit, hashName(name), name)
}

// AddQueue adds a queue, or gives the one of that name a new ref (its
// bindings stay and lead to the new ref; O(its bindings)).
func (r *Routes) AddQueue(name string, ref QueueRef) {
	qb := r.qs[name]
	if qb == nil {
		r.qs[name] = &qBook{ref: ref}
	} else if qb.ref == ref {
		return
	} else {
		qb.ref = ref
		for _, rec := range qb.in {
			src := r.exs[rec.b.Source]
			r.apply(src, rec, dest{name: name}, false)
			r.apply(src, rec, dest{name: name, ref: ref}, true)
			r.putEx(src)
		}
	}
	r.cur = nil
	r.tab.queues = r.tab.queues.set(r.edit, hashName(name), name, ref)
}

// DeleteQueue removes a queue and the bindings to it.
func (r *Routes) DeleteQueue(name string) {
	qb := r.qs[name]
	if qb == nil {
		return
	}
	r.cur = nil
	for _, rec := range qb.in {
		src := r.exs[rec.b.Source]
		r.apply(src, rec, dest{name: name, ref: qb.ref}, false)
		delete(src.out, rec.id)
		r.putEx(src)
	}
	delete(r.qs, name)
	r.tab.queues = r.tab.queues.del(r.edit, hashName(name), name)
}

// Bind adds a binding. It returns false, changing nothing, when the same
// binding (source, destination, kind, key, args) is there already, or when
// its source or destination does not exist (the caller checks those
// first). Routes keeps its own copy of b.
func (r *Routes) Bind(b Binding) bool {
	src := r.exs[b.Source]
	if src == nil {
		return false
	}
	var in *inList
	if b.ToExchange {
		dx := r.exs[b.Destination]
		if dx == nil {
			return false
		}
		in = &dx.in
	} else {
		q := r.qs[b.Destination]
		if q == nil {
			return false
		}
		in = &q.in
	}
	id := bindingID(&b)
	if _, dup := src.out[id]; dup {
		return false
	}
	b.Args = cloneTable(b.Args)
	rec := &bindRec{b: b, id: id}
	src.out[id] = rec
	in.add(rec)
	r.apply(src, rec, r.destOf(&rec.b), true)
	r.putEx(src)
	r.cur = nil
	return true
}

// Unbind removes a binding; false: there is no such binding.
func (r *Routes) Unbind(b Binding) bool {
	src := r.exs[b.Source]
	if src == nil {
		return false
	}
	id := bindingID(&b)
	rec := src.out[id]
	if rec == nil {
		return false
	}
	r.inOf(&rec.b).remove(rec)
	delete(src.out, id)
	r.apply(src, rec, r.destOf(&rec.b), false)
	r.putEx(src)
	r.cur = nil
	return true
}

// Table returns an immutable snapshot of the routing table, safe for any
// number of concurrent readers; later changes make new snapshots and leave
// this one as it is. O(1).
func (r *Routes) Table() *Table {
	if r.cur == nil {
		t := r.tab
		r.cur = &t
		r.edit = &pedit{} // what t holds is frozen from now on
	}
	return r.cur
}

// inOf returns the list of bindings to an existing binding's destination.
func (r *Routes) inOf(b *Binding) *inList {
	if b.ToExchange {
		return &r.exs[b.Destination].in
	}
	return &r.qs[b.Destination].in
}

// destOf returns where an existing binding leads.
func (r *Routes) destOf(b *Binding) dest {
	if b.ToExchange {
		return dest{name: b.Destination, ex: true}
	}
	return dest{name: b.Destination, ref: r.qs[b.Destination].ref}
}

func (r *Routes) putEx(bk *exBook) {
	r.tab.exchanges = r.tab.exchanges.set(r.edit, hashName(bk.rx.Name), bk.rx.Name, bk.rx)
}

// apply adds (or removes) one binding's route to (or from) its source's
// routing structure: a new rex sharing all it did not change.
func (r *Routes) apply(bk *exBook, rec *bindRec, d dest, add bool) {
	ed := r.edit
	rx := r.editable(bk.rx)
	b := &rec.b
	switch rx.Kind {
	case wire.ExchangeDirect:
		h := hashName(b.Key)
		s, _ := rx.direct.get(h, b.Key)
		if s = s.change(ed, d, add, 0); s.m.len() == 0 {
			rx.direct = rx.direct.del(ed, h, b.Key)
		} else {
			rx.direct = rx.direct.set(ed, h, b.Key, s)
		}
	case wire.ExchangeFanout:
		rx.dests = rx.dests.change(ed, d, add, 0)
	case wire.ExchangeTopic:
		rx.topic = rx.topic.change(ed, topicWords(b.Key), d, add)
	case wire.ExchangeHeaders:
		h := hashName(rec.id)
		if add {
			rx.headers = rx.headers.set(ed, h, rec.id, newHeaderBinding(b, d))
		} else {
			rx.headers = rx.headers.del(ed, h, rec.id)
		}
	case wire.ExchangeConsistentHash:
		w, ok := bindingWeight(b.Key)
		if !ok {
			return // not a weight: the binding routes nothing
		}
		h, k := d.hash(), d.key()
		before, _ := rx.dests.m.get(h, k)
		rx.dests = rx.dests.change(ed, d, add, w)
		after, _ := rx.dests.m.get(h, k)
		if bk.weights == nil {
			bk.weights = map[float64]int{}
		}
		if before.n > 0 {
			if bk.weights[before.weight]--; bk.weights[before.weight] == 0 {
				delete(bk.weights, before.weight)
			}
		}
		if after.n > 0 {
			bk.weights[after.weight]++
		}
		rx.hashEqual = len(bk.weights) <= 1
	default:
		return // an unknown kind routes nothing
	}
	bk.rx = rx
}

// bindingWeight parses a consistent-hash binding key: an integer ≥ 1,
// empty meaning 1.
func bindingWeight(key string) (float64, bool) {
	if key == "" {
		return 1, true
	}
	w, err := strconv.Atoi(key)
	if err != nil || w < 1 {
		return 0, false
	}
	return float64(w), true
}

// bindingID identifies a binding as Bind and Unbind compare them: source,
// destination, kind, key and encoded args, each length-prefixed.
func bindingID(b *Binding) string {
	buf := make([]byte, 0, 16+len(b.Source)+len(b.Destination)+len(b.Key))
	buf = binary.AppendUvarint(buf, uint64(len(b.Source)))
	buf = append(buf, b.Source...)
	buf = binary.AppendUvarint(buf, uint64(len(b.Destination)))
	buf = append(buf, b.Destination...)
	if b.ToExchange {
		buf = append(buf, 1)
	} else {
		buf = append(buf, 0)
	}
	buf = binary.AppendUvarint(buf, uint64(len(b.Key)))
	buf = append(buf, b.Key...)
	buf = wire.AppendTable(buf, b.Args)
	return string(buf)
}

// cloneTable copies a table deeply enough that the caller may reuse the
// original's byte slices.
func cloneTable(t wire.Table) wire.Table {
	if t == nil {
		return nil
	}
	c := slices.Clone(t)
	for i := range c {
		if c[i].Value.Bytes != nil {
			c[i].Value.Bytes = slices.Clone(c[i].Value.Bytes)
		}
	}
	return c
}

func hashHeader(e Exchange) string {
	if e.Kind == wire.ExchangeConsistentHash {
		if v, ok := e.Args.Get("hash-header"); ok && v.Kind == wire.KindString {
			return string(v.Bytes)
		}
	}
	return ""
}

func newRex(e Exchange, ed *pedit) *rex {
	return &rex{Exchange: e, hashHdr: hashHeader(e), hashEqual: true, edit: ed}
}

// editable returns x if it was made since the last snapshot (no reader
// has it), else a copy of it that is.
func (r *Routes) editable(x *rex) *rex {
	if x.edit == r.edit {
		return x
	}
	c := *x
	c.edit = r.edit
	return &c
}

func newHeaderBinding(b *Binding, d dest) rheader {
	hb := rheader{d: d}
	for _, f := range b.Args {
		if f.Key == "x-match" {
			hb.any = f.Value.Kind == wire.KindString && string(f.Value.Bytes) == "any"
			continue
		}
		if strings.HasPrefix(f.Key, "x-") {
			continue
		}
		hb.match = append(hb.match, f)
	}
	return hb
}

// topicWords splits a binding pattern into words ('.'-separated; empty
// words count), consecutive "#" words counting as one (they match the
// same keys), as the compiled trie does.
func topicWords(pattern string) []string {
	words := strings.Split(pattern, ".")
	out := words[:0]
	for _, w := range words {
		if w == "#" && len(out) > 0 && out[len(out)-1] == "#" {
			continue
		}
		out = append(out, w)
	}
	return out
}
