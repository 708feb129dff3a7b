// Command warren-loadtest drives a broker with producers and consumers and
// reports rates, latency percentiles, and any lost, duplicated or reordered
// messages. It exits non-zero on any loss, or when a scenario's required
// rate was not held.
//
//	warren-loadtest --driver warren --producers 4 --consumers 1 --queues 4 --size 128 --duration 30s
//	warren-loadtest --driver amqp --url amqp://guest:guest@127.0.0.1:5672/ --scenario persistent-1k
//	warren-loadtest --scenario million --json million.json
//	warren-loadtest --scenario throughput --html throughput.html
//	warren-loadtest compare --out compare.md --html compare.html
//	warren-loadtest rawsync --dir /var/lib/warren --block 262144 --duration 5s   # the disk's raw pwrite+fdatasync rate
//	warren-loadtest rawsync --dir /var/lib/warren --block 16384 --rate 600 --duration 30s   # its latency per second at a fixed rate
//	warren-loadtest --persistent --ledger run.ledger --duration 60s   # the broker may be killed meanwhile
//	warren-loadtest scale-idle --idle 10000 --broker-pid PID        # a pair beside 10,000 idle connections (make bench-scale)
//	warren-loadtest rawnet --rate 10000 --duration 20s             # a loopback TCP echo's round trip: the latency floor
//	warren-loadtest --verify run.ledger                              # after a restart: exit 3 if a confirmed message is missing
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/warren-mq/warren/client"
	"github.com/warren-mq/warren/loadtest"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	os.Exit(run(ctx, os.Args[1:], os.Stdout, os.Stderr))
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 && args[0] == "compare" {
		return compare(ctx, args[1:], stdout, stderr)
	}
	if len(args) > 0 && args[0] == "rawsync" {
		return rawsync(args[1:], stdout, stderr)
	}
	if len(args) > 0 && args[0] == "rawnet" {
		return rawnet(args[1:], stdout, stderr)
	}
	if len(args) > 0 && args[0] == "idle" {
		return idle(ctx, args[1:], os.Stdin, stdout, stderr)
	}
	if len(args) > 0 && args[0] == "scale-idle" {
		return scaleIdle(ctx, args[1:], stdout, stderr)
	}
	fs := flag.NewFlagSet("warren-loadtest", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var c loadtest.Config
	scenario := fs.String("scenario", "", "a built-in scenario ("+strings.Join(loadtest.ScenarioNames(), ", ")+") or a JSON file (FILE or FILE:NAME); flags override it")
	fs.StringVar(&c.Driver, "driver", "", "warren or amqp (default warren)")
	fs.StringVar(&c.URL, "url", "", "broker URL (default warren://guest:guest@127.0.0.1:5680, or amqp://guest:guest@127.0.0.1:5672/)")
	fs.IntVar(&c.Producers, "producers", 0, "producer connections (default 1)")
	fs.IntVar(&c.Consumers, "consumers", 0, "consumers per queue (default 1)")
	fs.IntVar(&c.Queues, "queues", 0, "queues (default 1)")
	fs.StringVar(&c.ExchangeType, "exchange-type", "", "direct, topic or fanout (default direct)")
	fs.StringVar(&c.Size, "size", "", "message size in bytes, or a range such as 64-4096 (default 128; at least 20)")
	fs.StringVar(&c.Priorities, "priorities", "", "priority range such as 0-9 (default: none)")
	fs.BoolVar(&c.Persistent, "persistent", false, "publish persistent messages to durable queues")
	fs.StringVar(&c.QueueType, "queue-type", "", "amqp only: classic or quorum")
	fs.IntVar(&c.ConfirmWindow, "confirm-window", 0, "unconfirmed messages per producer (default 10000)")
	fs.IntVar(&c.Prefetch, "prefetch", 0, "consumer prefetch (default 1000)")
	fs.IntVar(&c.AckBatch, "ack-batch", 0, "ack every N messages with multiple (default 100, at most half the prefetch)")
	fs.IntVar(&c.Rate, "rate", 0, "fixed total publish rate in msg/s, for latency runs (default 0: as fast as possible)")
	fs.DurationVar(&c.Duration, "duration", 0, "how long to publish after the warmup (default 10s)")
	fs.Int64Var(&c.Count, "count", 0, "publish this many messages in all instead of running for a duration")
	fs.DurationVar(&c.Warmup, "warmup", 0, "run this long before measuring")
	fs.StringVar(&c.JSONPath, "json", "", "write the report as JSON to this file")
	htmlPath := fs.String("html", "", "write the report as a self-contained HTML page (charts over time) to this file")
	fs.StringVar(&c.Ledger, "ledger", "", "keep the queues and add what was confirmed and consumed to this file, for --verify after broker restarts; a lost broker connection ends the publishing phase")
	fs.StringVar(&c.Verify, "verify", "", "consume the queues of this ledger file until empty and report every confirmed message that never came back (exit 3 on any)")
	fs.BoolVar(&c.PublishOnly, "publish-only", false, "start no consumers: the queues keep what is published (with --ledger, for a later --verify)")
	quiet := fs.Duration("quiet", 5*time.Second, "--verify: stop after this long without a delivery")
	fs.IntVar(&c.BrokerPID, "broker-pid", 0, "the broker's process id on this machine: report its CPU time per message (from /proc)")
	cpuProfile := fs.String("cpuprofile", "", "write a CPU profile of the load generator over the measured window (after the warmup, what its CPU per message counts) to this file, for go tool pprof")
	caFile := fs.String("ca", "", "warrens:// URLs: a PEM CA to verify the broker's certificate with (default: the system's roots)")
	certFile := fs.String("cert", "", "warrens:// URLs: a PEM client certificate (mutual TLS; with no user in the URL, EXTERNAL)")
	keyFile := fs.String("key", "", "the key of --cert")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if *caFile != "" || *certFile != "" || *keyFile != "" {
		tc, err := client.LoadTLS(*caFile, *certFile, *keyFile)
		if err != nil {
			fmt.Fprintln(stderr, err)
			return 2
		}
		c.TLS = tc
	}
	if c.Verify != "" {
		_, err := loadtest.Verify(ctx, c, *quiet, stdout)
		if err != nil {
			fmt.Fprintln(stderr, err)
			if errors.Is(err, loadtest.ErrLoss) {
				return 3
			}
			return 1
		}
		return 0
	}
	cfg := c
	if *scenario != "" {
		sc, err := loadtest.LoadScenario(*scenario)
		if err != nil {
			fmt.Fprintln(stderr, err)
			return 2
		}
		cfg = overlay(sc, c)
	}
	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		if err != nil {
			fmt.Fprintln(stderr, err)
			return 2
		}
		defer f.Close()
		cfg.CPUProfile = f
	}
	rep, err := loadtest.Run(ctx, cfg, stdout)
	if rep != nil && c.JSONPath != "" {
		if werr := rep.WriteJSON(c.JSONPath); werr != nil {
			fmt.Fprintln(stderr, werr)
			return 1
		}
	}
	if rep != nil && *htmlPath != "" {
		if werr := rep.WriteHTMLFile(*htmlPath); werr != nil {
			fmt.Fprintln(stderr, werr)
			return 1
		}
	}
	if err != nil {
		fmt.Fprintln(stderr, err)
		if errors.Is(err, loadtest.ErrLoss) || errors.Is(err, loadtest.ErrRateNotHeld) {
			return 3
		}
		return 1
	}
	return 0
}

// overlay applies the flags that were set over a scenario.
func overlay(s, f loadtest.Config) loadtest.Config {
	str := func(dst *string, v string) {
		if v != "" {
			*dst = v
		}
	}
	num := func(dst *int, v int) {
		if v != 0 {
			*dst = v
		}
	}
	str(&s.Driver, f.Driver)
	str(&s.URL, f.URL)
	num(&s.Producers, f.Producers)
	num(&s.Consumers, f.Consumers)
	num(&s.Queues, f.Queues)
	str(&s.ExchangeType, f.ExchangeType)
	str(&s.Size, f.Size)
	str(&s.Priorities, f.Priorities)
	str(&s.QueueType, f.QueueType)
	num(&s.ConfirmWindow, f.ConfirmWindow)
	num(&s.Prefetch, f.Prefetch)
	num(&s.AckBatch, f.AckBatch)
	num(&s.Rate, f.Rate)
	if f.Persistent {
		s.Persistent = true
	}
	if f.Duration != 0 {
		s.Duration, s.DurationS = f.Duration, 0
	}
	if f.Count != 0 {
		s.Count = f.Count
	}
	if f.Warmup != 0 {
		s.Warmup, s.WarmupS = f.Warmup, 0
	}
	str(&s.Ledger, f.Ledger)
	s.PublishOnly = s.PublishOnly || f.PublishOnly
	if f.BrokerPID != 0 {
		s.BrokerPID = f.BrokerPID
	}
	if f.TLS != nil {
		s.TLS = f.TLS
	}
	return s
}

// rawsync measures the disk's raw pwrite+fdatasync rate at a block size
// (`make bench-durable` compares the log's rate with it).
func rawsync(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("warren-loadtest rawsync", flag.ContinueOnError)
	fs.SetOutput(stderr)
	dir := fs.String("dir", ".", "a directory on the disk to measure (a temporary file is written there and removed)")
	block := fs.Int("block", 256<<10, "bytes written before each fdatasync")
	dur := fs.Duration("duration", 5*time.Second, "how long to measure")
	rate := fs.Int("rate", 0, "syncs per second, paced: report each pwrite+fdatasync's latency, per second and over the run, and the CPU per sync (0: as fast as possible, the rate)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if *rate > 0 {
		r, err := loadtest.RawSyncPaced(*dir, *block, *rate, *dur)
		if err != nil {
			fmt.Fprintln(stderr, err)
			return 1
		}
		fmt.Fprintln(stdout, r)
		return 0
	}
	r, err := loadtest.RawSync(*dir, *block, *dur)
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 1
	}
	fmt.Fprintln(stdout, r)
	return 0
}

// rawnet measures a loopback TCP echo's round trip at a fixed rate: the
// floor under the latency scenario's publish→confirm times on this machine.
func rawnet(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("warren-loadtest rawnet", flag.ContinueOnError)
	fs.SetOutput(stderr)
	rate := fs.Int("rate", 10000, "messages per second")
	size := fs.Int("size", 128, "message size in bytes (at least 8)")
	dur := fs.Duration("duration", 20*time.Second, "how long to send")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	r, err := loadtest.RawNet(*rate, *size, max(1, int(dur.Seconds()*float64(*rate))))
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 1
	}
	fmt.Fprintln(stdout, r)
	return 0
}

// compare runs the standard scenarios against Warren and RabbitMQ side by
// side (`make bench-compare`).
func compare(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("warren-loadtest compare", flag.ContinueOnError)
	fs.SetOutput(stderr)
	wurl := fs.String("warren-url", "warren://guest:guest@127.0.0.1:5680", "Warren broker")
	aurl := fs.String("amqp-url", "amqp://guest:guest@127.0.0.1:5672/", "RabbitMQ broker")
	wamqp := fs.String("warren-amqp-url", "", "Warren's AMQP 0-9-1 listener (--amqp-listen), driven by the same AMQP client as RabbitMQ; empty: not compared")
	scen := fs.String("scenarios", "throughput,persistent-1k,priority-mix,queues-1000,latency", "comma-separated scenarios")
	dur := fs.Duration("duration", 0, "override each scenario's duration")
	outPath := fs.String("out", "", "write the markdown table here (default stdout)")
	wpid := fs.Int("warren-pid", 0, "Warren's process id, for its CPU time per message")
	apid := fs.Int("amqp-pid", 0, "RabbitMQ's process id (beam.smp), for its CPU time per message")
	htmlPath := fs.String("html", "", "also write the brokers side by side as a self-contained HTML page (charts over time) to this file")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	out := stdout
	if *outPath != "" {
		f, err := os.Create(*outPath)
		if err != nil {
			fmt.Fprintln(stderr, err)
			return 1
		}
		defer f.Close()
		out = f
	}
	targets := []loadtest.CompareTarget{{Label: "Warren", Driver: "warren", URL: *wurl, PID: *wpid}}
	if *wamqp != "" {
		targets = append(targets, loadtest.CompareTarget{Label: "Warren AMQP", Driver: "amqp", URL: *wamqp, PID: *wpid})
	}
	targets = append(targets,
		loadtest.CompareTarget{Label: "RabbitMQ classic", Driver: "amqp", URL: *aurl, QueueType: "classic", PID: *apid},
		loadtest.CompareTarget{Label: "RabbitMQ quorum", Driver: "amqp", URL: *aurl, QueueType: "quorum", PID: *apid})
	// The machine may be shared: its load average goes with the numbers.
	fmt.Fprintf(out, "Load average (1, 5, 15 min) at the start: %s\n\n", loadAvg())
	results, err := loadtest.Compare(ctx, strings.Split(*scen, ","), targets, *dur, stderr, out)
	loadtest.WriteRatios(out, results, [][2]string{
		{"Warren AMQP", "RabbitMQ classic"}, {"Warren AMQP", "RabbitMQ quorum"},
		{"Warren", "RabbitMQ classic"}, {"Warren", "Warren AMQP"},
	})
	fmt.Fprintf(out, "\nLoad average (1, 5, 15 min) at the end: %s\n", loadAvg())
	if *htmlPath != "" && len(results) > 0 {
		if werr := loadtest.WriteCompareHTMLFile(*htmlPath, results); werr != nil {
			fmt.Fprintln(stderr, werr)
			return 1
		}
	}
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 1
	}
	return 0
}

// loadAvg is /proc/loadavg's first three fields ("?" where it cannot be
// read).
func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], ", ")
}
