package queue

import (
	"math/rand/v2"
	"slices"
	"testing"
)

// TestEachMessageListsWhatTheQueueHolds: after every step of random runs,
// EachMessage lists exactly the messages the effects say the queue still
// holds (ready, parked for a retry, out with a consumer, or a held dead
// letter not yet settled), each once,
// with its size, and changes nothing.
func TestEachMessageListsWhatTheQueueHolds(t *testing.T) {
	seeds := uint64(100)
	if raceEnabled {
		seeds = 15
	}
	for seed := uint64(0); seed < seeds; seed++ {
		r := rand.New(rand.NewPCG(seed, 5))
		env := randomMachine(r)
		sizes := map[uint64]uint32{}
		for step := 0; step < 150; step++ {
			randomStep(r, env)
			var want []uint64
			for id, w := range env.where {
				if w == "queue" || w == "unacked" || w == "dead-lettered" && env.m.cfg.HoldDeadLetters {
					want = append(want, id)
				}
			}
			slices.Sort(want)
			snap := env.m.Snapshot()
			var got []uint64
			env.m.EachMessage(func(id uint64, size uint32) {
				got = append(got, id)
				if s, ok := sizes[id]; ok && s != size {
					t.Fatalf("seed %d step %d: message %d listed with size %d, then %d", seed, step, id, s, size)
				}
				sizes[id] = size
			})
			slices.Sort(got)
			if !slices.Equal(got, want) {
				t.Fatalf("seed %d step %d: EachMessage lists %v; the effects say the queue holds %v", seed, step, got, want)
			}
			if string(env.m.Snapshot()) != string(snap) {
				t.Fatalf("seed %d step %d: EachMessage changed the state", seed, step)
			}
		}
	}
}
