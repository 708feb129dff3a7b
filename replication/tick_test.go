package replication

import (
	"testing"

	"github.com/warren-mq/warren/queue"
	"github.com/warren-mq/warren/segment"
	"go.etcd.io/raft/v3/raftpb"
)

// TestWorkerTicks: time-driven work of a durable queue is a logged Tick
// the leader proposes once the queue's latest Timer comes due (design
// §1.4): nothing is proposed before, the Tick expires the messages when
// applied, a queue with nothing pending gets no Tick, and a group gets at
// most one Tick per 10 ms.
func TestWorkerTicks(t *testing.T) {
	l := openMemLog(t, segment.NewMemFS())
	defer l.Close()
	s := newShard(t, l)
	defer s.w.Close()
	drops := 0
	g, err := s.w.Open(3, raftpb.SnapshotMetadata{ConfState: raftpb.ConfState{Voters: []uint64{1}}},
		NewQueueFSM(queue.New(queue.Config{MessageTTLMs: 100}, 0), 0, func(a *Applied) {
			for _, e := range a.Effects {
				if e.Kind == queue.Drop {
					drops++
				}
			}
		}))
	if err != nil {
		t.Fatal(err)
	}
	_, _ = g.Add(&queue.Enqueue{Msgs: make([]queue.Message, 3)})
	s.settle()
	if at, ok := g.FSM().WakeAt(); !ok || at != 100 {
		t.Fatalf("wake at %d %v, want 100", at, ok)
	}
	if at, ok := s.w.NextWake(); !ok || at != 100 {
		t.Fatalf("the worker's next wake %d %v, want 100", at, ok)
	}
	proposals := func() uint64 { return s.w.Stats().Proposals }
	before := proposals()
	s.nowMs = 50
	if n := s.w.Tick(s.nowMs); n != 0 {
		t.Fatalf("%d ticks before anything is due", n)
	}
	s.settle()
	if proposals() != before {
		t.Fatal("a tick was proposed before the queue's timer came due")
	}
	s.nowMs = 150
	if n := s.w.Tick(s.nowMs); n != 1 {
		t.Fatalf("%d ticks when one queue is due", n)
	}
	if n := s.w.Tick(s.nowMs + 5); n != 0 {
		t.Fatal("a second tick within 10 ms")
	}
	s.settle()
	if drops != 3 || g.FSM().Machine().Ready() != 0 {
		t.Fatalf("after the tick: %d dropped, %d ready", drops, g.FSM().Machine().Ready())
	}
	if _, ok := g.FSM().WakeAt(); ok {
		t.Fatal("the queue still asks for a tick with nothing pending")
	}
	if _, ok := s.w.NextWake(); ok {
		t.Fatal("the worker still wants a tick with nothing pending")
	}
	before = proposals()
	s.nowMs = 1000
	if n := s.w.Tick(s.nowMs); n != 0 {
		t.Fatalf("%d ticks with nothing pending", n)
	}
	s.settle()
	if proposals() != before {
		t.Fatal("a tick was proposed with nothing pending")
	}
}
