package broker

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/warren-mq/warren/replication"
	"github.com/warren-mq/warren/segment"
)

// dirState is every file under dir: its size and the SHA-256 of its
// bytes.
func dirState(t *testing.T, dir string) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		out[p] = fmt.Sprintf("%d %x", len(b), sha256.Sum256(b))
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// toDisk writes mem's /data into dir/log (a node's data directory).
func toDisk(t *testing.T, mem *segment.MemFS, dir string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Join(dir, "log"), 0o750); err != nil {
		t.Fatal(err)
	}
	for name, data := range memState(t, mem) {
		if err := os.WriteFile(filepath.Join(dir, "log", name), []byte(data), 0o600); err != nil {
			t.Fatal(err)
		}
	}
}

// tearActiveWAL appends a torn record (zeros) to the active WAL file of
// mem's /data, which a start cuts.
func tearActiveWAL(t *testing.T, mem *segment.MemFS) {
	t.Helper()
	names, _ := mem.List("/data")
	var wal string
	for _, n := range names {
		if strings.HasPrefix(n, "wal-") {
			wal = "/data/" + n
		}
	}
	f, err := mem.Open(wal)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	size, _ := f.Size()
	if _, err := f.WriteAt(make([]byte, 40), size); err != nil {
		t.Fatal(err)
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
}

// TestRefusedStartLeavesTheDataDirectory: a node that refuses to start
// for damage (to its metadata, in a sealed WAL file, in the active WAL
// file) leaves its data directory as it found it, for an operator or a
// later build to inspect and repair: no file added (a WAL file with
// quarantine marks), removed (a damaged WAL file the worker moved), cut (a
// torn tail) or changed; twice in a row, the second refused as the first.
func TestRefusedStartLeavesTheDataDirectory(t *testing.T) {
	for _, tc := range []struct {
		name   string
		damage func(t *testing.T, mem *segment.MemFS)
	}{
		{"metadata segment", func(t *testing.T, mem *segment.MemFS) {
			n := openDurNode(t, mem)
			declareDurable(t, n.b, "q", true)
			n.close(t)
			moveToSegments(t, mem)
			damageGroup(t, mem, replication.MetaGroupID)
		}},
		{"sealed WAL", func(t *testing.T, mem *segment.MemFS) {
			wal := walDamageNode(t, mem, 3)
			mem.Corrupt(wal, mem.FileSize(wal)*3/4, 3)
		}},
		{"active WAL", func(t *testing.T, mem *segment.MemFS) {
			n := openDurNode(t, mem)
			q := declareDurable(t, n.b, "q", true)
			k := newDurSink()
			for range 20 {
				batch := publish(n.b, q, k, true, strings.Repeat("x", 512))
				k.waitFor(t, "the confirm", func() bool { return k.confirmed(batch) })
			}
			n.close(t)
			names, _ := mem.List("/data")
			var wal string
			for _, name := range names {
				if strings.HasPrefix(name, "wal-") {
					wal = "/data/" + name
				}
			}
			mem.Corrupt(wal, mem.FileSize(wal)/2, 3)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mem := segment.NewMemFS()
			tc.damage(t, mem)
			if tc.name != "active WAL" {
				tearActiveWAL(t, mem) // and a torn tail, which a start that goes on cuts
			}
			before := memState(t, mem)
			dir := t.TempDir()
			toDisk(t, mem, dir)
			onDisk := dirState(t, dir)
			var first string
			for i := range 2 {
				_, _, err := openNodeLog(mem, "/data", nil)
				if !errors.Is(err, segment.ErrCorrupt) {
					t.Fatalf("start %d: %v, want a refusal (ErrCorrupt)", i+1, err)
				}
				if i == 0 {
					first = err.Error()
				} else if err.Error() != first {
					t.Fatalf("the second start refused otherwise than the first:\n%v\n%s", err, first)
				}
				if after := memState(t, mem); !maps.Equal(before, after) {
					t.Fatalf("start %d refused, and changed the log: files %v, were %v", i+1, keys(after), keys(before))
				}
				if _, _, err := OpenNodeLog(dir, nil); !errors.Is(err, segment.ErrCorrupt) {
					t.Fatalf("start %d on disk: %v, want a refusal (ErrCorrupt)", i+1, err)
				}
				if after := dirState(t, dir); !maps.Equal(onDisk, after) {
					t.Fatalf("start %d on disk refused, and changed the data directory:\n%v\nwas\n%v", i+1, after, onDisk)
				}
			}
		})
	}
}

func keys(m map[string]string) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}
