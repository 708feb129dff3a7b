package client

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/warren-mq/warren/wire"
)

// ConsumeOptions configure a consumer.
type ConsumeOptions struct {
	Tag      string // empty: the broker picks one
	Prefetch uint32 // unacked deliveries in flight; 0: the broker's maximum
	// PrefetchBytes stops deliveries while this many body bytes are unacked
	// (0: no byte limit).
	PrefetchBytes uint32
	AutoAck       bool // at-most-once: no acks, nothing redelivered
	Exclusive     bool
	Priority      int16
	// ConsumerTimeout overrides the queue's consumer-timeout-ms for this
	// consumer (SUBSCRIBE argument consumer-timeout-ms; whole milliseconds,
	// at least 1): a delivery not settled or extended within it is taken
	// back and redelivered, and OnLeaseExpired is told. 0: the queue's.
	ConsumerTimeout time.Duration
}

// Delivery is one delivered message. Settle it with exactly one of Ack,
// Nack or Reject (not for auto-ack consumers).
type Delivery struct {
	Tag           uint64
	Redelivered   bool
	DeliveryCount uint32
	FailedCount   uint32
	Persistent    bool
	Priority      uint8
	Exchange      string
	RoutingKey    string
	Body          []byte
	rawProps      []byte
	ch            *Channel
}

// Props decodes the message's properties (nil if it has none).
func (d *Delivery) Props() (*wire.Props, error) { return wire.DecodeProps(d.rawProps) }

// Ack tells the broker the message is done with. Acks are batched and sent
// by the connection's writer.
func (d *Delivery) Ack() error { return d.ch.settle(wire.SettleAck, d.Tag, d.Tag, 0) }

// AckMultiple acks this and every earlier outstanding delivery of the
// channel.
func (d *Delivery) AckMultiple() error { return d.ch.settle(wire.SettleAck, 0, d.Tag, 0) }

// Nack returns the message: to its queue (requeue) or to the dead-letter
// exchange.
func (d *Delivery) Nack(requeue bool) error {
	if requeue {
		return d.ch.settle(wire.SettleRequeue, d.Tag, d.Tag, 0)
	}
	return d.ch.settle(wire.SettleReject, d.Tag, d.Tag, 0)
}

// Reject dead-letters the message (or drops it if its queue has no
// dead-letter exchange).
func (d *Delivery) Reject() error { return d.ch.settle(wire.SettleReject, d.Tag, d.Tag, 0) }

// Extend asks for more time before the queue's ack timeout takes the
// delivery back (0: the queue's timeout again).
func (d *Delivery) Extend(lease time.Duration) error {
	return d.ch.settle(wire.SettleExtend, d.Tag, d.Tag, uint32(lease/time.Millisecond))
}

// Consumer is a running subscription.
type Consumer struct {
	ch      *Channel
	Tag     string
	Queue   string
	autoAck bool
	feed    chan *Delivery
	done    chan struct{}
	once    sync.Once
	sendMu  sync.RWMutex // held (read) while the reader sends on feed
	stopped atomic.Bool  // set by stop before done is closed
	mu      sync.Mutex
	err     error
	expired func(tags []uint64)

	// Reader goroutine only.
	batch   func([]Delivery) // a ConsumeBatch consumer's handler
	scratch []Delivery       // ConsumeBatch's reused slice
	lastEx  string           // the last exchange and routing key seen, reused
	lastRK  string           // while they repeat, so a run allocates no strings
}

// ErrCancelled is the error of a consumer the broker cancelled.
var ErrCancelled = errors.New("client: consumer cancelled")

// Consume starts a consumer whose deliveries come on the returned
// consumer's Deliveries channel.
func (ch *Channel) Consume(ctx context.Context, queue string, o ConsumeOptions) (*Consumer, error) {
	return ch.consume(ctx, queue, o, nil)
}

// ConsumeBatch starts a consumer whose deliveries are handed to handler a
// frame's worth at a time, without copying: the fast path (no allocation
// per message).
//
// THE RULE: each Delivery's Body (and its Props' source bytes) points into
// the connection's read buffer and is valid ONLY UNTIL handler RETURNS.
// So is the slice ds itself. After that the buffer is reused for the next
// frames and a body you kept changes under you. Copy what you keep
// (append([]byte(nil), d.Body...)); settle with the Delivery's methods,
// during the call or later from a copy of the Delivery (Tag, flags,
// Exchange and RoutingKey stay valid; only Body and Props do not). Build
// with -tags warrendebug to have released bodies overwritten with 0xDB, so
// code that breaks the rule fails visibly.
//
// handler runs on the connection's reader goroutine: while it runs nothing
// else is read on the connection (confirms, replies, other consumers). It
// must not wait for anything that needs the connection to read (a
// Publish's confirm, a declare's reply); acks are fine (they are only
// queued). Acking the last delivery of ds with AckMultiple settles the
// whole batch in one range. Deliveries() of such a consumer carries
// nothing and is closed when it stops.
func (ch *Channel) ConsumeBatch(ctx context.Context, queue string, o ConsumeOptions, handler func(ds []Delivery)) (*Consumer, error) {
	if handler == nil {
		return nil, errors.New("client: ConsumeBatch needs a handler")
	}
	return ch.consume(ctx, queue, o, handler)
}

func (ch *Channel) consume(ctx context.Context, queue string, o ConsumeOptions, batch func([]Delivery)) (*Consumer, error) {
	buf := int(o.Prefetch)
	if buf == 0 || buf > 4096 {
		buf = 4096
	}
	if batch != nil {
		buf = 0
	}
	var args wire.Table
	if o.ConsumerTimeout != 0 {
		ms := o.ConsumerTimeout.Milliseconds()
		if ms < 1 {
			return nil, fmt.Errorf("client: ConsumeOptions.ConsumerTimeout %v: want at least 1ms, or 0 for the queue's", o.ConsumerTimeout)
		}
		args = wire.Table{{Key: "consumer-timeout-ms", Value: wire.Int(ms)}}
	}
	cs := &Consumer{ch: ch, Queue: queue, autoAck: o.AutoAck, feed: make(chan *Delivery, buf), done: make(chan struct{}), batch: batch}
	_, err := ch.request(ctx, func(req uint32) wire.Body {
		return &wire.Subscribe{Req: req, Queue: queue, ConsumerTag: o.Tag, AutoAck: o.AutoAck, Exclusive: o.Exclusive,
			Priority: o.Priority, PrefetchCount: o.Prefetch, PrefetchBytes: o.PrefetchBytes, Args: args}
	}, func(b wire.Body) {
		// On the reader goroutine, before any delivery for it is read.
		if ok, isOK := b.(*wire.SubscribeOK); isOK {
			cs.Tag = ok.ConsumerTag
			ch.mu.Lock()
			ch.consumers[cs.Tag] = cs
			ch.mu.Unlock()
		}
	})
	if err != nil {
		return nil, err
	}
	return cs, nil
}

// ConsumeFunc starts a consumer and runs handler for each delivery, one at
// a time, on a goroutine of its own, until the consumer stops.
func (ch *Channel) ConsumeFunc(ctx context.Context, queue string, o ConsumeOptions, handler func(*Delivery)) (*Consumer, error) {
	cs, err := ch.Consume(ctx, queue, o)
	if err != nil {
		return nil, err
	}
	go func() {
		for d := range cs.Deliveries() {
			handler(d)
		}
	}()
	return cs, nil
}

// Deliveries is the consumer's feed; it is closed when the consumer stops.
func (cs *Consumer) Deliveries() <-chan *Delivery { return cs.feed }

// Done is closed when the consumer has stopped; Err says why.
func (cs *Consumer) Done() <-chan struct{} { return cs.done }

// Err is why the consumer stopped (nil after a Cancel).
func (cs *Consumer) Err() error {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	return cs.err
}

// OnLeaseExpired registers fn for deliveries the broker took back after
// the ack timeout (the queue's, or ConsumeOptions.ConsumerTimeout).
func (cs *Consumer) OnLeaseExpired(fn func(tags []uint64)) {
	cs.mu.Lock()
	cs.expired = fn
	cs.mu.Unlock()
}

// Cancel stops the consumer and closes Deliveries(). Deliveries the
// application already took stay its own to settle; those it had not taken
// yet (still in Deliveries()) go back to the queue, as a requeue does
// (counted as a failed delivery), so no message waits unseen on this
// channel until it closes. The broker sends nothing for the consumer after
// it answered the CANCEL. An auto-ack consumer's untaken deliveries are
// dropped: the broker counted them settled when it sent them.
func (cs *Consumer) Cancel(ctx context.Context) error {
	_, err := cs.ch.request(ctx, func(req uint32) wire.Body { return &wire.Cancel{Req: req, ConsumerTag: cs.Tag} })
	cs.ch.mu.Lock()
	delete(cs.ch.consumers, cs.Tag)
	cs.ch.mu.Unlock()
	cs.stop(nil)
	if err != nil {
		return err // not cancelled by this request (the broker had, or the connection went)
	}
	for d := range cs.feed { // closed by stop: ends once it is empty
		if !cs.autoAck {
			_ = d.Nack(true)
		}
	}
	return nil
}

func (cs *Consumer) stop(err error) {
	cs.once.Do(func() {
		cs.mu.Lock()
		cs.err = err
		cs.mu.Unlock()
		cs.stopped.Store(true)
		close(cs.done) // wakes a reader blocked sending on feed
		cs.sendMu.Lock()
		close(cs.feed) // no send is in flight now, and none will start
		cs.sendMu.Unlock()
	})
}

// deliverCopies hands one DELIVER frame's deliveries to a Consume
// consumer's feed, each with its own copy of its body and properties
// (reader goroutine). It blocks while the feed is full: the reader then
// stops reading and TCP pushes back on the broker, which is what an
// auto-ack consumer relies on. Once the consumer has stopped, the rest go
// back to the queue (giveBack).
//
// The feed's read lock is taken once per frame, and a delivery goes in
// with a plain non-blocking send while the feed has room: a two-way select
// per delivery was a tenth of the client's CPU on this path (BENCHMARKS.md).
func (cs *Consumer) deliverCopies(ch *Channel, it wire.DeliveryIter) {
	cs.sendMu.RLock()
	defer cs.sendMu.RUnlock()
	var d wire.Delivery
	for it.Next(&d) {
		if cs.stopped.Load() {
			cs.giveBack(ch, &d, it)
			return
		}
		// One copy per delivery: the application owns what it gets.
		buf := make([]byte, len(d.Body)+len(d.Properties))
		copy(buf, d.Body)
		copy(buf[len(d.Body):], d.Properties)
		dd := &Delivery{
			Tag: d.Tag, Redelivered: d.Flags&wire.Redelivered != 0, DeliveryCount: d.DeliveryCount,
			FailedCount: d.FailedCount, Persistent: d.Flags&wire.DeliveredPersistent != 0, Priority: d.Priority,
			Exchange: intern(&cs.lastEx, d.Exchange), RoutingKey: intern(&cs.lastRK, d.RoutingKey),
			Body: buf[:len(d.Body):len(d.Body)], rawProps: buf[len(d.Body):], ch: ch,
		}
		select {
		case cs.feed <- dd:
			continue
		default:
		}
		select {
		case cs.feed <- dd:
		case <-cs.done:
			cs.giveBack(ch, &d, it)
			return
		}
	}
}

// giveBack requeues d and the rest of it, deliveries that came for a
// consumer cancelled meanwhile (Cancel): the application never sees them.
// An auto-ack consumer's are dropped, settled already; on a connection
// that is closing the settle fails and the broker takes them back anyway.
func (cs *Consumer) giveBack(ch *Channel, d *wire.Delivery, it wire.DeliveryIter) {
	if cs.autoAck {
		return
	}
	for {
		_ = ch.settle(wire.SettleRequeue, d.Tag, d.Tag, 0)
		if !it.Next(d) {
			return
		}
	}
}

// intern returns s if b spells it, else string(b) remembered in *s: a run
// of deliveries with the same exchange or routing key allocates once.
func intern(s *string, b []byte) string {
	if string(b) != *s {
		*s = string(b)
	}
	return *s
}

// deliverBatch hands one DELIVER frame's deliveries to a ConsumeBatch
// handler without copying (reader goroutine), then releases them.
func (cs *Consumer) deliverBatch(ch *Channel, it wire.DeliveryIter) {
	var d wire.Delivery
	select {
	case <-cs.done:
		if it.Next(&d) {
			cs.giveBack(ch, &d, it)
		}
		return
	default:
	}
	ds := cs.scratch[:0]
	for it.Next(&d) {
		ds = append(ds, Delivery{
			Tag: d.Tag, Redelivered: d.Flags&wire.Redelivered != 0, DeliveryCount: d.DeliveryCount,
			FailedCount: d.FailedCount, Persistent: d.Flags&wire.DeliveredPersistent != 0, Priority: d.Priority,
			Exchange: intern(&cs.lastEx, d.Exchange), RoutingKey: intern(&cs.lastRK, d.RoutingKey),
			Body: d.Body[:len(d.Body):len(d.Body)], rawProps: d.Properties[:len(d.Properties):len(d.Properties)], ch: ch,
		})
	}
	cs.scratch = ds
	if len(ds) > 0 {
		cs.batch(ds)
	}
	for i := range ds {
		if poisonReleased {
			poison(ds[i].Body)
			poison(ds[i].rawProps)
		}
		ds[i].Body, ds[i].rawProps = nil, nil // do not pin the buffer
	}
}

func poison(b []byte) {
	for i := range b {
		b[i] = 0xDB
	}
}
