package queue

import "math/bits"

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
// new version.
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
// the maps are zero. Nodes are never modified once published: data and
// kids arrays are shared between versions and copied to be changed.
type pnode[K comparable, V any] struct {
	dataMap, nodeMap uint32
	data             []pentry[K, V]
	kids             []*pnode[K, V]
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

// set returns the map with k (hash h) set to v.
func (m pmap[K, V]) set(h uint64, k K, v V) pmap[K, V] {
	root, added := m.root.set(0, pentry[K, V]{h, k, v})
	m.root = root
	if added {
		m.n++
	}
	return m
}

// del returns the map without k (hash h); the same map if k is absent.
func (m pmap[K, V]) del(h uint64, k K) pmap[K, V] {
	root, removed := m.root.del(0, h, k)
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

func (n *pnode[K, V]) set(shift uint, e pentry[K, V]) (*pnode[K, V], bool) {
	if n == nil {
		if shift >= 64 {
			return &pnode[K, V]{data: []pentry[K, V]{e}}, true
		}
		return &pnode[K, V]{dataMap: pmapBit(e.hash, shift), data: []pentry[K, V]{e}}, true
	}
	if shift >= 64 {
		for i := range n.data {
			if n.data[i].key == e.key {
				c := &pnode[K, V]{data: replaceAt(n.data, i, e)}
				return c, false
			}
		}
		return &pnode[K, V]{data: insertAt(n.data, len(n.data), e)}, true
	}
	bit := pmapBit(e.hash, shift)
	if n.dataMap&bit != 0 {
		i := pmapIndex(n.dataMap, bit)
		old := &n.data[i]
		if old.hash == e.hash && old.key == e.key {
			return &pnode[K, V]{dataMap: n.dataMap, nodeMap: n.nodeMap, data: replaceAt(n.data, i, e), kids: n.kids}, false
		}
		// Two entries in one slot: both go down a level.
		sub := pair(shift+pmapBits, *old, e)
		return &pnode[K, V]{
			dataMap: n.dataMap &^ bit, nodeMap: n.nodeMap | bit,
			data: removeAt(n.data, i), kids: insertAt(n.kids, pmapIndex(n.nodeMap, bit), sub),
		}, true
	}
	if n.nodeMap&bit != 0 {
		j := pmapIndex(n.nodeMap, bit)
		kid, added := n.kids[j].set(shift+pmapBits, e)
		return &pnode[K, V]{dataMap: n.dataMap, nodeMap: n.nodeMap, data: n.data, kids: replaceAt(n.kids, j, kid)}, added
	}
	return &pnode[K, V]{
		dataMap: n.dataMap | bit, nodeMap: n.nodeMap,
		data: insertAt(n.data, pmapIndex(n.dataMap, bit), e), kids: n.kids,
	}, true
}

// pair makes the node at shift holding two entries with different keys.
func pair[K comparable, V any](shift uint, a, b pentry[K, V]) *pnode[K, V] {
	if shift >= 64 {
		return &pnode[K, V]{data: []pentry[K, V]{a, b}}
	}
	ba, bb := pmapBit(a.hash, shift), pmapBit(b.hash, shift)
	if ba == bb {
		return &pnode[K, V]{nodeMap: ba, kids: []*pnode[K, V]{pair(shift+pmapBits, a, b)}}
	}
	if bb < ba {
		a, b = b, a
	}
	return &pnode[K, V]{dataMap: ba | bb, data: []pentry[K, V]{a, b}}
}

func (n *pnode[K, V]) del(shift uint, h uint64, k K) (*pnode[K, V], bool) {
	if n == nil {
		return nil, false
	}
	if shift >= 64 {
		for i := range n.data {
			if n.data[i].key == k {
				if len(n.data) == 1 {
					return nil, true
				}
				return &pnode[K, V]{data: removeAt(n.data, i)}, true
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
		return &pnode[K, V]{dataMap: n.dataMap &^ bit, nodeMap: n.nodeMap, data: removeAt(n.data, i), kids: n.kids}, true
	}
	if n.nodeMap&bit == 0 {
		return n, false
	}
	j := pmapIndex(n.nodeMap, bit)
	kid, removed := n.kids[j].del(shift+pmapBits, h, k)
	if !removed {
		return n, false
	}
	switch {
	case kid == nil:
		if n.dataMap == 0 && len(n.kids) == 1 {
			return nil, true
		}
		return &pnode[K, V]{dataMap: n.dataMap, nodeMap: n.nodeMap &^ bit, data: n.data, kids: removeAt(n.kids, j)}, true
	case len(kid.kids) == 0 && len(kid.data) == 1:
		// A lone entry moves up into this node (its hash has bit here), so
		// the trie stays as shallow as its contents need.
		return &pnode[K, V]{
			dataMap: n.dataMap | bit, nodeMap: n.nodeMap &^ bit,
			data: insertAt(n.data, pmapIndex(n.dataMap, bit), kid.data[0]), kids: removeAt(n.kids, j),
		}, true
	}
	return &pnode[K, V]{dataMap: n.dataMap, nodeMap: n.nodeMap, data: n.data, kids: replaceAt(n.kids, j, kid)}, true
}

// insertAt, replaceAt and removeAt return changed copies: the input is
// shared with older versions and never written.
func insertAt[T any](s []T, i int, v T) []T {
	c := make([]T, len(s)+1)
	copy(c, s[:i])
	c[i] = v
	copy(c[i+1:], s[i:])
	return c
}

func replaceAt[T any](s []T, i int, v T) []T {
	c := make([]T, len(s))
	copy(c, s)
	c[i] = v
	return c
}

func removeAt[T any](s []T, i int) []T {
	if len(s) == 1 {
		return nil
	}
	c := make([]T, len(s)-1)
	copy(c, s[:i])
	copy(c[i:], s[i+1:])
	return c
}

// strhash hashes a name, key or word for the persistent maps: 8 bytes at
// a time, each folded in by a 64×64→128-bit multiply whose halves are
// xored (wyhash's "mum"). It is deterministic (the maps' shape and walk
// order are the same in every process) and, unlike xxhash's assembly,
// cheap to call for the short strings routing looks up on every publish.
func strhash[T string | []byte](s T) uint64 {
	const m1, m2 = 0x9e3779b97f4a7c15, 0xe7037ed1a0b428db
	h := uint64(len(s)) ^ m2
	for len(s) >= 8 {
		v := uint64(s[0]) | uint64(s[1])<<8 | uint64(s[2])<<16 | uint64(s[3])<<24 |
			uint64(s[4])<<32 | uint64(s[5])<<40 | uint64(s[6])<<48 | uint64(s[7])<<56
		hi, lo := bits.Mul64(h^v, m1)
		h = hi ^ lo
		s = s[8:]
	}
	var v uint64
	for i := 0; i < len(s); i++ {
		v |= uint64(s[i]) << (8 * i)
	}
	hi, lo := bits.Mul64(h^v, m1)
	return hi ^ lo
}
