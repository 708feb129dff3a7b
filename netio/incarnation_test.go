package netio

import (
	"context"
	"fmt"
	"hash/crc32"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// A node restarted on the same data directory with its clock set back
// (an hour: NTP stepping it after a reboot) gets an incarnation above its
// first life's, not the clock's; a damaged incarnation file stops the
// start with an error naming it, never a start from the clock.
func TestIncarnationRisesWhenTheClockGoesBack(t *testing.T) {
	dir := t.TempDir()
	ctx := context.Background()
	cfg := Config{Addr: "127.0.0.1:0", DataDir: dir}
	s, err := Start(cfg)
	if err != nil {
		t.Fatal(err)
	}
	first := s.Broker.IncarnationMs()
	if err := s.Close(ctx); err != nil {
		t.Fatal(err)
	}

	back := time.Now().Add(-time.Hour).UnixMilli()
	cfg.clock = func() int64 { return back }
	s, err = Start(cfg)
	if err != nil {
		t.Fatal(err)
	}
	second := s.Broker.IncarnationMs()
	if err := s.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if second <= first {
		t.Fatalf("the second life's incarnation %d is not above the first's %d (clock at %d)", second, first, back)
	}

	// A clean stop leaves the bound at what the life ran, not a reserve
	// ahead: the restart is not pushed far past the first life.
	if second > first+10_000 {
		t.Fatalf("the second life's incarnation %d is %d ms past the first's", second, second-first)
	}

	path := filepath.Join(dir, "incarnation")
	for _, bad := range []string{"", "warren-incarnation 1 123", "warren-incarnation 1 1764690000000 0\n"} {
		if err := os.WriteFile(path, []byte(bad), 0o640); err != nil {
			t.Fatal(err)
		}
		s, err = Start(cfg)
		if err == nil {
			_ = s.Close(ctx)
			t.Fatalf("started over an incarnation file of %q", bad)
		}
		if !strings.Contains(err.Error(), path) {
			t.Fatalf("the error does not name the file: %v", err)
		}
	}

	// A start refused for it leaves the data directory as it was: the
	// log is not opened (its torn tail, here 40 zero bytes after the
	// active WAL file's last record, is not cut; no mark is written).
	wals, _ := filepath.Glob(filepath.Join(dir, "log", "wal-*"))
	if len(wals) == 0 {
		t.Fatal("no WAL file")
	}
	wal := wals[len(wals)-1]
	f, err := os.OpenFile(wal, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	_, err = f.Write(make([]byte, 40))
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		t.Fatal(err)
	}
	before := dirState(t, dir)
	if s, err = Start(cfg); err == nil {
		_ = s.Close(ctx)
		t.Fatal("started over a bad incarnation file")
	}
	if after := dirState(t, dir); after != before {
		t.Fatalf("a start refused for its incarnation file changed the data directory:\n%s\nbecame\n%s", before, after)
	}
}

// dirState lists every file under dir with its size and content's hash.
func dirState(t *testing.T, dir string) string {
	t.Helper()
	var b strings.Builder
	err := filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		raw, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		fmt.Fprintf(&b, "%s %d %08x\n", p, len(raw), crc32.ChecksumIEEE(raw))
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return b.String()
}
