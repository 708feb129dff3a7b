package segment

import (
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"
)

// BenchmarkAppendBehindMover: the latency of each Append while the mover
// copies everything (nothing is ever compacted: every entry of every
// sealed WAL file is copied into its group's segment file, one fdatasync
// per group per move), on the real filesystem with the default 64 MiB WAL
// files and no move lag; 16 appenders of 64 KiB each (64 entries of 1 KiB)
// over 96 or 960 groups. With 960 groups a move syncs 960 files and the
// mover falls MaxSealedWALs files behind, so appends wait for it.
// mover=off: no worker (Options.Manual), the WAL alone. Reports the
// latency of an Append (p50, p99, p99.9, max, and how many took over
// 100 ms), how many waited for the mover and the longest wait
// (Stats.MoverWaits, MoverWaitMax), and the bytes moved per byte of WAL. Use a -benchtime of
// 8192x or more (512 MiB of appends: eight WAL files).
func BenchmarkAppendBehindMover(b *testing.B) {
	for _, mover := range []string{"all", "off"} {
		for _, groups := range []int{96, 960} {
			b.Run(fmt.Sprintf("mover=%s/groups=%d", mover, groups), func(b *testing.B) {
				benchBehind(b, mover == "off", groups)
			})
		}
	}
}

func benchBehind(b *testing.B, manual bool, groups int) {
	const (
		appenders = 16
		perAppend = 64
		size      = 1024
	)
	groupsPer := groups / appenders
	l, err := Open(OSFS{}, b.TempDir(), Options{Manual: manual, MoveLag: -1})
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close()
	data := make([]byte, size)
	lat := make([][]time.Duration, appenders)
	b.SetBytes(perAppend * size)
	b.ResetTimer()
	var wg sync.WaitGroup
	for a := range appenders {
		wg.Add(1)
		go func() {
			defer wg.Done()
			es := make([]Entry, perAppend)
			next := make([]uint64, groupsPer)
			for i := a; i < b.N; i += appenders {
				k := (i / appenders) % groupsPer
				for j := range es {
					next[k]++
					es[j] = Entry{Index: next[k], Term: 1, Data: data}
				}
				t0 := time.Now()
				if err := l.Append(Batch{Group: uint64(a*groupsPer + k + 1), Entries: es}); err != nil {
					b.Error(err)
					return
				}
				lat[a] = append(lat[a], time.Since(t0))
			}
		}()
	}
	wg.Wait()
	b.StopTimer()
	all := slices.Concat(lat...)
	slices.Sort(all)
	if len(all) == 0 {
		return
	}
	q := func(p float64) float64 {
		return float64(all[min(len(all)-1, int(p*float64(len(all))))]) / 1e6
	}
	b.ReportMetric(q(0.5), "p50-ms")
	b.ReportMetric(q(0.99), "p99-ms")
	b.ReportMetric(q(0.999), "p99.9-ms")
	b.ReportMetric(float64(all[len(all)-1])/1e6, "max-ms")
	over, _ := slices.BinarySearch(all, 100*time.Millisecond)
	b.ReportMetric(float64(len(all)-over), "over-100ms")
	st := l.Stats()
	b.ReportMetric(float64(st.MovedBytes)/float64(st.WALBytes), "moved/wal")
	b.ReportMetric(float64(st.MoverWaits), "mover-waits")
	b.ReportMetric(float64(st.MoverWaitMax)/1e6, "mover-wait-max-ms")
}

// hangGuard bounds each wait of the mover tests: what should happen in
// microseconds and has not after this long never will (a lost wakeup),
// and the test fails naming it rather than hanging until go test's timeout.
const hangGuard = 10 * time.Second

// TestAppendPacedByMover: once the worker is MaxSealedWALs WAL files
// behind, an append waits for the next step of the move in progress, not
// for the whole move: with the mover held after copying one group of
// four (an eighth of its move), appends still fill an eighth of the new
// WAL file, the next one waits, and one more step of the mover (the next
// group's copies, the move still unfinished) lets it through.
func TestAppendPacedByMover(t *testing.T) {
	const walSize = 64 << 10
	l, err := Open(NewMemFS(), "/data", Options{WALSize: walSize, MoveLag: -1})
	must(t, err)
	// The mover reports each step on steps and waits for resume, until
	// release is closed (also when the test fails: Close waits for it).
	steps, resume, release := make(chan struct{}), make(chan struct{}), make(chan struct{})
	var once sync.Once
	free := func() { once.Do(func() { close(release) }) }
	defer l.Close()
	defer free()
	l.progressHook = func() {
		select {
		case steps <- struct{}{}:
			select {
			case <-resume:
			case <-release:
			}
		case <-release:
		}
	}
	// step waits for the mover's next step; a mover that never gets there
	// fails the test instead of hanging it.
	step := func() {
		t.Helper()
		select {
		case <-steps:
		case <-time.After(hangGuard):
			t.Fatalf("the mover did not report a step in %v", hangGuard)
		}
	}
	waits := make(chan struct{}, 64)
	l.waitHook = func() { waits <- struct{}{} }
	data := make([]byte, 1000)
	next := map[uint64]uint64{}
	batch := func(g uint64, n int) Batch {
		b := Batch{Group: g}
		for range n {
			next[g]++
			b.Entries = append(b.Entries, Entry{Index: next[g], Term: 1, Data: data})
		}
		return b
	}
	// An append that must not wait: it returns, or its wait is reported.
	noWait := func(what string, b Batch) {
		t.Helper()
		done := make(chan error, 1)
		go func() { done <- l.Append(b) }()
		select {
		case err := <-done:
			must(t, err)
		case <-waits:
			t.Fatalf("%s: the append waited for the mover", what)
		case <-time.After(hangGuard):
			t.Fatalf("%s: the append neither returned nor reported a wait in %v", what, hangGuard)
		}
	}
	// WAL file 1: 8 entries in each of 4 groups. Sealing it starts its
	// move, held at its first step: group 1's copies, an eighth of it.
	for g := uint64(1); g <= 4; g++ {
		noWait("file 1", batch(g, 8))
	}
	l.Rotate()
	noWait("file 2", batch(1, 1))
	step()
	l.mu.Lock()
	done := l.moveDone
	l.mu.Unlock()
	if done != 1.0/8 {
		t.Fatalf("the move reports %v done after one group of four's copies, want 1/8", done)
	}
	// WAL file 2 sealed: two files behind, the first an eighth moved.
	l.Rotate()
	noWait("sealing file 2", batch(1, 1))
	l.mu.Lock()
	start, sealed := l.wal.wsize, len(l.wals)
	l.mu.Unlock()
	if sealed != 2 {
		t.Fatalf("%d sealed WAL files, want 2", sealed)
	}
	// Appends fill the new file up to the mover's eighth, then wait.
	var waiting chan error
	for i := 0; waiting == nil; i++ {
		if i > walSize/len(data) {
			t.Fatal("appends never waited for the mover")
		}
		ch, b := make(chan error, 1), batch(2, 1)
		go func() { ch <- l.Append(b) }()
		select {
		case err := <-ch:
			must(t, err)
		case <-waits:
			waiting = ch
		case <-time.After(hangGuard):
			t.Fatalf("an append neither returned nor reported a wait in %v", hangGuard)
		}
	}
	l.mu.Lock()
	filled := l.wal.wsize
	l.mu.Unlock()
	if per := int64(len(data) + 64); filled < walSize/8-per || filled > walSize/8+per {
		t.Fatalf("appends waited with the new WAL file at %d bytes (from %d), want %d ± %d: an eighth, as far as the move is", filled, start, walSize/8, per)
	}
	// One more step of the move (group 2's copies: a quarter done) lets
	// the waiting append through, the move still unfinished.
	resume <- struct{}{}
	step()
	select {
	case err := <-waiting:
		must(t, err)
	case <-waits:
		t.Fatal("the append still waits with the move a quarter done")
	case <-time.After(hangGuard):
		t.Fatalf("the waiting append was not woken by the mover's step in %v (a lost wakeup)", hangGuard)
	}
	if st := l.Stats(); st.DeletedFiles != 0 || st.MoverWaits != 1 {
		t.Fatalf("%d files deleted (want none: the move is not finished), %d appends waited for the mover (want 1)", st.DeletedFiles, st.MoverWaits)
	}
	// Let the mover go: everything reads back.
	free()
	for g := uint64(1); g <= 4; g++ {
		es, err := l.Entries(g, 1, next[g]+1)
		must(t, err)
		if uint64(len(es)) != next[g] {
			t.Fatalf("group %d: %d entries, want %d", g, len(es), next[g])
		}
	}
}

// TestCompactionYieldsToWALMoves: appends wait for WAL moves, not for
// compaction, so Maintain goes back to the WAL files due between two
// compacted segment files (after compacting one at least). A WAL file
// sealed while the first of three compactions runs is moved before the
// third: with the old order the whole compaction pass came first, and an
// appender waiting for that move waited for all of it.
func TestCompactionYieldsToWALMoves(t *testing.T) {
	mem := NewMemFS()
	data := make([]byte, 1000)
	l, err := Open(mem, "/data", Options{Manual: true, WALSize: 64 << 10, SegmentSize: 8 << 10})
	must(t, err)
	defer l.Close()
	var es []Entry
	for i := uint64(1); i <= 40; i++ {
		es = append(es, Entry{Index: i, Term: 1, Data: data})
	}
	must(t, l.Append(Batch{Group: 1, Entries: es}))
	g2 := uint64(0)
	sealWAL := func() { // Rotate seals at the next write
		l.Rotate()
		g2++
		must(t, l.Append(Batch{Group: 2, Entries: []Entry{{Index: g2, Term: 1, Data: data}}}))
	}
	sealWAL()
	must(t, l.Maintain()) // group 1's entries in segment files of about 7 each
	// One live entry in each of the first three files: three compactions.
	must(t, l.Compact(1, 40, []uint64{1, 9, 17}))
	var sealed []int // WAL files sealed at each compaction
	l.compactHook = func() {
		if len(sealed) == 0 {
			sealWAL() // due now
		}
		l.mu.Lock()
		sealed = append(sealed, len(l.wals))
		l.mu.Unlock()
	}
	must(t, l.Maintain())
	if len(sealed) < 3 || sealed[len(sealed)-1] != 0 {
		t.Fatalf("sealed WAL files seen before each compaction: %v; want the one sealed during the first moved before the third", sealed)
	}
	for _, i := range []uint64{1, 9, 17} {
		e, release, err := l.EntriesView(1, i, i+1)
		must(t, err)
		if len(e) != 1 || len(e[0].Data) != len(data) {
			t.Fatalf("live entry %d after the compactions: %d entries", i, len(e))
		}
		release()
	}
	if st := l.Stats(); st.Compacted < 3 {
		t.Fatalf("%d entries compacted, want the three live ones", st.Compacted)
	}
}
