package segment

import (
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
)

// TestTornCrashSim: rounds of acknowledged random ops (appends,
// truncations, compactions, maintenance, removals), then a power cut with
// two writes in flight (a, started alone, in its fdatasync; b written
// behind it), neither acknowledged: the disk kept a prefix of their bytes
// (a torn write), or all of them but a hole (MemFS.CrashHole: a later
// write kept, part of an earlier one not). Recovery must open (the damage
// lies in writes never acknowledged), holding the acknowledged state plus
// a prefix of a's and b's records; the next round goes on from there.
// Seeds produce the shapes recovery once refused: the two writes torn are
// a fresh log's first (its WAL file's checkpoint names no group), or
// follow a restart that kept a partial write (a prefix of a write's
// records). Each round's new WAL file (Rotate before a) has its
// directory entry kept or not. The seed of a failure is printed; rerun
// it with -run 'TestTornCrashSim/seed=N'.
var tornSeeds = flag.Int("torn.seeds", 300, "seeds for TestTornCrashSim")

type tornTotals struct {
	Rounds, Holes, Prefixes int
	FirstWrites             int // a hole in a fresh log's first write, the next one's bytes kept
	AfterPartial            int // a hole in a, b's bytes kept, after a restart that kept a partial write
	PartialKept             int // recoveries that kept part of a write
}

func TestTornCrashSim(t *testing.T) {
	seeds := *tornSeeds
	if testing.Short() {
		seeds = min(seeds, 100)
	}
	var tot tornTotals
	for seed := 0; seed < seeds; seed++ {
		t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) { tornCrashOnce(t, uint64(seed), &tot) })
	}
	t.Logf("%+v", tot)
	if tot.FirstWrites == 0 || tot.AfterPartial == 0 || tot.PartialKept == 0 || tot.Prefixes == 0 {
		t.Fatalf("a shape was never produced: %+v", tot)
	}
}

func tornCrashOnce(t *testing.T, seed uint64, tot *tornTotals) {
	r := rand.New(rand.NewPCG(seed, 0x7042))
	// WAL files rotate only at Rotate: b never waits for a new file (a
	// write that starts one waits for nothing in flight).
	opts := Options{Manual: true, WALSize: 1 << 20, SegmentSize: int64(512 + r.IntN(4096)), MoveLag: r.IntN(3)}
	mem := NewMemFS()
	gn := &gen{r: r, terms: map[uint64]uint64{}, groups: []uint64{0, 1, 2, 3}}
	m := model{}
	partial := false // the last recovery kept part of a write
	for round := range 1 + r.IntN(3) {
		tot.Rounds++
		g := &walGateFS{MemFS: mem, syncing: make(chan string), release: make(chan error)}
		g.open.Store(true) // syncs pass until the two torn writes
		l, err := Open(g, "/data", opts)
		if err != nil {
			t.Fatalf("seed %d round %d: open: %v", seed, round, err)
		}
		acked := 0 // none: the torn writes are the first after a fresh start or a restart
		if r.IntN(2) != 0 {
			acked = 1 + r.IntN(12)
		}
		var history []op
		for range acked {
			o := gn.op(m)
			if err := l.do(o); err != nil {
				t.Fatalf("seed %d round %d: %v", seed, round, err)
			}
			m.apply(o)
			history = append(history, o)
		}
		l.mu.Lock()
		rotates := l.wal.wsize > l.wal.head // else a Rotate would wait for b's write, and b for a's
		l.mu.Unlock()
		if rotates && r.IntN(4) == 0 {
			l.Rotate() // a starts a new WAL file: its first write, with its checkpoint
		}
		a := appendOp(gn, m)
		ma := m.clone()
		ma.apply(a)
		b := appendOp(gn, ma)
		wal := walFiles(mem)[len(walFiles(mem))-1]
		synced := mem.FileSize(wal)
		g.open.Store(false)
		var wg sync.WaitGroup
		errs := make([]error, 2)
		wg.Add(1)
		go func() { defer wg.Done(); errs[0] = l.do(a) }()
		<-g.syncing
		sizeA := mem.FileSize(walFiles(mem)[len(walFiles(mem))-1])
		wg.Add(1)
		go func() { defer wg.Done(); errs[1] = l.do(b) }()
		<-g.syncing
		if l.Stats().Pipelined == 0 {
			t.Fatalf("seed %d round %d: b was not pipelined behind a", seed, round)
		}
		if r.IntN(2) == 0 {
			must(t, mem.SyncDir("/data")) // a new WAL file's entry reached the disk (a journal commit)
		}
		rotated := walFiles(mem)[len(walFiles(mem))-1] != wal
		if rotated {
			wal, synced = walFiles(mem)[len(walFiles(mem))-1], 0
		}
		size := int(mem.FileSize(wal) - synced) // a's and b's bytes (a's with a new file's checkpoint)
		var crashed *MemFS
		aBytes := int(sizeA - synced) // a's (with a new file's header and checkpoint)
		hole, skip := r.IntN(2) == 0, r.IntN(size)
		if hole && r.IntN(2) == 0 {
			skip = r.IntN(aBytes) // in a
			if r.IntN(2) == 0 {
				skip = r.IntN(min(aBytes, 64)) // in a's first record (or its file's header)
			}
		}
		if hole {
			lose := 1 + r.IntN(300)
			crashed = mem.CrashHole(skip, lose, nil)
			tot.Holes++
			if skip < aBytes && skip+lose < size {
				// The hole is in a, and b's bytes survive after it.
				if round == 0 && acked == 0 {
					tot.FirstWrites++
				}
				if partial && acked == 0 {
					tot.AfterPartial++
				}
			}
		} else {
			crashed = mem.Crash(skip)
			tot.Prefixes++
		}
		g.release <- ErrInjected
		g.release <- ErrInjected
		wg.Wait()
		for i, err := range errs {
			if !errors.Is(err, ErrStopped) {
				t.Fatalf("seed %d round %d: write %d: %v, want ErrStopped", seed, round, i, err)
			}
		}
		l.Close()

		// Not with Quarantine: gen's hard states may commit past a later
		// truncation, which raft never does and Quarantine reports.
		l, err = Open(crashed, "/data", opts)
		if err != nil {
			t.Fatalf("seed %d round %d (hole %v at %d of %d bytes, rotated %v, after a partial write %v): recovery: %v",
				seed, round, hole, skip, size, rotated, partial, err)
		}
		if d := l.Damaged(); len(d) != 0 {
			t.Fatalf("seed %d round %d: damaged %+v", seed, round, d)
		}
		both := op{batches: append(append([]Batch(nil), a.batches...), b.batches...)}
		cands := candidatesFrom(m, history, &both)
		k := -1
		for i, c := range cands {
			if c.matchesRange(l) == nil {
				k = i
				break
			}
		}
		if k < 0 {
			t.Fatalf("seed %d round %d: recovered state is not the acknowledged one plus a prefix of the torn writes' records: %v",
				seed, round, cands[0].matchesRange(l))
		}
		if err := cands[k].checkKept(l); err != nil {
			t.Fatalf("seed %d round %d: live entries: %v", seed, round, err)
		}
		// cands: the acknowledged state, then 1..n records of a and b, then
		// both whole. Part of a write kept: a prefix that is not a's whole.
		na, n := len(records(a)), len(records(both))
		partial = k > 0 && k < n && k != na
		if partial {
			tot.PartialKept++
		}
		m = cands[k]
		must(t, l.Close())
		mem = crashed
	}
}

// appendOp is a random append of gn's: its batches' records make one
// write.
func appendOp(gn *gen, m model) op {
	for {
		if o := gn.op(m); len(o.batches) > 0 {
			return o
		}
	}
}
