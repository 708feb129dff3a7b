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
	env := randomMachine(r)
	var all []Effect
	for step := 0; step < 200; step++ {
		all = append(all, randomStep(r, env)...)
		if err := env.m.checkInvariants(); err != nil {
			t.Fatalf("seed %d step %d: %v", seed, step, err)
		}
		if err := env.checkAccounting(); err != nil {
			t.Fatalf("seed %d step %d: %v", seed, step, err)
		}
	}
	return all
}

// randomMachine makes a queue with a random configuration.
func randomMachine(r *rand.Rand) *traceEnv {
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
		cfg.RetryInitialMs, cfg.RetryMultiplierMilli, cfg.RetryMaxMs = int64(1+r.IntN(50)), uint32(1000+r.IntN(2000)), 200
	}
	if r.IntN(3) == 0 {
		cfg.ConsumerTimeout = int64(1 + r.IntN(300))
	}
	if r.IntN(3) == 0 {
		cfg.DedupWindowMs = int64(1 + r.IntN(200))
	}
	cfg.HoldDeadLetters = r.IntN(2) == 0
	return &traceEnv{m: New(cfg, 0), where: map[uint64]string{}}
}

// randomStep applies one random command and returns a copy of its effects.
func randomStep(r *rand.Rand, env *traceEnv) []Effect {
	if env.tags == nil {
		env.tags = map[ConsumerID][]uint64{}
	}
	var out []Effect
	record := func(effs []Effect) {
		for _, e := range effs {
			env.account(e)
			if e.Kind == Deliver {
				env.tags[e.Consumer] = append(env.tags[e.Consumer], e.Tag)
			}
		}
		out = append(out, effs...)
	}
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
		effs, err := env.m.Subscribe(env.now, ConsumerSpec{ID: c, Owner: OwnerID(c % 2), Prefetch: uint32(r.IntN(4)), PrefetchBytes: uint32(r.IntN(3) * 60), Priority: int16(r.IntN(2)), AutoAck: r.IntN(6) == 0, TimeoutMs: int64(r.IntN(3) * r.IntN(200))})
		if err == nil {
			record(effs)
		}
	case op == 4:
		effs, err := env.m.Cancel(env.now, c, r.IntN(2) == 0)
		if err == nil {
			record(effs)
		}
	case op < 8 && len(env.tags[c]) > 0:
		ts := env.tags[c]
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
		// Settle a held dead letter (its targets have it), or an id that
		// is not one, or let time pass.
		if n, _ := env.m.HeldDeadLetters(); n > 0 && r.IntN(2) == 0 {
			var ids []uint64
			env.m.EachHeldDeadLetter(func(id uint64, _ wire.DeathReason, _ int64) { ids = append(ids, id) })
			record(env.m.SettleDeadLetter(env.now, ids[r.IntN(len(ids))]))
		} else if r.IntN(8) == 0 {
			record(env.m.SettleDeadLetter(env.now, uint64(r.IntN(int(env.nextID)+1))))
		} else {
			record(env.m.Tick(env.now))
		}
	}
	return out
}

// TestSnapshotRoundTrip: at random points of random runs, a restored
// snapshot re-snapshots to the same bytes and then behaves identically to
// the original under the same further commands; SnapshotLen is its exact
// length (Snapshot allocates it once) and AppendSnapshot appends it.
func TestSnapshotRoundTrip(t *testing.T) {
	for seed := uint64(0); seed < 200; seed++ {
		r := rand.New(rand.NewPCG(seed, 99))
		a := randomMachine(r)
		for step := 0; step < 120; step++ {
			randomStep(r, a)
		}
		snap := a.m.Snapshot()
		if n := a.m.SnapshotLen(); len(snap) != n || cap(snap) != n {
			t.Fatalf("seed %d: a snapshot of %d bytes (capacity %d), SnapshotLen %d", seed, len(snap), cap(snap), n)
		}
		if b := a.m.AppendSnapshot([]byte("pre")); string(b) != "pre"+string(snap) {
			t.Fatalf("seed %d: AppendSnapshot differs from Snapshot", seed)
		}
		m2, err := Restore(snap)
		if err != nil {
			t.Fatalf("seed %d: restore: %v", seed, err)
		}
		if again := m2.Snapshot(); string(again) != string(snap) {
			t.Fatalf("seed %d: snapshot of the restored machine differs", seed)
		}
		b := &traceEnv{m: m2, now: a.now, nextID: a.nextID, where: map[uint64]string{}, tags: map[ConsumerID][]uint64{}}
		for c, ts := range a.tags {
			b.tags[c] = append([]uint64(nil), ts...)
		}
		// Drive both with the same random future.
		ra := rand.New(rand.NewPCG(seed, 1234))
		rb := rand.New(rand.NewPCG(seed, 1234))
		for step := 0; step < 80; step++ {
			ea := randomStep(ra, a)
			eb := randomStep(rb, b)
			if len(ea) != len(eb) {
				t.Fatalf("seed %d step %d: %d vs %d effects", seed, step, len(ea), len(eb))
			}
			for i := range ea {
				if ea[i] != eb[i] {
					t.Fatalf("seed %d step %d: %+v vs %+v", seed, step, ea[i], eb[i])
				}
			}
		}
	}
	for _, bad := range [][]byte{nil, {9}, {snapshotVersion, 1, 2}} {
		if _, err := Restore(bad); err == nil {
			t.Fatalf("restored garbage %v", bad)
		}
	}
}
