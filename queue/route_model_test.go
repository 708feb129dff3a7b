package queue

// The reference model of routing: the table compiled whole from a
// Topology, as the broker did before Routes (Topology.Compile on every
// change). Routes is tested against it (route_prop_test.go), and so are
// the routing semantics (route_test.go, hash_test.go).

import (
	"cmp"
	"math"
	"slices"
	"strconv"
	"strings"

	"github.com/cespare/xxhash/v2"
	"github.com/warren-mq/warren/wire"
)

// Topology is the state a CompiledTable is compiled from: exchanges,
// queues and bindings, in the order they were made. Bindings whose source
// or destination does not exist are skipped when compiling.
type Topology struct {
	Exchanges map[string]Exchange
	Queues    map[string]struct{}
	Bindings  []Binding
}

// NewTopology returns a topology with no exchanges and no queues.
func NewTopology() *Topology {
	return &Topology{Exchanges: map[string]Exchange{}, Queues: map[string]struct{}{}}
}

type cdest struct {
	name string
	ex   *compiled // non-nil for an exchange-to-exchange binding
}

type headerBinding struct {
	d cdest
	headerMatch
}

// hashDest is one destination of a consistent-hash exchange: its summed
// binding weight and a hash of its name, the per-destination half of the
// rendezvous score.
type hashDest struct {
	d      cdest
	seed   uint64
	weight float64
}

type compiled struct {
	Exchange
	alt *compiled

	direct  map[string][]cdest
	fanout  []cdest
	topic   *topicNode
	headers []headerBinding
	hashed  []hashDest // sorted by name (then queue before exchange)
	// hashEqual: every destination has the same weight, so the largest
	// u wins and no logarithm is needed.
	hashEqual bool
	hashHdr   string
}

// CompiledTable is an immutable routing table compiled whole from a
// Topology: the reference model Routes is tested against.
type CompiledTable struct {
	exchanges map[string]*compiled
	queues    map[string]struct{}
}

// Compile builds the routing table for t. Bindings to exchanges or queues
// that do not exist are skipped.
func (t *Topology) Compile() *CompiledTable {
	tab := &CompiledTable{exchanges: map[string]*compiled{}, queues: map[string]struct{}{}}
	for q := range t.Queues {
		tab.queues[q] = struct{}{}
	}
	for name, ex := range t.Exchanges {
		c := &compiled{Exchange: ex}
		switch ex.Kind {
		case wire.ExchangeDirect:
			c.direct = map[string][]cdest{}
		case wire.ExchangeTopic:
			c.topic = &topicNode{}
		case wire.ExchangeConsistentHash:
			if v, ok := ex.Args.Get("hash-header"); ok && v.Kind == wire.KindString {
				c.hashHdr = string(v.Bytes)
			}
		}
		tab.exchanges[name] = c
	}
	for _, c := range tab.exchanges {
		c.alt = tab.exchanges[c.Alternate]
	}
	for _, b := range t.Bindings {
		src := tab.exchanges[b.Source]
		if src == nil {
			continue
		}
		d := cdest{name: b.Destination}
		if b.ToExchange {
			if d.ex = tab.exchanges[b.Destination]; d.ex == nil {
				continue
			}
		} else if _, ok := tab.queues[b.Destination]; !ok {
			continue
		}
		switch src.Kind {
		case wire.ExchangeDirect:
			src.direct[b.Key] = appendDest(src.direct[b.Key], d)
		case wire.ExchangeFanout:
			src.fanout = appendDest(src.fanout, d)
		case wire.ExchangeTopic:
			src.topic.insert(b.Key, d)
		case wire.ExchangeHeaders:
			hb := headerBinding{d: d}
			for _, f := range b.Args {
				if f.Key == "x-match" {
					hb.any = f.Value.Kind == wire.KindString && string(f.Value.Bytes) == "any"
					continue
				}
				if len(f.Key) >= 2 && f.Key[:2] == "x-" {
					continue
				}
				hb.match = append(hb.match, f)
			}
			src.headers = append(src.headers, hb)
		case wire.ExchangeConsistentHash:
			w, err := strconv.Atoi(b.Key)
			if b.Key == "" {
				w, err = 1, nil
			}
			if err != nil || w < 1 {
				continue
			}
			src.addHashed(d, w)
		}
	}
	for _, c := range tab.exchanges {
		slices.SortFunc(c.hashed, func(a, b hashDest) int {
			if a.d.name != b.d.name {
				return cmp.Compare(a.d.name, b.d.name)
			}
			return cmp.Compare(a.seed, b.seed)
		})
		c.hashEqual = true
		for _, h := range c.hashed {
			c.hashEqual = c.hashEqual && h.weight == c.hashed[0].weight
		}
	}
	return tab
}

// addHashed adds weight w for d to a consistent-hash exchange; bindings of
// the same destination add up.
func (c *compiled) addHashed(d cdest, w int) {
	for i := range c.hashed {
		if c.hashed[i].d == d {
			c.hashed[i].weight += float64(w)
			return
		}
	}
	seed := xxhash.Sum64String(d.name)
	if d.ex != nil {
		seed = xxhash.Sum64String("exchange\x00" + d.name)
	}
	c.hashed = append(c.hashed, hashDest{d: d, seed: seed, weight: float64(w)})
}

// pickHashed chooses the destination for key hash h by weighted rendezvous
// hashing: each destination i scores w_i / -ln(u_i), u_i uniform in (0, 1)
// drawn from h and the destination's name, and the highest score wins. So
// destination i wins with probability exactly w_i / Σw, whatever the names,
// and a destination joining takes only the keys it now wins (w_new/Σw of
// them); no key moves between the others. O(destinations), no allocation.
// The score is floating point: this is a pure function of the table and
// the key (no queue state holds a float), computed with math.Log; two
// scores closer than its rounding error are vanishingly rare.
func (c *compiled) pickHashed(h uint64) cdest {
	if c.hashEqual { // equal weights: the largest u (so the largest x) wins
		best, bestX := 0, fmix64(h^c.hashed[0].seed)
		for i := 1; i < len(c.hashed); i++ {
			if x := fmix64(h ^ c.hashed[i].seed); x > bestX { // ties: the first by name
				best, bestX = i, x
			}
		}
		return c.hashed[best].d
	}
	best, bestScore := 0, -1.0
	for i := range c.hashed {
		x := fmix64(h ^ c.hashed[i].seed)
		u := (float64(x>>11) + 0.5) / (1 << 53) // in (0, 1)
		if s := c.hashed[i].weight / -math.Log(u); s > bestScore {
			best, bestScore = i, s
		}
	}
	return c.hashed[best].d
}

func appendDest(ds []cdest, d cdest) []cdest {
	for _, x := range ds {
		if x == d {
			return ds
		}
	}
	return append(ds, d)
}

// Route appends to dst the queues a message published to exchange with
// routingKey and headers (raw table entries, as in wire.Properties.Headers)
// goes to, each once, and returns it. ok is false when the exchange does
// not exist. An empty result means unroutable (the caller returns
// mandatory messages). The default exchange "" routes to the queue named
// by the key. Route allocates nothing once dst has room.
func (t *CompiledTable) Route(dst []string, exchange string, routingKey []byte, headers []byte) (out []string, ok bool) {
	if exchange == "" {
		if _, found := t.queues[string(routingKey)]; found {
			dst = append(dst, string(routingKey))
		}
		return dst, true
	}
	c := t.exchanges[exchange]
	if c == nil {
		return dst, false
	}
	var visited [maxExchangeHops]*compiled
	start := len(dst)
	dst, _ = c.route(dst, start, routingKey, headers, visited[:0])
	return dst, true
}

// HasExchange reports whether exchange exists (the default always does).
func (t *CompiledTable) HasExchange(name string) bool {
	_, ok := t.exchanges[name]
	return ok || name == ""
}

// IsInternal reports whether exchange is internal (fed only by
// exchange-to-exchange bindings, not by publishers).
func (t *CompiledTable) IsInternal(name string) bool {
	c := t.exchanges[name]
	return c != nil && c.Internal
}

// HasQueue reports whether a queue exists.
func (t *CompiledTable) HasQueue(name string) bool { _, ok := t.queues[name]; return ok }

// route appends the queues c routes the message to; reached reports
// whether one of c's bindings led it to a queue (one it had reached by
// another path counts: c's alternate is used only when no binding takes
// the message, whatever order they are walked in).
func (c *compiled) route(dst []string, start int, key, headers []byte, visited []*compiled) (out []string, reached bool) {
	if slices.Contains(visited, c) || len(visited) == cap(visited) {
		return dst, false // a cycle, or too deep
	}
	visited = append(visited, c)
	add := func(d cdest) {
		if d.ex != nil {
			var r bool
			dst, r = d.ex.route(dst, start, key, headers, visited)
			reached = reached || r
			return
		}
		reached = true
		if !slices.Contains(dst[start:], d.name) {
			dst = append(dst, d.name)
		}
	}
	switch c.Kind {
	case wire.ExchangeDirect:
		for _, d := range c.direct[string(key)] {
			add(d)
		}
	case wire.ExchangeFanout:
		for _, d := range c.fanout {
			add(d)
		}
	case wire.ExchangeTopic:
		var m topicMatcher
		m.split(key)
		m.match(c.topic, 0, func(d cdest) { add(d) })
	case wire.ExchangeHeaders:
		for i := range c.headers {
			if c.headers[i].matches(headers) {
				add(c.headers[i].d)
			}
		}
	case wire.ExchangeConsistentHash:
		if len(c.hashed) > 0 {
			hk := key
			if c.hashHdr != "" {
				hk = headerBytes(headers, c.hashHdr)
			}
			add(c.pickHashed(xxhash.Sum64(hk)))
		}
	}
	if !reached && c.alt != nil {
		dst, reached = c.alt.route(dst, start, key, headers, visited)
	}
	return dst, reached
}

// topicNode is one level of the topic trie: a binding pattern's words are a
// path from the root; "*" and "#" have their own edges.
type topicNode struct {
	words map[string]*topicNode
	star  *topicNode // "*": exactly one word
	hash  *topicNode // "#": zero or more words
	dests []cdest
}

// insert adds a binding pattern. Words are split on '.', empty words count
// ("a..b" has three words; "" is one empty word). Consecutive "#" words are
// one "#" (they match the same keys), which also keeps matching polynomial.
func (n *topicNode) insert(pattern string, d cdest) {
	prev := ""
	for _, w := range strings.Split(pattern, ".") {
		if w == "#" && prev == "#" {
			continue
		}
		prev = w
		var next **topicNode
		switch w {
		case "*":
			next = &n.star
		case "#":
			next = &n.hash
		default:
			if n.words == nil {
				n.words = map[string]*topicNode{}
			}
			c := n.words[w]
			if c == nil {
				c = &topicNode{}
				n.words[w] = c
			}
			n = c
			continue
		}
		if *next == nil {
			*next = &topicNode{}
		}
		n = *next
	}
	n.dests = appendDest(n.dests, d)
}

// match calls found for every binding whose pattern matches words i.. of
// the key. Duplicates are possible (the caller dedups).
func (m *topicMatcher) match(n *topicNode, i int, found func(cdest)) {
	if n.hash != nil {
		// "#" swallows zero or more words.
		for j := i; j <= m.n; j++ {
			m.match(n.hash, j, found)
		}
	}
	if i == m.n {
		for _, d := range n.dests {
			found(d)
		}
		return
	}
	if n.words != nil {
		if c := n.words[string(m.word(i))]; c != nil {
			m.match(c, i+1, found)
		}
	}
	if n.star != nil {
		m.match(n.star, i+1, found)
	}
}
