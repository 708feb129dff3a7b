package main

import (
	"fmt"
	"os"

	"github.com/warren-mq/warren/segment"
)

// WARREN_TEST_POWERLOSS=1 is a test-only storage mode (the fault harness,
// cmd/warren-jepsen): every write to the log stays in warrend's memory
// until its fdatasync (segment.PowerLossFS), so a kill -9 loses every
// unsynced write as a power cut would. Never for production: it is slower
// and holds unsynced writes in memory.
func init() {
	if os.Getenv("WARREN_TEST_POWERLOSS") == "1" {
		segment.UsePowerLoss()
		fmt.Fprintln(os.Stderr, "warrend: WARREN_TEST_POWERLOSS=1: test-only power-loss storage mode (unsynced writes are held in memory and lost at a kill)")
	}
}
