package loadtest

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"
)

// Latency is a percentile summary in milliseconds.
type Latency struct {
	P50  float64 `json:"p50"`
	P90  float64 `json:"p90"`
	P99  float64 `json:"p99"`
	P999 float64 `json:"p999"`
	Max  float64 `json:"max"`
}

func latency(h *hdrhistogram.Histogram) Latency {
	return Latency{P50: ms(h.ValueAtQuantile(50)), P90: ms(h.ValueAtQuantile(90)), P99: ms(h.ValueAtQuantile(99)),
		P999: ms(h.ValueAtQuantile(99.9)), Max: ms(h.Max())}
}

// Report is a run's result; its JSON is what --json writes.
type Report struct {
	Driver    string  `json:"driver"`
	Scenario  string  `json:"scenario"`
	DurationS float64 `json:"duration_s"`
	Published int64   `json:"published"`
	Confirmed int64   `json:"confirmed"`
	Nacked    int64   `json:"nacked"`
	// Unconfirmed were published but neither confirmed nor nacked by the
	// drain deadline: in flight, not lost.
	Unconfirmed int64 `json:"unconfirmed,omitempty"`
	Consumed    int64 `json:"consumed"`
	Lost        int64 `json:"lost"`
	// Left is what a publish-only run confirmed and left in the queues on
	// purpose, or what a ledger run could not consume because the broker
	// went away: not consumed, and not counted as lost (a ledger's
	// --verify checks it).
	Left        int64   `json:"left_in_queues,omitempty"`
	Duplicates  int64   `json:"duplicates"`
	Reordered   int64   `json:"reordered"`
	PublishRate float64 `json:"publish_rate"`
	ConsumeRate float64 `json:"consume_rate"`
	ConfirmLat  Latency `json:"confirm_latency_ms"`
	E2ELat      Latency `json:"e2e_latency_ms"`
	Conditions  string  `json:"conditions"`
	// CPU time per consumed message over the measured window, in µs: the
	// broker's (BrokerPID; 0 when not known) and the load generator's
	// whole process (producers, consumers and tracker).
	BrokerCPU float64 `json:"broker_cpu_us_per_msg,omitempty"`
	ClientCPU float64 `json:"client_cpu_us_per_msg,omitempty"`
	// BrokerRSS is the broker's VmRSS at the end of the run, in bytes
	// (BrokerPID; 0 when not known).
	BrokerRSS int64   `json:"broker_rss_bytes,omitempty"`
	MinRate   float64 `json:"min_rate,omitempty"`
	RateHeld  *bool   `json:"rate_held,omitempty"`
	// WarmupS is how long the run went before measuring; Series has a
	// point per second of the publishing phase (the progress lines), the
	// warmup included, and one for the last partial second.
	WarmupS float64  `json:"warmup_s"`
	Series  []Second `json:"series,omitempty"`
}

// Second is one interval of a run's progress: the rates over it and the
// latency percentiles of the confirms and deliveries that arrived in it
// (zero, with a zero count, when none did).
type Second struct {
	T           float64 `json:"t_s"` // the interval's end, in seconds since the run started
	PublishRate float64 `json:"publish_rate"`
	ConsumeRate float64 `json:"consume_rate"`
	Confirms    int64   `json:"confirms"`
	ConfirmP50  float64 `json:"confirm_p50_ms"`
	ConfirmP99  float64 `json:"confirm_p99_ms"`
	Deliveries  int64   `json:"deliveries"` // from at most 16 consumers (maxE2EIntervalSources)
	E2EP50      float64 `json:"e2e_p50_ms"`
	E2EP99      float64 `json:"e2e_p99_ms"`
}

func (t *tracker) report(cfg *Config, pubDur, consDur time.Duration, pubMeasured, consMeasured int64) *Report {
	pub, acked, nacked := t.totals()
	r := &Report{
		Driver: cfg.Driver, Scenario: cfg.Scenario, DurationS: pubDur.Seconds(),
		Published: pub, Confirmed: acked, Nacked: nacked, Unconfirmed: pub - acked - nacked, Consumed: t.consumed.Load(),
		Lost: t.lost(), Duplicates: t.dups.Load(), Reordered: t.reorder.Load(),
		ConfirmLat: latency(merge(t.confirm)), E2ELat: latency(merge(t.e2e)),
		Conditions: fmt.Sprintf("%d producers, %d queues × %d consumers, %s exchange, %s-byte %s messages, confirm window %d, prefetch %d, ack batch %d",
			cfg.Producers, cfg.Queues, cfg.Consumers, cfg.ExchangeType, cfg.Size, map[bool]string{true: "persistent", false: "transient"}[cfg.Persistent],
			cfg.ConfirmWindow, cfg.Prefetch, ackBatch(cfg)),
	}
	if cfg.prios {
		r.Conditions += ", priorities " + cfg.Priorities
	}
	if cfg.Rate > 0 {
		r.Conditions += fmt.Sprintf(", fixed rate %d/s", cfg.Rate)
	}
	if cfg.QueueType != "" {
		r.Conditions += ", " + cfg.QueueType + " queues"
	}
	if pubDur > 0 {
		r.PublishRate = float64(pubMeasured) / pubDur.Seconds()
	}
	if consDur > 0 {
		r.ConsumeRate = float64(consMeasured) / consDur.Seconds()
	}
	if cfg.MinRate > 0 {
		held := r.PublishRate >= cfg.MinRate && r.ConsumeRate >= cfg.MinRate
		r.MinRate, r.RateHeld = cfg.MinRate, &held
	}
	return r
}

func (r *Report) print(w io.Writer) {
	fmt.Fprintf(w, "\n== %s / %s: %s\n", r.Driver, r.Scenario, r.Conditions)
	fmt.Fprintf(w, "published %d  confirmed %d  nacked %d  consumed %d  lost %d  duplicates %d  reordered %d\n",
		r.Published, r.Confirmed, r.Nacked, r.Consumed, r.Lost, r.Duplicates, r.Reordered)
	fmt.Fprintf(w, "publish %.0f msg/s  consume %.0f msg/s  over %.1fs\n", r.PublishRate, r.ConsumeRate, r.DurationS)
	l := func(name string, x Latency) {
		fmt.Fprintf(w, "%-16s p50 %.3f  p90 %.3f  p99 %.3f  p99.9 %.3f  max %.3f ms\n", name, x.P50, x.P90, x.P99, x.P999, x.Max)
	}
	fmt.Fprintf(w, "CPU per message: broker %s µs  load generator %s µs\n", cpuString(r.BrokerCPU), cpuString(r.ClientCPU))
	if r.BrokerRSS > 0 {
		fmt.Fprintf(w, "broker VmRSS at the end: %.1f MiB\n", mib(r.BrokerRSS))
	}
	l("publish→confirm", r.ConfirmLat)
	l("publish→deliver", r.E2ELat)
	if r.RateHeld != nil {
		if *r.RateHeld {
			fmt.Fprintf(w, "HELD: at least %.0f msg/s published and consumed\n", r.MinRate)
		} else {
			fmt.Fprintf(w, "NOT HELD: needed %.0f msg/s published and consumed; got %.0f and %.0f\n", r.MinRate, r.PublishRate, r.ConsumeRate)
		}
	}
	if r.Unconfirmed > 0 {
		fmt.Fprintf(w, "%d unconfirmed at the drain deadline (in flight: the broker may still hold them; not counted as lost)\n", r.Unconfirmed)
	}
	if r.Left > 0 {
		fmt.Fprintf(w, "%d confirmed messages left in the queues (not consumed by this run, not counted as lost)\n", r.Left)
	}
	if r.Lost > 0 {
		fmt.Fprintf(w, "LOSS: %d confirmed messages were never consumed\n", r.Lost)
	}
}

// WriteJSON writes the report to path.
func (r *Report) WriteJSON(path string) error {
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}
