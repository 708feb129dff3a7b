package queue

import (
	"math/rand/v2"
	"testing"

	"github.com/warren-mq/warren/wire"
)

// TestRandomCommands drives machines with random command sequences and
// checks after every step that the internal invariants hold and that every
// published message is accounted for exactly once by the effects (in the
// queue, out with a consumer, settled, dead-lettered, dropped or rejected).
// It also runs each sequence twice and requires identical effects: the
// machine is deterministic. Failing seeds are printed.
func TestRandomCommands(t *testing.T) {
	for seed := uint64(0); seed < 300; seed++ {
		a := runRandom(t, seed)
		b := runRandom(t, seed)
		if len(a) != len(b) {
			t.Fatalf("seed %d: not deterministic: %d vs %d effects", seed, len(a), len(b))
		}
		for i := range a {
			if a[i] != b[i] {
				t.Fatalf("seed %d: not deterministic at effect %d: %+v vs %+v", seed, i, a[i], b[i])
			}
		}
	}
}

func runRandom(t *testing.T, seed uint64) []Effect {
	r := rand.New(rand.NewPCG(seed, 7))
	cfg := Config{
		MaxPriority:     uint8(r.IntN(4)),
		StrictPriority:  r.IntN(4) == 0,
		StarvationLimit: 1 + r.IntN(4),
		DeadLetter:      r.IntN(2) == 0,
		SingleActive:    r.IntN(5) == 0,
	}
	if r.IntN(3) == 0 {
		cfg.MaxLength = int64(1 + r.IntN(20))
		cfg.Overflow = wire.Overflow(r.IntN(3))
	}
	if r.IntN(3) == 0 {
		cfg.MessageTTLMs = int64(1 + r.IntN(500))
	}
	if r.IntN(3) == 0 {
		cfg.DeliveryLimit = uint32(1 + r.IntN(4))
	}
	if r.IntN(3) == 0 {
		cfg.RetryInitialMs, cfg.RetryMultiplier, cfg.RetryMaxMs = int64(1+r.IntN(50)), 2, 200
	}
	if r.IntN(3) == 0 {
		cfg.ConsumerTimeout = int64(1 + r.IntN(300))
	}
	if r.IntN(3) == 0 {
		cfg.DedupWindowMs = int64(1 + r.IntN(200))
	}
	env := &traceEnv{m: New(cfg, 0), where: map[uint64]string{}}
	var all []Effect
	tags := map[ConsumerID][]uint64{}
	record := func(effs []Effect) {
		for _, e := range effs {
			env.account(e)
			if e.Kind == Deliver {
				tags[e.Consumer] = append(tags[e.Consumer], e.Tag)
			}
			all = append(all, e)
		}
	}
	for step := 0; step < 200; step++ {
		env.now += int64(r.IntN(40))
		c := ConsumerID(1 + r.IntN(3))
		switch op := r.IntN(10); {
		case op < 3:
			var msgs []Message
			for i := r.IntN(5); i >= 0; i-- {
				env.nextID++
				m := Message{ID: env.nextID, Size: uint32(r.IntN(100)), Priority: uint8(r.IntN(6)), DedupKey: uint64(r.IntN(30))}
				if r.IntN(4) == 0 {
					m.ExpirationMs, m.HasExpiration = uint32(r.IntN(300)), true
				}
				env.where[env.nextID] = "queue"
				msgs = append(msgs, m)
			}
			record(env.m.Enqueue(env.now, msgs))
		case op == 3:
			effs, err := env.m.Subscribe(env.now, ConsumerSpec{ID: c, Owner: OwnerID(c % 2), Prefetch: uint32(r.IntN(4)), Priority: int16(r.IntN(2)), AutoAck: r.IntN(6) == 0})
			if err == nil {
				record(effs)
			}
		case op == 4:
			effs, err := env.m.Cancel(env.now, c, r.IntN(2) == 0)
			if err == nil {
				record(effs)
			}
		case op < 8 && len(tags[c]) > 0:
			ts := tags[c]
			tag := ts[r.IntN(len(ts))]
			first := tag
			if r.IntN(3) == 0 {
				first = 0
			}
			effs, err := env.m.Settle(env.now, c, wire.SettleOp(1+r.IntN(4)), first, tag, uint32(r.IntN(100)))
			if err == nil {
				record(effs)
			}
		case op == 8:
			record(env.m.Down(env.now, OwnerID(r.IntN(2))))
		default:
			record(env.m.Tick(env.now))
		}
		if err := env.m.checkInvariants(); err != nil {
			t.Fatalf("seed %d step %d: %v", seed, step, err)
		}
		if err := env.checkAccounting(); err != nil {
			t.Fatalf("seed %d step %d: %v", seed, step, err)
		}
	}
	return all
}
