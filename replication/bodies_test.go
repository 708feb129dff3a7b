package replication

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/warren-mq/warren/queue"
	"github.com/warren-mq/warren/segment"
	"github.com/warren-mq/warren/wire"
	"go.etcd.io/raft/v3/raftpb"
)

// TestBodiesFromTheLog: every body a group was given comes back by its
// message id: at delivery, inside the apply (from the tail cache), later
// from segment files (after maintenance moved them), after a snapshot
// compacted the log (the entries still holding messages are kept), and
// after a restart; a message acked and compacted away has no body
// (ErrNoBody), never another message's.
func TestBodiesFromTheLog(t *testing.T) {
	r := rand.New(rand.NewPCG(9, 9))
	fs := segment.NewMemFS()
	l := openMemLog(t, fs)
	store, _ := OpenSnapStore(l)
	s := newShard(t, l)
	bodies := map[uint64][]byte{}
	var g *Group
	delivered := 0
	fsm := NewQueueFSM(queue.New(queue.Config{}, 0), 0, func(a *Applied) {
		if e, ok := a.Command.(*queue.Enqueue); ok {
			for i, m := range e.Msgs {
				bodies[m.ID] = bytes.Clone(e.Bodies[i])
			}
		}
		for _, e := range a.Effects {
			if e.Kind != queue.Deliver {
				continue
			}
			b, err := g.Body(e.Msg)
			if err != nil || !bytes.Equal(b, bodies[e.Msg]) {
				t.Fatalf("delivery of %#x: body %q, %v; want %q", e.Msg, b, err, bodies[e.Msg])
			}
			delivered++
		}
	})
	g, err := s.w.Open(3, raftpb.SnapshotMetadata{ConfState: raftpb.ConfState{Voters: []uint64{1}}}, fsm)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = g.Add(&queue.Subscribe{Spec: queue.ConsumerSpec{ID: 1, Owner: 1, Prefetch: 50}})
	for round := range 40 {
		var msgs []queue.Message
		var bs [][]byte
		for range 1 + r.IntN(5) {
			b := []byte(fmt.Sprintf("round %d body %d %s", round, len(msgs), bytes.Repeat([]byte{'x'}, r.IntN(300))))
			msgs = append(msgs, queue.Message{Size: uint32(len(b))})
			bs = append(bs, b)
		}
		_, _ = g.Add(&queue.Enqueue{Msgs: msgs, Bodies: bs})
		if round%3 == 2 {
			_, _ = g.Add(&queue.Settle{Consumer: 1, Op: wire.SettleAck, Last: uint64(round * 2)})
		}
		s.nowMs++
		s.round()
		s.settle()
		g.ReleaseBodies()
		if round%10 == 9 {
			if err := l.Maintain(); err != nil {
				t.Fatal(err)
			}
		}
	}
	if delivered == 0 {
		t.Fatal("nothing was delivered")
	}
	check := func(g *Group, when string) {
		t.Helper()
		held := map[uint64]bool{}
		g.FSM().Machine().EachMessage(func(id uint64, _ uint32) { held[id] = true })
		for id, want := range bodies {
			b, err := g.Body(id)
			switch {
			case held[id] && (err != nil || !bytes.Equal(b, want)):
				t.Fatalf("%s: held message %#x: body %q, %v; want %q", when, id, b, err, want)
			case !held[id] && err == nil && !bytes.Equal(b, want):
				t.Fatalf("%s: acked message %#x: body %q, want %q or none", when, id, b, want)
			case !held[id] && err != nil && !errors.Is(err, ErrNoBody):
				t.Fatalf("%s: acked message %#x: %v", when, id, err)
			}
		}
		g.ReleaseBodies()
	}
	check(g, "after maintenance")
	done := false
	if err := g.Snapshot(store, func(_ raftpb.SnapshotMetadata, err error) {
		if err != nil {
			t.Fatal(err)
		}
		done = true
	}); err != nil {
		t.Fatal(err)
	}
	for !done {
		(<-s.inbox)()
		s.w.Round(s.nowMs)
	}
	s.settle()
	check(g, "after a snapshot")
	gone := 0
	for id := range bodies {
		if _, err := g.Body(id); err != nil {
			gone++
		}
	}
	g.ReleaseBodies()
	if gone == 0 {
		t.Fatal("the snapshot compacted no acked message's entry away: the test checks nothing")
	}
	s.w.Close()
	l.Close()

	l = openMemLog(t, fs)
	defer l.Close()
	store, _ = OpenSnapStore(l)
	s2 := newShard(t, l)
	defer s2.w.Close()
	g2, err := s2.w.Recover(3, store, raftpb.ConfState{Voters: []uint64{1}}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	s2.settle()
	check(g2, "after a restart")
}

// TestBodyIndexKept: a consumer's reads of one entry over many batches
// (ReleaseBodies between them) decode the entry once, from the tail cache
// or from segment; the bodies come back right whatever the order:
// empty ones, an Enqueue without bodies (ErrNoBody), a slot past the
// entry's messages (ErrNoBody), and reads that hop between more entries
// than the index keeps.
func TestBodyIndexKept(t *testing.T) {
	l := openMemLog(t, segment.NewMemFS())
	s := newShard(t, l)
	want := map[uint64][]byte{} // nil: no body
	var order []uint64
	fsm := NewQueueFSM(queue.New(queue.Config{}, 0), 0, func(a *Applied) {
		if e, ok := a.Command.(*queue.Enqueue); ok {
			for i, m := range e.Msgs {
				var b []byte
				if e.Bodies != nil {
					b = bytes.Clone(e.Bodies[i])
				}
				want[m.ID] = b
				order = append(order, m.ID)
			}
		}
	})
	g, err := s.w.Open(4, raftpb.SnapshotMetadata{ConfState: raftpb.ConfState{Voters: []uint64{1}}}, fsm)
	if err != nil {
		t.Fatal(err)
	}
	const entries = 4
	for e := range entries {
		var msgs []queue.Message
		var bs [][]byte
		for i := range 50 {
			b := bytes.Repeat([]byte{byte('a' + e)}, (i*37)%200) // the first one empty
			msgs, bs = append(msgs, queue.Message{Size: uint32(len(b))}), append(bs, b)
		}
		_, _ = g.Add(&queue.Enqueue{Msgs: msgs, Bodies: bs})
		_, _ = g.Add(&queue.Enqueue{Msgs: make([]queue.Message, 3)}) // no bodies
		s.nowMs++
		s.settle()
	}
	if len(order) != entries*53 {
		t.Fatalf("%d messages applied", len(order))
	}
	check := func(id uint64) {
		t.Helper()
		b, err := g.Body(id)
		switch {
		case want[id] == nil:
			if !errors.Is(err, ErrNoBody) {
				t.Fatalf("message %#x, enqueued without a body: %q, %v", id, b, err)
			}
		case err != nil || !bytes.Equal(b, want[id]) || b == nil:
			t.Fatalf("message %#x: %q, %v; want %q", id, b, err, want[id])
		}
	}
	builds := g.bodies.builds
	// In order, ten messages a batch: each entry decoded once.
	for i, id := range order {
		check(id)
		if i%10 == 9 {
			g.ReleaseBodies()
		}
	}
	g.ReleaseBodies()
	if n := g.bodies.builds - builds; n != entries {
		t.Fatalf("%d entries read in batches of 10 messages: indexed %d times", entries, n)
	}
	if _, err := g.Body(order[0] | 0xFFFF); !errors.Is(err, ErrNoBody) {
		t.Fatalf("a slot past the entry's messages: %v", err)
	}
	// Hopping between entries, in random order: right bodies throughout.
	r := rand.New(rand.NewPCG(4, 4))
	for i := range 2000 {
		check(order[r.IntN(len(order))])
		if i%7 == 0 {
			g.ReleaseBodies()
		}
	}
	g.ReleaseBodies()
	s.w.Close()
}
