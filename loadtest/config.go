// Package loadtest is Warren's load harness: it drives a broker (Warren
// natively, or any AMQP 0-9-1 broker such as RabbitMQ) with producers and
// consumers, checks that every confirmed message is consumed (counting
// losses, duplicates and reorderings), and measures rates and latency
// percentiles from HDR histograms. cmd/warren-loadtest is its command line.
package loadtest

import (
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"sort"
	"strconv"
	"strings"
	"time"
)

// Config is one run. The JSON names are those of scenario files.
type Config struct {
	Scenario      string        `json:"-"`
	Driver        string        `json:"driver,omitempty"` // warren or amqp
	URL           string        `json:"url,omitempty"`
	Producers     int           `json:"producers,omitempty"`
	Consumers     int           `json:"consumers,omitempty"` // per queue
	Queues        int           `json:"queues,omitempty"`
	ExchangeType  string        `json:"exchange_type,omitempty"` // direct, topic, fanout
	Size          string        `json:"size,omitempty"`          // bytes, or a range "64-4096"
	Priorities    string        `json:"priorities,omitempty"`    // e.g. "0-9"; empty: none
	Persistent    bool          `json:"persistent,omitempty"`
	QueueType     string        `json:"queue_type,omitempty"` // amqp: classic or quorum
	ConfirmWindow int           `json:"confirm_window,omitempty"`
	Prefetch      int           `json:"prefetch,omitempty"`
	AckBatch      int           `json:"ack_batch,omitempty"`
	Rate          int           `json:"rate,omitempty"` // total msgs/s; 0: as fast as possible
	Duration      time.Duration `json:"-"`
	Count         int64         `json:"count,omitempty"` // total messages; overrides duration
	Warmup        time.Duration `json:"-"`
	DrainTimeout  time.Duration `json:"-"`
	DurationS     float64       `json:"duration_s,omitempty"`
	WarmupS       float64       `json:"warmup_s,omitempty"`
	MinRate       float64       `json:"min_rate,omitempty"` // the run fails if publish or consume rate is lower
	JSONPath      string        `json:"-"`
	// BrokerPID, when set, is the broker's process id on this machine: the
	// report then gives the broker's CPU time per consumed message, read
	// from /proc over the measured window.
	BrokerPID int `json:"-"`
	// TLS configures warrens:// URLs (warren-loadtest --ca, --cert, --key);
	// nil: the system's roots.
	TLS *tls.Config `json:"-"`
	// Stop, when set, ends the publishing phase when it is closed (like the
	// end of Duration); the drain and the report follow as usual.
	Stop <-chan struct{} `json:"-"`
	// Ledger, when set, is a file that keeps the run's accounting across
	// broker restarts (see Ledger): the queues are kept rather than
	// declared afresh, a producer losing its connection ends the
	// publishing phase instead of failing the run, the loss verdict is left
	// to a Verify run, and the confirmed and received sequence numbers are
	// added to the file at the end of the run (an interrupt included).
	Ledger string `json:"-"`
	// PublishOnly starts no consumers (for a ledger run: the queues keep
	// what was published for a later run or Verify).
	PublishOnly bool `json:"-"`
	// Verify is the ledger file a Verify run checks.
	Verify string `json:"-"`
	// Live, when set, is given the run's running totals.
	Live *Live `json:"-"`
	// CPUProfile, when set, is given a CPU profile (go tool pprof) of
	// this process over the measured window: after the warmup, to the end
	// of the drain, what the report's load generator CPU counts.
	CPUProfile io.Writer `json:"-"`

	sizeLo, sizeHi int
	prioLo, prioHi int
	prios          bool
}

// Defaults for anything a scenario and the flags leave unset.
func (c *Config) fill() error {
	if c.Driver == "" {
		c.Driver = "warren"
	}
	if c.URL == "" {
		if c.Driver == "amqp" {
			c.URL = "amqp://guest:guest@127.0.0.1:5672/"
		} else {
			c.URL = "warren://guest:guest@127.0.0.1:5680"
		}
	}
	def := func(v *int, d int) {
		if *v <= 0 {
			*v = d
		}
	}
	def(&c.Producers, 1)
	def(&c.Consumers, 1)
	def(&c.Queues, 1)
	def(&c.ConfirmWindow, 10000)
	def(&c.Prefetch, 1000)
	def(&c.AckBatch, 100)
	if c.ExchangeType == "" {
		c.ExchangeType = "direct"
	}
	switch c.ExchangeType {
	case "direct", "topic", "fanout":
	default:
		return fmt.Errorf("loadtest: --exchange-type %q: want direct, topic or fanout", c.ExchangeType)
	}
	if c.Driver != "warren" && c.Driver != "amqp" {
		return fmt.Errorf("loadtest: --driver %q: want warren or amqp", c.Driver)
	}
	if c.Size == "" {
		c.Size = "128"
	}
	lo, hi, err := parseRange(c.Size)
	if err != nil {
		return fmt.Errorf("loadtest: --size: %w", err)
	}
	if lo < headerSize {
		return fmt.Errorf("loadtest: --size must be at least %d bytes (the tracking header)", headerSize)
	}
	c.sizeLo, c.sizeHi = lo, hi
	if c.Priorities != "" {
		lo, hi, err := parseRange(c.Priorities)
		if err != nil || hi > 255 {
			return fmt.Errorf("loadtest: --priorities %q: want a range within 0-255", c.Priorities)
		}
		c.prioLo, c.prioHi, c.prios = lo, hi, true
	}
	if c.DurationS > 0 && c.Duration == 0 {
		c.Duration = time.Duration(c.DurationS * float64(time.Second))
	}
	if c.WarmupS > 0 && c.Warmup == 0 {
		c.Warmup = time.Duration(c.WarmupS * float64(time.Second))
	}
	if c.Duration == 0 && c.Count == 0 {
		c.Duration = 10 * time.Second
	}
	if c.DrainTimeout == 0 {
		c.DrainTimeout = 10 * time.Second
	}
	if c.Scenario == "" {
		c.Scenario = "custom"
	}
	return nil
}

func parseRange(s string) (lo, hi int, err error) {
	a, b, isRange := strings.Cut(s, "-")
	lo, err = strconv.Atoi(strings.TrimSpace(a))
	if err != nil {
		return 0, 0, fmt.Errorf("%q is not a number or range", s)
	}
	hi = lo
	if isRange {
		if hi, err = strconv.Atoi(strings.TrimSpace(b)); err != nil || hi < lo {
			return 0, 0, fmt.Errorf("%q is not a range lo-hi", s)
		}
	}
	if lo < 0 {
		return 0, 0, fmt.Errorf("%q is negative", s)
	}
	return lo, hi, nil
}

func (c *Config) size(r *rand.Rand) int {
	if c.sizeHi == c.sizeLo {
		return c.sizeLo
	}
	return c.sizeLo + r.IntN(c.sizeHi-c.sizeLo+1)
}

func (c *Config) priority(r *rand.Rand) uint8 {
	if !c.prios {
		return 0
	}
	return uint8(c.prioLo + r.IntN(c.prioHi-c.prioLo+1))
}

// copies is how many queues each message reaches.
func (c *Config) copies() int {
	if c.ExchangeType == "fanout" {
		return c.Queues
	}
	return 1
}

// Scenarios are the named standard runs (BENCHMARKS.md). A scenario file
// (--scenario FILE) is a JSON object of the same shape: name → settings.
var Scenarios = map[string]Config{
	"throughput":    {Producers: 2, Consumers: 2, Queues: 2, Size: "128", DurationS: 20, WarmupS: 2},
	"persistent-1k": {Producers: 2, Consumers: 2, Queues: 2, Size: "1024", Persistent: true, DurationS: 20, WarmupS: 2},
	"priority-mix":  {Producers: 2, Consumers: 1, Queues: 1, Size: "128", Priorities: "0-9", DurationS: 20, WarmupS: 2},
	"queues-1000":   {Producers: 4, Consumers: 1, Queues: 1000, Size: "128", Prefetch: 100, DurationS: 20, WarmupS: 2},
	// Issue 17 item 5: 10,000 queues with a consumer each (313 consumer
	// connections, 32 channels each), loaded by 4 producers spreading
	// their messages over every queue (make bench-scale).
	"queues-10000": {Producers: 4, Consumers: 1, Queues: 10000, Size: "128", Prefetch: 100, AckBatch: 20, DurationS: 30, WarmupS: 5},
	"latency":      {Producers: 1, Consumers: 1, Queues: 1, Size: "128", Rate: 10000, DurationS: 20, WarmupS: 2},
	// Durable queues, 1 KiB persistent messages (make bench-durable runs
	// the first two with the broker's fdatasyncs counted beside them).
	"persistent-1k-1q":      {Producers: 2, Consumers: 1, Queues: 1, Size: "1024", Persistent: true, DurationS: 20, WarmupS: 2},
	"persistent-1k-100q":    {Producers: 4, Consumers: 1, Queues: 100, Size: "1024", Persistent: true, DurationS: 20, WarmupS: 2},
	"latency-persistent-1k": {Producers: 1, Consumers: 1, Queues: 1, Size: "1024", Persistent: true, Rate: 10000, DurationS: 20, WarmupS: 2},
	// The 1,000,000 msg/s validation: 60 s held, 128-byte transient
	// messages, batching clients, queues as the unit of parallelism.
	"million": {Producers: 16, Consumers: 1, Queues: 16, Size: "128", ConfirmWindow: 50000, Prefetch: 5000, AckBatch: 500, DurationS: 60, WarmupS: 5, MinRate: 1_000_000},
}

// ScenarioNames lists the built-in scenarios.
func ScenarioNames() []string {
	var n []string
	for k := range Scenarios {
		n = append(n, k)
	}
	sort.Strings(n)
	return n
}

// LoadScenario returns a built-in scenario, or one named entry of a JSON
// scenario file ("FILE" with one entry, or "FILE:NAME").
func LoadScenario(spec string) (Config, error) {
	if c, ok := Scenarios[spec]; ok {
		c.Scenario = spec
		return c, nil
	}
	path, name, _ := strings.Cut(spec, ":")
	b, err := os.ReadFile(path)
	if err != nil {
		return Config{}, fmt.Errorf("loadtest: scenario %q is neither built in (%s) nor a readable file: %w", spec, strings.Join(ScenarioNames(), ", "), err)
	}
	var m map[string]Config
	dec := json.NewDecoder(strings.NewReader(string(b)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&m); err != nil {
		return Config{}, fmt.Errorf("loadtest: scenario file %s: %w", path, err)
	}
	if name == "" {
		if len(m) != 1 {
			return Config{}, fmt.Errorf("loadtest: scenario file %s has %d scenarios; pick one with FILE:NAME", path, len(m))
		}
		for k := range m {
			name = k
		}
	}
	c, ok := m[name]
	if !ok {
		return Config{}, fmt.Errorf("loadtest: no scenario %q in %s", name, path)
	}
	c.Scenario = name
	return c, nil
}
