package queue

import (
	"hash/maphash"
	"math/bits"
	"slices"
)

// pmap is a persistent hash map: a hash-array-mapped trie (CHAMP layout:
// each node keeps its entries and its children in two arrays indexed by
// bitmaps) whose updates copy only the path from the root to the changed
// entry, O(log32 n) nodes, and leave the old map intact. So a writer can
// change a map that readers are using without a lock: readers hold a
// version, and a version is never modified once another version has been
// made from it.
//
// The caller computes the hash of each key (the same function for a map's
// whole life); equal keys must have equal hashes. Keys whose 64-bit hashes
// collide fully share a collision node, searched linearly.
//
// The zero pmap is an empty map. A pmap is a value: set and del return the
// new version (and may reuse, in place, the nodes of the writer's current
// batch: see pedit).
type pmap[K comparable, V any] struct {
	root *pnode[K, V]
	n    int
}

type pentry[K comparable, V any] struct {
	hash uint64
	key  K
	val  V
}

// pnode is a trie node. At shift < 64, dataMap and nodeMap say which of
// the 32 slots of this level (5 bits of the hash) hold an entry and which
// a child; data and kids list them in slot order. At shift ≥ 64 the node
// is a collision node: data lists entries whose hashes are all equal, and
// the maps are zero. A node is never modified once a version holding it
// has been published (see pedit); its data and kids arrays are its own,
// and a copy of the node copies them.
type pnode[K comparable, V any] struct {
	dataMap, nodeMap uint32
	data             []pentry[K, V]
	kids             []*pnode[K, V]
	edit             *pedit // the writer's batch that made it (see pedit)
	// dataOwn and kidsOwn: the arrays are this node's alone (so its batch
	// may change them in place); a copy shares its original's until it
	// changes them.
	dataOwn, kidsOwn bool
}

const pmapBits = 5

func pmapBit(h uint64, shift uint) uint32 { return 1 << ((h >> (shift & 63)) & (1<<pmapBits - 1)) }

func pmapIndex(bitmap, bit uint32) int { return bits.OnesCount32(bitmap & (bit - 1)) }

// len returns the number of entries.
func (m pmap[K, V]) len() int { return m.n }

// get returns the value of key k, whose hash is h.
func (m pmap[K, V]) get(h uint64, k K) (V, bool) {
	n := m.root
	for shift := uint(0); n != nil; shift += pmapBits {
		if shift >= 64 {
			for i := range n.data {
				if n.data[i].key == k {
					return n.data[i].val, true
				}
			}
			break
		}
		bit := pmapBit(h, shift)
		if n.dataMap&bit != 0 {
			if e := &n.data[pmapIndex(n.dataMap, bit)]; e.hash == h && e.key == k {
				return e.val, true
			}
			break
		}
		if n.nodeMap&bit == 0 {
			break
		}
		n = n.kids[pmapIndex(n.nodeMap, bit)]
	}
	var zero V
	return zero, false
}

// pmapGetBytes is get for string keys given as bytes (a routing key, a
// word of one), without converting them to a string. h is the hash of
// the bytes, as of the string.
func pmapGetBytes[V any](m pmap[string, V], h uint64, k []byte) (V, bool) {
	n := m.root
	for shift := uint(0); n != nil; shift += pmapBits {
		if shift >= 64 {
			for i := range n.data {
				if n.data[i].key == string(k) {
					return n.data[i].val, true
				}
			}
			break
		}
		bit := pmapBit(h, shift)
		if n.dataMap&bit != 0 {
			if e := &n.data[pmapIndex(n.dataMap, bit)]; e.hash == h && e.key == string(k) {
				return e.val, true
			}
			break
		}
		if n.nodeMap&bit == 0 {
			break
		}
		n = n.kids[pmapIndex(n.nodeMap, bit)]
	}
	var zero V
	return zero, false
}

// pedit marks the nodes one writer made since it last published a
// version (Routes.Table): those no reader can see, so the writer changes
// them in place instead of copying them again (a batch of changes between
// two snapshots allocates once per node, not once per change). A nil
// pedit copies always. It has a field so that distinct pedits have
// distinct addresses.
type pedit struct{ _ byte }

// set returns the map with k (hash h) set to v. Nodes marked with ed
// (non-nil) may be changed in place: ed must be one no published version
// was made under.
func (m pmap[K, V]) set(ed *pedit, h uint64, k K, v V) pmap[K, V] {
	root, added := m.root.set(ed, 0, pentry[K, V]{h, k, v})
	m.root = root
	if added {
		m.n++
	}
	return m
}

// del returns the map without k (hash h); the same map if k is absent.
func (m pmap[K, V]) del(ed *pedit, h uint64, k K) pmap[K, V] {
	root, removed := m.root.del(ed, 0, h, k)
	if removed {
		m.root = root
		m.n--
	}
	return m
}

// all calls f for every entry, in no particular order (not for hot paths:
// f is called through a function value).
func (m pmap[K, V]) all(f func(K, V)) {
	m.root.all(f)
}

func (n *pnode[K, V]) all(f func(K, V)) {
	if n == nil {
		return
	}
	for i := range n.data {
		f(n.data[i].key, n.data[i].val)
	}
	for _, c := range n.kids {
		c.all(f)
	}
}

// editable returns n if ed may change it in place, else a copy of n
// that ed may (sharing n's arrays until it changes them: ownData,
// ownKids).
func (n *pnode[K, V]) editable(ed *pedit) *pnode[K, V] {
	if ed != nil && n.edit == ed {
		return n
	}
	return &pnode[K, V]{dataMap: n.dataMap, nodeMap: n.nodeMap, data: n.data, kids: n.kids, edit: ed}
}

// ownData and ownKids give n arrays of its own before it changes them.
func (n *pnode[K, V]) ownData() {
	if !n.dataOwn {
		n.data, n.dataOwn = slices.Clone(n.data), true
	}
}

func (n *pnode[K, V]) ownKids() {
	if !n.kidsOwn {
		n.kids, n.kidsOwn = slices.Clone(n.kids), true
	}
}

func newLeaf[K comparable, V any](ed *pedit, dataMap uint32, data ...pentry[K, V]) *pnode[K, V] {
	return &pnode[K, V]{dataMap: dataMap, data: data, edit: ed, dataOwn: true, kidsOwn: true}
}

func (n *pnode[K, V]) set(ed *pedit, shift uint, e pentry[K, V]) (*pnode[K, V], bool) {
	if n == nil {
		if shift >= 64 {
			return newLeaf(ed, 0, e), true
		}
		return newLeaf(ed, pmapBit(e.hash, shift), e), true
	}
	if shift >= 64 {
		for i := range n.data {
			if n.data[i].key == e.key {
				c := n.editable(ed)
				c.ownData()
				c.data[i] = e
				return c, false
			}
		}
		c := n.editable(ed)
		c.ownData()
		c.data = append(c.data, e)
		return c, true
	}
	bit := pmapBit(e.hash, shift)
	if n.dataMap&bit != 0 {
		i := pmapIndex(n.dataMap, bit)
		old := n.data[i]
		c := n.editable(ed)
		c.ownData()
		if old.hash == e.hash && old.key == e.key {
			c.data[i] = e
			return c, false
		}
		// Two entries in one slot: both go down a level.
		sub := pair(ed, shift+pmapBits, old, e)
		c.ownKids()
		c.data = slices.Delete(c.data, i, i+1)
		c.kids = slices.Insert(c.kids, pmapIndex(c.nodeMap, bit), sub)
		c.dataMap &^= bit
		c.nodeMap |= bit
		return c, true
	}
	if n.nodeMap&bit != 0 {
		j := pmapIndex(n.nodeMap, bit)
		kid, added := n.kids[j].set(ed, shift+pmapBits, e)
		c := n.editable(ed)
		if c.kids[j] != kid {
			c.ownKids()
			c.kids[j] = kid
		}
		return c, added
	}
	c := n.editable(ed)
	c.ownData()
	c.data = slices.Insert(c.data, pmapIndex(c.dataMap, bit), e)
	c.dataMap |= bit
	return c, true
}

// pair makes the node at shift holding two entries with different keys.
func pair[K comparable, V any](ed *pedit, shift uint, a, b pentry[K, V]) *pnode[K, V] {
	if shift >= 64 {
		return newLeaf(ed, 0, a, b)
	}
	ba, bb := pmapBit(a.hash, shift), pmapBit(b.hash, shift)
	if ba == bb {
		return &pnode[K, V]{nodeMap: ba, kids: []*pnode[K, V]{pair(ed, shift+pmapBits, a, b)}, edit: ed, dataOwn: true, kidsOwn: true}
	}
	if bb < ba {
		a, b = b, a
	}
	return newLeaf(ed, ba|bb, a, b)
}

func (n *pnode[K, V]) del(ed *pedit, shift uint, h uint64, k K) (*pnode[K, V], bool) {
	if n == nil {
		return nil, false
	}
	if shift >= 64 {
		for i := range n.data {
			if n.data[i].key == k {
				if len(n.data) == 1 {
					return nil, true
				}
				c := n.editable(ed)
				c.ownData()
				c.data = slices.Delete(c.data, i, i+1)
				return c, true
			}
		}
		return n, false
	}
	bit := pmapBit(h, shift)
	if n.dataMap&bit != 0 {
		i := pmapIndex(n.dataMap, bit)
		if e := &n.data[i]; e.hash != h || e.key != k {
			return n, false
		}
		if len(n.data) == 1 && n.nodeMap == 0 {
			return nil, true
		}
		c := n.editable(ed)
		c.ownData()
		c.data = slices.Delete(c.data, i, i+1)
		c.dataMap &^= bit
		return c, true
	}
	if n.nodeMap&bit == 0 {
		return n, false
	}
	j := pmapIndex(n.nodeMap, bit)
	kid, removed := n.kids[j].del(ed, shift+pmapBits, h, k)
	if !removed {
		return n, false
	}
	if kid == nil && n.dataMap == 0 && len(n.kids) == 1 {
		return nil, true
	}
	c := n.editable(ed)
	switch {
	case kid == nil:
		c.ownKids()
		c.kids = slices.Delete(c.kids, j, j+1)
		c.nodeMap &^= bit
	case len(kid.kids) == 0 && len(kid.data) == 1:
		// A lone entry moves up into this node (its hash has bit here), so
		// the trie stays as shallow as its contents need.
		c.ownKids()
		c.ownData()
		c.kids = slices.Delete(c.kids, j, j+1)
		c.nodeMap &^= bit
		c.data = slices.Insert(c.data, pmapIndex(c.dataMap, bit), kid.data[0])
		c.dataMap |= bit
	case c.kids[j] != kid:
		c.ownKids()
		c.kids[j] = kid
	}
	return c, true
}

// nameSeed seeds the hash of names, keys and words in the persistent
// maps: chosen at random per process, as Go's maps do, so that a client
// cannot pick names that all land in one collision node (an unseeded hash
// of this speed can be inverted: TestRoutesNameHashFlooding). So the
// maps' shapes, and the order Route lists queues in, differ between
// processes; what Route returns as a set does not.
var nameSeed = maphash.MakeSeed()

// hashName and hashBytes hash a name, key or word (the same value for the
// same bytes).
func hashName(s string) uint64 { return maphash.String(nameSeed, s) }

func hashBytes(b []byte) uint64 { return maphash.Bytes(nameSeed, b) }
