package replication

import (
	"runtime"
	"testing"

	"github.com/warren-mq/warren/segment"
	"go.etcd.io/raft/v3/raftpb"
)

// TestEntriesCopiesOnlyWhatItReturns: reading entries back from segment
// (a replay after a restart) copies only the entries raft's size limit
// lets through, not every entry of the chunk it looked at: with entries of
// 64 KiB and a limit of two of them, one call must not allocate the whole
// 256-entry chunk (16 MiB; a 10 M-message backlog replayed through such
// copies spent most of its restart in memmove and page faults).
func TestEntriesCopiesOnlyWhatItReturns(t *testing.T) {
	l, err := segment.Open(segment.NewMemFS(), "/data", segment.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	const n, size = 300, 64 << 10
	data := make([]byte, size)
	var b segment.Batch
	for i := uint64(1); i <= n; i++ {
		b = segment.Batch{Group: testGroup, Entries: append(b.Entries, segment.Entry{Index: i, Term: 1, Data: data})}
		if i%50 == 0 {
			if err := l.Append(b); err != nil {
				t.Fatal(err)
			}
			b.Entries = b.Entries[:0]
		}
	}
	s, err := openRaftStorage(l, testGroup, raftpb.SnapshotMetadata{ConfState: raftpb.ConfState{Voters: []uint64{1}}})
	if err != nil {
		t.Fatal(err)
	}
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	es, err := s.Entries(1, n+1, 2*size+1024)
	runtime.ReadMemStats(&after)
	if err != nil {
		t.Fatal(err)
	}
	if len(es) != 2 || es[0].Index != 1 || len(es[1].Data) != size {
		t.Fatalf("Entries(1, %d, two entries) returned %d entries, want 2 of %d bytes", n+1, len(es), size)
	}
	if got := after.TotalAlloc - before.TotalAlloc; got > 16*size {
		t.Fatalf("Entries allocated %d KiB to return %d entries of %d KiB (want at most %d KiB)",
			got>>10, len(es), size>>10, 16*size>>10)
	}
}
