package segment

import (
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"

	"golang.org/x/sys/unix"
)

// BenchmarkAppendSync: concurrent appenders (one per group, up to 64
// goroutines) each appending batches of 8 entries and waiting for
// durability, on the real filesystem. Group commit makes many appends
// share each fdatasync. Reports entries/s, MB/s of payload and entries per
// fdatasync.
func BenchmarkAppendSync(b *testing.B) {
	for _, size := range []int{128, 1024} {
		for _, groups := range []int{1, 100, 1000} {
			b.Run(fmt.Sprintf("size=%d/groups=%d", size, groups), func(b *testing.B) {
				l, err := Open(OSFS{}, b.TempDir(), Options{})
				if err != nil {
					b.Fatal(err)
				}
				defer l.Close()
				writers := min(groups, 64)
				const perAppend = 8
				data := make([]byte, size)
				var next atomic.Int64
				last := make([]atomic.Uint64, groups)
				var gLocks = make([]sync.Mutex, groups)
				b.SetBytes(int64(size * perAppend))
				b.ReportAllocs()
				b.ResetTimer()
				var wg sync.WaitGroup
				for w := 0; w < writers; w++ {
					wg.Add(1)
					go func(w int) {
						defer wg.Done()
						es := make([]Entry, perAppend)
						for {
							n := next.Add(1)
							if n > int64(b.N) {
								return
							}
							g := int(n) % groups
							gLocks[g].Lock()
							start := last[g].Load() + 1
							for i := range es {
								es[i] = Entry{Index: start + uint64(i), Term: 1, Data: data}
							}
							if err := l.Append(Batch{Group: uint64(g), Entries: es}); err != nil {
								gLocks[g].Unlock()
								b.Error(err)
								return
							}
							last[g].Store(start + perAppend - 1)
							gLocks[g].Unlock()
						}
					}(w)
				}
				wg.Wait()
				b.StopTimer()
				b.ReportMetric(float64(b.N*perAppend)/b.Elapsed().Seconds(), "entries/s")
				b.ReportMetric(float64(b.N*perAppend)/float64(max(l.Stats().Syncs, 1)), "entries/sync")
			})
		}
	}
}

// BenchmarkRawWriteSync is the ceiling: pwrite of 64 KiB blocks at the end
// of a file plus fdatasync, as fast as the disk goes, with no framing.
func BenchmarkRawWriteSync(b *testing.B) {
	f, err := os.OpenFile(filepath.Join(b.TempDir(), "raw"), os.O_RDWR|os.O_CREATE, 0o640)
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, 64<<10)
	b.SetBytes(int64(len(buf)))
	var off int64
	for b.Loop() {
		if _, err := f.WriteAt(buf, off); err != nil {
			b.Fatal(err)
		}
		if err := unix.Fdatasync(int(f.Fd())); err != nil {
			b.Fatal(err)
		}
		off += int64(len(buf))
	}
}

// BenchmarkRead: reading 100 × 1 KiB entries through a read-only mapping
// (no copy) against pread into a fresh buffer.
func BenchmarkRead(b *testing.B) {
	l, err := Open(OSFS{}, b.TempDir(), Options{})
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close()
	data := make([]byte, 1024)
	for i := uint64(1); i <= 10000; i += 100 {
		es := make([]Entry, 100)
		for j := range es {
			es[j] = Entry{Index: i + uint64(j), Term: 1, Data: data}
		}
		if err := l.Append(Batch{Group: 1, Entries: es}); err != nil {
			b.Fatal(err)
		}
	}
	b.Run("mmap-view", func(b *testing.B) {
		b.SetBytes(100 * 1024)
		b.ReportAllocs()
		lo := uint64(1)
		for b.Loop() {
			es, release, err := l.EntriesView(1, lo, lo+100)
			if err != nil {
				b.Fatal(err)
			}
			var sum byte
			for _, e := range es {
				sum += e.Data[len(e.Data)-1]
			}
			_ = sum
			release()
			lo = lo%9800 + 100
		}
	})
	b.Run("pread-copy", func(b *testing.B) {
		b.SetBytes(100 * 1024)
		b.ReportAllocs()
		lo := uint64(1)
		for b.Loop() {
			if _, err := l.Entries(1, lo, lo+100); err != nil {
				b.Fatal(err)
			}
			lo = lo%9800 + 100
		}
	})
}
