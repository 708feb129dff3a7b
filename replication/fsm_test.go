package replication

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/warren-mq/warren/queue"
	"github.com/warren-mq/warren/wire"
)

var fsmSeeds = flag.Int("fsm.seeds", 0, "seeds for the FSM equivalence test (0: 150, or 15 under -race)")

func seedCount() int {
	if *fsmSeeds > 0 {
		return *fsmSeeds
	}
	if raceEnabled {
		return 15
	}
	return 150
}

// randomConfig is a random queue configuration exercising every feature
// the commands can reach (priorities, limits and overflow, TTL, dead
// letters, delivery limits, retries, leases, dedup, single active).
func randomConfig(r *rand.Rand) queue.Config {
	cfg := queue.Config{
		MaxPriority:     uint8(r.IntN(4)),
		StrictPriority:  r.IntN(4) == 0,
		StarvationLimit: 1 + r.IntN(4),
		DeadLetter:      r.IntN(2) == 0,
		SingleActive:    r.IntN(5) == 0,
	}
	if r.IntN(3) == 0 {
		cfg.MaxLength = int64(1 + r.IntN(20))
		cfg.Overflow = wire.Overflow(r.IntN(4))
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
	if r.IntN(6) == 0 {
		cfg.AutoDelete = true
	}
	if r.IntN(6) == 0 {
		cfg.ExpiresMs = int64(1 + r.IntN(400))
	}
	cfg.HoldDeadLetters = r.IntN(2) == 0 // as durable queues have it
	return cfg
}

// workload makes random entries of random commands, from what it has seen
// delivered (for settles).
type workload struct {
	r      *rand.Rand
	hdrNow int64
	seq    uint64
	tags   map[queue.ConsumerID][]uint64
	dead   []uint64 // the dead letters seen (to settle, if held)
}

// saw records an effect the workload's commands caused.
func (w *workload) saw(e queue.Effect) {
	switch e.Kind {
	case queue.Deliver:
		w.tags[e.Consumer] = append(w.tags[e.Consumer], e.Tag)
	case queue.DeadLetter:
		w.dead = append(w.dead, e.Msg)
	}
}

func (w *workload) command() queue.Command {
	r := w.r
	c := queue.ConsumerID(1 + r.IntN(3))
	junk := int64(r.IntN(1000)) // the command's own time, which apply ignores
	switch op := r.IntN(20); {
	case op < 7:
		n := r.IntN(6)
		e := &queue.Enqueue{NowMs: junk}
		for range n {
			m := queue.Message{ID: r.Uint64(), Size: uint32(r.IntN(100)), Priority: uint8(r.IntN(6)), DedupKey: uint64(r.IntN(30))}
			if r.IntN(4) == 0 {
				m.ExpirationMs, m.HasExpiration = uint32(r.IntN(300)), true
			}
			e.Msgs = append(e.Msgs, m)
		}
		if r.IntN(2) == 0 {
			e.Bodies = make([][]byte, n)
			for i := range e.Bodies {
				e.Bodies[i] = []byte(fmt.Sprint("body", i))
			}
		}
		return e
	case op < 9:
		return &queue.Subscribe{NowMs: junk, Spec: queue.ConsumerSpec{ID: c, Owner: queue.OwnerID(c % 2), Prefetch: uint32(r.IntN(4)),
			PrefetchBytes: uint32(r.IntN(3) * 60), Priority: int16(r.IntN(2)), AutoAck: r.IntN(6) == 0, TimeoutMs: int64(r.IntN(3) * r.IntN(200))}}
	case op == 9:
		return &queue.Cancel{NowMs: junk, Consumer: c, Requeue: r.IntN(2) == 0}
	case op < 15:
		ts := w.tags[c]
		if len(ts) == 0 {
			return &queue.Tick{NowMs: junk}
		}
		tag := ts[r.IntN(len(ts))] // may be settled already: ErrUnknownTag
		first := tag
		if r.IntN(3) == 0 {
			first = 0
		}
		op := wire.SettleOp(1 + r.IntN(4))
		if r.IntN(50) == 0 {
			op = 9 // not a settle op: the machine refuses it
		}
		return &queue.Settle{NowMs: junk, Consumer: c, Op: op, First: first, Last: tag, ArgMs: uint32(r.IntN(100))}
	case op < 17:
		return &queue.Down{NowMs: junk, Owner: queue.OwnerID(r.IntN(2))}
	case op < 19:
		if len(w.dead) > 0 && r.IntN(2) == 0 {
			// Its targets have it (a held one), or it was settled already.
			return &queue.SettleDeadLetter{NowMs: junk, ID: w.dead[r.IntN(len(w.dead))]}
		}
		return &queue.Tick{NowMs: junk}
	}
	return &queue.Purge{NowMs: junk}
}

// entry makes the next entry: a header time that mostly grows and
// sometimes goes back (a new leader's slower clock), and 0–5 commands.
func (w *workload) entry() (EntryHeader, []queue.Command) {
	w.hdrNow += int64(w.r.IntN(60)) - 15
	w.seq++
	h := EntryHeader{NowMs: w.hdrNow, Proposer: 1<<48 | 1, Seq: w.seq}
	var cmds []queue.Command
	for i := w.r.IntN(6); i > 0; i-- {
		cmds = append(cmds, w.command())
	}
	return h, cmds
}

type step struct {
	cmd  int
	now  int64
	effs []queue.Effect
	err  error
	// ignored: a settle of a tag not outstanding (changed nothing; not compared)
	ignored bool
}

func (s step) String() string {
	return fmt.Sprintf("cmd %d at %d: %v err=%v", s.cmd, s.now, s.effs, s.err)
}

// direct applies an entry's commands straight to m, as the FSM promises
// to: at max(header time, last), ids index<<16|slot, ErrUnknownTag ignored.
func direct(m *queue.Machine, index uint64, now int64, cmds []queue.Command) []step {
	var out []step
	slot := uint64(0)
	for i, c := range cmds {
		var cmd queue.Command
		switch c := c.(type) {
		case *queue.Enqueue:
			e := *c
			e.NowMs = now
			e.Msgs = slices.Clone(c.Msgs)
			for k := range e.Msgs {
				e.Msgs[k].ID = index<<16 | slot
				slot++
			}
			cmd = &e
		case *queue.Settle:
			x := *c
			x.NowMs = now
			cmd = &x
		case *queue.Subscribe:
			x := *c
			x.NowMs = now
			cmd = &x
		case *queue.Cancel:
			x := *c
			x.NowMs = now
			cmd = &x
		case *queue.Down:
			x := *c
			x.NowMs = now
			cmd = &x
		case *queue.Tick:
			cmd = &queue.Tick{NowMs: now}
		case *queue.Purge:
			cmd = &queue.Purge{NowMs: now}
		case *queue.SettleDeadLetter:
			cmd = &queue.SettleDeadLetter{NowMs: now, ID: c.ID}
		}
		effs, err := m.Apply(cmd)
		ignored := err == queue.ErrUnknownTag
		if ignored {
			effs, err = nil, nil
		}
		out = append(out, step{cmd: i, now: now, effs: slices.Clone(effs), err: err, ignored: ignored})
	}
	return out
}

// liveFromMachine is the live set recomputed from what m holds.
func liveFromMachine(m *queue.Machine) []uint64 {
	var ids []uint64
	m.EachMessage(func(id uint64, _ uint32) { ids = append(ids, id>>16) })
	slices.Sort(ids)
	return slices.Compact(ids)
}

func stepsEqual(a, b []step) bool {
	return slices.EqualFunc(a, b, func(x, y step) bool {
		return x.cmd == y.cmd && x.now == y.now && slices.Equal(x.effs, y.effs) && errors.Is(x.err, y.err) && errors.Is(y.err, x.err)
	})
}

// TestFSMEquivalence: random workloads applied through encoded entries
// and QueueFSM give, command for command, the same effects and errors as
// the same commands applied straight to a Machine at the entry's time
// with index<<16|slot ids; the live entry set equals the one recomputed
// from the machine after every entry; WakeAt follows the last Timer; the
// machines' snapshots are byte-equal at the end. At a random point the
// FSM is snapshotted and restored into a second FSM, which then applies
// the same entries and ends with byte-equal snapshots and equal effects.
func TestFSMEquivalence(t *testing.T) {
	for seed := uint64(0); seed < uint64(seedCount()); seed++ {
		r := rand.New(rand.NewPCG(seed, 42))
		cfg := randomConfig(r)
		ref := queue.New(cfg, 0)
		var got []step
		sink := func(a *Applied) {
			got = append(got, step{cmd: a.Cmd, now: a.NowMs, effs: slices.Clone(a.Effects), err: a.Err})
		}
		f := NewQueueFSM(queue.New(cfg, 0), 0, sink)
		var twin *QueueFSM // restored from f's snapshot
		var twinGot []step
		restoreAt := uint64(1 + r.IntN(120))
		w := &workload{r: r, tags: map[queue.ConsumerID][]uint64{}}
		lastNow, wake := int64(0), int64(0)
		var enc EntryEncoder
		for index := uint64(1); index <= 150; index++ {
			h, cmds := w.entry()
			enc.Reset()
			for _, c := range cmds {
				if err := enc.Add(c); err != nil {
					t.Fatal(err)
				}
			}
			data := enc.Finish(h)
			if r.IntN(15) == 0 {
				data = nil // a raft no-op
			}
			var want []step
			if data != nil {
				lastNow = max(lastNow, h.NowMs)
				want = direct(ref, index, lastNow, cmds)
				for _, s := range want {
					if s.err == nil && !s.ignored {
						wake = 0
					}
					for _, e := range s.effs {
						if e.Kind == queue.Timer {
							wake = e.At
						}
						w.saw(e)
					}
				}
			}
			got = got[:0]
			if _, err := f.Apply(index, data); err != nil {
				t.Fatalf("seed %d entry %d: %v", seed, index, err)
			}
			if !stepsEqual(got, want) {
				t.Fatalf("seed %d entry %d: through the log\n%v\ndirect\n%v", seed, index, got, want)
			}
			if twin != nil {
				twinGot = twinGot[:0]
				if _, err := twin.Apply(index, data); err != nil {
					t.Fatalf("seed %d entry %d (restored): %v", seed, index, err)
				}
				if !stepsEqual(twinGot, want) {
					t.Fatalf("seed %d entry %d: the restored FSM's effects differ\n%v\n%v", seed, index, twinGot, want)
				}
			}
			if l, m := f.LiveEntries(nil, index), liveFromMachine(f.Machine()); !slices.Equal(l, m) {
				t.Fatalf("seed %d entry %d: live set %v, the machine holds messages of %v", seed, index, l, m)
			}
			if at, _ := f.WakeAt(); at != wake {
				t.Fatalf("seed %d entry %d: WakeAt %d, the last Timer said %d", seed, index, at, wake)
			}
			if f.LastNow() != lastNow || f.AppliedIndex() != index {
				t.Fatalf("seed %d entry %d: LastNow %d applied %d", seed, index, f.LastNow(), f.AppliedIndex())
			}
			if index == restoreAt {
				snap, _ := f.Snapshot()
				twin = NewQueueFSM(queue.New(queue.Config{}, 0), 0, func(a *Applied) {
					twinGot = append(twinGot, step{cmd: a.Cmd, now: a.NowMs, effs: slices.Clone(a.Effects), err: a.Err})
				})
				if err := twin.Restore(index, snap); err != nil {
					t.Fatalf("seed %d: restore at %d: %v", seed, index, err)
				}
				if again, _ := twin.Snapshot(); !bytes.Equal(again, snap) {
					t.Fatalf("seed %d: restored snapshot differs", seed)
				}
				if l := twin.LiveEntries(nil, index); !slices.Equal(l, f.LiveEntries(nil, index)) {
					t.Fatalf("seed %d: restored live set %v, want %v", seed, l, f.LiveEntries(nil, index))
				}
			}
		}
		if !bytes.Equal(f.Machine().Snapshot(), ref.Snapshot()) {
			t.Fatalf("seed %d: the machine applied through the log differs from the one applied directly", seed)
		}
		if twin != nil {
			a, _ := f.Snapshot()
			b, _ := twin.Snapshot()
			if !bytes.Equal(a, b) {
				t.Fatalf("seed %d: FSM restored at %d ends with a different snapshot", seed, restoreAt)
			}
		}
	}
}

// TestFSMRefusesAndStaysPut: an entry out of order, a malformed entry
// (here: its last command damaged) and a bad snapshot are errors that
// change nothing; in particular no command of a bad entry has run.
func TestFSMRefusesAndStaysPut(t *testing.T) {
	f := NewQueueFSM(queue.New(queue.Config{}, 0), 0, nil)
	good, _ := AppendEntry(nil, EntryHeader{NowMs: 10}, &queue.Enqueue{Msgs: []queue.Message{{Size: 1}}})
	if _, err := f.Apply(1, good); err != nil {
		t.Fatal(err)
	}
	before, _ := f.Snapshot()
	if _, err := f.Apply(1, good); !errors.Is(err, ErrApplyOrder) {
		t.Fatalf("applied twice: %v", err)
	}
	if _, err := f.Apply(3, good); !errors.Is(err, ErrApplyOrder) {
		t.Fatalf("applied with a gap: %v", err)
	}
	bad, _ := AppendEntry(nil, EntryHeader{NowMs: 20}, &queue.Enqueue{Msgs: []queue.Message{{Size: 1}}}, &queue.Cancel{Consumer: 1})
	// The Cancel's frame is the last 32 bytes (8 of frame header, 19 of
	// command, 5 of pad); its requeue byte, the command's last, becomes 7.
	bad[len(bad)-32+8+18] = 7
	if _, err := f.Apply(2, bad); !errors.Is(err, ErrMalformedEntry) {
		t.Fatalf("malformed entry: %v", err)
	}
	if after, _ := f.Snapshot(); !bytes.Equal(before, after) || f.Machine().Ready() != 1 {
		t.Fatal("a refused entry changed the state")
	}
	for _, snap := range [][]byte{nil, make([]byte, 31), append([]byte{2}, before[1:]...), append([]byte{1, 1}, before[2:]...)} {
		if err := f.Restore(1, snap); !errors.Is(err, ErrBadFSMSnapshot) {
			t.Fatalf("restored %x: %v", snap, err)
		}
	}
	if err := f.Restore(2, before); !errors.Is(err, ErrBadFSMSnapshot) {
		t.Fatalf("restored a snapshot of entry 1 as entry 2: %v", err)
	}
	if after, _ := f.Snapshot(); !bytes.Equal(before, after) {
		t.Fatal("a refused snapshot changed the state")
	}
}

// TestFSMClientErrorsAreResults: a command the machine refuses reaches the
// sink with its error and the next command of the entry still runs; a
// settle of a tag already taken back is ignored (no error, no effect).
func TestFSMClientErrorsAreResults(t *testing.T) {
	var seen []string
	f := NewQueueFSM(queue.New(queue.Config{}, 0), 0, func(a *Applied) {
		seen = append(seen, fmt.Sprintf("%d:%s:%d:%v", a.Cmd, a.Command.Kind(), len(a.Effects), a.Err != nil))
	})
	data, _ := AppendEntry(nil, EntryHeader{NowMs: 1},
		&queue.Cancel{Consumer: 9},                                        // unknown consumer: refused
		&queue.Settle{Consumer: 9, Op: wire.SettleAck, First: 5, Last: 5}, // unknown consumer: refused
		&queue.Subscribe{Spec: queue.ConsumerSpec{ID: 1, Owner: 1}},
		&queue.Settle{Consumer: 1, Op: wire.SettleAck, First: 7, Last: 7}, // unknown tag: ignored
		&queue.Enqueue{Msgs: []queue.Message{{Size: 3}}},
	)
	if _, err := f.Apply(1, data); err != nil {
		t.Fatal(err)
	}
	want := []string{"0:cancel:0:true", "1:settle:0:true", "2:subscribe:0:false", "3:settle:0:false", "4:enqueue:1:false"}
	if !slices.Equal(seen, want) {
		t.Fatalf("sink saw %v, want %v", seen, want)
	}
}
