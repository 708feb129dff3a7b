package loadtest

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/warren-mq/warren/client"
	"github.com/warren-mq/warren/wire"
)

// warrenDriver drives a Warren broker through the Go SDK: one connection per
// producer and per consumer.
type warrenDriver struct {
	url        string
	conns      []*client.Conn
	consConn   *client.Conn
	consOnConn int

	ackMu     sync.Mutex
	acks      []*ackState
	stopFlush chan struct{} // closed by close: ends flushAcks
	flushDone chan struct{}
	closeOnce sync.Once
}

// consumersPerConn bounds how many consumers share one connection.
const consumersPerConn = 32

func (d *warrenDriver) dial(ctx context.Context, cfg *Config) (*client.Conn, *client.Channel, error) {
	c, err := client.Dial(ctx, d.url, client.Options{ConfirmWindow: cfg.ConfirmWindow, Name: "warren-loadtest", TLS: cfg.TLS})
	if err != nil {
		return nil, nil, err
	}
	ch, err := c.Channel(ctx)
	if err != nil {
		c.Close()
		return nil, nil, err
	}
	d.conns = append(d.conns, c)
	return c, ch, nil
}

func (d *warrenDriver) setup(ctx context.Context, cfg *Config, t *topo) error {
	_, ch, err := d.dial(ctx, cfg)
	if err != nil {
		return err
	}
	// Start from scratch: a previous run may have declared them otherwise.
	// A ledger run keeps them: what they hold is accounted for.
	for _, q := range t.queues {
		if cfg.Ledger != "" {
			break
		}
		if _, err := ch.DeleteQueue(ctx, q, false, false); err != nil && wire.CodeOf(err) != wire.NotFound {
			return err
		}
	}
	if cfg.Ledger == "" {
		if err := ch.DeleteExchange(ctx, t.exchange, false); err != nil && wire.CodeOf(err) != wire.NotFound {
			return err
		}
	}
	if err := ch.DeclareExchange(ctx, t.exchange, cfg.ExchangeType, client.ExchangeOptions{Durable: cfg.Persistent}); err != nil {
		return err
	}
	var args wire.Table
	if cfg.prios {
		args = append(args, wire.Field{Key: "max-priority", Value: wire.Int(int64(cfg.prioHi))})
	}
	for i, q := range t.queues {
		if _, err := ch.DeclareQueue(ctx, q, client.QueueOptions{Durable: cfg.Persistent, Args: args}); err != nil {
			return err
		}
		if err := ch.Bind(ctx, client.Binding{Source: t.exchange, Destination: q, RoutingKey: t.binds[i]}); err != nil {
			return err
		}
	}
	return nil
}

type warrenProducer struct{ ch *client.Channel }

func (d *warrenDriver) producer(ctx context.Context, cfg *Config, onConfirm func(first, last uint64, ok bool)) (producer, error) {
	_, ch, err := d.dial(ctx, cfg)
	if err != nil {
		return nil, err
	}
	ch.NotifyConfirm(func(first, last uint64, err error) { onConfirm(first, last, err == nil) })
	return &warrenProducer{ch: ch}, nil
}

func (p *warrenProducer) publish(ctx context.Context, exchange, key string, body []byte, prio uint8, persistent bool) error {
	_, err := p.ch.PublishAsync(ctx, exchange, client.Message{RoutingKey: key, Body: body, Priority: prio, Persistent: persistent})
	return err
}

func (p *warrenProducer) wait(ctx context.Context) error { return p.ch.WaitConfirms(ctx) }
func (p *warrenProducer) close()                         {}

type warrenConsumer struct{ cs *client.Consumer }

func (d *warrenDriver) consumer(ctx context.Context, cfg *Config, queue string, handle func([]byte)) (closer, error) {
	// Consumers share connections, a channel each, consumersPerConn to a
	// connection, so a thousand queues do not mean a thousand sockets.
	if d.consConn == nil || d.consOnConn == consumersPerConn {
		c, _, err := d.dial(ctx, cfg)
		if err != nil {
			return nil, err
		}
		d.consConn, d.consOnConn = c, 0
	}
	d.consOnConn++
	ch, err := d.consConn.Channel(ctx)
	if err != nil {
		return nil, err
	}
	// ConsumeBatch: no copy, no allocation and no channel hand-off per
	// message (handle reads the body and keeps nothing of it). Every
	// ackEvery messages are acked with one AckMultiple; what a frame left
	// unacked is acked by the driver's flusher (flushAcks) within 20 ms.
	ackEvery := ackBatch(cfg)
	st := &ackState{}
	cs, err := ch.ConsumeBatch(ctx, queue, client.ConsumeOptions{Prefetch: uint32(cfg.Prefetch)}, func(ds []client.Delivery) {
		st.mu.Lock()
		defer st.mu.Unlock()
		for i := range ds {
			handle(ds[i].Body)
			if st.n++; st.n >= ackEvery {
				_ = ds[i].AckMultiple()
				st.n = 0
			}
		}
		st.pending = st.n > 0
		if st.pending {
			st.last = ds[len(ds)-1] // settling a copy later is allowed; its Body is not read
			st.last.Body = nil
		}
	})
	if err != nil {
		return nil, err
	}
	st.done = cs.Done()
	d.addAckState(st)
	return &warrenConsumer{cs: cs}, nil
}

func (c *warrenConsumer) close() {}

// ackState is a consumer's acks not yet sent: what a frame left over when it
// ended short of the ack batch.
type ackState struct {
	done    <-chan struct{}
	mu      sync.Mutex
	last    client.Delivery // the frame's last delivery, when unacked ones precede it
	pending bool
	n       int
}

// ackFlushEvery is how soon a consumer's leftover acks are sent, so a quiet
// stream never stalls on prefetch.
const ackFlushEvery = 20 * time.Millisecond

// addAckState hands a consumer's leftover acks to the driver's one flusher
// goroutine: a ticker per consumer would wake 10,000 goroutines 50 times a
// second in a 10,000-queue run, a load generator's cost that a broker
// benchmark should not carry.
func (d *warrenDriver) addAckState(st *ackState) {
	d.ackMu.Lock()
	defer d.ackMu.Unlock()
	d.acks = append(d.acks, st)
	if d.stopFlush != nil {
		return
	}
	d.stopFlush = make(chan struct{})
	d.flushDone = make(chan struct{})
	go d.flushAcks(d.stopFlush, d.flushDone)
}

func (d *warrenDriver) flushAcks(stop <-chan struct{}, done chan<- struct{}) {
	defer close(done)
	tick := time.NewTicker(ackFlushEvery)
	defer tick.Stop()
	for {
		select {
		case <-stop:
			return
		case <-tick.C:
		}
		d.flushPending()
	}
}

// flushPending acks what each consumer handled and has not acked yet.
func (d *warrenDriver) flushPending() {
	d.ackMu.Lock()
	acks := d.acks
	d.ackMu.Unlock()
	for _, st := range acks {
		st.mu.Lock()
		if st.pending {
			select {
			case <-st.done:
			default:
				_ = st.last.AckMultiple()
			}
			st.pending, st.n = false, 0
		}
		st.mu.Unlock()
	}
}

// close acks what the consumers handled, then closes every connection; a
// second call does nothing. Once it returns no consumer acks anything more,
// so what the tracker holds as received then covers every ack the broker
// got (a ledger run records it only after close).
func (d *warrenDriver) close() {
	d.closeOnce.Do(func() {
		if d.stopFlush != nil {
			close(d.stopFlush)
			<-d.flushDone
			d.flushPending()
		}
		for _, c := range d.conns {
			c.Close()
		}
	})
}

// ackBatch keeps the ack batch well under the prefetch, so a consumer never
// waits for messages the broker holds back until it acks.
func ackBatch(cfg *Config) int {
	n := cfg.AckBatch
	if cfg.Prefetch > 0 && n > cfg.Prefetch/2 {
		n = max(1, cfg.Prefetch/2)
	}
	return n
}

var errNoDriver = errors.New("loadtest: unknown driver")
