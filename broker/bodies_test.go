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
	if b.span() > 2*b.live+1024+1 {
		t.Fatalf("window spans %d for %d live: the pinned head was not moved out", b.span(), b.live)
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

// TestBodyStoreSlidingWindowReusesItsSlice: a queue whose messages are
// settled in order (the usual case) puts at the tail and deletes at the
// head; the window slides through one backing array instead of growing a
// new one every time the old one's tail is used up.
func TestBodyStoreSlidingWindowReusesItsSlice(t *testing.T) {
	var b bodyStore
	m := &StoredMsg{}
	next, oldest := uint64(1), uint64(1)
	for ; next <= 500; next++ { // a window of 500 in flight
		b.put(next, m)
	}
	slide := func() {
		for range 10000 {
			b.put(next, m)
			next++
			if b.del(oldest) != m {
				t.Fatalf("del(%d) lost the message", oldest)
			}
			oldest++
		}
	}
	slide() // reach the steady state
	if allocs := testing.AllocsPerRun(5, slide); allocs != 0 {
		t.Fatalf("%v allocations per 10,000 put+del, want 0", allocs)
	}
	if c := cap(b.s); c > 2048 {
		t.Fatalf("backing array of %d slots for a window of 500", c)
	}
	for id := oldest; id < next; id++ {
		if b.get(id) != m {
			t.Fatalf("get(%d) lost the message", id)
		}
	}
}

// TestBodyStoreLetsGoOfADrainedArray: once every message is gone, a big
// backing array is dropped rather than kept by an idle queue.
func TestBodyStoreLetsGoOfADrainedArray(t *testing.T) {
	var b bodyStore
	m := &StoredMsg{}
	for id := uint64(1); id <= 100000; id++ {
		b.put(id, m)
	}
	for id := uint64(1); id <= 100000; id++ {
		b.del(id)
	}
	if c := cap(b.s); c > bodiesKeepMax {
		t.Fatalf("a drained store keeps %d slots", c)
	}
	b.put(100001, m)
	if b.get(100001) != m || b.len() != 1 {
		t.Fatal("the store does not work after draining")
	}
}
