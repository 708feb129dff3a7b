package queue

import (
	"bytes"
	"math"
	"slices"

	"github.com/cespare/xxhash/v2"
	"github.com/warren-mq/warren/wire"
)

// Table is an immutable snapshot of Routes: any number of readers may
// route against it at once, without locks, while the writer changes
// Routes (which shares all it did not change with this snapshot).
type Table struct {
	exchanges pmap[string, *rex]
	queues    pmap[string, QueueRef]
}

// rex is an exchange as routed: immutable, replaced whole (sharing its
// unchanged maps) when the exchange or one of its bindings changes.
type rex struct {
	Exchange
	hashHdr   string // consistent-hash: the header hashed instead of the key
	hashEqual bool   // consistent-hash: all destinations weigh the same

	direct  pmap[string, destSet] // direct: binding key → destinations
	dests   destSet               // fanout and consistent-hash
	topic   *tnode                // topic: the pattern trie
	headers pmap[string, rheader] // headers: by binding identity

	edit *pedit // the writer's batch that made it (Routes.editable)
}

// dest is where a binding leads: a queue, by ref, or an exchange, by
// name (looked up when routing, so that changing an exchange changes no
// other exchange).
type dest struct {
	name string
	ref  QueueRef
	ex   bool
}

type destKey struct {
	name string
	ex   bool
}

// exchangeSalt tells apart the hashes of a queue and an exchange of the
// same name in a destSet; an exchange destination's hash xor the salt is
// the hash of its name, its key in Table.exchanges.
const exchangeSalt = 0x9e3779b97f4a7c15

func (d dest) key() destKey { return destKey{d.name, d.ex} }

func (d dest) hash() uint64 {
	if d.ex {
		return hashName(d.name) ^ exchangeSalt
	}
	return hashName(d.name)
}

// rheader is a headers binding: its destination and its condition.
type rheader struct {
	d dest
	headerMatch
}

// dentry is what a set holds for a destination (its key: the name, and
// whether it is an exchange): the bindings that lead there.
type dentry struct {
	ref    QueueRef // the queue's
	n      int32    // bindings leading here (the entry goes at 0)
	weight float64  // consistent-hash: their summed weight
	seed   uint64   // consistent-hash: the destination's half of the score
}

// destSet is a set of destinations; nEx counts the exchanges among them
// (none: routing appends its queues without looking for duplicates).
type destSet struct {
	m   pmap[destKey, dentry]
	nEx int
}

// change returns the set with one binding to d added (or removed), of
// weight w.
func (s destSet) change(ed *pedit, d dest, add bool, w float64) destSet {
	h, k := d.hash(), d.key()
	e, ok := s.m.get(h, k)
	if add {
		if !ok {
			e.seed = hashSeed(d)
			if d.ex {
				s.nEx++
			}
		}
		e.ref = d.ref // a queue re-added under a new ref takes it
		e.n++
		e.weight += w
	} else {
		if !ok {
			panic("queue: BUG: removing a binding to " + d.name + " that is not in its set")
		}
		e.n--
		e.weight -= w
		if e.n == 0 {
			if d.ex {
				s.nEx--
			}
			s.m = s.m.del(ed, h, k)
			return s
		}
	}
	s.m = s.m.set(ed, h, k, e)
	return s
}

// hashSeed is the per-destination half of the rendezvous score, as the
// compiled table computes it.
func hashSeed(d dest) uint64 {
	if d.ex {
		return xxhash.Sum64String("exchange\x00" + d.name)
	}
	return xxhash.Sum64String(d.name)
}

// tnode is a node of the persistent topic trie: a binding pattern's words
// are a path from the root; "*" and "#" have their own edges. A change
// copies the nodes on its pattern's path; empty nodes are pruned.
type tnode struct {
	words pmap[string, *tnode]
	star  *tnode // "*": exactly one word
	hash  *tnode // "#": zero or more words
	dests destSet
	edit  *pedit // the writer's batch that made it (see pedit)
}

// change returns the trie with one binding of pattern words to d added (or
// removed); nil when it is empty. Nodes of batch ed change in place.
func (n *tnode) change(ed *pedit, words []string, d dest, add bool) *tnode {
	c := n
	if n == nil {
		c = &tnode{edit: ed}
	} else if n.edit != ed {
		cp := *n
		cp.edit = ed
		c = &cp
	}
	switch {
	case len(words) == 0:
		c.dests = c.dests.change(ed, d, add, 0)
	case words[0] == "*":
		c.star = c.star.change(ed, words[1:], d, add)
	case words[0] == "#":
		c.hash = c.hash.change(ed, words[1:], d, add)
	default:
		h := hashName(words[0])
		kid, _ := c.words.get(h, words[0])
		if kid = kid.change(ed, words[1:], d, add); kid == nil {
			c.words = c.words.del(ed, h, words[0])
		} else {
			c.words = c.words.set(ed, h, words[0], kid)
		}
	}
	if c.words.len() == 0 && c.star == nil && c.hash == nil && c.dests.m.len() == 0 {
		return nil
	}
	return c
}

// Route appends to dst the queues a message published to exchange with
// routingKey and headers (raw table entries, as in wire.Properties.Headers)
// goes to, each once, and returns it. The order of the queues is not
// defined (it differs between processes: see nameSeed). ok is false when the exchange does
// not exist. An empty result means unroutable (the caller returns
// mandatory messages). The default exchange "" routes to the queue named
// by the key. Bindings to exchanges are followed (cycles and chains longer
// than maxExchangeHops stop), and an exchange none of whose bindings leads
// the message to a queue hands it to its alternate. Route allocates
// nothing once dst has room.
func (t *Table) Route(dst []QueueRef, exchange string, routingKey, headers []byte) ([]QueueRef, bool) {
	if exchange == "" {
		if bytes.IndexByte(routingKey, VhostSep) >= 0 {
			return dst, true // another vhost's queue: no key in "/" names it
		}
		if ref, ok := pmapGetBytes(t.queues, hashBytes(routingKey), routingKey); ok {
			dst = append(dst, ref)
		}
		return dst, true
	}
	if exchange[len(exchange)-1] == VhostSep {
		// A virtual host's default exchange ("vhost" VhostSep): the queue
		// of that vhost named by the key, whose name is the exchange's
		// followed by the key (on the stack: names are at most 255 bytes).
		var buf [2 * 256]byte
		name := append(append(buf[:0], exchange...), routingKey...)
		if ref, ok := pmapGetBytes(t.queues, hashBytes(name), name); ok {
			dst = append(dst, ref)
		}
		return dst, true
	}
	c, ok := t.exchanges.get(hashName(exchange), exchange)
	if !ok {
		return dst, false
	}
	if out, done := c.routeDirectly(dst, routingKey, headers); done {
		return out, true
	}
	rt := router{t: t, dst: dst, start: len(dst), key: routingKey, headers: headers}
	rt.route(c, nil)
	return rt.dst, true
}

// routeDirectly is the fast path of the common cases, where an exchange
// leads straight to queues and has something for the message: it routes
// without the router's state. done is false when the message needs the
// general path (a binding to an exchange, an alternate to try, a topic or
// headers exchange).
func (c *rex) routeDirectly(dst []QueueRef, key, headers []byte) (out []QueueRef, done bool) {
	var s *destSet
	switch c.Kind {
	case wire.ExchangeDirect:
		set, ok := pmapGetBytes(c.direct, hashBytes(key), key)
		if !ok {
			return dst, c.Alternate == ""
		}
		s = &set
	case wire.ExchangeFanout:
		s = &c.dests
	case wire.ExchangeConsistentHash:
		if c.dests.m.len() == 0 {
			return dst, c.Alternate == ""
		}
		hk := key
		if c.hashHdr != "" {
			hk = headerBytes(headers, c.hashHdr)
		}
		var best *dentryKV
		if h := xxhash.Sum64(hk); c.hashEqual {
			best, _ = pickEqual(c.dests.m.root, h, nil, 0)
		} else {
			best, _ = pickWeighted(c.dests.m.root, h, nil, -1)
		}
		if best.key.ex {
			return dst, false
		}
		return append(dst, best.val.ref), true
	default:
		return dst, false
	}
	if s.nEx != 0 || (s.m.len() == 0 && c.Alternate != "") {
		return dst, false
	}
	return appendRefs(dst, s.m.root), true
}

// HasExchange reports whether exchange exists (the default always does,
// and so does a virtual host's: its name followed by VhostSep).
func (t *Table) HasExchange(name string) bool {
	_, ok := t.exchanges.get(hashName(name), name)
	return ok || name == "" || name[len(name)-1] == VhostSep
}

// VhostSep separates a virtual host's name from a resource's in the
// broker's internal names ("vhost" VhostSep "name"; the default vhost's
// resources keep their plain names). It is a control character, which no
// name a client gives may contain, so two vhosts' names never meet; the
// broker (broker.QualifyName) builds and strips these names.
const VhostSep = '\x1f'

// IsInternal reports whether exchange is internal (fed only by
// exchange-to-exchange bindings, not by publishers).
func (t *Table) IsInternal(name string) bool {
	c, ok := t.exchanges.get(hashName(name), name)
	return ok && c.Internal
}

// Queue returns the ref of the queue called name.
func (t *Table) Queue(name string) (QueueRef, bool) {
	return t.queues.get(hashName(name), name)
}

// router is one Route call's state, on the caller's stack.
type router struct {
	t            *Table
	dst          []QueueRef
	start        int // dst[start:] is this call's result
	key, headers []byte
}

// hop is one exchange of the chain from the published one to the one
// routing now, on the stack of route's calls: a cycle stops, and so does
// a chain maxExchangeHops long.
type hop struct {
	c    *rex
	prev *hop
	n    int // exchanges in the chain up to and including this one
}

// route routes the message through c. reached reports whether one of c's
// bindings led it to a queue (one the message had reached by another path
// counts): when none did, c's alternate gets it. So the result does not
// depend on the order bindings are walked in.
func (rt *router) route(c *rex, path *hop) (reached bool) {
	here := hop{c: c, prev: path, n: 1}
	if path != nil {
		if path.n == maxExchangeHops {
			return false
		}
		for h := path; h != nil; h = h.prev {
			if h.c == c {
				return false
			}
		}
		here.n = path.n + 1
	}
	depth := &here
	switch c.Kind {
	case wire.ExchangeDirect:
		if s, ok := pmapGetBytes(c.direct, hashBytes(rt.key), rt.key); ok {
			reached = rt.addSet(&s, depth)
		}
	case wire.ExchangeFanout:
		reached = rt.addSet(&c.dests, depth)
	case wire.ExchangeTopic:
		if c.topic != nil {
			var m topicMatcher
			m.split(rt.key)
			reached = rt.matchTopic(&m, c.topic, 0, depth)
		}
	case wire.ExchangeHeaders:
		reached = rt.addHeaders(c.headers.root, depth)
	case wire.ExchangeConsistentHash:
		if c.dests.m.len() > 0 {
			hk := rt.key
			if c.hashHdr != "" {
				hk = headerBytes(rt.headers, c.hashHdr)
			}
			var best *dentryKV
			if h := xxhash.Sum64(hk); c.hashEqual {
				best, _ = pickEqual(c.dests.m.root, h, nil, 0)
			} else {
				best, _ = pickWeighted(c.dests.m.root, h, nil, -1)
			}
			reached = rt.addEntry(best, depth)
		}
	}
	if !reached && c.Alternate != "" {
		if alt, ok := rt.t.exchanges.get(hashName(c.Alternate), c.Alternate); ok {
			reached = rt.route(alt, depth)
		}
	}
	return reached
}

// add routes to one destination: a queue (appended unless the result has
// it), or an exchange.
func (rt *router) add(d *dest, depth *hop) bool {
	if d.ex {
		x, ok := rt.t.exchanges.get(hashName(d.name), d.name)
		return ok && rt.route(x, depth)
	}
	if !slices.Contains(rt.dst[rt.start:], d.ref) {
		rt.dst = append(rt.dst, d.ref)
	}
	return true
}

// addSet routes to every destination of a set (sets are never empty). A
// set's queues are distinct, so when the result is still empty and the
// set leads to no exchange they are appended without looking for
// duplicates.
func (rt *router) addSet(s *destSet, depth *hop) bool {
	if s.nEx == 0 && len(rt.dst) == rt.start {
		rt.dst = appendRefs(rt.dst, s.m.root)
		return s.m.len() > 0
	}
	return rt.addNode(s.m.root, depth)
}

func appendRefs(dst []QueueRef, n *pnode[destKey, dentry]) []QueueRef {
	if n == nil {
		return dst
	}
	for i := range n.data {
		dst = append(dst, n.data[i].val.ref)
	}
	for _, k := range n.kids {
		dst = appendRefs(dst, k)
	}
	return dst
}

func (rt *router) addNode(n *pnode[destKey, dentry], depth *hop) bool {
	if n == nil {
		return false
	}
	reached := false
	for i := range n.data {
		if rt.addEntry(&n.data[i], depth) {
			reached = true
		}
	}
	for _, k := range n.kids {
		if rt.addNode(k, depth) {
			reached = true
		}
	}
	return reached
}

// addEntry routes to one destination of a set.
func (rt *router) addEntry(e *dentryKV, depth *hop) bool {
	if e.key.ex {
		x, ok := rt.t.exchanges.get(e.hash^exchangeSalt, e.key.name)
		return ok && rt.route(x, depth)
	}
	if !slices.Contains(rt.dst[rt.start:], e.val.ref) {
		rt.dst = append(rt.dst, e.val.ref)
	}
	return true
}

func (rt *router) addHeaders(n *pnode[string, rheader], depth *hop) bool {
	if n == nil {
		return false
	}
	reached := false
	for i := range n.data {
		if hb := &n.data[i].val; hb.matches(rt.headers) && rt.add(&hb.d, depth) {
			reached = true
		}
	}
	for _, k := range n.kids {
		if rt.addHeaders(k, depth) {
			reached = true
		}
	}
	return reached
}

// matchTopic routes to the destinations of every pattern in the trie
// under n that matches words i.. of the key.
func (rt *router) matchTopic(m *topicMatcher, n *tnode, i int, depth *hop) bool {
	reached := false
	if n.hash != nil {
		// "#" swallows zero or more words.
		for j := i; j <= m.n; j++ {
			if rt.matchTopic(m, n.hash, j, depth) {
				reached = true
			}
		}
	}
	if i == m.n {
		return rt.addSet(&n.dests, depth) || reached
	}
	if n.words.len() > 0 {
		w := m.word(i)
		if c, ok := pmapGetBytes(n.words, hashBytes(w), w); ok && rt.matchTopic(m, c, i+1, depth) {
			reached = true
		}
	}
	if n.star != nil && rt.matchTopic(m, n.star, i+1, depth) {
		reached = true
	}
	return reached
}

// pickEqual and pickWeighted find a consistent-hash exchange's
// destination for key hash h by weighted rendezvous hashing, exactly as
// compiled.pickHashed does: the highest score wins, ties going to the
// first destination by name (then queue before exchange, by seed),
// whatever order the set is walked in. best is the best so far (nil:
// none yet; pickWeighted starts from bestScore -1, below every score);
// the state is passed in registers, not through memory.
func pickEqual(n *pnode[destKey, dentry], h uint64, best *dentryKV, bestX uint64) (*dentryKV, uint64) {
	for i := range n.data {
		e := &n.data[i]
		if x := fmix64(h ^ e.val.seed); x > bestX || best == nil || (x == bestX && hashBefore(e, best)) {
			best, bestX = e, x
		}
	}
	for _, k := range n.kids {
		best, bestX = pickEqual(k, h, best, bestX)
	}
	return best, bestX
}

func pickWeighted(n *pnode[destKey, dentry], h uint64, best *dentryKV, bestScore float64) (*dentryKV, float64) {
	for i := range n.data {
		e := &n.data[i]
		x := fmix64(h ^ e.val.seed)
		u := (float64(x>>11) + 0.5) / (1 << 53) // in (0, 1)
		if s := e.val.weight / -math.Log(u); s > bestScore || (s == bestScore && hashBefore(e, best)) {
			best, bestScore = e, s
		}
	}
	for _, k := range n.kids {
		best, bestScore = pickWeighted(k, h, best, bestScore)
	}
	return best, bestScore
}

// hashBefore is the compiled table's order of consistent-hash
// destinations: by name, then by seed.
func hashBefore(a, b *dentryKV) bool {
	if a.key.name != b.key.name {
		return a.key.name < b.key.name
	}
	return a.val.seed < b.val.seed
}

// dentryKV is a set's entry: destination (key) and dentry.
type dentryKV = pentry[destKey, dentry]
