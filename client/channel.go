package client

import (
	"context"
	"errors"
	"strconv"
	"sync"

	"github.com/warren-mq/warren/wire"
)

// Channel is a stream of work on a connection with its own publish
// sequence numbers and delivery tags. It is safe for concurrent use.
type Channel struct {
	c  *Conn
	id uint16

	mu          sync.Mutex
	window      *sync.Cond
	reqSeq      uint32
	pending     map[uint32]*call
	unconfirmed int
	outBase     uint64 // sequence number of outstanding[0]
	outstanding []bool // per published sequence number: not yet confirmed
	waiters     map[uint64]chan error
	confirmFn   func(first, last uint64, err error)
	returnFn    func(Return)
	consumers   map[string]*Consumer
	err         error

	// under c.wmu
	nextSeq uint64
	mark    wire.BatchMark
	batchN  uint32
	batchEx string
	batchAt int
	settleQ []wire.Settlement
}

type call struct {
	reply   chan wire.Body
	onReply func(wire.Body) // runs on the reader goroutine, before reply
}

func newChannel(c *Conn, id uint16) *Channel {
	ch := &Channel{c: c, id: id, nextSeq: 1, pending: map[uint32]*call{}, waiters: map[uint64]chan error{}, consumers: map[string]*Consumer{}}
	ch.window = sync.NewCond(&ch.mu)
	return ch
}

// ID is the channel's number on its connection.
func (ch *Channel) ID() uint16 { return ch.id }

// request sends a request frame and waits for its reply.
func (ch *Channel) request(ctx context.Context, build func(req uint32) wire.Body, onReply ...func(wire.Body)) (wire.Body, error) {
	ch.mu.Lock()
	if ch.err != nil {
		ch.mu.Unlock()
		return nil, ch.err
	}
	ch.reqSeq++
	req := ch.reqSeq
	cl := &call{reply: make(chan wire.Body, 1)}
	if len(onReply) > 0 {
		cl.onReply = onReply[0]
	}
	ch.pending[req] = cl
	ch.mu.Unlock()
	if err := ch.c.sendFrame(ch.id, build(req)); err != nil {
		return nil, err
	}
	select {
	case b := <-cl.reply:
		if b == nil {
			return nil, ch.closedErr()
		}
		if e, ok := b.(*wire.ErrorReply); ok {
			return nil, &wire.Error{Code: e.Code, Reason: e.Message}
		}
		return b, nil
	case <-ctx.Done():
		ch.mu.Lock()
		delete(ch.pending, req)
		ch.mu.Unlock()
		return nil, ctx.Err()
	}
}

func (ch *Channel) closedErr() error {
	ch.mu.Lock()
	defer ch.mu.Unlock()
	if ch.err != nil {
		return ch.err
	}
	return ErrClosed
}

// fail closes the channel's side of things: requests, waiters and
// consumers get err.
func (ch *Channel) fail(err error) {
	ch.mu.Lock()
	if ch.err == nil {
		ch.err = err
	}
	pending := ch.pending
	ch.pending = map[uint32]*call{}
	waiters := ch.waiters
	ch.waiters = map[uint64]chan error{}
	cons := ch.consumers
	ch.consumers = map[string]*Consumer{}
	fn := ch.confirmFn
	ch.unconfirmed = 0
	// The exact sequence numbers nobody confirmed, as ranges.
	var lost [][2]uint64
	for i, out := range ch.outstanding {
		if !out {
			continue
		}
		s := ch.outBase + uint64(i)
		if n := len(lost); n > 0 && lost[n-1][1]+1 == s {
			lost[n-1][1] = s
		} else {
			lost = append(lost, [2]uint64{s, s})
		}
	}
	ch.outstanding = nil
	ch.window.Broadcast()
	ch.mu.Unlock()
	for _, cl := range pending {
		close(cl.reply)
	}
	for _, w := range waiters {
		w <- err
	}
	for _, cs := range cons {
		cs.stop(err)
	}
	if fn != nil {
		for _, r := range lost {
			fn(r[0], r[1], err)
		}
	}
}

// Close closes the channel: its consumers stop and their unacked
// deliveries go back to their queues.
func (ch *Channel) Close() error {
	if err := ch.c.sendFrame(ch.id, &wire.ChannelClose{Code: wire.OK}); err != nil {
		return err
	}
	ch.fail(ErrClosed)
	return nil
}

// ExchangeOptions are an exchange's settings.
type ExchangeOptions struct {
	Durable, AutoDelete, Internal, Passive bool
	AlternateExchange                      string
	Args                                   wire.Table
}

// DeclareExchange creates an exchange or checks an existing one. kind is
// "direct", "topic", "fanout", "headers" or "consistent-hash".
func (ch *Channel) DeclareExchange(ctx context.Context, name, kind string, o ExchangeOptions) error {
	k, ok := wire.ParseExchangeKind(kind)
	if !ok {
		return &wire.Error{Code: wire.InvalidArgument, Reason: "unknown exchange kind " + kind}
	}
	_, err := ch.request(ctx, func(req uint32) wire.Body {
		return &wire.ExchangeDeclare{Req: req, Name: name, Kind: k, Durable: o.Durable, AutoDelete: o.AutoDelete,
			Internal: o.Internal, Passive: o.Passive, Alternate: o.AlternateExchange, Args: o.Args}
	})
	return err
}

// DeleteExchange deletes an exchange.
func (ch *Channel) DeleteExchange(ctx context.Context, name string, ifUnused bool) error {
	_, err := ch.request(ctx, func(req uint32) wire.Body { return &wire.ExchangeDelete{Req: req, Name: name, IfUnused: ifUnused} })
	return err
}

// QueueOptions are a queue's flags; its settings (priorities, TTL, limits,
// dead-lettering…) go in Args under the keys of spec/PROTOCOL.md §7.2.
type QueueOptions struct {
	Durable, Exclusive, AutoDelete, Passive bool
	Args                                    wire.Table
}

// QueueInfo is what QUEUE_DECLARE_OK says.
type QueueInfo struct {
	Name      string
	Messages  uint64
	Consumers uint32
}

// DeclareQueue creates a queue (name "" lets the broker pick one) or checks
// an existing one.
func (ch *Channel) DeclareQueue(ctx context.Context, name string, o QueueOptions) (QueueInfo, error) {
	b, err := ch.request(ctx, func(req uint32) wire.Body {
		return &wire.QueueDeclare{Req: req, Name: name, Durable: o.Durable, Exclusive: o.Exclusive, AutoDelete: o.AutoDelete, Passive: o.Passive, Args: o.Args}
	})
	if err != nil {
		return QueueInfo{}, err
	}
	ok, isOK := b.(*wire.QueueDeclareOK)
	if !isOK {
		return QueueInfo{}, errors.New("client: unexpected reply to QUEUE_DECLARE")
	}
	return QueueInfo{Name: ok.Name, Messages: ok.Messages, Consumers: ok.Consumers}, nil
}

func (ch *Channel) countReply(b wire.Body, err error) (uint64, error) {
	if err != nil {
		return 0, err
	}
	if ok, isOK := b.(*wire.OKReply); isOK {
		return ok.Count, nil
	}
	return 0, errors.New("client: unexpected reply")
}

// DeleteQueue deletes a queue and returns how many messages it held.
func (ch *Channel) DeleteQueue(ctx context.Context, name string, ifUnused, ifEmpty bool) (uint64, error) {
	return ch.countReply(ch.request(ctx, func(req uint32) wire.Body {
		return &wire.QueueDelete{Req: req, Name: name, IfUnused: ifUnused, IfEmpty: ifEmpty}
	}))
}

// PurgeQueue deletes a queue's ready messages and returns how many.
func (ch *Channel) PurgeQueue(ctx context.Context, name string) (uint64, error) {
	return ch.countReply(ch.request(ctx, func(req uint32) wire.Body { return &wire.QueuePurge{Req: req, Name: name} }))
}

// Binding routes from exchange Source to a queue, or to an exchange when
// ToExchange.
type Binding struct {
	Source, Destination, RoutingKey string
	ToExchange                      bool
	Args                            wire.Table
}

// Bind adds a binding.
func (ch *Channel) Bind(ctx context.Context, b Binding) error {
	_, err := ch.request(ctx, func(req uint32) wire.Body {
		return &wire.Bind{Req: req, ToExchange: b.ToExchange, Destination: b.Destination, Source: b.Source, RoutingKey: b.RoutingKey, Args: b.Args}
	})
	return err
}

// Unbind removes a binding.
func (ch *Channel) Unbind(ctx context.Context, b Binding) error {
	_, err := ch.request(ctx, func(req uint32) wire.Body {
		return &wire.Bind{Unbind: true, Req: req, ToExchange: b.ToExchange, Destination: b.Destination, Source: b.Source, RoutingKey: b.RoutingKey, Args: b.Args}
	})
	return err
}

// Message is a message to publish.
type Message struct {
	RoutingKey string
	Body       []byte
	Mandatory  bool // returned (NotifyReturn) if no queue takes it
	Persistent bool
	Priority   uint8
	Props      *wire.Props // optional: content type, message id, expiration, headers…
}

// ErrTooLarge is returned for a message that cannot fit one frame.
var ErrTooLarge = errors.New("client: message larger than the negotiated frame size")

// PublishAsync queues a message for the next batch and returns its
// sequence number on this channel. It blocks while the confirm window is
// full or the broker has paused publishing (FLOW). The confirm arrives at
// NotifyConfirm handlers.
func (ch *Channel) PublishAsync(ctx context.Context, exchange string, m Message) (uint64, error) {
	return ch.publish(ctx, exchange, &m, nil)
}

// nackReason says what a nack means and what to do about it. A CONFIRM
// carries only the code; Publish and PublishBatch, which know the
// exchange, name it (namedNack).
func nackReason(code wire.Code) string {
	switch code {
	case wire.ExchangeNotFound:
		return "the exchange does not exist: declare it before publishing to it"
	case wire.ExchangeInternal:
		return "the exchange is internal: it takes messages only from exchanges bound to it"
	case wire.QueueFull:
		return "a queue that takes this message is full (overflow reject-publish): retry once it has drained"
	case wire.InternalNack:
		return "the broker could not take the message: retry it (in a cluster, the node holding the queue may be down or unreachable: the broker's log names it)"
	}
	return "nacked by the broker"
}

// namedNack puts the exchange's name into a nack that is about it.
func namedNack(err error, exchange string) error {
	var we *wire.Error
	if !errors.As(err, &we) {
		return err
	}
	switch we.Code {
	case wire.ExchangeNotFound:
		return &wire.Error{Code: we.Code, Reason: "exchange " + strconv.Quote(exchange) + " does not exist: declare it before publishing to it"}
	case wire.ExchangeInternal:
		return &wire.Error{Code: we.Code, Reason: "exchange " + strconv.Quote(exchange) + " is internal: it takes messages only from exchanges bound to it"}
	}
	return err
}

// Publish sends a message and waits for the broker's confirm. A nack comes
// back as a *Error with the reason code.
func (ch *Channel) Publish(ctx context.Context, exchange string, m Message) error {
	wait := make(chan error, 1)
	if _, err := ch.publish(ctx, exchange, &m, wait); err != nil {
		return err
	}
	select {
	case err := <-wait:
		return namedNack(err, exchange)
	case <-ctx.Done():
		return ctx.Err()
	}
}

// PublishBatch publishes messages in order and waits for all their confirms.
// It returns the first error (a nack or a lost connection).
func (ch *Channel) PublishBatch(ctx context.Context, exchange string, ms []Message) error {
	waits := make([]chan error, len(ms))
	for i := range ms {
		waits[i] = make(chan error, 1)
		if _, err := ch.publish(ctx, exchange, &ms[i], waits[i]); err != nil {
			return err
		}
	}
	var first error
	for _, w := range waits {
		select {
		case err := <-w:
			if err != nil && first == nil {
				first = namedNack(err, exchange)
			}
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return first
}

func (ch *Channel) publish(ctx context.Context, exchange string, m *Message, wait chan error) (uint64, error) {
	c := ch.c
	if len(m.RoutingKey) > wire.MaxNameLen || len(exchange) > wire.MaxNameLen {
		return 0, &wire.Error{Code: wire.InvalidArgument, Reason: "exchange or routing key longer than 255 bytes"}
	}
	// Flow control, then the confirm window; both give up when ctx ends.
	c.mu.Lock()
	if !c.flowOn && c.err == nil {
		stop := context.AfterFunc(ctx, func() {
			c.mu.Lock()
			c.flowCond.Broadcast()
			c.mu.Unlock()
		})
		for !c.flowOn && c.err == nil && ctx.Err() == nil {
			c.flowCond.Wait()
		}
		stop()
		if ctx.Err() != nil {
			c.mu.Unlock()
			return 0, ctx.Err()
		}
	}
	c.mu.Unlock()
	ch.mu.Lock()
	if ch.unconfirmed >= c.opts.ConfirmWindow && ch.err == nil {
		stop := context.AfterFunc(ctx, func() {
			ch.mu.Lock()
			ch.window.Broadcast()
			ch.mu.Unlock()
		})
		for ch.unconfirmed >= c.opts.ConfirmWindow && ch.err == nil && ctx.Err() == nil {
			ch.window.Wait()
		}
		stop()
		if ctx.Err() != nil {
			ch.mu.Unlock()
			return 0, ctx.Err()
		}
	}
	if ch.err != nil {
		ch.mu.Unlock()
		return 0, ch.err
	}
	ch.unconfirmed++
	ch.mu.Unlock()

	var fl wire.MessageFlags
	if m.Mandatory {
		fl |= wire.Mandatory
	}
	if m.Persistent {
		fl |= wire.Persistent
	}
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if c.closing {
		ch.release(1)
		return 0, c.closedErr()
	}
	c.scratch = wire.AppendProps(c.scratch[:0], m.Props)
	size := 2 + 1 + len(m.RoutingKey) + len(c.scratch) + 4 + len(m.Body)
	limit := int(c.maxFrame) - wire.HeaderSize - 8 - 4 - 1 - len(exchange)
	if size > limit {
		ch.release(1)
		return 0, ErrTooLarge
	}
	if c.open != nil && (c.open != ch || ch.batchEx != exchange || len(c.wbuf)-ch.batchAt+size > int(c.maxFrame) || ch.batchN >= 4096) {
		c.sealLocked()
	}
	if c.open == nil {
		// Settlements queued before this publish go before it, as before
		// any other frame (sendFrame): an ack then a publish reach the
		// broker in that order.
		c.flushSettlesLocked()
		ch.batchAt = len(c.wbuf)
		c.wbuf, ch.mark = wire.BeginPublish(c.wbuf, ch.id, ch.nextSeq, []byte(exchange))
		ch.batchN, ch.batchEx = 0, exchange
		c.open = ch
	}
	seq := ch.nextSeq
	ch.nextSeq++
	ch.batchN++
	ch.mu.Lock()
	if len(ch.outstanding) == 0 {
		ch.outBase = seq
	}
	ch.outstanding = append(ch.outstanding, true)
	ch.mu.Unlock()
	c.wbuf = wire.AppendMessage(c.wbuf, &wire.Message{Flags: fl, Priority: m.Priority, RoutingKey: []byte(m.RoutingKey), Properties: c.scratch[2:], Body: m.Body})
	if wait != nil {
		ch.mu.Lock()
		ch.waiters[seq] = wait
		ch.mu.Unlock()
	}
	c.wcond.Signal()
	return seq, nil
}

func (ch *Channel) release(n int) {
	ch.mu.Lock()
	ch.unconfirmed -= n
	ch.window.Broadcast()
	ch.mu.Unlock()
}

// sealLocked closes the open publish batch. c.wmu must be held.
func (c *Conn) sealLocked() {
	if ch := c.open; ch != nil {
		c.wbuf = ch.mark.End(c.wbuf, ch.batchN)
		c.open = nil
	}
}

// NotifyConfirm registers fn for confirms: each call covers sequence
// numbers first..last with err nil (ack) or the nack's *Error. When the
// connection is lost, fn gets every sequence number still unconfirmed, as
// ranges, with ErrConnectionLost: nothing published is left unreported,
// and nothing is reported twice (a confirm read after the loss is not).
// fn runs on the reader goroutine (or the one that saw the loss) and must
// not block.
func (ch *Channel) NotifyConfirm(fn func(first, last uint64, err error)) {
	ch.mu.Lock()
	ch.confirmFn = fn
	ch.mu.Unlock()
}

// Return is a mandatory message no queue took.
type Return struct {
	Seq      uint64
	Code     wire.Code
	Exchange string
	Message  Message
}

// NotifyReturn registers fn for returned messages. It runs on the reader
// goroutine, before the confirm of the same message.
func (ch *Channel) NotifyReturn(fn func(Return)) {
	ch.mu.Lock()
	ch.returnFn = fn
	ch.mu.Unlock()
}

// WaitConfirms blocks until every message published so far is confirmed.
func (ch *Channel) WaitConfirms(ctx context.Context) error {
	stop := context.AfterFunc(ctx, func() {
		ch.mu.Lock()
		ch.window.Broadcast()
		ch.mu.Unlock()
	})
	defer stop()
	ch.mu.Lock()
	defer ch.mu.Unlock()
	for ch.unconfirmed > 0 && ch.err == nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		ch.window.Wait()
	}
	return ch.err
}

// onConfirm handles one CONFIRM range (reader goroutine).
func (ch *Channel) onConfirm(r wire.ConfirmRange) {
	var err error
	if r.Code != wire.OK {
		err = &wire.Error{Code: r.Code, Reason: nackReason(r.Code)}
	}
	ch.mu.Lock()
	if ch.err != nil {
		// Torn down (by the writer or heartbeater) while the reader still
		// dispatched what it had read: fail reported every unconfirmed
		// number lost, and each is reported once.
		ch.mu.Unlock()
		return
	}
	for s := r.First; s <= r.Last; s++ {
		if s >= ch.outBase && s-ch.outBase < uint64(len(ch.outstanding)) {
			ch.outstanding[s-ch.outBase] = false
		}
	}
	for len(ch.outstanding) > 0 && !ch.outstanding[0] {
		ch.outstanding = ch.outstanding[1:]
		ch.outBase++
	}
	var ws []chan error
	if len(ch.waiters) > 0 {
		for s := r.First; s <= r.Last; s++ {
			if w, ok := ch.waiters[s]; ok {
				ws = append(ws, w)
				delete(ch.waiters, s)
			}
		}
	}
	fn := ch.confirmFn
	ch.mu.Unlock()
	for _, w := range ws {
		w <- err
	}
	if fn != nil {
		fn(r.First, r.Last, err)
	}
	// Only now does the window open: WaitConfirms returns after the
	// handlers have seen every confirm.
	ch.mu.Lock()
	ch.unconfirmed = max(0, ch.unconfirmed-int(r.Last-r.First+1))
	ch.window.Broadcast()
	ch.mu.Unlock()
}

// settle queues a settlement; the writer sends queued ones as ranges.
func (ch *Channel) settle(op wire.SettleOp, first, last uint64, arg uint32) error {
	c := ch.c
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if c.closing {
		return c.closedErr()
	}
	if n := len(ch.settleQ); n > 0 && first != 0 {
		p := &ch.settleQ[n-1]
		if p.Op == op && p.Arg == arg && p.First != 0 && p.Last+1 == first {
			p.Last = last
			c.wcond.Signal()
			return nil
		}
	}
	ch.settleQ = append(ch.settleQ, wire.Settlement{Op: op, First: first, Last: last, Arg: arg})
	c.settles[ch] = struct{}{}
	c.wcond.Signal()
	return nil
}

// flushSettlesLocked turns queued settlements into SETTLE frames.
func (c *Conn) flushSettlesLocked() {
	// A frame holds at most 65,535 entries, and within max_frame (a run
	// of acks and nacks in turn takes an entry each).
	maxFrame := int(c.maxFrame)
	if maxFrame < wire.MinMaxFrame {
		maxFrame = wire.MinMaxFrame // not negotiated yet (no deliveries then; tests)
	}
	per := min(wire.MaxSettleEntries, (maxFrame-wire.HeaderSize-2)/wire.SettleEntrySize)
	for ch := range c.settles {
		q := ch.settleQ
		for len(q) > 0 {
			n := min(len(q), per)
			c.wbuf = wire.AppendSettle(c.wbuf, ch.id, q[:n])
			q = q[n:]
		}
		ch.settleQ = ch.settleQ[:0]
		delete(c.settles, ch)
	}
}
