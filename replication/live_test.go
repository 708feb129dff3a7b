package replication

import (
	"math/rand/v2"
	"slices"
	"testing"
)

// liveModel is the brute-force set: every entry ever added with its count.
type liveModel struct {
	idx       []uint64
	live      map[uint64]uint32
	size      map[uint64]uint32
	deadBytes uint64
}

func (m *liveModel) want(upTo uint64) []uint64 {
	var out []uint64
	for _, i := range m.idx {
		if i <= upTo && m.live[i] > 0 {
			out = append(out, i)
		}
	}
	return out
}

// TestLiveIndexAgainstModel: random adds and releases, some runs with a
// pinned head (one message held at the first entry while thousands behind
// it die, which forces the rewrite), checked against the brute-force set
// after every step: appendLive at random bounds, deadBytes, the count, and
// release's verdict on entries that hold nothing.
func TestLiveIndexAgainstModel(t *testing.T) {
	seeds := uint64(30)
	if raceEnabled {
		seeds = 6
	}
	for seed := uint64(0); seed < seeds; seed++ {
		r := rand.New(rand.NewPCG(seed, 11))
		var l liveIndex
		m := &liveModel{live: map[uint64]uint32{}, size: map[uint64]uint32{}}
		next := uint64(1)
		pinned := seed%3 == 0
		steps := 1500
		if pinned {
			l.add(next, 1, 7)
			m.idx, m.live[next], m.size[next] = append(m.idx, next), 1, 7
			next++
			steps = 6000
		}
		var held []uint64 // message ids still held (not the pinned one)
		rewritten, prevHoles := false, 0
		for step := 0; step < steps; step++ {
			if prevHoles > 1000 && l.holes == 0 {
				rewritten = true
			}
			prevHoles = l.holes
			if r.IntN(2) == 0 || len(held) == 0 {
				next += 1 + r.Uint64N(3)
				msgs, size := uint32(r.IntN(4)), uint32(r.IntN(5000))
				l.add(next, msgs, size)
				if msgs == 0 {
					m.deadBytes += uint64(size)
				} else {
					m.idx = append(m.idx, next)
					m.live[next], m.size[next] = msgs, size
					for s := range msgs {
						held = append(held, next<<16|uint64(s))
					}
				}
			} else {
				k := r.IntN(len(held))
				if r.IntN(4) != 0 {
					k = r.IntN(min(len(held), 3)) // mostly near the head
				}
				id := held[k]
				held = slices.Delete(held, k, k+1)
				if !l.release(id) {
					t.Fatalf("seed %d step %d: release of held message %x refused", seed, step, id)
				}
				i := id >> 16
				m.live[i]--
				if m.live[i] == 0 {
					m.deadBytes += uint64(m.size[i])
				}
			}
			if r.IntN(5) == 0 {
				gone := m.idx[r.IntN(len(m.idx))]
				if m.live[gone] == 0 && l.release(gone<<16) {
					t.Fatalf("seed %d step %d: released a message of dead entry %d", seed, step, gone)
				}
				if l.release((next + 1) << 16) {
					t.Fatalf("seed %d step %d: released a message of an entry never added", seed, step)
				}
			}
			if step > 300 && step%20 != 0 {
				continue // the model's checks are O(entries): sample them
			}
			upTo := next
			if r.IntN(2) == 0 {
				upTo = r.Uint64N(next + 1)
			}
			if got, want := l.appendLive(nil, upTo), m.want(upTo); !slices.Equal(got, want) {
				t.Fatalf("seed %d step %d: live ≤ %d = %v, want %v", seed, step, upTo, got, want)
			}
			if l.deadBytes != m.deadBytes || l.entries() != len(m.want(next)) {
				t.Fatalf("seed %d step %d: deadBytes %d entries %d, want %d, %d", seed, step, l.deadBytes, l.entries(), m.deadBytes, len(m.want(next)))
			}
		}
		if pinned && !rewritten {
			t.Fatalf("seed %d: the pinned run never rewrote its holes (%d slots): it tests nothing", seed, len(l.es))
		}
		if pinned && len(l.es) > 2*l.entries()+2048 {
			t.Fatalf("seed %d: %d slots for %d live entries: dead ones behind a pinned head are never dropped", seed, len(l.es), l.entries())
		}
	}
}

// TestLiveIndexReleaseAllocatesNothing: add and release in steady state
// allocate nothing.
func TestLiveIndexReleaseAllocatesNothing(t *testing.T) {
	var l liveIndex
	idx := uint64(1)
	for ; idx < 5000; idx++ {
		l.add(idx, 2, 100)
	}
	i := uint64(1)
	a := testing.AllocsPerRun(1000, func() {
		l.release(i << 16)
		l.release(i<<16 | 1)
		l.add(idx, 2, 100)
		i++
		idx++
	})
	if a != 0 {
		t.Fatalf("%v allocations per entry", a)
	}
}
