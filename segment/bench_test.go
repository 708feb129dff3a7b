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

// BenchmarkAppendSync: concurrent appenders (one goroutine per group, up
// to 1,000) each appending batches of 8 entries and waiting for
// durability, on the real filesystem. Group commit makes many appends
// share each fdatasync. Reports entries/s, MB/s of payload and entries per
// WAL fdatasync.
//
// mover says what the background worker has to do meanwhile:
//   - all: nothing is ever compacted, so it copies every entry from the WAL
//     into segment files (the worst case: a queue nobody consumes);
//   - consumed: each group compacts 64 entries behind its head every 16
//     appends (consumers keep up), so most entries are dropped before their
//     WAL file is moved and it copies few;
//   - off: no worker (Options.Manual): the WAL append path alone.
func BenchmarkAppendSync(b *testing.B) {
	for _, mover := range []string{"all", "consumed", "off"} {
		for _, size := range []int{128, 1024} {
			for _, groups := range []int{1, 100, 1000} {
				b.Run(fmt.Sprintf("mover=%s/size=%d/groups=%d", mover, size, groups), func(b *testing.B) {
					benchAppend(b, mover, size, groups)
				})
			}
		}
	}
}

func benchAppend(b *testing.B, mover string, size, groups int) {
	// No move lag: the mover's cost is what these runs measure.
	l, err := Open(OSFS{}, b.TempDir(), Options{Manual: mover == "off", MoveLag: -1})
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close()
	const perAppend = 8
	data := make([]byte, size)
	// Warm up: every group gets its segment file before the clock starts
	// (creating a file costs about 1.6 ms on this machine's ext4).
	for g := 0; g < groups; g++ {
		if err := l.Append(Batch{Group: uint64(g), Entries: []Entry{{Index: 1, Term: 1, Data: data}}}); err != nil {
			b.Fatal(err)
		}
	}
	l.Rotate()
	if err := l.Append(Batch{Group: 0, Entries: []Entry{{Index: 2, Term: 1, Data: data}}}); err != nil {
		b.Fatal(err)
	}
	if err := l.Maintain(); err != nil {
		b.Fatal(err)
	}
	if err := l.Compact(0, 2, nil); err != nil {
		b.Fatal(err)
	}
	for g := 1; g < groups; g++ {
		if err := l.Compact(uint64(g), 1, nil); err != nil {
			b.Fatal(err)
		}
	}
	base := l.Stats()
	var next atomic.Int64
	b.SetBytes(int64(size * perAppend))
	b.ReportAllocs()
	b.ResetTimer()
	var wg sync.WaitGroup
	for g := 0; g < groups; g++ {
		wg.Add(1)
		go func(g uint64) {
			defer wg.Done()
			es := make([]Entry, perAppend)
			last := uint64(1)
			if g == 0 {
				last = 2
			}
			for n := 1; next.Add(1) <= int64(b.N); n++ {
				for i := range es {
					es[i] = Entry{Index: last + 1 + uint64(i), Term: 1, Data: data}
				}
				if err := l.Append(Batch{Group: g, Entries: es}); err != nil {
					b.Error(err)
					return
				}
				last += perAppend
				if mover == "consumed" && n%16 == 0 {
					if err := l.Compact(g, last-64, nil); err != nil {
						b.Error(err)
						return
					}
				}
			}
		}(uint64(g))
	}
	wg.Wait()
	b.StopTimer()
	st := l.Stats()
	st.Syncs -= base.Syncs
	st.Moved -= base.Moved
	b.ReportMetric(float64(b.N*perAppend)/b.Elapsed().Seconds(), "entries/s")
	b.ReportMetric(float64(b.N*perAppend)/float64(max(st.Syncs, 1)), "entries/sync")
	b.ReportMetric(float64(b.N*perAppend*(size+entryHeader))/float64(max(st.Syncs, 1)), "bytes/sync")
	b.ReportMetric(float64(st.Moved)/float64(b.N*perAppend), "moved/entry")
}

// BenchmarkRawWriteSync is the ceiling: pwrite of blocks at the end of a
// file plus fdatasync, as fast as the disk goes, with no framing.
func BenchmarkRawWriteSync(b *testing.B) {
	for _, block := range []int{64 << 10, 256 << 10, 1 << 20, 4 << 20} {
		b.Run(fmt.Sprintf("block=%dKiB", block>>10), func(b *testing.B) { rawWriteSync(b, block) })
	}
}

func rawWriteSync(b *testing.B, block int) {
	f, err := os.OpenFile(filepath.Join(b.TempDir(), "raw"), os.O_RDWR|os.O_CREATE, 0o640)
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, block)
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
// (no copy) against Entries, which copies them into a fresh buffer.
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
	b.Run("copy", func(b *testing.B) {
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

// BenchmarkOpen: Open (and Close) of a log whose entries all sit in
// segment files, on the real filesystem with a warm page cache: 10
// groups × 24 MiB of 1 KiB entries in 4 MiB segment files (60 sealed, 10
// current). Reports the segment bytes per open as MB/s and the footers
// loaded (0 before format version 3: every file was scanned).
func BenchmarkOpen(b *testing.B) {
	dir := b.TempDir()
	opts := Options{Manual: true, SegmentSize: 4 << 20}
	l, err := Open(OSFS{}, dir, opts)
	if err != nil {
		b.Fatal(err)
	}
	data := make([]byte, 1024)
	const groups, perGroup = 10, 24 << 10
	for i := uint64(1); i <= perGroup; i += 256 {
		for g := uint64(1); g <= groups; g++ {
			es := make([]Entry, 256)
			for j := range es {
				es[j] = Entry{Index: i + uint64(j), Term: 1, Data: data}
			}
			if err := l.Append(Batch{Group: g, Entries: es}); err != nil {
				b.Fatal(err)
			}
		}
		if i%(4<<10) == 1 {
			l.Rotate()
			if err := l.Maintain(); err != nil {
				b.Fatal(err)
			}
		}
	}
	l.Rotate() // the next append starts a new WAL file; the move empties the last one
	if err := l.Append(Batch{Group: 1, HardState: &HardState{Term: 1, Commit: perGroup}}); err != nil {
		b.Fatal(err)
	}
	if err := l.Maintain(); err != nil {
		b.Fatal(err)
	}
	if err := l.Close(); err != nil {
		b.Fatal(err)
	}
	var total int64
	names, _ := os.ReadDir(dir)
	for _, n := range names {
		if fi, err := n.Info(); err == nil && filepath.Ext(n.Name()) == ".seg" {
			total += fi.Size()
		}
	}
	b.SetBytes(total)
	var footers uint64
	for b.Loop() {
		l, err := Open(OSFS{}, dir, opts)
		if err != nil {
			b.Fatal(err)
		}
		footers = l.Stats().FootersRead
		if err := l.Close(); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(footers), "footers/op")
	b.ReportMetric(float64(len(names)), "files")
}
