package loadtest

import (
	"context"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// amqpDriver drives any AMQP 0-9-1 broker (RabbitMQ classic or quorum
// queues) with the same scenario: one connection per producer and per
// consumer, publisher confirms, manual acks with multiple.
type amqpDriver struct {
	url        string
	mu         sync.Mutex
	conns      []*amqp.Connection
	consConn   *amqp.Connection
	consOnConn int
}

func (d *amqpDriver) dial() (*amqp.Connection, *amqp.Channel, error) {
	c, err := amqp.Dial(d.url)
	if err != nil {
		return nil, nil, err
	}
	ch, err := c.Channel()
	if err != nil {
		c.Close()
		return nil, nil, err
	}
	d.mu.Lock()
	d.conns = append(d.conns, c)
	d.mu.Unlock()
	return c, ch, nil
}

func (d *amqpDriver) setup(ctx context.Context, cfg *Config, t *topo) error {
	_, ch, err := d.dial()
	if err != nil {
		return err
	}
	for _, q := range t.queues {
		if cfg.Ledger != "" { // a ledger run keeps what the queues hold
			break
		}
		if _, err := ch.QueueDelete(q, false, false, false); err != nil {
			return err
		}
	}
	if cfg.Ledger == "" {
		if err := ch.ExchangeDelete(t.exchange, false, false); err != nil {
			return err
		}
	}
	if err := ch.ExchangeDeclare(t.exchange, cfg.ExchangeType, cfg.Persistent, false, false, false, nil); err != nil {
		return err
	}
	args := amqp.Table{}
	if cfg.prios {
		args["x-max-priority"] = int32(cfg.prioHi)
	}
	durable := cfg.Persistent
	if cfg.QueueType != "" {
		args["x-queue-type"] = cfg.QueueType
		if cfg.QueueType == "quorum" {
			durable = true
		}
	}
	for i, q := range t.queues {
		if _, err := ch.QueueDeclare(q, durable, false, false, false, args); err != nil {
			return err
		}
		if err := ch.QueueBind(q, t.binds[i], t.exchange, false, nil); err != nil {
			return err
		}
	}
	return nil
}

type amqpProducer struct {
	ch     *amqp.Channel
	mu     sync.Mutex
	cond   *sync.Cond
	out    int
	window int
	done   chan struct{}
}

func (d *amqpDriver) producer(ctx context.Context, cfg *Config, onConfirm func(first, last uint64, ok bool)) (producer, error) {
	_, ch, err := d.dial()
	if err != nil {
		return nil, err
	}
	if err := ch.Confirm(false); err != nil {
		return nil, err
	}
	p := &amqpProducer{ch: ch, window: cfg.ConfirmWindow, done: make(chan struct{})}
	p.cond = sync.NewCond(&p.mu)
	confirms := ch.NotifyPublish(make(chan amqp.Confirmation, cfg.ConfirmWindow))
	go func() {
		defer close(p.done)
		for c := range confirms {
			onConfirm(c.DeliveryTag, c.DeliveryTag, c.Ack)
			p.mu.Lock()
			p.out--
			p.cond.Broadcast()
			p.mu.Unlock()
		}
		p.mu.Lock()
		p.out = 0
		p.cond.Broadcast()
		p.mu.Unlock()
	}()
	return p, nil
}

func (p *amqpProducer) publish(ctx context.Context, exchange, key string, body []byte, prio uint8, persistent bool) error {
	p.mu.Lock()
	for p.out >= p.window {
		p.cond.Wait()
	}
	p.out++
	p.mu.Unlock()
	mode := amqp.Transient
	if persistent {
		mode = amqp.Persistent
	}
	return p.ch.PublishWithContext(ctx, exchange, key, false, false, amqp.Publishing{Body: body, Priority: prio, DeliveryMode: mode})
}

func (p *amqpProducer) wait(ctx context.Context) error {
	stop := context.AfterFunc(ctx, func() {
		p.mu.Lock()
		p.cond.Broadcast()
		p.mu.Unlock()
	})
	defer stop()
	p.mu.Lock()
	defer p.mu.Unlock()
	for p.out > 0 && ctx.Err() == nil {
		p.cond.Wait()
	}
	return ctx.Err()
}

func (p *amqpProducer) close() { _ = p.ch.Close() }

type amqpConsumer struct{ ch *amqp.Channel }

func (d *amqpDriver) consumer(ctx context.Context, cfg *Config, queue string, handle func([]byte)) (closer, error) {
	if d.consConn == nil || d.consOnConn == consumersPerConn {
		c, _, err := d.dial()
		if err != nil {
			return nil, err
		}
		d.consConn, d.consOnConn = c, 0
	}
	d.consOnConn++
	ch, err := d.consConn.Channel()
	if err != nil {
		return nil, err
	}
	if err := ch.Qos(cfg.Prefetch, 0, false); err != nil {
		return nil, err
	}
	dels, err := ch.Consume(queue, "", false, false, false, false, nil)
	if err != nil {
		return nil, err
	}
	ackEvery := ackBatch(cfg)
	go func() {
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		var last *amqp.Delivery
		n := 0
		for {
			select {
			case dl, ok := <-dels:
				if !ok {
					return
				}
				handle(dl.Body)
				last = &dl
				if n++; n >= ackEvery {
					_ = dl.Ack(true)
					last, n = nil, 0
				}
			case <-tick.C:
				if last != nil {
					_ = last.Ack(true)
					last, n = nil, 0
				}
			}
		}
	}()
	return &amqpConsumer{ch: ch}, nil
}

func (c *amqpConsumer) close() { _ = c.ch.Close() }

func (d *amqpDriver) close() {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, c := range d.conns {
		_ = c.Close()
	}
}
