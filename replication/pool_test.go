package replication

import (
	"sync"
	"testing"
	"time"

	"github.com/warren-mq/warren/queue"
	"github.com/warren-mq/warren/segment"
	"go.etcd.io/raft/v3/raftpb"
)

// TestPoolBoundsConcurrency: a pool of n runs every job, in order, never
// more than n at once, and n at once when that many wait.
func TestPoolBoundsConcurrency(t *testing.T) {
	p := NewPool(3)
	gate := make(chan struct{})
	var mu sync.Mutex
	var started []int
	var wg sync.WaitGroup
	for i := range 20 {
		wg.Add(1)
		p.Go(func() {
			defer wg.Done()
			mu.Lock()
			started = append(started, i)
			mu.Unlock()
			<-gate
		})
	}
	deadline := time.After(10 * time.Second)
	for p.Peak() < 3 {
		select {
		case <-deadline:
			t.Fatalf("peak %d: three jobs never ran at once", p.Peak())
		case <-time.After(time.Millisecond):
		}
	}
	close(gate)
	wg.Wait()
	p.Close()
	if p.Peak() != 3 || len(started) != 20 {
		t.Fatalf("peak %d, %d jobs ran", p.Peak(), len(started))
	}
	for i := 3; i < 20; i++ {
		if started[i] < 3 {
			t.Fatalf("job order %v: queued jobs start in order after the first three", started)
		}
	}
}

// TestSnapshotsShareThePool: twenty groups snapshotting in one round all
// finish, through a shared pool of two.
func TestSnapshotsShareThePool(t *testing.T) {
	fs := segment.NewMemFS()
	l := openMemLog(t, fs)
	defer l.Close()
	store, _ := OpenSnapStore(l)
	pool := NewPool(2)
	defer pool.Close()
	s := &shard{t: t, inbox: make(chan func(), 1024)}
	s.w = NewWorker(l, WorkerConfig{Post: func(fn func()) { s.inbox <- fn }, Pool: pool})
	defer s.w.Close()
	var gs []*snapGroup
	for gid := uint64(3); gid < 23; gid++ {
		g, err := s.w.Open(gid, raftpb.SnapshotMetadata{ConfState: raftpb.ConfState{Voters: []uint64{1}}}, NewQueueFSM(queue.New(queue.Config{}, 0), 0, nil))
		if err != nil {
			t.Fatal(err)
		}
		_, _ = g.Add(&queue.Enqueue{Msgs: []queue.Message{{Size: 1}}, Bodies: [][]byte{{1}}})
		gs = append(gs, &snapGroup{workerGroup: workerGroup{g: g}})
	}
	s.settle()
	done := 0
	for _, sg := range gs {
		if err := sg.g.Snapshot(store, func(_ raftpb.SnapshotMetadata, err error) {
			if err != nil {
				t.Error(err)
			}
			done++
		}); err != nil {
			t.Fatal(err)
		}
	}
	s.settleSnapshots(gs)
	if done != len(gs) || pool.Peak() > 2 {
		t.Fatalf("%d of %d snapshots done; pool peak %d", done, len(gs), pool.Peak())
	}
}
