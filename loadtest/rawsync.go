package loadtest

import (
	"fmt"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"
)

// RawSyncResult is the disk's raw rate for one block size: pwrite of a
// block at the end of a file, then fdatasync, one at a time.
type RawSyncResult struct {
	Block    int
	Syncs    int
	Elapsed  time.Duration
	MBPerSec float64 // 10^6 bytes per second
}

func (r RawSyncResult) String() string {
	return fmt.Sprintf("raw pwrite+fdatasync, %d-byte blocks: %d syncs in %.2fs, %.0f syncs/s, %.1f MB/s",
		r.Block, r.Syncs, r.Elapsed.Seconds(), float64(r.Syncs)/r.Elapsed.Seconds(), r.MBPerSec)
}

// RawSync measures the disk under dir the way the log writes it, without
// the log: pwrite of block bytes at the end of a fresh file, then
// fdatasync, repeated for d (the ceiling a group commit of block bytes per
// sync is compared with; segment's BenchmarkRawWriteSync does the same for
// fixed sizes). The file is removed afterwards.
func RawSync(dir string, block int, d time.Duration) (RawSyncResult, error) {
	if block <= 0 {
		return RawSyncResult{}, fmt.Errorf("loadtest: rawsync: block %d: want a positive size in bytes", block)
	}
	f, err := os.CreateTemp(dir, "rawsync-*")
	if err != nil {
		return RawSyncResult{}, fmt.Errorf("loadtest: rawsync: %w", err)
	}
	defer os.Remove(filepath.Join(dir, filepath.Base(f.Name())))
	defer f.Close()
	buf := make([]byte, block)
	for i := range buf {
		buf[i] = byte(i * 7)
	}
	var off int64
	n := 0
	start := time.Now()
	for time.Since(start) < d {
		if _, err := f.WriteAt(buf, off); err != nil {
			return RawSyncResult{}, fmt.Errorf("loadtest: rawsync: %w", err)
		}
		if err := unix.Fdatasync(int(f.Fd())); err != nil {
			return RawSyncResult{}, fmt.Errorf("loadtest: rawsync: %w", err)
		}
		off += int64(block)
		n++
	}
	el := time.Since(start)
	return RawSyncResult{Block: block, Syncs: n, Elapsed: el, MBPerSec: float64(off) / el.Seconds() / 1e6}, nil
}
