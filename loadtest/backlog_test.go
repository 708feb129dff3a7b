package loadtest

import (
	"bytes"
	"context"
	"regexp"
	"strconv"
	"sync"
	"testing"
	"time"
)

// lateConfirms is a driver whose broker delivers each message at once and
// confirms nothing until the producer waits: deliveries run ahead of
// confirms, as they do when a real broker's confirms lag.
type lateConfirms struct {
	mu       sync.Mutex
	handlers map[string]func([]byte)
}

func (d *lateConfirms) setup(context.Context, *Config, *topo) error { return nil }
func (d *lateConfirms) consumer(_ context.Context, _ *Config, q string, h func([]byte)) (closer, error) {
	d.mu.Lock()
	d.handlers[q] = h
	d.mu.Unlock()
	return nil, nil
}
func (d *lateConfirms) producer(_ context.Context, _ *Config, on func(first, last uint64, ok bool)) (producer, error) {
	return &lateProducer{d: d, on: on}, nil
}
func (d *lateConfirms) close() {}

type lateProducer struct {
	d   *lateConfirms
	on  func(first, last uint64, ok bool)
	seq uint64
}

func (p *lateProducer) publish(ctx context.Context, _, key string, body []byte, _ uint8, _ bool) error {
	p.d.mu.Lock()
	h := p.d.handlers[key]
	p.d.mu.Unlock()
	h(append([]byte(nil), body...))
	p.seq++
	if p.seq%5000 == 0 {
		time.Sleep(time.Millisecond) // pace, so a second holds some progress
	}
	return ctx.Err()
}
func (p *lateProducer) wait(context.Context) error {
	if p.seq > 0 {
		p.on(1, p.seq, true)
	}
	return nil
}
func (p *lateProducer) close() {}

// The progress line's backlog is what was published and not yet consumed:
// never negative, even when deliveries run ahead of confirms.
func TestProgressBacklogNeverNegative(t *testing.T) {
	cfg := Config{Driver: "warren", URL: "warren://x", Producers: 2, Consumers: 1, Queues: 2, Size: "64",
		Duration: 1100 * time.Millisecond, DrainTimeout: time.Second, Scenario: "test"}
	if err := cfg.fill(); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	rep, err := run(context.Background(), &cfg, &lateConfirms{handlers: map[string]func([]byte){}}, &out, 0)
	if err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	m := regexp.MustCompile(`backlog (-?\d+)`).FindAllStringSubmatch(out.String(), -1)
	if len(m) == 0 || rep.Consumed == 0 {
		t.Fatalf("no progress line with a backlog:\n%s", out.String())
	}
	for _, x := range m {
		if n, _ := strconv.Atoi(x[1]); n < 0 {
			t.Errorf("progress line shows backlog %d", n)
		}
	}
}
