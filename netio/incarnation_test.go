package netio

import (
	"context"
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
}
