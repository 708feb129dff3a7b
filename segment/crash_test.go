package segment

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
)

// model is the reference: what must be stored after each acknowledged op.
// Its rules are restated from the Log's doc comments, not shared with it.
type model map[uint64]*mgroup

type mgroup struct {
	first, last uint64
	stored      map[uint64]Entry // the raft log [first, last] and the live entries kept below it
	hs          *HardState
	prevTerm    uint64 // the term of first-1, recorded by a compaction (0: unknown)
}

func (m model) g(id uint64) *mgroup {
	if m[id] == nil {
		m[id] = &mgroup{first: 1, stored: map[uint64]Entry{}}
	}
	return m[id]
}

func (m model) clone() model {
	out := model{}
	for id, g := range m {
		c := *g
		c.stored = maps.Clone(g.stored)
		if g.hs != nil {
			hs := *g.hs
			c.hs = &hs
		}
		out[id] = &c
	}
	return out
}

func (g *mgroup) cutFrom(idx uint64) {
	for k := range g.stored {
		if k >= idx {
			delete(g.stored, k)
		}
	}
}

// kept lists the live entries below first, sorted.
func (g *mgroup) kept() []uint64 {
	var out []uint64
	for k := range g.stored {
		if k < g.first {
			out = append(out, k)
		}
	}
	slices.Sort(out)
	return out
}

type op struct {
	batches  []Batch
	trunc    *[2]uint64
	compact  *[2]uint64
	live     []uint64
	maintain bool
	remove   *uint64 // RemoveGroup
}

func (m model) apply(o op) {
	if o.remove != nil {
		delete(m, *o.remove)
		return
	}
	for _, b := range o.batches {
		g := m.g(b.Group)
		for _, e := range b.Entries {
			if (g.last < g.first || e.Index < g.first) && g.first != e.Index {
				g.first, g.prevTerm = e.Index, 0
			}
			g.cutFrom(e.Index)
			g.stored[e.Index] = Entry{Index: e.Index, Term: e.Term, Data: append([]byte(nil), e.Data...)}
			g.last = e.Index
		}
		if b.HardState != nil {
			hs := *b.HardState
			g.hs = &hs
		}
	}
	if o.trunc != nil {
		g := m.g(o.trunc[0])
		if from := o.trunc[1]; from <= g.last {
			g.cutFrom(from)
			if from < g.first {
				g.first, g.prevTerm = from, 0
			}
			g.last = from - 1
		}
	}
	if o.compact != nil {
		g := m.g(o.compact[0])
		if upTo := o.compact[1]; upTo >= g.first {
			g.prevTerm = 0
			if e, ok := g.stored[upTo]; ok && upTo <= g.last {
				g.prevTerm = e.Term
			}
			g.first = upTo + 1
			g.last = max(g.last, upTo)
		}
		for k := range g.stored {
			if k < g.first && !slices.Contains(o.live, k) {
				delete(g.stored, k)
			}
		}
	}
}

// matchesRange reports whether the log's raft logs and hard states are
// the model's, entry for entry.
func (m model) matchesRange(l *Log) error {
	ids := map[uint64]bool{}
	for id := range m {
		ids[id] = true
	}
	for _, id := range l.Groups() {
		ids[id] = true
	}
	return m.matchesGroups(l, ids)
}

// matchesGroups is matchesRange for some groups only.
func (m model) matchesGroups(l *Log, ids map[uint64]bool) error {
	for id := range ids {
		g := m.g(id)
		if g.last >= g.first || l.LastIndex(id) >= l.FirstIndex(id) {
			if l.FirstIndex(id) != g.first || l.LastIndex(id) != g.last {
				return fmt.Errorf("group %d: range %d..%d, model %d..%d", id, l.FirstIndex(id), l.LastIndex(id), g.first, g.last)
			}
			es, err := l.Entries(id, g.first, g.last+1)
			if err != nil {
				return fmt.Errorf("group %d: %v", id, err)
			}
			for _, e := range es {
				w := g.stored[e.Index]
				if e.Term != w.Term || !bytes.Equal(e.Data, w.Data) {
					return fmt.Errorf("group %d entry %d differs", id, e.Index)
				}
			}
		}
		hs, ok := l.HardState(id)
		if (g.hs != nil) != ok || (ok && hs != *g.hs) {
			return fmt.Errorf("group %d hard state %+v (%v), model %+v", id, hs, ok, g.hs)
		}
		if g.first > 1 {
			term, err := l.Term(id, g.first-1)
			if g.prevTerm != 0 && (err != nil || term != g.prevTerm) {
				return fmt.Errorf("group %d: term of %d (before first): %d, %v; model %d", id, g.first-1, term, err, g.prevTerm)
			}
		}
	}
	return nil
}

// checkKept hands the log each group's live set, as an owner does after a
// restart, and checks every kept entry reads back byte for byte.
func (m model) checkKept(l *Log) error {
	for id, g := range m {
		kept := g.kept()
		if err := l.Compact(id, g.first-1, kept); err != nil {
			return err
		}
		for _, k := range kept {
			es, release, err := l.EntriesView(id, k, k+1)
			if err != nil {
				return fmt.Errorf("group %d kept entry %d: %w", id, k, err)
			}
			if es[0].Term != g.stored[k].Term || !bytes.Equal(es[0].Data, g.stored[k].Data) {
				release()
				return fmt.Errorf("group %d kept entry %d differs", id, k)
			}
			release()
		}
	}
	return nil
}

// gen produces random ops on its groups; terms grow per group as raft's
// do.
type gen struct {
	r      *rand.Rand
	terms  map[uint64]uint64
	groups []uint64
}

func (gn *gen) group() uint64 { return gn.groups[gn.r.IntN(len(gn.groups))] }

func (gn *gen) op(m model) op {
	r := gn.r
	var o op
	switch k := r.IntN(21); {
	case k < 13:
		for n := 1 + r.IntN(3); n > 0; n-- {
			id := gn.group()
			g := m.g(id)
			start := g.last + 1
			if g.last >= g.first && r.IntN(4) == 0 { // a new leader overwrites a suffix
				start = g.first + uint64(r.IntN(int(g.last-g.first+1)))
				gn.terms[id]++
			}
			gn.terms[id] = max(gn.terms[id], 1)
			b := Batch{Group: id}
			for i := 0; i < 1+r.IntN(6); i++ {
				d := make([]byte, r.IntN(300))
				for j := range d {
					d[j] = byte(r.Uint32())
				}
				b.Entries = append(b.Entries, Entry{Index: start + uint64(i), Term: gn.terms[id], Data: d})
			}
			if r.IntN(3) == 0 {
				b.HardState = &HardState{Term: gn.terms[id], Vote: uint64(r.IntN(3)), Commit: uint64(r.IntN(int(start) + 1))}
			}
			if !slices.ContainsFunc(o.batches, func(x Batch) bool { return x.Group == id }) {
				o.batches = append(o.batches, b)
			}
		}
	case k < 15:
		id := gn.group()
		g := m.g(id)
		o.trunc = &[2]uint64{id, g.first + uint64(r.IntN(int(g.last-g.first+2)))}
		gn.terms[id]++ // raft truncates only for a new leader's entries
	case k < 18:
		id := gn.group()
		g := m.g(id)
		upTo := g.first + uint64(r.IntN(int(g.last-g.first+2))) - 1
		if r.IntN(4) == 0 {
			upTo = g.first - 1 // only a new live set
		}
		o.compact = &[2]uint64{id, upTo}
		for k := range g.stored {
			if k <= max(upTo, g.first-1) && r.IntN(3) == 0 {
				o.live = append(o.live, k)
			}
		}
		slices.Sort(o.live)
	case k < 20:
		o.maintain = true
	default:
		id := gn.group()
		o.remove = &id
	}
	return o
}

func (l *Log) do(o op) error {
	switch {
	case o.trunc != nil:
		return l.Truncate(o.trunc[0], o.trunc[1])
	case o.compact != nil:
		return l.Compact(o.compact[0], o.compact[1], o.live)
	case o.maintain:
		return l.Maintain()
	case o.remove != nil:
		return l.RemoveGroup(*o.remove)
	}
	return l.Append(o.batches...)
}

// records splits an op's batches into the records the log writes: a
// group's entries, then its hard state.
func records(o op) []op {
	var out []op
	for _, b := range o.batches {
		if len(b.Entries) > 0 {
			out = append(out, op{batches: []Batch{{Group: b.Group, Entries: b.Entries}}})
		}
		if b.HardState != nil {
			out = append(out, op{batches: []Batch{{Group: b.Group, HardState: b.HardState}}})
		}
	}
	return out
}

// candidates are the states recovery may rightly find after history
// (acknowledged) and failed (the op whose sync failed, or nil): the
// history, plus any prefix of the failed op's records, or all of it.
func candidates(history []op, failed *op) []model {
	return candidatesFrom(model{}, history, failed)
}

// candidatesFrom is candidates for a history that starts from base.
func candidatesFrom(base model, history []op, failed *op) []model {
	m := base.clone()
	for _, o := range history {
		m.apply(o)
	}
	out := []model{m}
	if failed != nil {
		recs := records(*failed)
		for k := 1; k <= len(recs); k++ {
			mk := m.clone()
			for _, r := range recs[:k] {
				mk.apply(r)
			}
			out = append(out, mk)
		}
		mk := m.clone()
		mk.apply(*failed)
		out = append(out, mk)
	}
	return out
}

func crashOpts(r *rand.Rand) Options {
	return Options{Manual: true, WALSize: int64(512 + r.IntN(4096)), SegmentSize: int64(512 + r.IntN(4096)),
		CompactBelow: 0.2 + 0.6*r.Float64(), MoveLag: r.IntN(3)}
}

// TestCrashProperty: random appends (with suffix overwrites by a new
// term), hard states, truncations, compactions with live sets, and
// maintenance (WAL files moved into segment files and deleted, segments
// compacted and deleted) across groups on the in-memory filesystem, with
// small files so that all of it happens often. Then a crash: between
// operations, or in one whose write or fsync (of a file or the directory)
// failed, with a random torn tail on every file. Then recovery: the acknowledged
// state must be there, byte for byte; the failed operation may have
// survived wholly or as a prefix of its records, never as garbage; hard
// state is the last durable one; the owner's live entries below the
// compaction point read back intact. Then a bit is flipped in a random
// file: recovery must report corruption, or serve only what the history
// wrote. The seed of a failure is printed; rerun it with
// -run 'TestCrashProperty/seed=N'.
var crashSeeds = flag.Int("crash.seeds", 1000, "seeds for TestCrashProperty")

func TestCrashProperty(t *testing.T) {
	seeds := *crashSeeds
	if testing.Short() {
		seeds = min(seeds, 100)
	}
	var tot crashTotals
	for seed := 0; seed < seeds; seed++ {
		t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) { crashOnce(t, uint64(seed), &tot) })
	}
	t.Logf("%+v", tot)
	// The run must have exercised every path it claims to.
	if tot.Moved == 0 || tot.Compacted == 0 || tot.Deleted == 0 || tot.Sealed == 0 || tot.FailedOps == 0 ||
		tot.FlipsReported == 0 || tot.FlipsCut == 0 || tot.Footers == 0 || tot.FlipsOnRead == 0 {
		t.Fatalf("a path was never exercised: %+v", tot)
	}
}

type crashTotals struct {
	Moved, Compacted, Deleted, Sealed, Pipelined uint64
	Footers                                      uint64 // sealed files recovery loaded from their footers
	FailedOps, FlipsReported, FlipsCut           int
	FlipsOnRead                                  int // found on first read (a file loaded from its footer)
}

func crashOnce(t *testing.T, seed uint64, tot *crashTotals) {
	r := rand.New(rand.NewPCG(seed, 77))
	opts := crashOpts(r)
	fs := NewMemFS()
	l, err := Open(fs, "/data", opts)
	must(t, err)
	gn := &gen{r: r, terms: map[uint64]uint64{}, groups: []uint64{0, 1, 2, 3, 4, 5, 6, 7}}
	m := model{}
	var history []op
	steps := 1 + r.IntN(80)
	var failed *op
	for i := 0; i < steps; i++ {
		o := gn.op(m)
		if i == steps-1 {
			switch r.IntN(3) {
			case 0:
				fs.FailSync(1 + r.IntN(3)) // one of the next syncs fails; then we crash
			case 1:
				fs.FailWrite(1 + r.IntN(3)) // or one of the next writes
			}
		}
		if err := l.do(o); err != nil {
			if !errors.Is(err, ErrStopped) {
				t.Fatalf("seed %d: op %d: %v", seed, i, err)
			}
			failed = &o
			break
		}
		m.apply(o)
		history = append(history, o)
	}
	st := l.Stats()
	tot.Moved += st.Moved
	tot.Compacted += st.Compacted
	tot.Deleted += st.DeletedFiles
	tot.Sealed += st.SegmentsSealed
	if failed != nil {
		tot.FailedOps++
	}
	crashed := fs.Crash(r.IntN(2000))
	files, _ := crashed.List("/data")

	l2, err := Open(crashed, "/data", opts)
	if err != nil {
		t.Fatalf("seed %d: recovery: %v (files %v)", seed, err, files)
	}
	tot.Footers += l2.Stats().FootersRead
	var match model
	for _, c := range candidates(history, failed) {
		if c.matchesRange(l2) == nil {
			match = c
			break
		}
	}
	if match == nil {
		t.Fatalf("seed %d: recovered state is neither the acknowledged one nor it plus part of the failed op: %v", seed, m.matchesRange(l2))
	}
	if err := match.checkKept(l2); err != nil {
		t.Fatalf("seed %d: live entries: %v", seed, err)
	}
	// Maintenance after recovery leaves the same state.
	must(t, l2.Maintain())
	must(t, match.matchesRange(l2))
	must(t, match.checkKept(l2))
	// A removed group's files are reclaimed.
	known := l2.Groups()
	names, _ := crashed.List("/data")
	for _, n := range names {
		if _, g, wal, ok := parseName(n); ok && !wal && !slices.Contains(known, g) {
			t.Fatalf("seed %d: %s of a removed group is still on disk after maintenance", seed, n)
		}
	}
	l2.Close()

	// Bit rot: flip one bit in a random file.
	files, _ = crashed.List("/data")
	if len(files) == 0 {
		return
	}
	name := "/data/" + files[r.IntN(len(files))]
	size := crashed.FileSize(name)
	if size == 0 {
		return
	}
	off := r.Int64N(size)
	crashed.Corrupt(name, off, uint(r.IntN(8)))
	l3, err := Open(crashed, "/data", opts)
	if errors.Is(err, ErrCorrupt) || errors.Is(err, ErrVersion) {
		tot.FlipsReported++
		return // detected
	}
	tot.FlipsCut++
	if err != nil {
		t.Fatalf("seed %d: flipped bit at %s:%d: unexpected error %v", seed, name, off, err)
	}
	defer l3.Close()
	// Not reported at open, in a sealed file loaded from its footer: the
	// first read of the damaged record reports it.
	for _, id := range l3.Groups() {
		if _, err := l3.Entries(id, l3.FirstIndex(id), l3.LastIndex(id)+1); errors.Is(err, ErrCorrupt) {
			tot.FlipsOnRead++
			return
		}
	}
	// Not reported at open: the damage was cut as a torn tail. The state
	// must then be one the history went through, and the live entries must
	// read back or be reported missing.
	var ok []model
	for k := len(history); k >= 0 && len(ok) == 0; k-- {
		var f *op
		if k < len(history) {
			f = &history[k]
		} else {
			f = failed
		}
		for _, c := range candidates(history[:k], f) {
			if c.matchesRange(l3) == nil {
				ok = append(ok, c)
			}
		}
	}
	if len(ok) == 0 {
		t.Fatalf("seed %d: a bit flipped at %s:%d was neither reported nor cut cleanly: %v", seed, name, off, m.matchesRange(l3))
	}
	// Entries kept in every state that matches must be there or reported.
	common := ok[0].clone()
	for _, c := range ok[1:] {
		for id, g := range common {
			for k, e := range g.stored {
				if k < g.first {
					if ce, in := c.g(id).stored[k]; !in || !bytes.Equal(ce.Data, e.Data) || c.g(id).first != g.first {
						delete(g.stored, k)
					}
				}
			}
		}
	}
	if err := common.checkKept(l3); err != nil && !errors.Is(err, ErrCorrupt) {
		t.Fatalf("seed %d: a bit flipped at %s:%d: live entries neither intact nor reported: %v", seed, name, off, err)
	}
}

// TestConcurrentCrash: several goroutines, each owning some groups, run
// random ops at once while the background worker moves, compacts and
// deletes files (small files), so the pipelined group commit, rotations
// and moves interleave; a write or sync fails at a random point and every
// goroutine stops at its first error; then a crash with torn tails. Each
// goroutine's groups must then hold its acknowledged history, plus
// possibly part or all of the op it was in when the engine stopped.
func TestConcurrentCrash(t *testing.T) {
	seeds := max(*crashSeeds/10, 20)
	if testing.Short() {
		seeds = 20
	}
	var tot crashTotals
	for seed := 0; seed < seeds; seed++ {
		t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) { concurrentCrashOnce(t, uint64(seed), &tot) })
	}
	t.Logf("%+v", tot)
	if tot.Moved == 0 || tot.FailedOps == 0 {
		t.Fatalf("a path was never exercised: %+v", tot)
	}
	if tot.Pipelined == 0 {
		// Whether a commit is pipelined behind another depends on the
		// goroutines' timing: a clean-clone CI run saw none in 20 seeds.
		// Reported, not failed; make soak-segment runs many more seeds.
		t.Logf("no pipelined commit in %d seeds this run (scheduling)", seeds)
	}
}

func concurrentCrashOnce(t *testing.T, seed uint64, tot *crashTotals) {
	r := rand.New(rand.NewPCG(seed, 99))
	opts := crashOpts(r)
	opts.Manual = false
	fs := NewMemFS()
	l, err := Open(fs, "/data", opts)
	must(t, err)
	const workers = 4
	type result struct {
		history []op
		failed  *op
		groups  []uint64
	}
	results := make([]result, workers)
	if r.IntN(4) != 0 {
		if r.IntN(2) == 0 {
			fs.FailSync(1 + r.IntN(60))
		} else {
			fs.FailWrite(1 + r.IntN(60))
		}
	}
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		groups := []uint64{uint64(2 * w), uint64(2*w + 1)}
		wr := rand.New(rand.NewPCG(seed, uint64(w)))
		wg.Add(1)
		go func() {
			defer wg.Done()
			gn := &gen{r: wr, terms: map[uint64]uint64{}, groups: groups}
			m := model{}
			res := &results[w]
			res.groups = groups
			for i := 0; i < 40; i++ {
				o := gn.op(m)
				if o.maintain {
					continue // the worker does it
				}
				if err := l.do(o); err != nil {
					if !errors.Is(err, ErrStopped) {
						t.Errorf("seed %d worker %d: %v", seed, w, err)
					}
					res.failed = &o
					return
				}
				m.apply(o)
				res.history = append(res.history, o)
			}
		}()
	}
	wg.Wait()
	st := l.Stats()
	tot.Moved += st.Moved
	tot.Pipelined += st.Pipelined
	for _, res := range results {
		if res.failed != nil {
			tot.FailedOps++
		}
	}
	l.Close()
	crashed := fs.Crash(r.IntN(2000))
	opts.Manual = true
	l2, err := Open(crashed, "/data", opts)
	if err != nil {
		t.Fatalf("seed %d: recovery: %v", seed, err)
	}
	defer l2.Close()
	for w, res := range results {
		ids := map[uint64]bool{}
		for _, g := range res.groups {
			ids[g] = true
		}
		ok := false
		var last error
		for _, c := range candidates(res.history, res.failed) {
			if last = c.matchesGroups(l2, ids); last == nil {
				if err := c.checkKept(l2); err != nil {
					t.Fatalf("seed %d worker %d: live entries: %v", seed, w, err)
				}
				ok = true
				break
			}
		}
		if !ok {
			t.Fatalf("seed %d worker %d: recovered state is not its acknowledged history (plus part of its failed op): %v", seed, w, last)
		}
	}
}
