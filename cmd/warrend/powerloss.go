package main

import (
	"fmt"
	"os"
	"strconv"

	"github.com/warren-mq/warren/segment"
)

// Test-only storage settings for the fault harness (cmd/warren-jepsen),
// read from the environment at start; never for production.
//
// WARREN_TEST_POWERLOSS=1: every write to the log stays in warrend's
// memory until its fdatasync (segment.PowerLossFS), so a kill -9 loses
// every unsynced write as a power cut would. Slower, and it holds unsynced
// writes in memory.
//
// WARREN_TEST_WAL_SIZE, WARREN_TEST_SEGMENT_SIZE (bytes): the log's WAL
// and segment file sizes (64 MiB each by default), so that a short run
// rotates WAL files and writes segment files.
func init() {
	if os.Getenv("WARREN_TEST_POWERLOSS") == "1" {
		segment.UsePowerLoss()
		fmt.Fprintln(os.Stderr, "warrend: WARREN_TEST_POWERLOSS=1: test-only power-loss storage mode (unsynced writes are held in memory and lost at a kill)")
	}
	wal, _ := strconv.ParseInt(os.Getenv("WARREN_TEST_WAL_SIZE"), 10, 64)
	seg, _ := strconv.ParseInt(os.Getenv("WARREN_TEST_SEGMENT_SIZE"), 10, 64)
	if wal > 0 || seg > 0 {
		segment.UseTestSizes(max(wal, 0), max(seg, 0))
		fmt.Fprintf(os.Stderr, "warrend: test-only log file sizes: WAL %d, segment %d bytes (0: the default)\n", wal, seg)
	}
}
