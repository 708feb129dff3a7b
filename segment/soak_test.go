package segment

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"os"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestSoakTenMillion stores 10,000,000 entries of 1 KiB (100 groups, 100
// appenders, batches of 64) on the real filesystem, with the background
// worker moving them into segment files, then reads every one back
// through views and checks it. It reports the Go heap and the process's
// resident memory, split into anonymous memory and mapped file pages:
// bodies live in the page cache through mmap, not on the heap. About
// 20 GiB is written (WAL, then segments). Run with `make soak-segment`
// (SEGMENT_SOAK=1; SEGMENT_SOAK_DIR picks the directory).
func TestSoakTenMillion(t *testing.T) {
	if os.Getenv("SEGMENT_SOAK") == "" {
		t.Skip("set SEGMENT_SOAK=1 (make soak-segment)")
	}
	dir := t.TempDir()
	if d := os.Getenv("SEGMENT_SOAK_DIR"); d != "" {
		var err error
		if dir, err = os.MkdirTemp(d, "soak"); err != nil {
			t.Fatal(err)
		}
		defer os.RemoveAll(dir)
	}
	const (
		groups  = 100
		total   = 10_000_000
		perG    = total / groups
		batch   = 100
		entrySz = 1024
	)
	l, err := Open(OSFS{}, dir, Options{})
	must(t, err)
	fill := func(buf []byte, g, idx uint64) {
		for i := 0; i+16 <= len(buf); i += 16 {
			binary.LittleEndian.PutUint64(buf[i:], g)
			binary.LittleEndian.PutUint64(buf[i+8:], idx^uint64(i))
		}
	}
	start := time.Now()
	var wg sync.WaitGroup
	for g := uint64(0); g < groups; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			data := make([]byte, batch*entrySz)
			es := make([]Entry, batch)
			for idx := uint64(1); idx <= perG; idx += batch {
				for i := range es {
					d := data[i*entrySz : (i+1)*entrySz]
					fill(d, g, idx+uint64(i))
					es[i] = Entry{Index: idx + uint64(i), Term: 1, Data: d}
				}
				if err := l.Append(Batch{Group: g, Entries: es}); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	wrote := time.Since(start)
	must(t, l.Maintain()) // move what the worker has not yet
	moved := time.Since(start)
	st := l.Stats()
	if st.StoredEntries != total {
		t.Fatalf("%d entries stored, want %d", st.StoredEntries, total)
	}

	start = time.Now()
	want := make([]byte, entrySz)
	for g := uint64(0); g < groups; g++ {
		for lo := uint64(1); lo <= perG; lo += 1000 {
			es, release, err := l.EntriesView(g, lo, lo+1000)
			must(t, err)
			for _, e := range es {
				fill(want, g, e.Index)
				if string(e.Data) != string(want) {
					t.Fatalf("group %d entry %d differs", g, e.Index)
				}
			}
			release()
		}
	}
	read := time.Since(start)
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	anon, file := rss(t)
	t.Logf("wrote %d × %d B in %v (%.0f entries/s, %.0f MB/s), all in segments after %v; read back and checked in %v (%.0f MB/s)",
		total, entrySz, wrote.Round(time.Millisecond), total/wrote.Seconds(), total*entrySz/wrote.Seconds()/1e6,
		moved.Round(time.Millisecond), read.Round(time.Millisecond), total*entrySz/read.Seconds()/1e6)
	t.Logf("Go heap in use %.1f MiB (%.1f B per entry); RSS anonymous %.1f MiB, file-backed (mapped page cache) %.1f MiB; %d segment files, %d WAL files",
		float64(ms.HeapInuse)/(1<<20), float64(ms.HeapInuse)/total, float64(anon)/(1<<20), float64(file)/(1<<20), st.SegmentFiles, st.WALFiles)
	if ms.HeapInuse > 256<<20 {
		t.Fatalf("heap %d MiB: bodies are on the heap", ms.HeapInuse>>20)
	}
	must(t, l.Close())

	// Recovery reads every segment file to rebuild the index.
	start = time.Now()
	l, err = Open(OSFS{}, dir, Options{})
	must(t, err)
	if n := l.Stats().StoredEntries; n != total {
		t.Fatalf("%d entries after reopening, want %d", n, total)
	}
	t.Logf("reopened (index rebuilt from %d segment files, page cache warm) in %v", l.Stats().SegmentFiles, time.Since(start).Round(time.Millisecond))
	must(t, l.Close())
}

// rss reads the process's resident anonymous and file-backed memory.
func rss(t *testing.T) (anon, file int64) {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		t.Skip("no /proc")
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var kb int64
		switch {
		case strings.HasPrefix(sc.Text(), "RssAnon:"):
			fmt.Sscanf(strings.TrimPrefix(sc.Text(), "RssAnon:"), "%d", &kb)
			anon = kb << 10
		case strings.HasPrefix(sc.Text(), "RssFile:"):
			fmt.Sscanf(strings.TrimPrefix(sc.Text(), "RssFile:"), "%d", &kb)
			file = kb << 10
		}
	}
	return anon, file
}
