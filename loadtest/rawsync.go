package loadtest

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
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

// RawSyncLatency is the disk's pwrite+fdatasync latency at a fixed rate
// (RawSyncPaced): what a confirm after an fdatasync cannot beat, per
// second and over the run, and the process's CPU time per sync (on a
// virtual machine a flush may hold the vCPU that issued it).
type RawSyncLatency struct {
	Block, Rate         int
	Syncs               int
	Elapsed             time.Duration
	P50, P99, P999, Max time.Duration
	CPUPerSync          time.Duration // user + system CPU of the process per pwrite+fdatasync
	Seconds             []SyncSecond
}

// SyncSecond is one second of a paced run.
type SyncSecond struct {
	Syncs         int
	P50, P99, Max time.Duration
}

func (r RawSyncLatency) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "raw pwrite+fdatasync, %d-byte blocks at %d syncs/s: %d syncs in %.2fs; p50 %.2f ms, p99 %.2f ms, p99.9 %.2f ms, max %.2f ms; CPU %.0f µs per sync\n",
		r.Block, r.Rate, r.Syncs, r.Elapsed.Seconds(), durMs(r.P50), durMs(r.P99), durMs(r.P999), durMs(r.Max), float64(r.CPUPerSync)/1e3)
	for i, s := range r.Seconds {
		fmt.Fprintf(&b, "  second %2d: %4d syncs, p50 %5.2f ms, p99 %6.2f ms, max %6.2f ms\n", i+1, s.Syncs, durMs(s.P50), durMs(s.P99), durMs(s.Max))
	}
	return strings.TrimSuffix(b.String(), "\n")
}

func durMs(d time.Duration) float64 { return float64(d) / 1e6 }

// RawSyncPaced is RawSync at rate syncs per second (each due at a fixed
// time from the start; one that is late goes at once), timing each
// pwrite+fdatasync: the disk's own latency distribution at the rate a
// durable queue syncs at, per second (a step over time shows here without
// the broker) and over the run.
func RawSyncPaced(dir string, block, rate int, d time.Duration) (RawSyncLatency, error) {
	if block <= 0 || rate <= 0 {
		return RawSyncLatency{}, fmt.Errorf("loadtest: rawsync: block %d, rate %d: want positive numbers", block, rate)
	}
	f, err := os.CreateTemp(dir, "rawsync-*")
	if err != nil {
		return RawSyncLatency{}, fmt.Errorf("loadtest: rawsync: %w", err)
	}
	defer os.Remove(filepath.Join(dir, filepath.Base(f.Name())))
	defer f.Close()
	buf := make([]byte, block)
	for i := range buf {
		buf[i] = byte(i * 7)
	}
	r := RawSyncLatency{Block: block, Rate: rate}
	var all, sec []time.Duration
	closeSecond := func() {
		if len(sec) == 0 {
			r.Seconds = append(r.Seconds, SyncSecond{})
			return
		}
		slices.Sort(sec)
		r.Seconds = append(r.Seconds, SyncSecond{Syncs: len(sec), P50: quantile(sec, 0.5), P99: quantile(sec, 0.99), Max: sec[len(sec)-1]})
		sec = sec[:0]
	}
	cpu0 := processCPU()
	var off int64
	start := time.Now()
	for i := 1; ; i++ {
		due := start.Add(time.Duration(float64(i-1) / float64(rate) * float64(time.Second)))
		if due.Sub(start) >= d {
			break
		}
		if w := time.Until(due); w > 0 {
			time.Sleep(w)
		}
		for time.Since(start) >= time.Duration(len(r.Seconds)+1)*time.Second {
			closeSecond()
		}
		t0 := time.Now()
		if _, err := f.WriteAt(buf, off); err != nil {
			return RawSyncLatency{}, fmt.Errorf("loadtest: rawsync: %w", err)
		}
		if err := unix.Fdatasync(int(f.Fd())); err != nil {
			return RawSyncLatency{}, fmt.Errorf("loadtest: rawsync: %w", err)
		}
		l := time.Since(t0)
		off += int64(block)
		all = append(all, l)
		sec = append(sec, l)
	}
	r.Elapsed = time.Since(start)
	if len(sec) > 0 {
		closeSecond()
	}
	r.Syncs = len(all)
	if r.Syncs > 0 {
		slices.Sort(all)
		r.P50, r.P99, r.P999, r.Max = quantile(all, 0.5), quantile(all, 0.99), quantile(all, 0.999), all[len(all)-1]
		r.CPUPerSync = (processCPU() - cpu0) / time.Duration(r.Syncs)
	}
	return r, nil
}

// quantile of sorted durations.
func quantile(s []time.Duration, q float64) time.Duration {
	return s[min(len(s)-1, int(float64(len(s))*q))]
}

// processCPU is the process's user and system CPU time so far.
func processCPU() time.Duration {
	var ru unix.Rusage
	if unix.Getrusage(unix.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
