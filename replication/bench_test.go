package replication

import (
	"fmt"
	"github.com/warren-mq/warren/segment"
	"go.etcd.io/raft/v3/raftpb"
	"io"
	"path/filepath"
	"slices"
	"sync"
	"testing"

	"github.com/warren-mq/warren/queue"
	"github.com/warren-mq/warren/wire"
)

// BenchmarkFSMApply: the steady state of a queue whose consumer keeps up,
// through the log: each entry carries a 64-message Enqueue (1 KiB bodies)
// and the ack of the previous entry's 64 deliveries. Reported per message;
// the entries are encoded once, outside the timer (the apply path:
// check, decode, Machine commands, live set, sink).
func BenchmarkFSMApply(b *testing.B) {
	const per = 64
	body := make([]byte, 1024)
	msgs := make([]queue.Message, per)
	bodies := make([][]byte, per)
	for i := range msgs {
		msgs[i] = queue.Message{Size: 1024}
		bodies[i] = body
	}
	delivered := 0
	f := NewQueueFSM(queue.New(queue.Config{}, 0), 0, func(a *Applied) {
		for _, e := range a.Effects {
			if e.Kind == queue.Deliver {
				delivered++
			}
		}
	})
	first, _ := AppendEntry(nil, EntryHeader{NowMs: 1}, &queue.Subscribe{Spec: queue.ConsumerSpec{ID: 1, Owner: 1}})
	if _, err := f.Apply(1, first); err != nil {
		b.Fatal(err)
	}
	// Entry k (k ≥ 1) acks tags up to (k-1)*per: the previous entry's.
	var enc EntryEncoder
	entries := make([][]byte, 256)
	for k := range entries {
		enc.Reset()
		_ = enc.Add(&queue.Enqueue{Msgs: msgs, Bodies: bodies})
		_ = enc.Add(&queue.Settle{Consumer: 1, Op: wire.SettleAck, Last: 0}) // Last patched below
		entries[k] = append([]byte(nil), enc.Finish(EntryHeader{NowMs: 2})...)
	}
	// The Settle's Last field is at a fixed offset from the end: frame
	// (8) + command header (10) + consumer (8) + op (1) + first (8).
	settleLast := func(e []byte) []byte {
		cmdLen := 10 + 29
		start := len(e) - ((8 + cmdLen + 7) &^ 7)
		return e[start+8+10+8+1+8 : start+8+10+8+1+8+8]
	}
	b.SetBytes(per * 1024)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		e := entries[i%len(entries)]
		le.PutUint64(settleLast(e), uint64(i)*per)
		if _, err := f.Apply(uint64(i)+2, e); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*per), "ns/msg")
	if delivered != b.N*per || f.Machine().Unacked() != per || f.live.entries() != 1 {
		b.Fatalf("delivered %d of %d, unacked %d, live entries %d", delivered, b.N*per, f.Machine().Unacked(), f.live.entries())
	}
}

// BenchmarkSingleVoterCycle: one entry of 64 × 1 KiB messages (and the
// ack of the previous entry's) through a single-voter group: Propose,
// Ready, segment Append (on benchFS: no disk, so this is the CPU cost of
// raft, the storage mirror, segment's encoding and apply, not of fsync),
// Advance, the commit Ready, apply; every 128 entries a compaction to the
// applied index (keeping the live entries, as after a snapshot) and
// segment maintenance. Reported per message.
func BenchmarkSingleVoterCycle(b *testing.B) {
	const per = 64
	msgs := make([]queue.Message, per)
	bodies := make([][]byte, per)
	for i := range msgs {
		msgs[i] = queue.Message{Size: 1024}
		bodies[i] = make([]byte, 1024)
	}
	l, err := segment.Open(newBenchFS(6), "/data", segment.Options{Manual: true, WALSize: 16 << 20, SegmentSize: 16 << 20})
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close()
	fsm := NewQueueFSM(queue.New(queue.Config{}, 0), 0, nil)
	v, err := startVoter(l, fsm, map[uint64][]byte{})
	if err != nil {
		b.Fatal(err)
	}
	v.appended = nil // the test's record: not part of the cost
	sub, _ := AppendEntry(nil, EntryHeader{NowMs: 1}, &queue.Subscribe{Spec: queue.ConsumerSpec{ID: 1, Owner: 1}})
	if err := v.propose(sub); err != nil {
		b.Fatal(err)
	}
	var enc EntryEncoder
	// Proposals are copied out of the encoder (raft keeps them until they
	// are applied and out of the tail) into a ring of buffers made up
	// front: each entry here is applied within its propose call, and fresh
	// 64 KiB allocations would measure this VM's page faults, not raft.
	ring := make([][]byte, 64)
	for k := range ring {
		ring[k] = make([]byte, 0, 80<<10)
		for j := 0; j < cap(ring[k]); j += 4096 {
			ring[k] = append(ring[k][:j], 1)
		}
	}
	b.SetBytes(per * 1024)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		enc.Reset()
		_ = enc.Add(&queue.Enqueue{Msgs: msgs, Bodies: bodies})
		_ = enc.Add(&queue.Settle{Consumer: 1, Op: wire.SettleAck, Last: uint64(i) * per})
		data := append(ring[i%len(ring)][:0], enc.Finish(EntryHeader{NowMs: 2})...)
		if err := v.propose(data); err != nil {
			st := v.rn.Status()
			b.Fatalf("entry %d: %v (%+v, applied %d)", i, err, st.BasicStatus, fsm.AppliedIndex())
		}
		if i%128 == 127 {
			// What a snapshot allows (design §2.4): compact to the applied
			// index keeping the live entries, then let maintenance move
			// and delete files.
			at := fsm.AppliedIndex()
			term, _ := v.st.Term(at)
			if err := l.Compact(testGroup, at, fsm.LiveEntries(nil, at)); err != nil {
				b.Fatal(err)
			}
			if err := v.st.compacted(raftpb.SnapshotMetadata{Index: at, Term: term, ConfState: raftpb.ConfState{Voters: []uint64{1}}}); err != nil {
				b.Fatal(err)
			}
			if err := l.Maintain(); err != nil {
				b.Fatal(err)
			}
		}
	}
	b.StopTimer()
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*per), "ns/msg")
	if fsm.Machine().Unacked() != per {
		b.Fatalf("unacked %d", fsm.Machine().Unacked())
	}
}

// benchFS is an in-memory segment.FS whose Sync and Map cost nothing
// (MemFS copies a whole file on each, which would swamp the numbers) and
// which reuses the memory of removed files: for benchmarks of the CPU cost
// only. It reuses an array a view could still see: not for tests.
type benchFS struct {
	mu    sync.Mutex
	files map[string]*benchFile
	free  [][]byte // arrays of removed files, reused (fresh memory costs page faults that would dominate)
}

type benchFile struct {
	fs   *benchFS
	data []byte
}

// benchFileCap is the array each file gets: above the WAL and segment
// sizes the benchmarks open segment with.
const benchFileCap = 20 << 20

// newBenchFS returns a benchFS with n file arrays already faulted in.
func newBenchFS(n int) *benchFS {
	b := &benchFS{files: map[string]*benchFile{}}
	for range n {
		d := make([]byte, benchFileCap)
		for i := 0; i < len(d); i += 4096 {
			d[i] = 1
		}
		b.free = append(b.free, d[:0])
	}
	return b
}

func (b *benchFS) Open(name string) (segment.File, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	f := b.files[name]
	if f == nil {
		f = &benchFile{fs: b}
		b.files[name] = f
	}
	return f, nil
}

func (b *benchFS) Remove(name string) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if f := b.files[name]; f != nil && cap(f.data) >= benchFileCap {
		b.free = append(b.free, f.data[:0]) // no view outlives a call in the benchmark
	}
	delete(b.files, name)
	return nil
}

func (b *benchFS) List(dir string) ([]string, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []string
	for name := range b.files {
		if filepath.Dir(name) == filepath.Clean(dir) {
			out = append(out, filepath.Base(name))
		}
	}
	slices.Sort(out)
	return out, nil
}

func (b *benchFS) MkdirAll(string) error { return nil }
func (b *benchFS) SyncDir(string) error  { return nil }

func (f *benchFile) WriteAt(p []byte, off int64) (int, error) {
	f.fs.mu.Lock()
	defer f.fs.mu.Unlock()
	if end := int(off) + len(p); end > len(f.data) {
		if end > cap(f.data) {
			// Double: a fresh array, so mappings of the old one stay as
			// they were.
			var d []byte
			if n := len(f.fs.free); n > 0 && cap(f.fs.free[n-1]) >= end {
				d, f.fs.free = f.fs.free[n-1][:len(f.data)], f.fs.free[:n-1]
			} else {
				d = make([]byte, len(f.data), max(2*cap(f.data), end, benchFileCap))
			}
			copy(d, f.data)
			f.data = d
		}
		f.data = f.data[:end]
	}
	copy(f.data[off:], p)
	return len(p), nil
}

func (f *benchFile) ReadAt(p []byte, off int64) (int, error) {
	f.fs.mu.Lock()
	defer f.fs.mu.Unlock()
	if off >= int64(len(f.data)) {
		return 0, io.EOF
	}
	n := copy(p, f.data[off:])
	if n < len(p) {
		return n, io.EOF
	}
	return n, nil
}

func (f *benchFile) Sync() error { return nil }

func (f *benchFile) Truncate(size int64) error {
	f.fs.mu.Lock()
	defer f.fs.mu.Unlock()
	if size < int64(len(f.data)) {
		f.data = f.data[:size]
	} else {
		f.data = append(f.data, make([]byte, size-int64(len(f.data)))...)
	}
	return nil
}

func (f *benchFile) Size() (int64, error) {
	f.fs.mu.Lock()
	defer f.fs.mu.Unlock()
	return int64(len(f.data)), nil
}

func (f *benchFile) Close() error { return nil }

// Map shares the bytes written so far (segment never rewrites them).
func (f *benchFile) Map(int64) ([]byte, func() error, error) {
	f.fs.mu.Lock()
	defer f.fs.mu.Unlock()
	return f.data[:len(f.data):len(f.data)], func() error { return nil }, nil
}

// BenchmarkWorkerRound: one shard's worker with G groups; each round every
// group gets an Enqueue of M 1 KiB messages and the ack of its previous
// round's deliveries; the round proposes, its one Append runs on the
// appender (benchFS: CPU only, no fsync), the completion comes back
// through the inbox, and the next round applies. Every few rounds each
// group is compacted to its applied index (as after a snapshot). Reported
// per message; msgs/append is the batch each Append carried.
func BenchmarkWorkerRound(b *testing.B) {
	for _, c := range []struct{ groups, msgs int }{{1, 64}, {100, 16}} {
		b.Run(fmt.Sprintf("groups=%d,msgs=%d", c.groups, c.msgs), func(b *testing.B) {
			benchWorker(b, c.groups, c.msgs)
		})
	}
}

func benchWorker(b *testing.B, groups, per int) {
	msgs := make([]queue.Message, per)
	bodies := make([][]byte, per)
	for i := range msgs {
		msgs[i] = queue.Message{Size: 1024}
		bodies[i] = make([]byte, 1024)
	}
	l, err := segment.Open(newBenchFS(8), "/data", segment.Options{Manual: true, WALSize: 16 << 20, SegmentSize: 16 << 20})
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close()
	inbox := make(chan func(), 64)
	w := NewWorker(l, WorkerConfig{Post: func(fn func()) { inbox <- fn }})
	defer w.Close()
	voters := raftpb.ConfState{Voters: []uint64{1}}
	var gs []*Group
	for k := range groups {
		g, err := w.Open(uint64(10+k), raftpb.SnapshotMetadata{ConfState: voters}, NewQueueFSM(queue.New(queue.Config{}, 0), 0, nil))
		if err != nil {
			b.Fatal(err)
		}
		_, _ = g.Add(&queue.Subscribe{Spec: queue.ConsumerSpec{ID: 1, Owner: 1}})
		gs = append(gs, g)
	}
	done := uint64(0)
	round := func(now int64) {
		w.Round(now)
		for done < w.Stats().Appends {
			(<-inbox)()
			done++
			w.Round(now)
		}
	}
	round(1)
	round(1)
	compactEvery := max(1, 128/groups)
	b.SetBytes(int64(groups * per * 1024))
	b.ReportAllocs()
	b.ResetTimer()
	appends0 := w.Stats().Appends
	for i := 0; i < b.N; i++ {
		for _, g := range gs {
			_, _ = g.Add(&queue.Enqueue{Msgs: msgs, Bodies: bodies})
			_, _ = g.Add(&queue.Settle{Consumer: 1, Op: wire.SettleAck, Last: uint64(i * per)})
		}
		round(2)
		if i%compactEvery == compactEvery-1 {
			for _, g := range gs {
				at := g.FSM().AppliedIndex()
				term, _ := g.st.Term(at)
				if err := l.Compact(g.ID(), at, g.FSM().LiveEntries(nil, at)); err != nil {
					b.Fatal(err)
				}
				if err := g.st.compacted(raftpb.SnapshotMetadata{Index: at, Term: term, ConfState: voters}); err != nil {
					b.Fatal(err)
				}
			}
			if err := l.Maintain(); err != nil {
				b.Fatal(err)
			}
		}
	}
	b.StopTimer()
	n := float64(b.N * groups * per)
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/n, "ns/msg")
	b.ReportMetric(n/float64(w.Stats().Appends-appends0), "msgs/append")
	for _, g := range gs {
		if g.FSM().Machine().Unacked() != per || g.Err() != nil {
			b.Fatalf("group %d: unacked %d, err %v", g.ID(), g.FSM().Machine().Unacked(), g.Err())
		}
	}
}
