package queue

import (
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/warren-mq/warren/wire"
)

// TestLiveRunMatchesSettlingOneByOne: for random deliveries to two
// consumers (tags interleaved), some already settled, and random
// ascending tag lists, settling tags[:LiveRun(...)] as one range acks
// exactly the messages that acking each tag on its own does.
func TestLiveRunMatchesSettlingOneByOne(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 17))
	for round := 0; round < 2000; round++ {
		n := 1 + r.IntN(40)
		build := func() *Machine {
			m := New(Config{}, 0)
			msgs := make([]Message, n)
			for i := range msgs {
				msgs[i] = Message{ID: uint64(i + 1)}
			}
			m.Subscribe(0, ConsumerSpec{ID: 1, Owner: 1, Prefetch: 100})
			m.Subscribe(0, ConsumerSpec{ID: 2, Owner: 2, Prefetch: 100})
			m.Enqueue(0, msgs) // delivered round-robin: the tags interleave
			return m
		}
		seed := r.Uint64()
		pick := func(m *Machine) (ConsumerID, []uint64) {
			rr := rand.New(rand.NewPCG(seed, 1))
			id := ConsumerID(1 + rr.IntN(2))
			c := m.find(id)
			var live []uint64
			for _, o := range c.out[c.head:] {
				if !o.settled {
					live = append(live, o.tag)
				}
			}
			// Settle some of them first, leaving tombstones.
			for _, tag := range live {
				if rr.IntN(4) == 0 {
					m.Settle(0, id, wire.SettleAck, tag, tag, 0)
				}
			}
			// An ascending list: mostly live tags, some gaps, some
			// unknown or already settled ones.
			var tags []uint64
			for _, tag := range live {
				if rr.IntN(5) > 0 {
					tags = append(tags, tag)
				}
			}
			if rr.IntN(4) == 0 {
				tags = append(tags, 1000+uint64(rr.IntN(3)))
			}
			return id, tags
		}
		m1, m2 := build(), build()
		// Same deliveries in both: the machines are deterministic.
		id, tags := pick(m1)
		id2, tags2 := pick(m2)
		if id != id2 || !slices.Equal(tags, tags2) {
			t.Fatal("the two machines differ")
		}
		if len(tags) == 0 {
			continue
		}
		k := m1.LiveRun(id, tags)
		if k < 0 || k > len(tags) {
			t.Fatalf("LiveRun = %d for %d tags", k, len(tags))
		}
		var got, want []uint64
		if k > 0 {
			effs, err := m1.Settle(0, id, wire.SettleAck, tags[0], tags[k-1], 0)
			if err != nil {
				t.Fatalf("round %d: range settle of a live run: %v", round, err)
			}
			got = removed(effs)
		}
		for _, tag := range tags[:k] {
			effs, err := m2.Settle(0, id, wire.SettleAck, tag, tag, 0)
			if err != nil {
				t.Fatalf("round %d: tag %d of the run is not live: %v", round, tag, err)
			}
			want = append(want, removed(effs)...)
		}
		if !slices.Equal(got, want) {
			t.Fatalf("round %d: range acked %v, one by one %v (tags %v, run %d)", round, got, want, tags, k)
		}
		if k < len(tags) {
			// The run stops at a tag that is not the next live one.
			if _, err := m2.Settle(0, id, wire.SettleAck, tags[k], tags[k], 0); err == nil && k > 0 {
				// tags[k] was live: then a live tag not in the list lay
				// between tags[k-1] and tags[k] in m1.
				if !liveBetween(m1, id, tags[k-1], tags[k]) {
					t.Fatalf("round %d: run stopped at live tag %d with nothing between (tags %v)", round, tags[k], tags)
				}
			}
		}
	}
}

func removed(effs []Effect) []uint64 {
	var ids []uint64
	for _, e := range effs {
		if e.Kind == Remove {
			ids = append(ids, e.Msg)
		}
	}
	return ids
}

func liveBetween(m *Machine, id ConsumerID, a, b uint64) bool {
	c := m.find(id)
	for _, o := range c.out[c.head:] {
		if !o.settled && o.tag > a && o.tag < b {
			return true
		}
	}
	return false
}

// TestLiveRunInOrderAcksIsWhole: a consumer acking its deliveries in
// order (tags interleaved with another consumer's) gets one run for all.
func TestLiveRunInOrderAcksIsWhole(t *testing.T) {
	m := New(Config{}, 0)
	msgs := make([]Message, 100)
	for i := range msgs {
		msgs[i] = Message{ID: uint64(i + 1)}
	}
	m.Subscribe(0, ConsumerSpec{ID: 1, Owner: 1, Prefetch: 100})
	m.Subscribe(0, ConsumerSpec{ID: 2, Owner: 2, Prefetch: 100})
	m.Enqueue(0, msgs)
	c := m.find(1)
	var tags []uint64
	for _, o := range c.out {
		tags = append(tags, o.tag)
	}
	if len(tags) < 2 || tags[1] == tags[0]+1 {
		t.Fatalf("want interleaved tags, got %v", tags)
	}
	if k := m.LiveRun(1, tags); k != len(tags) {
		t.Fatalf("LiveRun = %d, want %d", k, len(tags))
	}
	if k := m.LiveRun(1, tags[3:]); k != len(tags)-3 {
		t.Fatalf("LiveRun from the middle = %d, want %d", k, len(tags)-3)
	}
	if k := m.LiveRun(9, tags); k != 0 {
		t.Fatalf("LiveRun of an unknown consumer = %d", k)
	}
}
