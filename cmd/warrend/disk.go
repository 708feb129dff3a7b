package main

import (
	"fmt"
	"io"
)

// writeDiskMetrics writes the free and total bytes of the filesystem that
// holds the data directory, read at scrape time (alerts: WarrenDiskLow in
// ops/prometheus/alerts.yml). Free is what an unprivileged process may
// still write. Nothing is written when the filesystem cannot be read.
func writeDiskMetrics(w io.Writer, dir string) {
	free, total, ok := diskSpace(dir)
	if !ok {
		return
	}
	fmt.Fprintf(w, "warren_disk_free_bytes %d\nwarren_disk_total_bytes %d\n", free, total)
}
