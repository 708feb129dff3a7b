package segment

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"sync"
	"testing"
)

// Entries of minExtent bytes or more are written from the appenders'
// slices (pwritev on a real disk), the rest copied: whatever the mix, in
// one group commit or many, across WAL rotations and maintenance, every
// entry reads back as appended, before and after a reopen (which checks
// every record's checksum).
func TestAppendExtents(t *testing.T) {
	for _, name := range []string{"memfs", "os"} {
		t.Run(name, func(t *testing.T) {
			var fs FS = NewMemFS()
			dir := "/data"
			if name == "os" {
				fs, dir = OSFS{}, t.TempDir()
			}
			opts := Options{WALSize: 3 << 20}
			l, err := Open(fs, dir, opts)
			if err != nil {
				t.Fatal(err)
			}
			sizes := []int{0, 1, 100, minExtent - 1, minExtent, minExtent + 1, 20000, maxEntriesRecord - entryHeader, maxEntriesRecord + 5}
			const groups, rounds = 4, 12
			want := make([]map[uint64][]byte, groups)
			hs := make([]HardState, groups)
			var wg sync.WaitGroup
			for g := range groups {
				want[g] = map[uint64][]byte{}
				wg.Add(1)
				go func() { // one appender per group: their batches share group commits
					defer wg.Done()
					rng := rand.New(rand.NewPCG(uint64(g), 7))
					next := uint64(1)
					for r := range rounds {
						var es []Entry
						for range 1 + rng.IntN(4) {
							d := make([]byte, sizes[rng.IntN(len(sizes))])
							for i := range d {
								d[i] = byte(rng.Uint32())
							}
							es = append(es, Entry{Index: next, Term: 1, Data: d})
							want[g][next] = d
							next++
						}
						b := Batch{Group: uint64(g + 1), Entries: es}
						if r%3 == 0 {
							hs[g] = HardState{Term: 1, Vote: 1, Commit: next - 1}
							h := hs[g]
							b.HardState = &h
						}
						if err := l.Append(b); err != nil {
							t.Error(err)
							return
						}
					}
				}()
			}
			wg.Wait()
			check := func(l *Log, when string) {
				t.Helper()
				for g := range groups {
					for idx, d := range want[g] {
						es, err := l.Entries(uint64(g+1), idx, idx+1)
						if err != nil {
							t.Fatalf("%s: group %d entry %d: %v", when, g+1, idx, err)
						}
						if !bytes.Equal(es[0].Data, d) {
							t.Fatalf("%s: group %d entry %d: %d bytes read, %d appended, not equal", when, g+1, idx, len(es[0].Data), len(d))
						}
					}
					if h, ok := l.HardState(uint64(g + 1)); !ok || h != hs[g] {
						t.Fatalf("%s: group %d hard state %+v %v, want %+v", when, g+1, h, ok, hs[g])
					}
				}
			}
			check(l, "before reopen")
			if l.Stats().WALBytes == 0 {
				t.Fatal("nothing written")
			}
			if err := l.Close(); err != nil {
				t.Fatal(err)
			}
			l, err = Open(fs, dir, opts)
			if err != nil {
				t.Fatal(err)
			}
			defer l.Close()
			check(l, "after reopen")
		})
	}
}

// WritevAt writes runs of more buffers than one pwritev takes, empty ones
// among them, in order.
func TestWritevAtManyBuffers(t *testing.T) {
	f, err := OSFS{}.Open(filepath.Join(t.TempDir(), "f"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var bufs [][]byte
	var want []byte
	for i := range 3*iovMax + 17 {
		b := []byte(fmt.Sprint(i, ","))
		if i%5 == 0 {
			b = nil
		}
		bufs = append(bufs, b)
		want = append(want, b...)
	}
	if err := writevAt(f, bufs, 3); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, len(want))
	if _, err := f.ReadAt(got, 3); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatal("read back differs")
	}
	if st, _ := f.Size(); st != int64(3+len(want)) {
		t.Fatalf("size %d, want %d", st, 3+len(want))
	}
}
