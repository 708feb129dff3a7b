package loadtest

import (
	"context"
	"strconv"
)

// driver talks to one kind of broker.
type driver interface {
	// setup declares the exchange, the queues and their bindings afresh.
	setup(ctx context.Context, cfg *Config, t *topo) error
	producer(ctx context.Context, cfg *Config, onConfirm func(first, last uint64, ok bool)) (producer, error)
	// consumer starts consuming queue; handle runs for every message, one
	// at a time per consumer (for Warren, on the connection's reader
	// goroutine), and body is valid only until it returns.
	consumer(ctx context.Context, cfg *Config, queue string, handle func(body []byte)) (closer, error)
	close()
}

type producer interface {
	// publish sends one message; sequence numbers count from 1 in call
	// order and are the ones onConfirm reports.
	publish(ctx context.Context, exchange, key string, body []byte, prio uint8, persistent bool) error
	// wait blocks until every publish is confirmed (or the context ends).
	wait(ctx context.Context) error
	close()
}

type closer interface{ close() }

// topo is the run's topology: one exchange, N queues, a routing key each.
type topo struct {
	exchange string
	queues   []string
	keys     []string // routing key that reaches queues[i]
	binds    []string // binding key for queues[i]
}

// newTopo names the run's exchange and queues. Persistent runs use names
// of their own (loadtest.durable.direct, loadtest-durable-0, …): an
// ordinary run leaves non-durable queues and exchange behind, which a
// ledger run, keeping what exists, could not redeclare durable; and an
// ordinary run, which deletes its names first, cannot empty a persistent
// ledger's queues.
func newTopo(cfg *Config) *topo {
	xp, qp := "loadtest.", "loadtest-"
	if cfg.Persistent {
		xp, qp = "loadtest.durable.", "loadtest-durable-"
	}
	t := &topo{exchange: xp + cfg.ExchangeType}
	for i := 0; i < cfg.Queues; i++ {
		q := qp + strconv.Itoa(i)
		t.queues = append(t.queues, q)
		switch cfg.ExchangeType {
		case "topic":
			t.keys = append(t.keys, "lt."+strconv.Itoa(i)+".m")
			t.binds = append(t.binds, "lt."+strconv.Itoa(i)+".*")
		case "fanout":
			t.keys = append(t.keys, "")
			t.binds = append(t.binds, "")
		default:
			t.keys = append(t.keys, q)
			t.binds = append(t.binds, q)
		}
	}
	return t
}
