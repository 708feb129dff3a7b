package broker

import (
	"math/rand/v2"
	"testing"
)

// TestBodyStoreAgainstMap drives the store and a map with the same random
// puts and deletes, including long-pinned heads.
func TestBodyStoreAgainstMap(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	var b bodyStore
	ref := map[uint64]*StoredMsg{}
	next := uint64(1)
	pinned := uint64(0)
	for step := 0; step < 200000; step++ {
		if r.IntN(3) > 0 || len(ref) == 0 {
			m := &StoredMsg{}
			b.put(next, m)
			ref[next] = m
			if pinned == 0 {
				pinned = next // never deleted until the end
			}
			next++
			continue
		}
		// Delete a random live id other than the pinned one, mostly recent.
		id := next - 1 - uint64(r.IntN(min(int(next-1), 50)))
		if id == pinned {
			continue
		}
		if got, want := b.del(id), ref[id]; got != want {
			t.Fatalf("step %d: del(%d) = %p, want %p", step, id, got, want)
		}
		delete(ref, id)
	}
	if b.len() != len(ref) {
		t.Fatalf("len %d, want %d", b.len(), len(ref))
	}
	for id, m := range ref {
		if b.get(id) != m {
			t.Fatalf("get(%d) wrong", id)
		}
	}
	if len(b.s) > 2*b.live+1024+1 {
		t.Fatalf("slice spans %d for %d live: the pinned head was not moved out", len(b.s), b.live)
	}
	n := 0
	b.each(func(id uint64, m *StoredMsg) {
		if ref[id] != m {
			t.Fatalf("each gave a wrong entry %d", id)
		}
		n++
	})
	if n != len(ref) {
		t.Fatalf("each visited %d, want %d", n, len(ref))
	}
}
