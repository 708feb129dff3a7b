package replication

import (
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/warren-mq/warren/queue"
	"github.com/warren-mq/warren/segment"
	"go.etcd.io/raft/v3/raftpb"
)

// walGateFS is MemFS whose WAL files' Sync waits, while the gate is shut,
// until it is opened: a write the test holds in flight.
type walGateFS struct {
	*segment.MemFS
	mu      sync.Mutex
	shut    bool
	open    chan struct{}
	waiting chan struct{} // a Sync waits at the gate
}

func newWALGateFS() *walGateFS {
	return &walGateFS{MemFS: segment.NewMemFS(), open: make(chan struct{}), waiting: make(chan struct{}, 16)}
}

func (g *walGateFS) Open(name string) (segment.File, error) {
	f, err := g.MemFS.Open(name)
	if err != nil || !strings.Contains(name, "wal") {
		return f, err
	}
	return walGateFile{f, g}, nil
}

func (g *walGateFS) setShut(shut bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.shut && !shut {
		close(g.open)
		g.open = make(chan struct{})
	}
	g.shut = shut
}

type walGateFile struct {
	segment.File
	g *walGateFS
}

// Map: segment reads through read-only mappings of the MemFS file.
func (f walGateFile) Map(size int64) ([]byte, func() error, error) {
	return f.File.(interface {
		Map(int64) ([]byte, func() error, error)
	}).Map(size)
}

func (f walGateFile) Sync() error {
	f.g.mu.Lock()
	shut, open := f.g.shut, f.g.open
	f.g.mu.Unlock()
	if shut {
		f.g.waiting <- struct{}{}
		<-open
	}
	return f.File.Sync()
}

// TestPipelinedRounds: on a single node, a solo group's next round is
// written while the previous round's fdatasync is still running (two
// Appends in flight, the second one pipelined), and nothing of either is
// applied (no effect, no confirm) until its write is durable; then both
// are applied, in order, under the seqs Add returned.
func TestPipelinedRounds(t *testing.T) {
	fs := newWALGateFS()
	l, err := segment.Open(fs, "/data", segment.Options{Manual: true, WALSize: 16 << 10, SegmentSize: 32 << 10})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	s := newShard(t, l)
	defer s.w.Close()
	var applied []uint64
	fsm := NewQueueFSM(queue.New(queue.Config{}, 0), 0, func(a *Applied) { applied = append(applied, a.Header.Seq) })
	g, err := s.w.Open(10, raftpb.SnapshotMetadata{ConfState: raftpb.ConfState{Voters: []uint64{1}}}, fsm)
	if err != nil {
		t.Fatal(err)
	}
	s.settle() // the election
	at := fsm.AppliedIndex()

	fs.setShut(true)
	defer fs.setShut(false) // on a failure: let the appenders finish (Close waits for them)
	enq := func(n int) uint64 {
		msgs := make([]queue.Message, n)
		bodies := make([][]byte, n)
		for i := range msgs {
			msgs[i] = queue.Message{Size: 3}
			bodies[i] = []byte("abc")
		}
		seq, err := g.Add(&queue.Enqueue{Msgs: msgs, Bodies: bodies})
		if err != nil {
			t.Fatal(err)
		}
		return seq
	}
	waitGate := func() {
		select {
		case <-fs.waiting:
		case <-time.After(10 * time.Second):
			t.Fatal("no write reached its fdatasync")
		}
	}
	seq1 := enq(2)
	if s.round() != 1 {
		t.Fatal("the first round submitted no Append")
	}
	waitGate() // round 1's write is in its fdatasync
	seq2 := enq(3)
	if s.round() != 1 {
		t.Fatal("the second round submitted no Append while the first was in flight")
	}
	waitGate() // round 2 written beside it, in its own fdatasync
	st := s.w.Stats()
	if st.Pipelined < 1 || st.Appends-st.Persisted != 2 {
		t.Fatalf("stats %+v: want a pipelined write and two Appends in flight", st)
	}
	if len(applied) != 0 || fsm.AppliedIndex() != at {
		t.Fatalf("applied %v (entry %d, was %d) before any write was durable", applied, fsm.AppliedIndex(), at)
	}
	if g.st.durable >= g.st.last {
		t.Fatalf("storage: durable %d, last %d: the staged entries are not durable yet", g.st.durable, g.st.last)
	}
	fs.setShut(false)
	s.settle()
	if !slices.Equal(applied, []uint64{seq1, seq2}) {
		t.Fatalf("applied under seqs %v, want %v", applied, []uint64{seq1, seq2})
	}
	if g.st.durable != g.st.last || fsm.AppliedIndex() != g.st.last {
		t.Fatalf("after the writes: durable %d, last %d, applied %d", g.st.durable, g.st.last, fsm.AppliedIndex())
	}
	if g.Err() != nil || s.fatal != nil {
		t.Fatal(g.Err(), s.fatal)
	}
}
