package loadtest

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/url"
	"strings"
	"time"
)

// CompareTarget is one broker configuration in a comparison.
type CompareTarget struct {
	Label     string // e.g. "Warren", "RabbitMQ classic"
	Driver    string
	URL       string
	QueueType string // amqp: classic or quorum
	PID       int    // the broker's process id, for its CPU per message (0: not measured)
}

// Compare runs each scenario against each target in turn (same machine, same
// settings) and writes a side-by-side markdown table to out; progress goes
// to log. Targets that are not reachable are skipped with a note. It
// returns every cell, run or not, in order (WriteCompareHTML draws them).
func Compare(ctx context.Context, scenarios []string, targets []CompareTarget, duration time.Duration, log, out io.Writer) ([]CompareResult, error) {
	var live []CompareTarget
	var results []CompareResult
	skipped := map[string]bool{}
	for _, t := range targets {
		if reachable(t.URL) {
			live = append(live, t)
		} else {
			skipped[t.Label] = true
			fmt.Fprintf(out, "> %s (%s) is not reachable; skipped.\n\n", t.Label, t.URL)
		}
	}
	fmt.Fprintln(out, "| scenario | broker | publish msg/s | consume msg/s | confirm p50 / p99 ms | publish→deliver p50 / p99 ms | broker / load generator CPU µs per msg | lost | conditions |")
	fmt.Fprintln(out, "|---|---|---|---|---|---|---|---|---|")
	for _, name := range scenarios {
		note := func(t CompareTarget, why string) {
			fmt.Fprintf(out, "| %s | %s | %s |  |  |  |  |  |  |\n", name, t.Label, why)
			results = append(results, CompareResult{Scenario: name, Label: t.Label, Note: why})
		}
		for _, t := range live {
			cfg, err := LoadScenario(name)
			if err != nil {
				return results, err
			}
			if t.QueueType == "quorum" && cfg.Queues > 100 {
				note(t, fmt.Sprintf("not run: declaring %d quorum queues (one Raft group each) had not finished after minutes on this machine", cfg.Queues))
				continue
			}
			if t.QueueType == "quorum" && cfg.Priorities != "" {
				note(t, "not supported: RabbitMQ quorum queues have no x-max-priority")
				continue
			}
			cfg.Driver, cfg.URL, cfg.QueueType, cfg.BrokerPID = t.Driver, t.URL, t.QueueType, t.PID
			if duration > 0 {
				cfg.Duration, cfg.DurationS = duration, 0
			}
			fmt.Fprintf(log, "\n### %s on %s\n", name, t.Label)
			rep, err := Run(ctx, cfg, log)
			if rep == nil {
				note(t, fmt.Sprintf("failed: %v", err))
				continue
			}
			results = append(results, CompareResult{Scenario: name, Label: t.Label, Report: rep})
			fmt.Fprintf(out, "| %s | %s | %.0f | %.0f | %.2f / %.2f | %.2f / %.2f | %s / %s | %d | %s |\n", name, t.Label,
				rep.PublishRate, rep.ConsumeRate, rep.ConfirmLat.P50, rep.ConfirmLat.P99, rep.E2ELat.P50, rep.E2ELat.P99,
				cpuString(rep.BrokerCPU), cpuString(rep.ClientCPU), rep.Lost, rep.Conditions)
		}
		for _, t := range targets {
			if skipped[t.Label] {
				results = append(results, CompareResult{Scenario: name, Label: t.Label, Note: "not reachable; skipped"})
			}
		}
	}
	return results, nil
}

func reachable(raw string) bool {
	u, err := url.Parse(raw)
	if err != nil {
		return false
	}
	host := u.Host
	if !strings.Contains(host, ":") {
		host += map[string]string{"amqp": ":5672", "warren": ":5680"}[u.Scheme]
	}
	c, err := net.DialTimeout("tcp", host, 2*time.Second)
	if err != nil {
		return false
	}
	c.Close()
	return true
}

// WriteRatios writes, per scenario, how each pair of targets (a, b) of
// the same comparison run compare: a's consume rate over b's (above 1: a
// moves more) and a's publish→deliver p99 over b's (below 1: a is
// faster). A pair of which either was not run is left out.
func WriteRatios(out io.Writer, results []CompareResult, pairs [][2]string) {
	type key struct{ scenario, label string }
	reps := map[key]*Report{}
	var scenarios []string
	for _, r := range results {
		if r.Report != nil {
			reps[key{r.Scenario, r.Label}] = r.Report
		}
		if len(scenarios) == 0 || scenarios[len(scenarios)-1] != r.Scenario {
			scenarios = append(scenarios, r.Scenario)
		}
	}
	wrote := false
	for _, s := range scenarios {
		for _, p := range pairs {
			a, b := reps[key{s, p[0]}], reps[key{s, p[1]}]
			if a == nil || b == nil {
				continue
			}
			if !wrote {
				fmt.Fprintln(out, "\n| scenario | a ÷ b | consume msg/s | publish→deliver p99 |")
				fmt.Fprintln(out, "|---|---|---|---|")
				wrote = true
			}
			fmt.Fprintf(out, "| %s | %s ÷ %s | %s | %s |\n", s, p[0], p[1], ratio(a.ConsumeRate, b.ConsumeRate), ratio(a.E2ELat.P99, b.E2ELat.P99))
		}
	}
}

func ratio(a, b float64) string {
	if b <= 0 || a <= 0 {
		return "–"
	}
	return fmt.Sprintf("%.2f×", a/b)
}
