package queue

import (
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/warren-mq/warren/wire"
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

// TestOutstandingReemitsUnsettledDeliveries: in random runs, Outstanding
// lists for each consumer exactly the tags it could still ack (checked on
// a restored copy: an ack of each delivered tag succeeds iff listed), in
// tag order, above the tag given, each with the fields of the latest
// Deliver of that tag; and it changes nothing.
func TestOutstandingReemitsUnsettledDeliveries(t *testing.T) {
	seeds := uint64(60)
	if raceEnabled {
		seeds = 10
	}
	listed := 0
	for seed := uint64(0); seed < seeds; seed++ {
		r := rand.New(rand.NewPCG(seed, 6))
		env := randomMachine(r)
		byTag := map[uint64]Effect{}
		for step := 0; step < 120; step++ {
			for _, e := range randomStep(r, env) {
				if e.Kind == Deliver {
					byTag[e.Tag] = e
				}
			}
			if step%6 != 5 {
				continue
			}
			snap := env.m.Snapshot()
			for c := ConsumerID(1); c <= 3; c++ {
				after := uint64(0)
				if ts := env.tags[c]; len(ts) > 0 && r.IntN(2) == 0 {
					after = ts[r.IntN(len(ts))]
				}
				var want []Effect
				for _, tag := range env.tags[c] {
					if tag <= after {
						continue
					}
					cp, err := Restore(snap)
					if err != nil {
						t.Fatal(err)
					}
					if _, err := cp.Settle(env.now, c, wire.SettleAck, tag, tag, 0); err == nil {
						want = append(want, byTag[tag])
					}
				}
				var got []Effect
				err := env.m.Outstanding(c, after, func(e Effect) { got = append(got, e) })
				if err != nil && (len(want) > 0 || env.m.HasConsumer(c)) {
					t.Fatalf("seed %d step %d: Outstanding(%d): %v, with %d deliveries out", seed, step, c, err, len(want))
				}
				if !slices.EqualFunc(got, want, func(a, b Effect) bool { return a == b }) {
					t.Fatalf("seed %d step %d: Outstanding(%d, after %d) = %+v; acks succeed for %+v", seed, step, c, after, got, want)
				}
				listed += len(got)
			}
			if string(env.m.Snapshot()) != string(snap) {
				t.Fatalf("seed %d step %d: Outstanding changed the state", seed, step)
			}
		}
	}
	if listed < 50 {
		t.Fatalf("only %d deliveries listed over every run: the test checks little", listed)
	}
}
