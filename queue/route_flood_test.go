package queue

import (
	"encoding/binary"
	"math/bits"
	"testing"
)

// floodNames returns n distinct 16-byte printable names built to have one
// 64-bit hash under an unseeded hash that folds 8-byte blocks into its
// state by xor and a multiply (the hash Routes used: h = len ^ m2; per
// block h = mum(h ^ v, m1)): the second block cancels the difference the
// first made. Any deterministic, unseeded hash of this family can be
// flooded like this by a client choosing queue names.
func floodNames(n int) []string {
	const m1, m2 = 0x9e3779b97f4a7c15, 0xe7037ed1a0b428db
	mum := func(x uint64) uint64 { hi, lo := bits.Mul64(x, m1); return hi ^ lo }
	h0 := uint64(16) ^ m2
	const base2 = 0x4141414141414141 // "AAAAAAAA"
	ref := mum(h0 ^ 0x4242424242424242)
	names := []string{}
	var b1, b2 [8]byte
	for v1 := uint64(0x3030303030303030); len(names) < n; v1++ {
		binary.LittleEndian.PutUint64(b1[:], v1)
		if !printable(b1[:]) {
			continue
		}
		v2 := base2 ^ ref ^ mum(h0^v1) // mum(h0^v1) ^ v2 == ref ^ base2
		binary.LittleEndian.PutUint64(b2[:], v2)
		if !printable(b2[:]) {
			continue
		}
		names = append(names, string(b1[:])+string(b2[:]))
	}
	return names
}

func printable(b []byte) bool {
	for _, c := range b {
		if c < 0x21 || c > 0x7e {
			return false
		}
	}
	return true
}

// maxCollision returns the largest collision node (entries whose 64-bit
// hashes are all equal) in the trie under n.
func maxCollision[K comparable, V any](n *pnode[K, V], shift uint) int {
	if n == nil {
		return 0
	}
	if shift >= 64 {
		return len(n.data)
	}
	m := 0
	for _, k := range n.kids {
		m = max(m, maxCollision(k, shift+pmapBits))
	}
	return m
}

// TestRoutesNameHashFlooding: queue names a client builds to collide under
// a known hash must not pile up in one collision node, where every
// declare copies and every lookup scans all of them (quadratic declares,
// linear routes: a denial of service by naming). Routes hashes names with
// a per-process random seed.
func TestRoutesNameHashFlooding(t *testing.T) {
	n := 500
	if raceEnabled {
		n = 100
	}
	names := floodNames(n)
	r := NewRoutes()
	for i, q := range names {
		r.AddQueue(q, QueueRef(i))
	}
	if got := r.Table().queues.len(); got != len(names) {
		t.Fatalf("%d queues, want %d", got, len(names))
	}
	if m := maxCollision(r.Table().queues.root, 0); m > 4 {
		t.Fatalf("%d of %d crafted queue names share one 64-bit hash (a collision node scanned and copied whole)", m, len(names))
	}
}
