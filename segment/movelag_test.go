package segment

import (
	"bytes"
	"testing"
)

// TestMoveLag: Maintain leaves the MoveLag newest sealed WAL files where
// they are; an entry compacted before its file's turn comes is never
// copied into a segment file, one still stored then is; entries in a
// sealed file not yet moved read back, before and after a restart.
func TestMoveLag(t *testing.T) {
	fs := NewMemFS()
	opts := Options{Manual: true, MoveLag: 1}
	l, err := Open(fs, "/data", opts)
	must(t, err)
	body := func(lo, hi uint64) []Entry {
		var out []Entry
		for i := lo; i <= hi; i++ {
			out = append(out, Entry{Index: i, Term: 1, Data: bytes.Repeat([]byte{byte(i)}, 100)})
		}
		return out
	}
	// Three WAL files: 1..10 (consumed below), 11..20, 21..30 (current).
	must(t, l.Append(Batch{Group: 7, Entries: body(1, 10)}))
	l.Rotate()
	must(t, l.Append(Batch{Group: 7, Entries: body(11, 20)}))
	must(t, l.Maintain())
	if st := l.Stats(); st.WALFiles != 2 || st.Moved != 0 || st.SegmentFiles != 0 {
		t.Fatalf("one sealed WAL file, within the lag, was touched: %+v", st)
	}
	// The owner compacts past 1..10 (all consumed) before their file's turn.
	must(t, l.Compact(7, 10, nil))
	l.Rotate()
	must(t, l.Append(Batch{Group: 7, Entries: body(21, 30)}))
	must(t, l.Maintain())
	st := l.Stats()
	if st.WALFiles != 2 || st.Moved != 0 || st.MovedBytes != 0 || st.SegmentFiles != 0 {
		t.Fatalf("the oldest sealed WAL file held only compacted entries: it should be deleted, nothing moved: %+v", st)
	}
	check := func(l *Log) {
		t.Helper()
		es, err := l.Entries(7, 11, 31)
		must(t, err)
		if want := body(11, 30); len(es) != len(want) {
			t.Fatalf("%d entries, want %d", len(es), len(want))
		} else {
			for i := range want {
				if es[i].Index != want[i].Index || !bytes.Equal(es[i].Data, want[i].Data) {
					t.Fatalf("entry %d: %d %x", want[i].Index, es[i].Index, es[i].Data[:4])
				}
			}
		}
	}
	check(l) // 11..20 from the sealed WAL file, 21..30 from the current one
	must(t, l.Close())
	l, err = Open(fs, "/data", opts)
	must(t, err)
	check(l)
	if f := l.FirstIndex(7); f != 11 {
		t.Fatalf("first index %d after a restart, want 11", f)
	}
	// One more sealed file: 11..20 are still stored when their turn
	// comes, so they are moved (and only they).
	l.Rotate()
	must(t, l.Append(Batch{Group: 7, Entries: body(31, 31)}))
	must(t, l.Maintain())
	if st := l.Stats(); st.Moved != 10 || st.MovedBytes == 0 || st.WALFiles != 2 || st.SegmentFiles != 1 {
		t.Fatalf("11..20 should have been moved into a segment file: %+v", st)
	}
	check(l)
	must(t, l.Close())
}

// TestMoveLagDefaults: the worker lags by defaultMoveLag files unless
// told otherwise; Manual owners get none unless they ask; a negative
// value turns it off.
func TestMoveLagDefaults(t *testing.T) {
	for _, c := range []struct {
		in   Options
		want int
	}{
		{Options{}, defaultMoveLag},
		{Options{MoveLag: -1}, 0},
		{Options{MoveLag: 5}, 5},
		{Options{Manual: true}, 0},
		{Options{Manual: true, MoveLag: 1}, 1},
	} {
		o := c.in
		must(t, o.defaults())
		if o.MoveLag != c.want {
			t.Errorf("%+v: MoveLag %d, want %d", c.in, o.MoveLag, c.want)
		}
	}
}
