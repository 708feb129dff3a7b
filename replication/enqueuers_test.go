package replication

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/warren-mq/warren/queue"
)

// fromEntry is an entry of one publish-from of n messages from o (bodies
// "q<qseq>").
func fromEntry(t *testing.T, o Origin, n int) []byte {
	t.Helper()
	enq := &queue.Enqueue{}
	for k := range n {
		enq.Msgs = append(enq.Msgs, queue.Message{Size: 8})
		enq.Bodies = append(enq.Bodies, fmt.Appendf(nil, "q%d", o.QSeq+uint64(k)))
	}
	var e EntryEncoder
	if err := e.AddFrom(o, enq); err != nil {
		t.Fatal(err)
	}
	return bytes.Clone(e.Finish(EntryHeader{NowMs: 1000}))
}

type fromFSM struct {
	t     *testing.T
	f     *QueueFSM
	idx   uint64
	last  FromResult
	msgs  []string // the bodies applied, in order
	store map[uint64][]byte
}

func newFromFSM(t *testing.T) *fromFSM {
	x := &fromFSM{t: t, store: map[uint64][]byte{}}
	x.f = NewQueueFSM(queue.New(queue.Config{}, 0), 0, x.sink)
	return x
}

func (x *fromFSM) sink(a *Applied) {
	if enq, ok := a.Command.(*queue.Enqueue); ok {
		x.last = a.From
		for k, b := range enq.Bodies {
			x.msgs = append(x.msgs, string(b))
			// The id names the body's place in the entry, counting the
			// messages skipped (Group.Body reads it so).
			if slot := int(enq.Msgs[k].ID & 0xFFFF); slot != a.From.Skipped+k {
				x.t.Errorf("message %q has slot %d, want %d", b, slot, a.From.Skipped+k)
			}
		}
	}
}

func (x *fromFSM) apply(data []byte) FromResult {
	x.t.Helper()
	x.idx++
	x.last = FromResult{}
	if _, err := x.f.Apply(x.idx, data); err != nil {
		x.t.Fatal(err)
	}
	x.store[x.idx] = data
	return x.last
}

func (x *fromFSM) publish(o Origin, n int) FromResult {
	x.t.Helper()
	return x.apply(fromEntry(x.t, o, n))
}

func TestEnqueuerDedup(t *testing.T) {
	x := newFromFSM(t)
	e := Origin{Enqueuer: 2<<48 | 1, Incarnation: 100}
	at := func(q uint64) Origin { o := e; o.QSeq = q; return o }
	check := func(r FromResult, want FromOutcome, skipped int, resend uint64) {
		t.Helper()
		if r.Outcome != want || r.Skipped != skipped || r.ResendFrom != resend {
			t.Fatalf("got %s skipped %d resend %d, want %s skipped %d resend %d", r.Outcome, r.Skipped, r.ResendFrom, want, skipped, resend)
		}
	}
	// A first part that does not start at 1: a gap (the first was lost).
	check(x.publish(at(3), 2), FromGap, 0, 1)
	if x.f.Enqueuers() != 0 {
		t.Fatalf("a refused part added its enqueuer")
	}
	check(x.publish(at(1), 2), FromApplied, 0, 0)   // 1, 2
	check(x.publish(at(1), 2), FromDuplicate, 0, 0) // resent whole
	check(x.publish(at(2), 3), FromApplied, 1, 0)   // 2 skipped; 3, 4
	check(x.publish(at(6), 1), FromGap, 0, 5)       // 5 missing
	check(x.publish(at(5), 2), FromApplied, 0, 0)   // 5, 6
	check(x.publish(at(7), 1), FromApplied, 0, 0)
	want := []string{"q1", "q2", "q3", "q4", "q5", "q6", "q7"}
	if strings.Join(x.msgs, ",") != strings.Join(want, ",") {
		t.Fatalf("applied %v, want %v", x.msgs, want)
	}
	if got := x.f.Machine().Ready(); got != 7 {
		t.Fatalf("%d ready, want 7", got)
	}
	// The entries that applied nothing are dead; every live one holds a
	// ready message.
	if live := x.f.LiveEntries(nil, x.idx); len(live) != 4 {
		t.Fatalf("live entries %v, want the 4 that applied messages", live)
	}

	// A new incarnation starts over at 1; the old one is refused.
	n := e
	n.Incarnation, n.QSeq = 101, 1
	check(x.publish(n, 1), FromApplied, 0, 0)
	check(x.publish(at(8), 1), FromStale, 0, 0)

	// Down removes it: a part from qseq 2 is then a gap.
	var enc EntryEncoder
	if err := enc.AddEnqueuerDown(e.Enqueuer, 101); err != nil {
		t.Fatal(err)
	}
	x.apply(bytes.Clone(enc.Finish(EntryHeader{NowMs: 1000})))
	if x.f.Enqueuers() != 0 {
		t.Fatalf("%d enqueuers after its down", x.f.Enqueuers())
	}
	n.QSeq = 2
	check(x.publish(n, 1), FromGap, 0, 1)
}

func TestEnqueuerDownNode(t *testing.T) {
	x := newFromFSM(t)
	for _, id := range []uint64{2<<48 | 1, 2<<48 | 2, 3<<48 | 1} {
		x.publish(Origin{Enqueuer: id, Incarnation: 5, QSeq: 1}, 1)
	}
	var enc EntryEncoder
	if err := enc.AddEnqueuerDown(2<<48|EveryEnqueuer, 5); err != nil {
		t.Fatal(err)
	}
	x.apply(bytes.Clone(enc.Finish(EntryHeader{NowMs: 1000})))
	if x.f.Enqueuers() != 1 {
		t.Fatalf("%d enqueuers, want node 3's only", x.f.Enqueuers())
	}
}

func TestEnqueuerTableFull(t *testing.T) {
	var tb enqueuerTable
	for i := range MaxEnqueuers {
		if r := tb.admit(Origin{Enqueuer: uint64(i), Incarnation: 1, QSeq: 1}, 1); r.Outcome != FromApplied {
			t.Fatalf("enqueuer %d: %s", i, r.Outcome)
		}
	}
	if r := tb.admit(Origin{Enqueuer: MaxEnqueuers, Incarnation: 1, QSeq: 1}, 1); r.Outcome != FromFull {
		t.Fatalf("a new enqueuer in a full table: %s", r.Outcome)
	}
	if r := tb.admit(Origin{Enqueuer: 7, Incarnation: 1, QSeq: 2}, 1); r.Outcome != FromApplied {
		t.Fatalf("a known enqueuer in a full table: %s", r.Outcome)
	}
}

// The enqueuer table is in the snapshot: a replica restored from it
// dedups as the one that took it; a snapshot without a table (version 1,
// as earlier builds wrote) still restores.
func TestEnqueuerSnapshotRoundTrip(t *testing.T) {
	x := newFromFSM(t)
	v1, err := x.f.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	if v1[0] != fsmSnapVersion {
		t.Fatalf("an FSM with no enqueuer wrote snapshot version %d", v1[0])
	}
	a := Origin{Enqueuer: 1<<48 | 3, Incarnation: 9, QSeq: 1}
	b := Origin{Enqueuer: 2<<48 | 1, Incarnation: 4, QSeq: 1}
	x.publish(a, 3)
	x.publish(b, 2)
	snap, err := x.f.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	if snap[0] != fsmSnapVersionEnqueuers {
		t.Fatalf("snapshot version %d, want %d", snap[0], fsmSnapVersionEnqueuers)
	}
	y := &fromFSM{t: t, idx: x.idx, store: map[uint64][]byte{}}
	if y.f, err = RestoreQueueFSM(x.idx, snap, y.sink); err != nil {
		t.Fatal(err)
	}
	again, _ := y.f.Snapshot()
	if !bytes.Equal(again, snap) {
		t.Fatalf("the restored FSM's snapshot differs")
	}
	a.QSeq = 2
	if r := y.publish(a, 3); r.Outcome != FromApplied || r.Skipped != 2 {
		t.Fatalf("after restore: %s skipped %d, want applied skipped 2", r.Outcome, r.Skipped)
	}
	if r := y.publish(b, 1); r.Outcome != FromDuplicate {
		t.Fatalf("after restore: %s, want duplicate", r.Outcome)
	}
	// The version 1 snapshot restores (no table).
	z, err := RestoreQueueFSM(0, v1, nil)
	if err != nil || z.Enqueuers() != 0 {
		t.Fatalf("version 1 snapshot: %v, %d enqueuers", err, z.Enqueuers())
	}
	// A table out of order is refused.
	bad := bytes.Clone(snap)
	copy(bad[fsmSnapHeaderLen+8:], snap[fsmSnapHeaderLen+8+24:fsmSnapHeaderLen+8+48])
	copy(bad[fsmSnapHeaderLen+8+24:], snap[fsmSnapHeaderLen+8:fsmSnapHeaderLen+8+24])
	if _, err := RestoreQueueFSM(x.idx, bad, nil); !errors.Is(err, ErrBadFSMSnapshot) {
		t.Fatalf("a table out of order: %v", err)
	}
}

// Enqueuer frames make a version 2 entry that decodes to what was
// encoded; a version 1 entry may not hold them.
func TestEnqueuerEntryFrames(t *testing.T) {
	o := Origin{Enqueuer: 5<<48 | 2, Incarnation: 77, QSeq: 12}
	data := fromEntry(t, o, 2)
	if data[0] != EntryVersionEnqueuers {
		t.Fatalf("entry version %d", data[0])
	}
	e, err := DecodeEntry(data)
	if err != nil {
		t.Fatal(err)
	}
	if f := e.Frames[0]; !f.From || f.Origin != o || len(e.Commands[0].(*queue.Enqueue).Msgs) != 2 {
		t.Fatalf("decoded %+v %+v", e.Frames, e.Commands)
	}
	bad := bytes.Clone(data)
	bad[0] = EntryVersion
	if _, err := DecodeEntry(bad); !errors.Is(err, ErrMalformedEntry) {
		t.Fatalf("a publish-from in a version 1 entry: %v", err)
	}
	plain, err := AppendEntry(nil, EntryHeader{}, &queue.Tick{})
	if err != nil || plain[0] != EntryVersion {
		t.Fatalf("an entry without enqueuer frames: version %d, %v", plain[0], err)
	}
}

func TestEntryVersion2NeedsEnqueuerFrame(t *testing.T) {
	plain, _ := AppendEntry(nil, EntryHeader{}, &queue.Tick{})
	plain[0] = EntryVersionEnqueuers
	if _, err := DecodeEntry(plain); !errors.Is(err, ErrMalformedEntry) {
		t.Fatalf("a version 2 entry without enqueuer frames: %v", err)
	}
}

// TestEnqueuerDuplicateAgreesWithAdmit: duplicate, which changes nothing,
// says FromDuplicate exactly when admit would, over random publish-froms
// of one message or more (incarnations, gaps, overlaps, resends) and
// downs.
func TestEnqueuerDuplicateAgreesWithAdmit(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	var tab enqueuerTable
	for i := range 20000 {
		enq := uint64(1+rng.IntN(3)) << 48
		if rng.IntN(50) == 0 {
			tab.down(enq, uint64(rng.IntN(3)))
			continue
		}
		o := Origin{Enqueuer: enq, Incarnation: uint64(rng.IntN(3)), QSeq: uint64(rng.IntN(12))}
		n := 1 + rng.IntN(4) // a part holds a message at least
		want := tab.duplicate(o, n)
		if got := tab.admit(o, n).Outcome == FromDuplicate; got != want {
			t.Fatalf("op %d: %+v n=%d: duplicate %v, admit's outcome duplicate %v", i, o, n, want, got)
		}
	}
}
