package segment

import (
	"bytes"
	"errors"
	"slices"
	"strings"
	"testing"
)

// Options.Quarantine: damage attributable to groups quarantines them;
// every other group opens with all its data.

var qGroups = []uint64{2, 5, 6, 7}

func qData(g, i uint64) []byte { return bytes.Repeat([]byte{byte(g*31 + i)}, 300) }

func qOpts(quarantine bool) Options {
	return Options{Manual: true, SegmentSize: 4 << 10, Quarantine: quarantine}
}

// qLog builds a log where every group of qGroups has entries 1..45 with
// a hard state: 1..40 moved into segment files (several sealed, with
// footers, and a current one), 41..45 in WAL files.
func qLog(t *testing.T) *MemFS {
	t.Helper()
	mem := NewMemFS()
	l, err := Open(mem, "/data", qOpts(false))
	must(t, err)
	app := func(lo, hi uint64) {
		for _, g := range qGroups {
			var es []Entry
			for i := lo; i <= hi; i++ {
				es = append(es, Entry{Index: i, Term: 1, Data: qData(g, i)})
			}
			must(t, l.Append(Batch{Group: g, Entries: es, HardState: &HardState{Term: 1, Vote: 1, Commit: hi}}))
		}
	}
	for i := uint64(1); i <= 40; i += 8 {
		app(i, i+7)
	}
	l.Rotate()
	app(41, 41)
	must(t, l.Maintain())
	app(42, 45)
	must(t, l.Close())
	return mem
}

// qCheck asserts that group g holds entries 1..hi intact and its hard state.
func qCheck(t *testing.T, l *Log, g, hi uint64) {
	t.Helper()
	if f, la := l.FirstIndex(g), l.LastIndex(g); f != 1 || la != hi {
		t.Fatalf("group %d: range %d..%d, want 1..%d", g, f, la, hi)
	}
	es, err := l.Entries(g, 1, hi+1)
	if err != nil {
		t.Fatalf("group %d: %v", g, err)
	}
	for _, e := range es {
		if !bytes.Equal(e.Data, qData(g, e.Index)) {
			t.Fatalf("group %d: entry %d differs", g, e.Index)
		}
	}
	if hs, ok := l.HardState(g); !ok || hs.Commit != hi {
		t.Fatalf("group %d: hard state %+v %v", g, hs, ok)
	}
}

// segFiles lists a group's segment files, oldest first.
func segFiles(mem *MemFS, g uint64) []string {
	names, _ := mem.List("/data")
	var out []string
	for _, n := range names {
		if _, grp, wal, ok := parseName(n); ok && !wal && grp == g {
			out = append(out, "/data/"+n)
		}
	}
	slices.Sort(out)
	return out
}

func walFiles(mem *MemFS) []string {
	names, _ := mem.List("/data")
	var out []string
	for _, n := range names {
		if _, _, wal, ok := parseName(n); ok && wal {
			out = append(out, "/data/"+n)
		}
	}
	slices.Sort(out)
	return out
}

func truncateFile(t *testing.T, mem *MemFS, name string, size int64) {
	t.Helper()
	h, err := mem.Open(name)
	must(t, err)
	must(t, h.Truncate(size))
}

// openDamaged opens mem with Quarantine and asserts that exactly the
// groups want are quarantined, each naming file (when given), and that
// every other group of qGroups holds 1..45; it also asserts that the
// open without Quarantine refuses.
func openDamaged(t *testing.T, mem *MemFS, file string, want ...uint64) *Log {
	t.Helper()
	if _, err := Open(mem.Crash(0), "/data", qOpts(false)); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("Open without Quarantine: %v, want ErrCorrupt", err)
	}
	l, err := Open(mem, "/data", qOpts(true))
	if err != nil {
		t.Fatalf("Open with Quarantine: %v", err)
	}
	var got []uint64
	for _, d := range l.Damaged() {
		got = append(got, d.Group)
		if file != "" && d.File != file[len("/data/"):] {
			t.Errorf("group %d: damage names %q, want %q (%s)", d.Group, d.File, file, d.Why)
		}
		if d.Why == "" {
			t.Errorf("group %d: no reason given", d.Group)
		}
	}
	if !slices.Equal(got, want) {
		t.Fatalf("quarantined %v, want %v (%+v)", got, want, l.Damaged())
	}
	for _, g := range qGroups {
		if slices.Contains(want, g) {
			if l.LastIndex(g) != 0 || slices.Contains(l.Groups(), g) {
				t.Fatalf("quarantined group %d is served: last %d", g, l.LastIndex(g))
			}
			if _, ok := l.Quarantined(g); !ok {
				t.Fatalf("Quarantined(%d) = false", g)
			}
			continue
		}
		qCheck(t, l, g, 45)
	}
	return l
}

// TestQuarantineSegmentDamage: a flipped bit or a truncation in one
// group's segment files (current, sealed with a footer, the footer
// itself) quarantines that group alone.
func TestQuarantineSegmentDamage(t *testing.T) {
	base := qLog(t)
	segs := segFiles(base, 6)
	if len(segs) < 3 {
		t.Fatalf("group 6 has segment files %v, want several", segs)
	}
	sealed, current := segs[0], segs[len(segs)-1]
	cases := []struct {
		name   string
		file   string
		damage func(mem *MemFS, name string)
	}{
		{"bit flipped in the current segment file", current, func(mem *MemFS, name string) {
			mem.Corrupt(name, fileHeader+recordHeader+5, 2)
		}},
		{"current segment file truncated", current, func(mem *MemFS, name string) {
			truncateFile(t, mem, name, mem.FileSize(name)/2)
		}},
		{"sealed segment file truncated", sealed, func(mem *MemFS, name string) {
			truncateFile(t, mem, name, mem.FileSize(name)-24)
		}},
		{"bit flipped in a sealed file's footer", sealed, func(mem *MemFS, name string) {
			mem.Corrupt(name, mem.FileSize(name)-40, 1)
		}},
		{"sealed file cut to its header", sealed, func(mem *MemFS, name string) {
			truncateFile(t, mem, name, 10)
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			mem := base.Crash(0)
			c.damage(mem, c.file)
			l := openDamaged(t, mem, c.file, 6)
			d, _ := l.Quarantined(6)
			t.Logf("%+v", d)
			if err := l.Append(Batch{Group: 6, Entries: []Entry{{Index: 46, Term: 1}}}); !errors.Is(err, ErrQuarantined) {
				t.Fatalf("append to a quarantined group: %v", err)
			}
			if err := l.Append(Batch{Group: 6, HardState: &HardState{Term: 9}}); !errors.Is(err, ErrQuarantined) {
				t.Fatalf("hard state of a quarantined group: %v", err)
			}
			if err := l.Truncate(6, 3); !errors.Is(err, ErrQuarantined) {
				t.Fatalf("truncate of a quarantined group: %v", err)
			}
			// The other groups write on.
			must(t, l.Append(Batch{Group: 5, Entries: []Entry{{Index: 46, Term: 1, Data: qData(5, 46)}}}))
			must(t, l.Maintain())
			// Its files stay as they are until it is removed.
			if got := segFiles(mem, 6); !slices.Equal(got, segs) {
				t.Fatalf("group 6's files changed while quarantined: %v, had %v", got, segs)
			}
			must(t, l.Close())
		})
	}
}

// TestQuarantineFooterEntryIsLazy: a bit flipped in an entry of a sealed
// file with an intact footer is not read at Open (the footer's point): the
// group opens, and the first read of that entry reports the file.
func TestQuarantineFooterEntryIsLazy(t *testing.T) {
	mem := qLog(t)
	seg := segFiles(mem, 6)[0]
	mem.Corrupt(seg, fileHeader+recordHeader+12+entryHeader+7, 3)
	l, err := Open(mem, "/data", qOpts(true))
	must(t, err)
	defer l.Close()
	if d := l.Damaged(); len(d) != 0 {
		t.Fatalf("quarantined %+v", d)
	}
	if _, err := l.Entries(6, 1, 2); !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), seg[len("/data/"):]) {
		t.Fatalf("reading the damaged entry: %v", err)
	}
}

// TestQuarantineHole: a group's segment file lost leaves a hole in its
// raft log: that group is quarantined, naming the missing entries.
func TestQuarantineHole(t *testing.T) {
	mem := qLog(t)
	must(t, mem.Remove(segFiles(mem, 7)[1]))
	must(t, mem.SyncDir("/data"))
	l := openDamaged(t, mem, "", 7)
	defer l.Close()
	if d, _ := l.Quarantined(7); !strings.Contains(d.Why, "missing") {
		t.Fatalf("reason %q", d.Why)
	}
}

// TestQuarantineRemoveAndReuse: a quarantined group stays quarantined
// across restarts (also once the WAL files that held it are gone) until
// RemoveGroup; then its files are deleted and the id starts empty.
func TestQuarantineRemoveAndReuse(t *testing.T) {
	mem := qLog(t)
	segs := segFiles(mem, 6)
	flip := mem.FileSize(segs[1]) - 40 // in its footer: found at Open
	mem.Corrupt(segs[1], flip, 0)
	l := openDamaged(t, mem, segs[1], 6)
	// Every WAL file of before goes (the quarantine is in the new one's
	// checkpoint).
	before := walFiles(mem)
	for i := range uint64(3) {
		l.Rotate()
		must(t, l.Append(Batch{Group: 2, Entries: []Entry{{Index: 46 + i, Term: 1}}}))
		must(t, l.Maintain())
	}
	for _, w := range walFiles(mem) {
		if slices.Contains(before, w) {
			t.Fatalf("%s still there", w)
		}
	}
	must(t, l.Close())
	// The bit flipped back: still quarantined, the mark in the checkpoint
	// outlives the evidence (and every record of the group in a WAL file).
	mem.Corrupt(segs[1], flip, 0)
	l2, err := Open(mem, "/data", qOpts(true))
	must(t, err)
	if d := l2.Damaged(); len(d) != 1 || d[0].Group != 6 {
		t.Fatalf("after a restart: quarantined %+v", d)
	}
	must(t, l2.Close())
	if _, err := Open(mem.Crash(0), "/data", qOpts(false)); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("a quarantined group opened without Quarantine: %v", err)
	}

	l3, err := Open(mem, "/data", qOpts(true))
	must(t, err)
	must(t, l3.RemoveGroup(6))
	if d := l3.Damaged(); len(d) != 0 {
		t.Fatalf("removed, still quarantined: %+v", d)
	}
	must(t, l3.Append(Batch{Group: 6, Entries: []Entry{{Index: 1, Term: 3, Data: []byte("fresh")}}, HardState: &HardState{Term: 3, Commit: 1}}))
	// A restart before the worker ran: the remove record wins.
	must(t, l3.Close())
	for _, fs := range []*MemFS{mem.Crash(0), mem} {
		l4, err := Open(fs, "/data", qOpts(true))
		must(t, err)
		if d := l4.Damaged(); len(d) != 0 || l4.LastIndex(6) != 1 {
			t.Fatalf("after remove and reuse: quarantined %+v, last %d", d, l4.LastIndex(6))
		}
		must(t, l4.Maintain())
		for _, s := range segs {
			if slices.Contains(segFiles(fs, 6), s) {
				t.Fatalf("%s of the removed group still there", s)
			}
		}
		es, err := l4.Entries(6, 1, 2)
		must(t, err)
		if string(es[0].Data) != "fresh" {
			t.Fatalf("reused group: %q", es[0].Data)
		}
		must(t, l4.Close())
	}
	l5, err := Open(mem, "/data", qOpts(false))
	must(t, err)
	must(t, l5.Close())
}

// TestQuarantineRemovedBeforeDamageFound: damage in the files of a group
// the WAL removes later does not quarantine anything.
func TestQuarantineRemovedBeforeDamageFound(t *testing.T) {
	mem := qLog(t)
	l, err := Open(mem, "/data", qOpts(false))
	must(t, err)
	must(t, l.RemoveGroup(6))
	must(t, l.Close()) // no Maintain: the files stay
	segs := segFiles(mem, 6)
	mem.Corrupt(segs[len(segs)-1], fileHeader+recordHeader+5, 2)
	l, err = Open(mem, "/data", qOpts(true))
	must(t, err)
	if d := l.Damaged(); len(d) != 0 {
		t.Fatalf("quarantined %+v", d)
	}
	must(t, l.Close())
}

// TestQuarantineWALDamage: damage in a sealed WAL file quarantines every
// group alive while it was written (conservative: which groups the
// damaged bytes held cannot be known) and no other; damage in the active
// WAL file cannot be bounded and refuses the open.
func TestQuarantineWALDamage(t *testing.T) {
	mem := NewMemFS()
	l, err := Open(mem, "/data", qOpts(false))
	must(t, err)
	for i := uint64(1); i <= 10; i++ {
		must(t, l.Append(Batch{Group: 5, Entries: []Entry{{Index: i, Term: 1, Data: qData(5, i)}}},
			Batch{Group: 6, Entries: []Entry{{Index: i, Term: 1, Data: qData(6, i)}}}))
	}
	l.Rotate()
	// Group 9 starts in the next file, after its checkpoint.
	for i := uint64(1); i <= 10; i++ {
		must(t, l.Append(Batch{Group: 9, Entries: []Entry{{Index: i, Term: 1, Data: qData(9, i)}}, HardState: &HardState{Term: 1, Commit: i}}))
	}
	must(t, l.Close())
	wals := walFiles(mem)
	if len(wals) != 2 {
		t.Fatalf("WAL files %v", wals)
	}

	sealed := mem.Crash(0)
	sealed.Corrupt(wals[0], sealed.FileSize(wals[0])/2, 4)
	if _, err := Open(sealed.Crash(0), "/data", qOpts(false)); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("without Quarantine: %v", err)
	}
	l, err = Open(sealed, "/data", qOpts(true))
	must(t, err)
	var got []uint64
	for _, d := range l.Damaged() {
		got = append(got, d.Group)
		if d.File != wals[0][len("/data/"):] {
			t.Fatalf("group %d names %s", d.Group, d.File)
		}
	}
	if !slices.Equal(got, []uint64{5, 6}) {
		t.Fatalf("quarantined %v, want [5 6]", got)
	}
	qCheck(t, l, 9, 10)
	must(t, l.Maintain()) // the damaged WAL file goes: the quarantine is in a checkpoint now
	if slices.Contains(walFiles(sealed), wals[0]) {
		t.Fatalf("the damaged WAL file was kept after its move")
	}
	must(t, l.Close())
	l, err = Open(sealed, "/data", qOpts(true))
	must(t, err)
	if d := l.Damaged(); len(d) != 2 {
		t.Fatalf("after a restart: %+v", d)
	}
	qCheck(t, l, 9, 10)
	must(t, l.Close())

	active := mem.Crash(0)
	active.Corrupt(wals[1], fileHeader+recordHeader+40, 4)
	_, err = Open(active, "/data", qOpts(true))
	if !errors.Is(err, ErrCorrupt) || !errors.Is(err, ErrUnattributable) || !strings.Contains(err.Error(), wals[1][len("/data/"):]) {
		t.Fatalf("damage in the active WAL file: %v, want ErrCorrupt and ErrUnattributable naming it", err)
	}
}
