package segment

import (
	"errors"
	"maps"
	"testing"
)

// TestPartialWriteRefusalWritesNothing: an Open that CheckDamage
// refuses writes nothing, also when the active WAL file ends in a kept
// partial write (which an Open that goes on seals, starting a new file).
func TestPartialWriteRefusalWritesNothing(t *testing.T) {
	mem := NewMemFS()
	l, err := Open(mem, "/data", Options{Manual: true})
	must(t, err)
	must(t, l.Append(Batch{Group: 1, Entries: ents(1, 3, 1, "acked"), HardState: &HardState{Term: 1, Commit: 3}}))
	wal := walFiles(mem)[0]
	synced := int(mem.Crash(0).FileSize(wal))
	mem.FailSync(1)
	if err := l.Append(Batch{Group: 1, Entries: ents(4, 4, 1, "partial")}, Batch{Group: 3, Entries: ents(1, 3, 1, "torn")}); !errors.Is(err, ErrStopped) {
		t.Fatal(err)
	}
	l.Close()
	crashed := mem.Crash(int(mem.FileSize(wal)) - synced - 8)
	before := memFiles(t, crashed)
	no := errors.New("no")
	if _, err := Open(crashed, "/data", Options{Manual: true, CheckDamage: func([]DamagedGroup) error { return no }}); !errors.Is(err, no) {
		t.Fatalf("%v", err)
	}
	if after := memFiles(t, crashed); !maps.Equal(before, after) {
		t.Fatalf("a refused Open changed the directory: %d files before, %d after", len(before), len(after))
	}
	l, err = Open(crashed, "/data", Options{Manual: true, CheckDamage: func([]DamagedGroup) error { return nil }})
	must(t, err)
	if n := len(walFiles(crashed)); n != 2 {
		t.Fatalf("%d WAL files after an Open that went on, want 2 (the partial write sealed)", n)
	}
	must(t, l.Close())
}
