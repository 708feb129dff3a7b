package segment

import (
	"errors"
	"maps"
	"strings"
	"testing"
)

// memFiles is every file of m's /data and its bytes.
func memFiles(t *testing.T, m *MemFS) map[string]string {
	t.Helper()
	names, err := m.List("/data")
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, n := range names {
		f, err := m.Open("/data/" + n)
		if err != nil {
			t.Fatal(err)
		}
		size, _ := f.Size()
		buf := make([]byte, size)
		_, _ = f.ReadAt(buf, 0)
		_ = f.Close()
		out[n] = string(buf)
	}
	return out
}

// TestCheckDamageRefusalWritesNothing: an Open that CheckDamage refuses
// returns its error and leaves the directory as it found it: a torn tail
// of the active WAL file is not cut until an Open that goes on.
func TestCheckDamageRefusalWritesNothing(t *testing.T) {
	m := NewMemFS()
	l := mustOpen(t, m)
	must(t, l.Append(Batch{Group: 7, Entries: ents(1, 20, 1, "a")}))
	must(t, l.Close())
	var wal string
	for n := range memFiles(t, m) {
		if strings.HasPrefix(n, "wal-") {
			wal = "/data/" + n
		}
	}
	f, err := m.Open(wal)
	if err != nil {
		t.Fatal(err)
	}
	size, _ := f.Size()
	_, err = f.WriteAt(make([]byte, 64), size) // a torn tail
	must(t, err)
	must(t, f.Close())
	before := memFiles(t, m)

	errNo := errors.New("not today")
	var asked []DamagedGroup
	_, err = Open(m, "/data", Options{Quarantine: true, CheckDamage: func(d []DamagedGroup) error {
		asked = append([]DamagedGroup{}, d...)
		return errNo
	}})
	if !errors.Is(err, errNo) || len(asked) != 0 {
		t.Fatalf("Open refused by CheckDamage: %v (asked with %v), want its error (asked with no damage)", err, asked)
	}
	if after := memFiles(t, m); !maps.Equal(before, after) {
		t.Fatal("an Open that CheckDamage refused changed the directory")
	}

	l, err = Open(m, "/data", Options{Quarantine: true, CheckDamage: func([]DamagedGroup) error { return nil }})
	if err != nil {
		t.Fatal(err)
	}
	got, err := l.Entries(7, 1, 21)
	if err != nil || len(got) != 20 {
		t.Fatalf("after the accepted Open: %d entries, %v", len(got), err)
	}
	must(t, l.Close())
	after := memFiles(t, m)
	if w := wal[len("/data/"):]; len(after[w]) != len(before[w])-64 {
		t.Fatalf("the active WAL file has %d bytes after an Open that went on, want its torn tail cut (%d)", len(after[w]), len(before[w])-64)
	}
}
