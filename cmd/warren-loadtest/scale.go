package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"time"

	"github.com/warren-mq/warren/loadtest"
)

// idle holds idle connections for scale-idle, in a process of its own: it
// prints "open N" once they are all open, holds them until its stdin
// closes (or a signal), then prints "lost K" (those that had closed
// meanwhile) and closes them.
func idle(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("warren-loadtest idle", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var o loadtest.IdleOptions
	fs.StringVar(&o.URL, "url", "warren://guest:guest@127.0.0.1:5680", "broker URL")
	fs.IntVar(&o.Conns, "conns", 1000, "idle connections to hold")
	fs.IntVar(&o.Channels, "channels", 1, "channels to open on each")
	fs.DurationVar(&o.Heartbeat, "heartbeat", 10*time.Second, "heartbeat interval proposed to the broker")
	fs.IntVar(&o.Parallel, "parallel", 64, "handshakes in flight (keep under the broker's max_unauthenticated_connections)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	set, err := loadtest.OpenIdle(ctx, o)
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 1
	}
	defer set.Close()
	fmt.Fprintf(stdout, "open %d\n", set.Len())
	eof := make(chan struct{})
	go func() { _, _ = io.Copy(io.Discard, stdin); close(eof) }()
	select {
	case <-eof:
	case <-ctx.Done():
	}
	lost, first := set.Lost()
	fmt.Fprintf(stdout, "lost %d\n", lost)
	if first != nil {
		fmt.Fprintf(stderr, "the first idle connection to close: %v\n", first)
	}
	return 0
}

// scaleIdle is `warren-loadtest scale-idle` (loadtest.ScaleIdle): the idle
// connections are held by child processes running `warren-loadtest idle`.
func scaleIdle(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("warren-loadtest scale-idle", flag.ContinueOnError)
	fs.SetOutput(stderr)
	url := fs.String("url", "warren://guest:guest@127.0.0.1:5680", "broker URL")
	n := fs.Int("idle", 10000, "idle connections in all (the broker's max_connections must allow them and the pair)")
	procs := fs.Int("procs", 2, "processes holding them")
	channels := fs.Int("channels", 1, "channels open on each idle connection")
	hb := fs.Duration("heartbeat", 10*time.Second, "heartbeat interval the idle connections propose")
	settle := fs.Duration("settle", 30*time.Second, "how long the idle connections sit before the broker's RSS and idle CPU are read")
	dur := fs.Duration("duration", 10*time.Second, "each pair run's measured time")
	warmup := fs.Duration("warmup", 2*time.Second, "each pair run's warmup")
	rate := fs.Int("rate", 0, "the pair's fixed publish rate in msg/s (default 0: as fast as possible)")
	rounds := fs.Int("rounds", 2, "rounds of the pair beside and then without the idle connections")
	pid := fs.Int("broker-pid", 0, "the broker's process id on this machine (required)")
	jsonPath := fs.String("json", "", "write the result as JSON to this file")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	exe, err := os.Executable()
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 1
	}
	cfg := loadtest.ScaleIdleConfig{
		Pair: loadtest.Config{Scenario: "scale-idle pair", URL: *url, Producers: 1, Consumers: 1, Queues: 1, Size: "128",
			Rate: *rate, Duration: *dur, Warmup: *warmup},
		Idle: *n, Procs: *procs, BrokerPID: *pid, Settle: *settle, Rounds: *rounds, Log: stderr,
		StartIdle: func(ctx context.Context, n int) (loadtest.IdleProc, error) {
			p, err := startIdleProc(ctx, exe, "--url", *url, "--conns", strconv.Itoa(n), "--channels", strconv.Itoa(*channels),
				"--heartbeat", hb.String())
			if err != nil {
				return nil, err
			}
			return p, nil
		},
	}
	rep, err := loadtest.ScaleIdle(ctx, cfg, stdout)
	if rep != nil && *jsonPath != "" {
		b, _ := json.MarshalIndent(rep, "", "  ")
		if werr := os.WriteFile(*jsonPath, append(b, '\n'), 0o644); werr != nil {
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

// idleProc is a child `warren-loadtest idle`.
type idleProc struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	lines *bufio.Scanner
}

func startIdleProc(ctx context.Context, exe string, args ...string) (*idleProc, error) {
	cmd := exec.CommandContext(ctx, exe, append([]string{"idle"}, args...)...)
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	p := &idleProc{cmd: cmd, stdin: stdin, lines: bufio.NewScanner(stdout)}
	if _, err := p.expect("open"); err != nil {
		stdin.Close()
		_ = cmd.Wait()
		return nil, err
	}
	return p, nil
}

// expect reads the child's next line, "WORD N", and returns N.
func (p *idleProc) expect(word string) (int, error) {
	if !p.lines.Scan() {
		return 0, fmt.Errorf("idle process %d ended before %q: %v", p.cmd.Process.Pid, word, p.lines.Err())
	}
	w, num, _ := strings.Cut(p.lines.Text(), " ")
	v, err := strconv.Atoi(num)
	if w != word || err != nil {
		return 0, fmt.Errorf("idle process %d said %q, want %q N", p.cmd.Process.Pid, p.lines.Text(), word)
	}
	return v, nil
}

func (p *idleProc) Pid() int { return p.cmd.Process.Pid }

func (p *idleProc) Stop() (int, error) {
	p.stdin.Close()
	lost, err := p.expect("lost")
	if werr := p.cmd.Wait(); werr != nil {
		err = errors.Join(err, werr)
	}
	return lost, err
}
