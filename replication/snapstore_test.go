package replication

import (
	"bytes"
	"errors"
	"sync/atomic"
	"testing"

	"github.com/warren-mq/warren/segment"
	"go.etcd.io/raft/v3/raftpb"
)

// TestSnapStore: snapshots round-trip through the store and a reopen,
// large ones in several chunks; a newer one replaces the older (which
// compaction then drops); an older one is refused; a snapshot whose last
// chunks never reached the disk is ignored in favour of the previous one;
// a damaged entry is an error naming the store.
func TestSnapStore(t *testing.T) {
	fs := segment.NewMemFS()
	l := openMemLog(t, fs)
	s, err := OpenSnapStore(l)
	if err != nil {
		t.Fatal(err)
	}
	defer func(n int) { snapChunk = n }(snapChunk)
	snapChunk = 1000
	big := make([]byte, 2*snapChunk+123)
	for i := range big {
		big[i] = byte(i * 7)
	}
	cs := raftpb.ConfState{Voters: []uint64{1}}
	put := func(gid, idx uint64, data []byte) {
		t.Helper()
		if err := s.Put(gid, raftpb.SnapshotMetadata{Index: idx, Term: 2, ConfState: cs}, data); err != nil {
			t.Fatal(err)
		}
	}
	put(3, 10, []byte("small"))
	put(4, 7, big)
	put(3, 20, []byte("newer"))
	if err := s.Put(3, raftpb.SnapshotMetadata{Index: 15}, nil); err == nil {
		t.Fatal("an older snapshot replaced a newer one")
	}
	if f := l.FirstIndex(SnapStoreGroup); f != 2 {
		t.Fatalf("group 1 starts at %d; the first snapshot of group 3 was replaced, so 2 (group 4's) is the oldest needed", f)
	}
	check := func(s *SnapStore) {
		t.Helper()
		for _, c := range []struct {
			gid, idx uint64
			data     []byte
		}{{3, 20, []byte("newer")}, {4, 7, big}} {
			meta, data, ok, err := s.Load(c.gid)
			if err != nil || !ok || meta.Index != c.idx || meta.Term != 2 || len(meta.ConfState.Voters) != 1 || !bytes.Equal(data, c.data) {
				t.Fatalf("group %d: %+v ok %v err %v, %d bytes", c.gid, meta, ok, err, len(data))
			}
		}
		if _, _, ok, _ := s.Load(9); ok {
			t.Fatal("a snapshot for a group that never took one")
		}
	}
	check(s)
	l.Close()
	l = openMemLog(t, fs)
	s, err = OpenSnapStore(l)
	if err != nil {
		t.Fatal(err)
	}
	check(s)

	// A snapshot torn after its first chunk: the previous one stands.
	if err := l.Append(segment.Batch{Group: SnapStoreGroup, Entries: []segment.Entry{{Index: l.LastIndex(SnapStoreGroup) + 1, Term: 1,
		Data: chunkBytes(4, 9, 0, 3, []byte("part"))}}}); err != nil {
		t.Fatal(err)
	}
	l.Close()
	l = openMemLog(t, fs)
	if s, err = OpenSnapStore(l); err != nil {
		t.Fatal(err)
	}
	check(s)

	if err := l.Append(segment.Batch{Group: SnapStoreGroup, Entries: []segment.Entry{{Index: l.LastIndex(SnapStoreGroup) + 1, Term: 1, Data: []byte{9, 0, 0}}}}); err != nil {
		t.Fatal(err)
	}
	if _, err := OpenSnapStore(l); !errors.Is(err, ErrBadSnapStore) {
		t.Fatalf("damaged store entry: %v", err)
	}
	l.Close()
}

// chunkBytes encodes one chunk the way Put does (for damage tests).
func chunkBytes(gid, idx uint64, chunk, chunks uint32, data []byte) []byte {
	b := []byte{snapChunkVersion, 0, 0, 0}
	b = le.AppendUint32(b, 0)
	b = le.AppendUint64(b, gid)
	b = le.AppendUint64(b, idx)
	b = le.AppendUint64(b, 2)
	b = le.AppendUint32(b, chunk)
	b = le.AppendUint32(b, chunks)
	return append(b, data...)
}

// TestSnapStoreForget: a deleted group's snapshot stops pinning the store:
// after Forget, compaction moves past it, and a reopened store does not
// bring it back.
func TestSnapStoreForget(t *testing.T) {
	fs := segment.NewMemFS()
	l := openMemLog(t, fs)
	s, _ := OpenSnapStore(l)
	cs := raftpb.ConfState{Voters: []uint64{1}}
	for _, gid := range []uint64{3, 4} {
		if err := s.Put(gid, raftpb.SnapshotMetadata{Index: 5, Term: 1, ConfState: cs}, []byte("x")); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Put(4, raftpb.SnapshotMetadata{Index: 9, Term: 1, ConfState: cs}, []byte("y")); err != nil {
		t.Fatal(err)
	}
	if f := l.FirstIndex(SnapStoreGroup); f != 1 {
		t.Fatalf("group 3's snapshot (entry 1) is pinned, yet the store starts at %d", f)
	}
	if err := s.Forget(3); err != nil {
		t.Fatal(err)
	}
	if _, ok := s.Latest(3); ok {
		t.Fatal("a forgotten group still has a snapshot")
	}
	if f := l.FirstIndex(SnapStoreGroup); f != 3 {
		t.Fatalf("after Forget(3) the store starts at %d, want 3 (group 4's latest)", f)
	}
	l.Close()
	l = openMemLog(t, fs)
	defer l.Close()
	s, _ = OpenSnapStore(l)
	if _, ok := s.Latest(3); ok {
		t.Fatal("a forgotten group's snapshot came back after a reopen")
	}
	if m, ok := s.Latest(4); !ok || m.Index != 9 {
		t.Fatalf("group 4: %+v %v", m, ok)
	}
}

// gateFS, once armed, blocks the first Sync of any file until gate is
// closed.
type gateFS struct {
	*segment.MemFS
	first   chan struct{} // closed when the first Sync is waiting
	gate    chan struct{}
	armed   atomic.Bool
	started atomic.Bool
}

func (g *gateFS) Open(name string) (segment.File, error) {
	f, err := g.MemFS.Open(name)
	return gateFile{f, g}, err
}

type gateFile struct {
	segment.File
	g *gateFS
}

// Map: segment reads through read-only mappings of the MemFS file.
func (f gateFile) Map(size int64) ([]byte, func() error, error) {
	return f.File.(interface {
		Map(int64) ([]byte, func() error, error)
	}).Map(size)
}

func (f gateFile) Sync() error {
	if f.g.armed.Load() && f.g.started.CompareAndSwap(false, true) {
		close(f.g.first)
		<-f.g.gate
	}
	return f.File.Sync()
}

// TestSnapStoreSharesWrites: Puts that arrive while another is being
// written are written together, in one Append and one compaction, and
// every one of them is the latest of its group, also after a reopen.
func TestSnapStoreSharesWrites(t *testing.T) {
	mem := segment.NewMemFS()
	fs := &gateFS{MemFS: mem, first: make(chan struct{}), gate: make(chan struct{})}
	l, err := segment.Open(fs, "/data", segment.Options{Manual: true})
	if err != nil {
		t.Fatal(err)
	}
	s, err := OpenSnapStore(l)
	if err != nil {
		t.Fatal(err)
	}
	const n = 20
	queued := make(chan struct{}, n)
	s.queuedHook = func() { queued <- struct{}{} }
	fs.armed.Store(true)
	cs := raftpb.ConfState{Voters: []uint64{1}}
	errs := make(chan error, n)
	put := func(gid uint64) {
		errs <- s.Put(gid, raftpb.SnapshotMetadata{Index: gid * 10, Term: 1, ConfState: cs}, bytes.Repeat([]byte{byte(gid)}, int(gid)))
	}
	go put(100) // its write holds the disk until the gate opens
	<-queued
	<-fs.first
	syncs0 := l.Stats().Syncs
	for gid := uint64(101); gid < 100+n; gid++ {
		go put(gid)
	}
	for range n - 1 {
		<-queued // every other Put is queued behind the first write
	}
	close(fs.gate)
	for range n {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	// The first Put's write and compaction, then one write and one
	// compaction for the other 19 together.
	if syncs := l.Stats().Syncs - syncs0; syncs > 4 {
		t.Fatalf("%d group commits for %d Puts: they were not written together", syncs, n)
	}
	check := func(s *SnapStore) {
		t.Helper()
		for gid := uint64(100); gid < 100+n; gid++ {
			meta, data, ok, err := s.Load(gid)
			if err != nil || !ok || meta.Index != gid*10 || !bytes.Equal(data, bytes.Repeat([]byte{byte(gid)}, int(gid))) {
				t.Fatalf("group %d: %v %v %+v %d bytes", gid, ok, err, meta, len(data))
			}
		}
	}
	check(s)
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	l, err = segment.Open(mem, "/data", segment.Options{Manual: true})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	s, err = OpenSnapStore(l)
	if err != nil {
		t.Fatal(err)
	}
	check(s)
}
