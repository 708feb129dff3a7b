package replication

import (
	"bytes"
	"fmt"
	"testing"

	"github.com/warren-mq/warren/queue"
	"github.com/warren-mq/warren/segment"
	"go.etcd.io/raft/v3/raftpb"
)

// A single voter's proposals (over 4 KiB: the encoder's buffer itself
// goes to raft) are reused for later entries once applied, and
// never while anything can still read them: views Body handed out during
// an apply stay intact while the next entries are encoded and written,
// until ReleaseBodies; and every body reads back as published afterwards,
// from segment.
func TestProposalBuffersRecycled(t *testing.T) {
	// ~400 KiB entries (segment's pool of large buffers) and ~30 KiB ones
	// (one of many queues in a round: replication's own pool).
	t.Run("large", func(t *testing.T) { proposalBuffersRecycled(t, 400, 0) })
	t.Run("small", func(t *testing.T) { proposalBuffersRecycled(t, 30, 0) })
	// A small entry proposed in the large buffer of the entries around it
	// is copied out of it (finish): applied while the next one is handed,
	// it does not make the group forget that one.
	t.Run("mixed", func(t *testing.T) { proposalBuffersRecycled(t, 400, 30) })
}

// proposalBuffersRecycled: entries of perEntry messages; with small,
// each round first proposes an entry of small messages, written while
// the round's own is encoded.
func proposalBuffersRecycled(t *testing.T, perEntry, small int) {
	fs := segment.NewMemFS()
	l := openMemLog(t, fs)
	defer l.Close()
	s := newShard(t, l)
	defer s.w.Close()
	var g *Group
	var views [][]byte // Body's views taken during applies, checked after later rounds
	var viewIDs []uint64
	published := map[uint64][]byte{}
	fsm := NewQueueFSM(queue.New(queue.Config{}, 0), 0, func(a *Applied) {
		if e, ok := a.Command.(*queue.Enqueue); ok {
			for i, m := range e.Msgs {
				published[m.ID] = bytes.Clone(e.Bodies[i])
			}
		}
		for _, e := range a.Effects {
			if e.Kind != queue.Deliver {
				continue
			}
			b, err := g.Body(e.Msg)
			if err != nil {
				t.Fatal(err)
			}
			views, viewIDs = append(views, b), append(viewIDs, e.Msg)
		}
	})
	g, err := s.w.Open(7, raftpb.SnapshotMetadata{ConfState: raftpb.ConfState{Voters: []uint64{1}}}, fsm)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = g.Add(&queue.Subscribe{Spec: queue.ConsumerSpec{ID: 1, Owner: 1, Prefetch: 1 << 20}})
	s.settle()
	enqueue := func(round int) {
		var msgs []queue.Message
		var bs [][]byte
		n := perEntry
		if round < 0 {
			n, round = small, -round
		}
		for i := range n {
			b := bytes.Repeat([]byte(fmt.Sprintf("<%d.%d>", round, i)), 100)
			msgs = append(msgs, queue.Message{Size: uint32(len(b))})
			bs = append(bs, b)
		}
		if _, err := g.Add(&queue.Enqueue{Msgs: msgs, Bodies: bs}); err != nil {
			t.Fatal(err)
		}
	}
	check := func(when string) {
		t.Helper()
		for i, v := range views {
			if !bytes.Equal(v, published[viewIDs[i]]) {
				t.Fatalf("%s: the view of message %#x changed (%d bytes, starting %q)", when, viewIDs[i], len(v), v[:min(len(v), 16)])
			}
		}
	}
	large := 0
	for round := range 30 {
		if small > 0 {
			enqueue(-2000 - round)
			s.round()
		}
		enqueue(round)
		large++
		s.nowMs++
		s.settle()
		check("after its round")
		if round%2 == 0 {
			// The next entry is encoded and written while this round's
			// views are out: none may reuse their bytes.
			enqueue(1000 + round)
			large++
			s.nowMs++
			s.settle()
			check("after the next entry")
		}
		g.ReleaseBodies()
		views, viewIDs = views[:0], viewIDs[:0]
	}
	// Every entry of perEntry messages is handed, and comes back (the
	// first ones may have been built before the pools had a buffer of
	// a class to come back to).
	if r := s.w.Stats().Recycled; r < uint64(large)-2 {
		t.Fatalf("%d proposal buffers recycled of %d entries of %d messages", r, large, perEntry)
	}
	for id, want := range published {
		b, err := g.Body(id)
		if err != nil || !bytes.Equal(b, want) {
			t.Fatalf("message %#x: %d bytes, %v; want %d bytes", id, len(b), err, len(want))
		}
	}
	g.ReleaseBodies()
}
