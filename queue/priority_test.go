package queue

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/warren-mq/warren/wire"
)

// TestPriorityBacklogStrictOrder: a backlog published before any consumer
// attaches, with no level holding more than K messages, comes out strictly
// by priority (issue 11 item 3: 3 at each level 0..9 came out
// p9 p9 p9 p8 p8 p8 p7 p7 p6 p7 …).
func TestPriorityBacklogStrictOrder(t *testing.T) {
	for seed := uint64(0); seed < 20; seed++ {
		r := rand.New(rand.NewPCG(seed, 3))
		var msgs []Message
		for l := 0; l <= 9; l++ {
			for k := 0; k < 3; k++ {
				msgs = append(msgs, Message{Priority: uint8(l)})
			}
		}
		r.Shuffle(len(msgs), func(i, j int) { msgs[i], msgs[j] = msgs[j], msgs[i] })
		prio := map[uint64]uint8{}
		m := New(Config{MaxPriority: 9}, 0)
		for i := range msgs {
			msgs[i].ID = uint64(i + 1)
			prio[msgs[i].ID] = msgs[i].Priority
			m.Enqueue(0, msgs[i:i+1]) // published one by one, as a client does
		}
		effs, err := m.Subscribe(0, ConsumerSpec{ID: 1, AutoAck: true})
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		last := 10
		bad := false
		for _, e := range effs {
			if e.Kind == Deliver {
				p := int(prio[e.Msg])
				got = append(got, fmt.Sprintf("p%d", p))
				if p > last {
					bad = true
				}
				last = p
			}
		}
		if len(got) != 30 || bad {
			t.Fatalf("seed %d: order %v, want strictly by priority", seed, got)
		}
	}
}

// valveBound is the documented bound (spec §7.2, Machine): while level l
// holds messages and higher levels may receive any number of new ones,
// level l is dispatched from within this many dispatches.
func valveBound(k, maxPriority, l int) int {
	return maxPriority * (k*(maxPriority-l+1) + 1)
}

// TestPriorityValveBound is the bound as a property: random backlogs, then
// one dispatch at a time (a prefetch-1 consumer acking) with random
// arrivals between dispatches, some of them adversarial (two high levels
// alternating, which a count reset on every level change could never
// stop). For every level that holds messages, the dispatches that pass it
// over never exceed valveBound.
func TestPriorityValveBound(t *testing.T) {
	worstSeen := 0
	seeds := uint64(300)
	if raceEnabled {
		seeds = 60
	}
	for seed := uint64(0); seed < seeds; seed++ {
		r := rand.New(rand.NewPCG(seed, 11))
		maxP := 1 + r.IntN(9)
		k := 1 + r.IntN(8)
		m := New(Config{MaxPriority: uint8(maxP), StarvationLimit: k}, 0)
		prio := map[uint64]int{}
		var id uint64
		publish := func(l int) {
			id++
			prio[id] = l
			m.Enqueue(0, []Message{{ID: id, Priority: uint8(l)}})
		}
		for i := r.IntN(60); i > 0; i-- {
			publish(r.IntN(maxP + 1))
		}
		effs, err := m.Subscribe(0, ConsumerSpec{ID: 1, Prefetch: 1})
		if err != nil {
			t.Fatal(err)
		}
		waited := make([]int, maxP+1) // dispatches since level l was last served, while it held messages
		mode := r.IntN(3)
		for step := 0; step < 2000; step++ {
			var tag uint64
			for _, e := range effs {
				if e.Kind != Deliver {
					continue
				}
				tag = e.Tag
				got := prio[e.Msg]
				for l := range waited {
					if l == got {
						waited[l] = 0
						continue
					}
					if m.levels[l].len() > 0 {
						waited[l]++
					}
					if b := valveBound(k, maxP, l); waited[l] > b {
						t.Fatalf("seed %d (max-priority %d, K %d): level %d passed over %d times, bound %d", seed, maxP, k, l, waited[l], b)
					}
					worstSeen = max(worstSeen, waited[l])
				}
			}
			// Arrivals before the next dispatch.
			switch mode {
			case 0: // random
				for i := r.IntN(3); i > 0; i-- {
					publish(r.IntN(maxP + 1))
				}
			case 1: // the top alternates between the two highest levels
				publish(maxP - step%2)
				if r.IntN(50) == 0 {
					publish(r.IntN(maxP))
				}
			case 2: // a stream at one random high level, lower ones sparse
				publish(maxP - r.IntN(2))
				if r.IntN(20) == 0 {
					publish(r.IntN(maxP + 1))
				}
			}
			for l := range waited {
				if m.levels[l].len() == 0 {
					waited[l] = 0
				}
			}
			if tag == 0 {
				break
			}
			effs, err = m.Settle(0, 1, wire.SettleAck, tag, tag, 0)
			if err != nil {
				t.Fatal(err)
			}
		}
	}
	t.Logf("longest wait seen: %d dispatches", worstSeen)
}

// TestRestoreRefusesBadValveState: a snapshot whose valve state names a
// level the queue does not have is refused, not trusted (the rotation
// indexes the level bitmap with it).
func TestRestoreRefusesBadValveState(t *testing.T) {
	m := New(Config{MaxPriority: 3}, 0)
	m.Enqueue(0, []Message{{ID: 1, Priority: 3}, {ID: 2}})
	if _, err := Restore(m.Snapshot()); err != nil {
		t.Fatal(err)
	}
	m.lastLevel = 1000
	if _, err := Restore(m.Snapshot()); err == nil {
		t.Fatal("restored a valve state naming level 1000 of 4")
	}
}
