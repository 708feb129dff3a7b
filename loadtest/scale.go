package loadtest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"time"
)

// ScaleIdleConfig is one run of `warren-loadtest scale-idle` (issue 17
// item 5): an active publisher/consumer pair measured without and beside
// Idle idle connections held by other processes (a process may open only so
// many files), and the broker's memory per idle connection.
type ScaleIdleConfig struct {
	Pair      Config // the active pair's run (its BrokerPID is set from BrokerPID)
	Idle      int    // idle connections in all
	Procs     int    // processes they are spread over
	BrokerPID int    // required: RSS and CPU are read from /proc/PID
	// Rounds of the pair with and then without the idle connections; 0: 2.
	Rounds int
	// Settle is how long the idle connections sit before the broker's RSS
	// and its CPU time with only them open are read: several heartbeat
	// intervals, so the figures include what heartbeats cost.
	Settle time.Duration
	// StartIdle starts one process holding n idle connections and returns
	// once they are all open.
	StartIdle func(ctx context.Context, n int) (IdleProc, error)
	Log       io.Writer // the pair runs' progress lines; nil: discarded
}

// IdleProc is a running holder of idle connections.
type IdleProc interface {
	// Stop closes its connections and ends it, returning how many of
	// them had closed before it was asked to (they should not have).
	Stop() (lost int, err error)
	// Pid is its process id, for its CPU time.
	Pid() int
}

// ScaleIdleReport is the result of ScaleIdle.
type ScaleIdleReport struct {
	Idle  int `json:"idle_connections"`
	Procs int `json:"processes"`
	// The broker's /proc/PID/status VmRSS and RssAnon, in bytes, before the
	// idle connections were first opened (before any pair run) and after
	// they had settled.
	RSSBefore     int64   `json:"rss_before_bytes"`
	RSSAfter      int64   `json:"rss_after_bytes"`
	AnonBefore    int64   `json:"rss_anon_before_bytes"`
	AnonAfter     int64   `json:"rss_anon_after_bytes"`
	RSSPerConn    float64 `json:"rss_per_connection_bytes"`
	OpenS         float64 `json:"open_s"`                   // wall time to open them all
	IdleCPUPct    float64 `json:"idle_broker_cpu_percent"`  // broker CPU over Settle, idle connections only, % of one core
	HolderCPUPct  float64 `json:"idle_holders_cpu_percent"` // the holding processes' CPU over Settle, % of one core
	IdleLost      int     `json:"idle_lost"`                // idle connections that closed while held
	Runs          []ScalePairRun
	LoadAvgBefore string `json:"loadavg_before"`
	LoadAvgAfter  string `json:"loadavg_after"`
}

// ScalePairRun is one run of the active pair.
type ScalePairRun struct {
	WithIdle    bool    `json:"with_idle"`
	ConsumeRate float64 `json:"consume_rate"`
	BrokerCPU   float64 `json:"broker_cpu_us_per_msg"`
	ClientCPU   float64 `json:"client_cpu_us_per_msg"`
	ConfirmP99  float64 `json:"confirm_p99_ms"`
	Lost        int64   `json:"lost"`
}

// ScaleIdle reads the broker's memory, opens the idle connections, lets them
// settle (reading the broker's memory and CPU again), runs the pair beside
// them, closes them and runs the pair without them; then opens them again
// for a second round of the two runs, so neither side always runs first.
// It prints a summary to out.
func ScaleIdle(ctx context.Context, cfg ScaleIdleConfig, out io.Writer) (*ScaleIdleReport, error) {
	if cfg.BrokerPID <= 0 {
		return nil, errors.New("loadtest: scale-idle needs the broker's pid (--broker-pid): RSS and CPU come from /proc")
	}
	if cfg.Idle <= 0 || cfg.Procs <= 0 || cfg.StartIdle == nil {
		return nil, errors.New("loadtest: scale-idle needs idle connections, processes and a way to start them")
	}
	rounds := cfg.Rounds
	if rounds <= 0 {
		rounds = 2
	}
	logw := cfg.Log
	if logw == nil {
		logw = io.Discard
	}
	cfg.Pair.BrokerPID = cfg.BrokerPID
	rep := &ScaleIdleReport{Idle: cfg.Idle, Procs: cfg.Procs, LoadAvgBefore: LoadAvg()}
	pair := func(withIdle bool) error {
		fmt.Fprintf(logw, "--- pair run, idle connections open: %v\n", withIdle)
		r, err := Run(ctx, cfg.Pair, logw)
		if err != nil {
			return fmt.Errorf("loadtest: the pair run (idle open: %v): %w", withIdle, err)
		}
		rep.Runs = append(rep.Runs, ScalePairRun{WithIdle: withIdle, ConsumeRate: r.ConsumeRate, BrokerCPU: r.BrokerCPU,
			ClientCPU: r.ClientCPU, ConfirmP99: r.ConfirmLat.P99, Lost: r.Lost})
		return nil
	}
	var err error
	if rep.RSSBefore, rep.AnonBefore, err = ProcRSS(cfg.BrokerPID); err != nil {
		return rep, err
	}
	var procs []IdleProc
	stopAll := func() error {
		var first error
		for _, p := range procs {
			lost, err := p.Stop()
			rep.IdleLost += lost
			if err != nil && first == nil {
				first = err
			}
		}
		procs = nil
		return first
	}
	defer stopAll()
	for round := 0; round < rounds; round++ {
		start := time.Now()
		for i := 0; i < cfg.Procs; i++ {
			n := cfg.Idle / cfg.Procs
			if i < cfg.Idle%cfg.Procs {
				n++
			}
			p, err := cfg.StartIdle(ctx, n)
			if err != nil {
				return rep, fmt.Errorf("loadtest: idle process %d: %w", i+1, err)
			}
			procs = append(procs, p)
		}
		if round == 0 {
			rep.OpenS = time.Since(start).Seconds()
			fmt.Fprintf(logw, "--- %d idle connections open in %.1fs; settling %v\n", cfg.Idle, rep.OpenS, cfg.Settle)
			cpu0 := cpuMeter{pid: cfg.BrokerPID}.sample()
			h0 := holdersCPU(procs)
			t0 := time.Now()
			select {
			case <-time.After(cfg.Settle):
			case <-ctx.Done():
				return rep, ctx.Err()
			}
			cpu1 := cpuMeter{pid: cfg.BrokerPID}.sample()
			el := float64(time.Since(t0))
			rep.IdleCPUPct = 100 * float64(cpu1.broker-cpu0.broker) / el
			rep.HolderCPUPct = 100 * float64(holdersCPU(procs)-h0) / el
			if rep.RSSAfter, rep.AnonAfter, err = ProcRSS(cfg.BrokerPID); err != nil {
				return rep, err
			}
			rep.RSSPerConn = float64(rep.RSSAfter-rep.RSSBefore) / float64(cfg.Idle)
		}
		if err := pair(true); err != nil {
			return rep, err
		}
		if err := stopAll(); err != nil {
			return rep, err
		}
		if err := pair(false); err != nil {
			return rep, err
		}
	}
	rep.LoadAvgAfter = LoadAvg()
	rep.print(out)
	if rep.IdleLost > 0 {
		return rep, fmt.Errorf("loadtest: %d idle connections closed while held", rep.IdleLost)
	}
	return rep, nil
}

// holdersCPU is the CPU time of the processes holding idle connections
// (this process's counts once, however many of them it is).
func holdersCPU(procs []IdleProc) time.Duration {
	var t time.Duration
	seen := map[int]bool{}
	for _, p := range procs {
		if seen[p.Pid()] {
			continue
		}
		seen[p.Pid()] = true
		if c := (cpuMeter{pid: p.Pid()}).sample(); c.brokerOK {
			t += c.broker
		}
	}
	return t
}

func (r *ScaleIdleReport) print(out io.Writer) {
	fmt.Fprintf(out, "idle connections: %d in %d processes, opened in %.1fs; %d closed while held\n", r.Idle, r.Procs, r.OpenS, r.IdleLost)
	fmt.Fprintf(out, "broker VmRSS %.1f → %.1f MiB (RssAnon %.1f → %.1f MiB): %.1f KiB per idle connection\n",
		mib(r.RSSBefore), mib(r.RSSAfter), mib(r.AnonBefore), mib(r.AnonAfter), r.RSSPerConn/1024)
	fmt.Fprintf(out, "CPU with only the idle connections open (heartbeats): the broker %.1f%% of one core, the processes holding them %.1f%%\n", r.IdleCPUPct, r.HolderCPUPct)
	fmt.Fprintf(out, "\n| run | idle connections | consumed msg/s | broker CPU µs/msg | client CPU µs/msg | confirm p99 ms | lost |\n|---|---|---|---|---|---|---|\n")
	for i, p := range r.Runs {
		n := 0
		if p.WithIdle {
			n = r.Idle
		}
		fmt.Fprintf(out, "| %d | %d | %.0f | %s | %s | %.2f | %d |\n", i+1, n, p.ConsumeRate, cpuString(p.BrokerCPU), cpuString(p.ClientCPU), p.ConfirmP99, p.Lost)
	}
	var with, without []float64
	for _, p := range r.Runs {
		if p.WithIdle {
			with = append(with, p.ConsumeRate)
		} else {
			without = append(without, p.ConsumeRate)
		}
	}
	if len(with) > 0 && len(without) > 0 {
		fmt.Fprintf(out, "\nconsumed msg/s with / without the idle connections (means): %.2f\n", mean(with)/mean(without))
	}
	fmt.Fprintf(out, "load average (1, 5, 15 min): %s at the start, %s at the end\n", r.LoadAvgBefore, r.LoadAvgAfter)
}

func mean(v []float64) float64 {
	s := 0.0
	for _, x := range v {
		s += x
	}
	return s / float64(len(v))
}

func mib(b int64) float64 { return float64(b) / (1 << 20) }

// ProcRSS reads a process's VmRSS and RssAnon, in bytes, from
// /proc/PID/status.
func ProcRSS(pid int) (rss, anon int64, err error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return 0, 0, fmt.Errorf("loadtest: the broker's memory: %w", err)
	}
	rss, anon, err = parseProcStatusRSS(b)
	if err != nil {
		return 0, 0, fmt.Errorf("%w (process %d: has it exited?)", err, pid)
	}
	return rss, anon, nil
}

// parseProcStatusRSS reads VmRSS and RssAnon ("VmRSS:   123456 kB") from
// the text of /proc/PID/status.
func parseProcStatusRSS(b []byte) (rss, anon int64, err error) {
	var haveRSS, haveAnon bool
	for _, line := range bytes.Split(b, []byte("\n")) {
		k, v, ok := bytes.Cut(line, []byte(":"))
		if !ok {
			continue
		}
		var dst *int64
		switch string(k) {
		case "VmRSS":
			dst, haveRSS = &rss, true
		case "RssAnon":
			dst, haveAnon = &anon, true
		default:
			continue
		}
		f := bytes.Fields(v)
		if len(f) != 2 || string(f[1]) != "kB" {
			return 0, 0, fmt.Errorf("loadtest: /proc status line %q: want \"N kB\"", line)
		}
		kb, perr := strconv.ParseInt(string(f[0]), 10, 64)
		if perr != nil {
			return 0, 0, fmt.Errorf("loadtest: /proc status line %q: %w", line, perr)
		}
		*dst = kb << 10
	}
	if !haveRSS || !haveAnon {
		return 0, 0, errors.New("loadtest: /proc status has no VmRSS or RssAnon line")
	}
	return rss, anon, nil
}

// LoadAvg is /proc/loadavg's first three fields ("?" where it cannot be
// read).
func LoadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := bytes.Fields(b)
	if len(f) < 3 {
		return "?"
	}
	return string(bytes.Join(f[:3], []byte(", ")))
}
