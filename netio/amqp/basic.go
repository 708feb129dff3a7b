package amqp

// The basic class: basic.qos, consume, cancel, publish (its content:
// publish.go), get (onGet, getDone), ack, nack, reject and recover (settle
// turns delivery tags into queue tags).

import (
	"strconv"
	"time"

	"github.com/warren-mq/warren/broker"
	"github.com/warren-mq/warren/netio"
	"github.com/warren-mq/warren/queue"
	"github.com/warren-mq/warren/wire"
)

func (c *conn) onBasic(ch *channel, id uint16, r *reader) error {
	switch id {
	case 10: // qos
		size, count, global := r.u32(), r.u16(), r.bitAt()
		if r.err != nil {
			return errSyntax
		}
		if global {
			// RabbitMQ 3.x: a prefetch shared by the channel's consumers,
			// beside each consumer's own (global=false).
			if size != 0 {
				return connErr(notImplemented, "NOT_IMPLEMENTED - prefetch_size!=0 with global=true ("+strconv.FormatUint(uint64(size), 10)+")")
			}
			c.mu.Lock()
			ch.globalMax = count
			c.flushStashLocked(ch)
			c.mu.Unlock()
			c.reply(ch.id, classBasic, 11, nil)
			return nil
		}
		ch.prefetch, ch.prefBytes = count, size
		c.reply(ch.id, classBasic, 11, nil)
		return nil
	case 20: // consume
		return c.onConsume(ch, r)
	case 30: // cancel
		tag := r.shortstr()
		noWait := r.bitAt()
		if r.err != nil {
			return errSyntax
		}
		c.mu.Lock()
		if rc := ch.reply; rc != nil && rc.tag == tag {
			ch.reply = nil
			c.mu.Unlock()
			c.dropReply(rc)
			if !noWait {
				c.reply(ch.id, classBasic, 31, func(b []byte) []byte { return putShortstr(b, tag) })
			}
			return nil
		}
		cr := ch.consumers[tag]
		delete(ch.consumers, tag)
		var back []broker.SettleItem
		if cr != nil {
			back = c.unstashLocked(ch, cr, nil)
		}
		c.mu.Unlock()
		if cr != nil {
			if len(back) > 0 { // never sent: back to the queue
				c.srv.Submit(broker.Command{Kind: broker.CmdSettle, Settles: back})
			}
			c.srv.Submit(broker.Command{Kind: broker.CmdCancel, Queue: cr.q, Consumer: cr.id})
		}
		if !noWait {
			c.reply(ch.id, classBasic, 31, func(b []byte) []byte { return putShortstr(b, tag) })
		}
		return nil
	case 40: // publish
		r.u16()
		exB := r.take(int(r.u8()))
		key := r.take(int(r.u8()))
		mandatory, immediate := r.bitAt(), r.bitAt()
		if r.err != nil {
			return errSyntax
		}
		if immediate {
			return connErr(notImplemented, "NOT_IMPLEMENTED - immediate=true")
		}
		// No allocation per publish: the exchange name is the last one's
		// string while it is the same, the key is copied out of the frame
		// buffer into the channel's scratch, and pending is the channel's.
		if string(exB) != ch.lastEx {
			ch.lastEx = string(exB)
		}
		ch.names = append(ch.names[:0], key...)
		ch.pubBuf = pending{exchange: ch.lastEx, key: ch.names, mandatory: mandatory}
		ch.pub = &ch.pubBuf
		return nil
	case 70:
		return c.onGet(ch, r)
	case 100, 110: // recover-async, recover
		requeue := r.bitAt()
		if r.err != nil {
			return errSyntax
		}
		if !requeue { // as RabbitMQ: redelivery to the same consumer is not offered
			return connErr(notImplemented, "NOT_IMPLEMENTED - requeue=false")
		}
		c.recover(ch)
		if id == 110 {
			c.reply(ch.id, classBasic, 111, nil)
		}
		return nil
	case 80, 90, 120: // ack, reject, nack
		tag := r.u64()
		var multiple, requeue bool
		switch id {
		case 80:
			multiple = r.bitAt()
		case 90:
			requeue = r.bitAt()
		case 120:
			multiple, requeue = r.bitAt(), r.bitAt()
		}
		if r.err != nil {
			return errSyntax
		}
		op := wire.SettleAck
		if id != 80 {
			op = wire.SettleReject
			if requeue {
				op = wire.SettleRequeue
			}
		}
		return c.settle(ch, tag, multiple, op)
	}
	return connErr(commandInvalid, "COMMAND_INVALID - unknown basic method "+strconv.Itoa(int(id)))
}

// recover returns every unacked delivery of the channel to its queue (to
// be redelivered, with redelivered set); their tags are forgotten.
func (c *conn) recover(ch *channel) {
	var items []broker.SettleItem
	c.mu.Lock()
	for i := range ch.tags {
		if e := &ch.tags[i]; e.live && e.q != nil {
			items = append(items, broker.SettleItem{Q: e.q, Consumer: e.cid, Op: wire.SettleRequeue, QTag: e.qtag})
		}
	}
	ch.tags = ch.tags[:0]
	ch.tagBase = ch.nextTag + 1
	ch.inflight = 0
	items = c.unstashLocked(ch, nil, items)
	c.mu.Unlock()
	requeueOrder(items)
	if len(items) > 0 {
		c.srv.Submit(broker.Command{Kind: broker.CmdSettle, Settles: items})
	}
}

// settle translates channel delivery tags into queue tags.
func (c *conn) settle(ch *channel, tag uint64, multiple bool, op wire.SettleOp) error {
	var items []broker.SettleItem
	c.mu.Lock()
	if ch.closing {
		// A shard closed the channel since handle looked (its tags are
		// gone, returned by its release): dropped, as on a closing channel.
		c.mu.Unlock()
		return nil
	}
	first, last := tag, tag
	if multiple {
		first = ch.tagBase
		if tag == 0 {
			last = ch.nextTag
		}
	}
	if !multiple && (tag < ch.tagBase || tag > ch.nextTag || !ch.tags[tag-ch.tagBase].live) {
		c.mu.Unlock()
		return chErr(preconditionFailed, "PRECONDITION_FAILED - unknown delivery tag "+strconv.FormatUint(tag, 10))
	}
	if last > ch.nextTag {
		c.mu.Unlock()
		return chErr(preconditionFailed, "PRECONDITION_FAILED - unknown delivery tag "+strconv.FormatUint(tag, 10))
	}
	for t := first; t <= last && t >= ch.tagBase; t++ {
		e := &ch.tags[t-ch.tagBase]
		if e.live {
			e.live = false
			if e.gated {
				e.gated = false
				ch.inflight--
			}
			if e.q != nil {
				items = append(items, broker.SettleItem{Q: e.q, Consumer: e.cid, Op: op, QTag: e.qtag})
				if ch.tx && e.get {
					ch.txGets = append(ch.txGets, len(ch.txSettles)+len(items)-1)
				}
			}
		}
	}
	// Drop the settled head.
	n := 0
	for n < len(ch.tags) && !ch.tags[n].live {
		n++
	}
	if n > 0 {
		ch.tags = append(ch.tags[:0], ch.tags[n:]...)
		ch.tagBase += uint64(n)
	}
	if ch.stashHead < len(ch.stashQ) {
		c.flushStashLocked(ch)
	}
	if ch.tx { // until tx.commit
		ch.txSettles = append(ch.txSettles, items...)
		items = nil
	}
	c.mu.Unlock()
	requeueOrder(items)
	if len(items) > 0 {
		c.srv.Submit(broker.Command{Kind: broker.CmdSettle, Settles: items})
	}
	return nil
}

func (c *conn) onConsume(ch *channel, r *reader) error {
	r.u16()
	qn, tag := ch.queueName(r.shortstr()), r.shortstr()
	_, noAck, exclusive, noWait := r.bitAt(), r.bitAt(), r.bitAt(), r.bitAt()
	args := r.table()
	if r.err != nil {
		return r.err
	}
	if qn == replyQueue {
		return c.onReplyConsume(ch, tag, noAck, noWait)
	}
	if err := c.srv.PermitIn(c.vh(), c.user, netio.PermRead, "queue", qn); err != nil { // permissions (issue 15)
		return err
	}
	var prio int16
	for _, f := range args {
		switch {
		case f.Key != "x-priority":
			return chErr(preconditionFailed, "PRECONDITION_FAILED - unsupported consumer argument '"+f.Key+"' for "+c.rs("queue", qn)+" (only x-priority is mapped)")
		case f.Value.Kind != wire.KindInt:
			return chErr(preconditionFailed, "PRECONDITION_FAILED - invalid arg 'x-priority' for "+c.rs("queue", qn)+": \"expected integer, got "+amqpTypeName(f.Value)+"\"")
		case f.Value.Int < -32768 || f.Value.Int > 32767:
			return chErr(preconditionFailed, "PRECONDITION_FAILED - invalid arg 'x-priority' for "+c.rs("queue", qn)+": \"expected an integer in [-32768, 32767]\"")
		}
		prio = int16(f.Value.Int)
	}
	q := c.srv.LookupQueue(c.qn(qn))
	if q == nil {
		return chErr(notFound, "NOT_FOUND - no queue '"+qn+"' in vhost '"+c.vh()+"'")
	}
	if x := q.ExclusiveTo(); x != 0 && x != c.id {
		return c.errExclusive(qn)
	}
	prefetch := uint32(ch.prefetch)
	if g := uint32(ch.globalMax); g > 0 && !noAck && (prefetch == 0 || g < prefetch) {
		prefetch = g // it can never have more out than the channel
	}
	if max := c.srv.MaxPrefetch(); prefetch == 0 || prefetch > max {
		prefetch = max
	}
	c.mu.Lock()
	if ch.closing || c.dead { // a shard closed it since the frame was read, or the socket is gone: dropped, as on a closing channel
		c.mu.Unlock()
		return nil
	}
	if tag == "" {
		c.ctagSeq++
		tag = "amq.ctag-" + strconv.FormatUint(c.id, 10) + "-" + strconv.Itoa(c.ctagSeq)
	}
	if _, dup := ch.consumers[tag]; dup {
		c.mu.Unlock()
		return connErr(notAllowed, "NOT_ALLOWED - attempt to reuse consumer tag '"+tag+"'")
	}
	if n := len(c.byID); n >= c.srv.MaxConsumersPerConnection() {
		c.mu.Unlock()
		return brokerErr(wire.LimitReached, c.srv.ConsumerLimitReason(n))
	}
	cr := &consumer{id: c.srv.NewConsumerID(), tag: tag, ch: ch, q: q, autoAck: noAck, noWait: noWait}
	if !noWait {
		cr.subscribed = make(chan struct{})
	}
	ch.consumers[tag] = cr
	c.byID[cr.id] = cr
	// Submitted under c.mu, as the channel was found open: OnClose marks
	// the channels closing under it before it submits the connection's
	// Down, so the subscribe goes before the Down or not at all (after
	// it, the queue kept a consumer of a connection that is gone, and
	// what it handed it unacked).
	spec := queue.ConsumerSpec{ID: cr.id, Owner: queue.OwnerID(c.id), Prefetch: prefetch, PrefetchBytes: ch.prefBytes, Priority: prio, Exclusive: exclusive}
	c.srv.Submit(broker.Command{Kind: broker.CmdSubscribe, Queue: q, Sink: c, Spec: spec})
	c.mu.Unlock()
	// consume-ok comes from the queue's shard: the methods behind this
	// one wait for it, so that their replies follow it (a basic.cancel's
	// cancel-ok came first). Off the loop, as basic.get waits.
	for cr.subscribed != nil {
		select {
		case <-cr.subscribed:
			return nil
		case <-time.After(100 * time.Millisecond):
			if c.stopped.Load() {
				return errClientClosed
			}
		}
	}
	return nil
}

// onGet answers basic.get with a consumer of prefetch 1 for one drain of
// the queue's shard: subscribed, then a barrier on that shard; whatever it
// was handed by the barrier is the answer (get-ok), else get-empty. It is
// then cancelled: with its message still held for an ack (a get with
// acks), or with everything returned (no-ack: the message acked first).
func (c *conn) onGet(ch *channel, r *reader) error {
	r.u16()
	qn := ch.queueName(r.shortstr())
	noAck := r.bitAt()
	if r.err != nil {
		return errSyntax
	}
	if err := c.srv.PermitIn(c.vh(), c.user, netio.PermRead, "queue", qn); err != nil { // permissions (issue 15)
		return err
	}
	q := c.srv.LookupQueue(c.qn(qn))
	if q == nil {
		return chErr(notFound, "NOT_FOUND - no queue '"+qn+"' in vhost '"+c.vh()+"'")
	}
	if x := q.ExclusiveTo(); x != 0 && x != c.id {
		return c.errExclusive(qn)
	}
	cr := &consumer{id: c.srv.NewConsumerID(), ch: ch, q: q, autoAck: noAck, noWait: true, get: make(chan struct{})}
	c.mu.Lock()
	if ch.closing || c.dead { // as in onConsume
		c.mu.Unlock()
		return nil
	}
	if n := len(c.byID); n >= c.srv.MaxConsumersPerConnection() { // a get's message unacked keeps its consumer
		c.mu.Unlock()
		return brokerErr(wire.LimitReached, c.srv.ConsumerLimitReason(n))
	}
	c.byID[cr.id] = cr
	// Under c.mu, as onConsume's: before the connection's Down or not at
	// all (after it, the get was handed the queue's head for nobody, and
	// its consumer cancelled holding it).
	c.srv.Submit(broker.Command{Kind: broker.CmdSubscribe, Queue: q, Sink: c, Spec: queue.ConsumerSpec{ID: cr.id, Owner: queue.OwnerID(c.id), Prefetch: 1, Get: true}})
	c.mu.Unlock()
	// On one node the consumer is cancelled before the barrier, right
	// after its subscribe handed it the head (if any): nothing reaches it
	// later. Cancelled after the answer, a message published in between
	// went to it and its cancel requeued it counted as a delivery, so a
	// get-empty that no client saw made the message redelivered (and
	// counted towards a delivery limit). A forwarded get (a cluster) is
	// drained by its barrier and cancelled after it, as before.
	local := q.Local()
	if local {
		c.srv.Submit(broker.Command{Kind: broker.CmdCancel, Queue: q, Consumer: cr.id})
	}
	c.srv.Submit(broker.Command{Kind: broker.CmdBarrier, Queue: q, Sink: getDone{c, cr}})
	for waiting := true; waiting; {
		select {
		case <-cr.get:
			waiting = false
		case <-time.After(100 * time.Millisecond):
			if c.stopped.Load() {
				return errClientClosed
			}
		}
	}
	c.mu.Lock()
	got, qtag, lost, lostQTag := cr.got, cr.getQTag, cr.lost, cr.lostQTag
	c.mu.Unlock()
	// Cancelled first: its prefetch of 1 is full while it holds its
	// message, so nothing more is handed to it (an ack first freed it,
	// the queue handed it the next message and the cancel requeued that
	// one, counted as delivered).
	// A message handed over once the channel was closing (lost) went to
	// no client: the cancel returns it, or (cancelled already) a settle.
	if !local {
		c.srv.Submit(broker.Command{Kind: broker.CmdCancel, Queue: q, Consumer: cr.id, Requeue: !got || lost})
	} else if lost {
		c.srv.Submit(broker.Command{Kind: broker.CmdSettle, Settles: []broker.SettleItem{{Q: q, Consumer: cr.id, Op: wire.SettleRequeue, QTag: lostQTag}}})
	}
	if got && noAck {
		c.srv.Submit(broker.Command{Kind: broker.CmdSettle, Settles: []broker.SettleItem{{Q: q, Consumer: cr.id, Op: wire.SettleAck, QTag: qtag}}})
	}
	return nil
}

// getDone answers a basic.get once the queue's shard has handed over
// what it had (a Sink for one CmdBarrier).
type getDone struct {
	*conn
	cr *consumer
}

// Answer runs on the queue's shard.
func (g getDone) Answer(uint64, broker.Result) {
	g.mu.Lock()
	g.cr.answered = true
	if !g.cr.got && !g.cr.ch.closing && !g.dead {
		b, st := method(g.out, g.cr.ch.id, classBasic, 72)
		b = putShortstr(b, "")
		g.out = endFrame(b, st)
		g.flushLocked()
	}
	g.mu.Unlock()
	close(g.cr.get)
}
