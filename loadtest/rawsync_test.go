package loadtest

import (
	"os"
	"testing"
	"time"
)

// TestRawSync: the raw disk measurement writes and syncs whole blocks,
// reports a rate, leaves no file behind, and refuses a block size that
// is not positive.
func TestRawSync(t *testing.T) {
	dir := t.TempDir()
	r, err := RawSync(dir, 64<<10, 50*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	if r.Syncs < 1 || r.MBPerSec <= 0 || r.Block != 64<<10 {
		t.Fatalf("RawSync = %+v: want at least one sync of 64 KiB and a rate", r)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 0 {
		t.Fatalf("RawSync left %d files in its directory", len(ents))
	}
	if _, err := RawSync(dir, 0, time.Millisecond); err == nil {
		t.Fatal("RawSync accepted a block of 0 bytes")
	}
}

// TestRawSyncPaced: the paced measurement never goes faster than its
// rate, reports ordered percentiles and one line per second begun,
// leaves no file behind, and refuses a rate that is not positive.
func TestRawSyncPaced(t *testing.T) {
	dir := t.TempDir()
	r, err := RawSyncPaced(dir, 4<<10, 100, 100*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	if r.Syncs < 1 || r.Syncs > 10 {
		t.Fatalf("RawSyncPaced at 100/s for 100 ms made %d syncs: want 1 to 10", r.Syncs)
	}
	if !(r.P50 > 0 && r.P50 <= r.P99 && r.P99 <= r.P999 && r.P999 <= r.Max) {
		t.Fatalf("percentiles out of order: %+v", r)
	}
	n := 0
	for _, s := range r.Seconds {
		n += s.Syncs
	}
	if len(r.Seconds) != 1 || n != r.Syncs {
		t.Fatalf("%d seconds holding %d syncs, want 1 holding %d", len(r.Seconds), n, r.Syncs)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 0 {
		t.Fatalf("RawSyncPaced left %d files in its directory", len(ents))
	}
	if _, err := RawSyncPaced(dir, 4<<10, 0, time.Millisecond); err == nil {
		t.Fatal("RawSyncPaced accepted a rate of 0")
	}
}
