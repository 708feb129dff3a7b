// Command warren-jepsen is Warren's fault harness (loadtest/jepsen): it
// starts warrend processes on loopback, runs producers with confirms and
// consumers with acks against them while it applies one class of fault
// after another (kill -9, SIGSTOP/SIGCONT, power loss, a flipped bit or a
// truncated log file, partitions between cluster nodes), then heals,
// drains and checks that nothing confirmed was lost and nothing was
// invented. It prints a table per class and ends with
// `lost=N duplicated=N invented=N`; the exit status is 1 when lost or
// invented is not 0 (or a class failed), 2 for bad usage.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/warren-mq/warren/loadtest/jepsen"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	os.Exit(run(ctx, os.Args[1:], os.Stdout, os.Stderr))
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("warren-jepsen", flag.ContinueOnError)
	fs.SetOutput(stderr)
	bin := fs.String("warrend", "bin/warrend", "the warrend binary (make build writes bin/warrend)")
	nodes := fs.Int("nodes", 1, "warrend processes: 1, or 3 or 5 as a cluster (--peers; the cluster's links go through fault proxies)")
	classes := fs.String("classes", "", "comma-separated fault classes (default: every one the node count allows): "+strings.Join(jepsen.Classes, ","))
	dur := fs.Duration("time", 10*time.Second, "each class's fault phase")
	producers := fs.Int("producers", 2, "producers (persistent messages, confirms)")
	consumers := fs.Int("consumers", 2, "consumers (acks, random requeue, cancel, reconnect)")
	queues := fs.Int("queues", 2, "durable queues")
	rate := fs.Int("rate", 500, "messages per second per producer")
	size := fs.Int("size", 256, "message bytes")
	fileSize := fs.Int64("file-size", 1<<20, "the nodes' WAL and segment file size in bytes (test-only WARREN_TEST_WAL_SIZE/_SEGMENT_SIZE), small so that a short run writes segment files for the damage classes; -1: warrend's default (64 MiB)")
	seed := fs.Uint64("seed", 0, "random seed (0: from the clock)")
	dir := fs.String("dir", "", "working directory for data and node logs (default: a temporary one, removed after)")
	if err := fs.Parse(args); err != nil {
		if err == flag.ErrHelp {
			return 0
		}
		return 2
	}
	if _, err := os.Stat(*bin); err != nil {
		fmt.Fprintf(stderr, "warren-jepsen: %v (run make build, or pass --warrend)\n", err)
		return 2
	}
	var cls []string
	if *classes != "" {
		cls = strings.Split(*classes, ",")
	}
	_, err := jepsen.Run(ctx, jepsen.Config{Warrend: *bin, Dir: *dir, Nodes: *nodes, Classes: cls, Time: *dur,
		Producers: *producers, Consumers: *consumers, Queues: *queues, Rate: *rate, Size: *size, FileSize: *fileSize, Seed: *seed, Out: stdout})
	if err != nil {
		fmt.Fprintln(stderr, "warren-jepsen:", err)
		return 1
	}
	return 0
}
