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
