// Command warren-abuse runs the hostile-client suite (package
// loadtest/abuse) against fresh warrend child processes: each probe beside
// a well-behaved 2,000 msg/s publisher/consumer pair, asserting that the
// broker stays up, its RSS stays within the probe's bound, the pair loses
// nothing and, for the probes that stay under the memory watermark, the
// pair's confirm p99 stays under 50 ms. `make abuse` runs it at full size.
//
//	warren-abuse [--bin bin/warrend] [--small] [--probe NAME,...] [--duration 15s] [--json FILE] [--md FILE]
//
// Exit codes: 0 every probe held, 1 a probe failed, 2 usage error.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/warren-mq/warren/loadtest/abuse"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("warren-abuse", flag.ContinueOnError)
	fs.SetOutput(stderr)
	bin := fs.String("bin", "bin/warrend", "the warrend binary to start for each probe")
	small := fs.Bool("small", false, "the scaled-down sizes of the `make test` run")
	probes := fs.String("probe", "", "comma-separated probe names (default: all): "+names())
	dur := fs.Duration("duration", 0, "how long each timed probe runs (default 15s; --small 3s)")
	jsonPath := fs.String("json", "", "write the results as JSON to this file")
	brokerCfg := fs.String("broker-config", "", `JSON object of warrend config keys for every broker, replacing the sizes' own (e.g. '{}' to run --small against a warrend without handshake_timeout_ms)`)
	mdPath := fs.String("md", "", "write the results as Markdown tables (RELIABILITY.md's form) to this file")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "warren-abuse: unexpected argument %q\n", fs.Arg(0))
		return 2
	}
	if _, err := os.Stat(*bin); err != nil {
		fmt.Fprintf(stderr, "warren-abuse: %v (build it with `make build`, or pass --bin)\n", err)
		return 2
	}
	s := abuse.Full()
	if *small {
		s = abuse.Small()
	}
	if *dur > 0 {
		s.Duration = *dur
	}
	if *brokerCfg != "" {
		s.BrokerConfig = nil
		if err := json.Unmarshal([]byte(*brokerCfg), &s.BrokerConfig); err != nil {
			fmt.Fprintf(stderr, "warren-abuse: --broker-config: %v\n", err)
			return 2
		}
	}
	// The idle-socket flood holds 10,005 sockets in this process.
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err == nil && lim.Cur < lim.Max {
		lim.Cur = lim.Max
		_ = syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim)
	}
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err == nil && lim.Cur < uint64(s.IdleSockets)+1000 {
		fmt.Fprintf(stderr, "warren-abuse: open-file limit %d is below the %d sockets of the idle-socket flood plus 1,000; raise it (ulimit -n)\n",
			lim.Cur, s.IdleSockets)
		return 2
	}
	var only []string
	if *probes != "" {
		only = strings.Split(*probes, ",")
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	start := time.Now()
	rs, err := abuse.Run(ctx, abuse.Options{Bin: *bin, Sizes: s, Only: only, Log: stdout})
	if len(rs) > 0 {
		fmt.Fprintf(stdout, "\n%s\n%d probes in %.0f s\n", abuse.Summary(rs), len(rs), time.Since(start).Seconds())
	}
	if *jsonPath != "" {
		b, _ := json.MarshalIndent(rs, "", "  ")
		if werr := os.WriteFile(*jsonPath, append(b, '\n'), 0o644); werr != nil {
			fmt.Fprintf(stderr, "warren-abuse: %v\n", werr)
		}
	}
	if *mdPath != "" {
		if werr := os.WriteFile(*mdPath, []byte(abuse.Summary(rs)+"\n"+abuse.Markdown(rs)), 0o644); werr != nil {
			fmt.Fprintf(stderr, "warren-abuse: %v\n", werr)
		}
	}
	if err != nil {
		fmt.Fprintf(stderr, "warren-abuse: %v\n", err)
		return 2
	}
	for _, r := range rs {
		if !r.OK() {
			return 1
		}
	}
	return 0
}

func names() string {
	var n []string
	for _, p := range abuse.Probes() {
		n = append(n, p.Name)
	}
	return strings.Join(n, ", ")
}
