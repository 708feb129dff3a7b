package queue

import (
	"slices"
	"strconv"
	"testing"

	"github.com/warren-mq/warren/wire"
)

// TestHeldDeadLetters: with HoldDeadLetters, a dead letter's DeadLetter
// effect is emitted as without it, and the message stays held (not
// ready, not delivered, its body still to keep), with its reason and
// death time, through a snapshot, until SettleDeadLetter removes it
// (once: a repeated settle changes nothing).
func TestHeldDeadLetters(t *testing.T) {
	m := New(Config{DeadLetter: true, HoldDeadLetters: true, MessageTTLMs: 1000}, 0)
	m.Enqueue(10, []Message{{ID: 1, Size: 5}, {ID: 2, Size: 7}})
	if _, err := m.Subscribe(20, ConsumerSpec{ID: 1, Owner: 1, Prefetch: 1}); err != nil {
		t.Fatal(err)
	}
	effs, err := m.Settle(30, 1, wire.SettleReject, 1, 1, 0)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(effs, func(e Effect) bool { return e.Kind == DeadLetter && e.Msg == 1 && e.Reason == wire.ReasonRejected }) {
		t.Fatalf("reject: effects %+v, want a DeadLetter of message 1", effs)
	}
	// Message 2 went to the consumer; it expires there only if requeued:
	// settle it so that message 3 expires in place.
	m.Settle(40, 1, wire.SettleAck, 2, 2, 0)
	m.Enqueue(50, []Message{{ID: 3, Size: 11}})
	m.Cancel(60, 1, true)
	m.Tick(2000) // message 3 expires (TTL 1000)
	if n, b := m.HeldDeadLetters(); n != 2 || b != 16 {
		t.Fatalf("held dead letters: %d (%d bytes), want 2 (16 bytes)", n, b)
	}
	if m.Ready() != 0 || m.Unacked() != 0 {
		t.Fatalf("ready %d unacked %d: held dead letters count as neither", m.Ready(), m.Unacked())
	}
	var held []string
	m2, err := Restore(m.Snapshot())
	if err != nil {
		t.Fatal(err)
	}
	m2.EachHeldDeadLetter(func(id uint64, r wire.DeathReason, at int64) {
		held = append(held, r.String()+"@"+strconv.FormatInt(at, 10)+"#"+strconv.FormatUint(id, 10))
	})
	if want := []string{"rejected@30#1", "expired@2000#3"}; !slices.Equal(held, want) {
		t.Fatalf("restored held dead letters %v, want %v", held, want)
	}
	var listed []uint64
	m2.EachMessage(func(id uint64, _ uint32) { listed = append(listed, id) })
	if !slices.Equal(listed, []uint64{1, 3}) {
		t.Fatalf("EachMessage lists %v, want the held dead letters [1 3]", listed)
	}
	for _, mm := range []*Machine{m, m2} {
		effs := mm.SettleDeadLetter(3000, 1)
		if len(effs) == 0 || effs[0] != (Effect{Kind: Remove, Msg: 1}) {
			t.Fatalf("settle of held dead letter 1: effects %+v, want a Remove of it", effs)
		}
		if effs := mm.SettleDeadLetter(3001, 1); slices.ContainsFunc(effs, func(e Effect) bool { return e.Kind == Remove }) {
			t.Fatalf("a repeated settle of dead letter 1 removed something: %+v", effs)
		}
		if n, b := mm.HeldDeadLetters(); n != 1 || b != 11 || !mm.IsHeldDeadLetter(3) {
			t.Fatalf("after the settle: %d held (%d bytes), want message 3 only", n, b)
		}
	}
	if string(m.Snapshot()) != string(m2.Snapshot()) {
		t.Fatal("the restored machine's snapshot differs after the same settles")
	}

	// Without the option, nothing is held: the DeadLetter frees it.
	m3 := New(Config{DeadLetter: true}, 0)
	m3.Enqueue(0, []Message{{ID: 1}})
	m3.Subscribe(0, ConsumerSpec{ID: 1, Owner: 1})
	m3.Settle(0, 1, wire.SettleReject, 1, 1, 0)
	if n, _ := m3.HeldDeadLetters(); n != 0 {
		t.Fatalf("a queue without HoldDeadLetters holds %d dead letters", n)
	}
}

// TestRestoreReadsVersion5: a snapshot of the previous version (what
// durable queues wrote before held dead letters) restores, as a queue
// that holds none.
func TestRestoreReadsVersion5(t *testing.T) {
	m := New(Config{DeadLetter: true, MaxPriority: 2}, 0)
	m.Enqueue(10, []Message{{ID: 1, Size: 5, Priority: 2}, {ID: 2, Size: 7}})
	v6 := m.Snapshot()
	// v5 lacks the hold flag (after the 17 config fields) and the held
	// count (before the 10 stats).
	const holdAt = 1 + 17*8
	v5 := append([]byte{oldSnapshotVersion}, v6[1:holdAt]...)
	v5 = append(v5, v6[holdAt+8:len(v6)-88]...)
	v5 = append(v5, v6[len(v6)-80:]...)
	m5, err := Restore(v5)
	if err != nil {
		t.Fatalf("restore of a version 5 snapshot: %v", err)
	}
	if string(m5.Snapshot()) != string(v6) {
		t.Fatal("a version 5 snapshot restores to a different machine")
	}
	if _, err := Restore(append([]byte{4}, v5[1:]...)); err == nil {
		t.Fatal("a version 4 snapshot was read")
	}
}
