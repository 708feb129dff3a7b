package amqp

// The connection as a broker Sink: confirms, deliveries (and those
// waiting for the channel-wide prefetch: the stash), and consumers'
// lives, called from shard goroutines.

import (
	"encoding/binary"
	"sync/atomic"

	"github.com/warren-mq/warren/broker"
	"github.com/warren-mq/warren/queue"
	"github.com/warren-mq/warren/wire"
)

// Sink: the broker's effects, from shard goroutines.

// Confirm sends basic.ack or basic.nack for a publish in confirm mode.
func (c *conn) Confirm(b *broker.PublishBatch) {
	if c.unconfirmed.Add(-1) < int64(c.l.cfg.MaxUnconfirmed) && c.waitConfirm.CompareAndSwap(true, false) {
		_ = c.gc.Wake(nil) // the loop reads on (c.gc was set before the publish)
	}
	seq, gen := b.FirstSeq&(1<<40-1), b.FirstSeq>>40
	if seq == 0 {
		return // not in confirm mode
	}
	code := atomic.LoadUint32(&b.Codes[0])
	c.mu.Lock()
	defer c.mu.Unlock()
	ch := c.channels[b.Ch]
	if c.dead || ch == nil || ch.gen&(1<<24-1) != gen || ch.closing { // FirstSeq keeps the generation's low 24 bits
		return
	}
	if ch.tx { // seq is its commit's
		c.txConfirmedLocked(ch, seq)
		return
	}
	id := uint16(80)
	if code != 0 {
		id = 120
	}
	out, st := method(c.out, b.Ch, classBasic, id)
	out = binary.BigEndian.AppendUint64(out, seq)
	out = append(out, 0)
	c.out = endFrame(out, st)
	c.flushLocked()
}

// Deliver writes basic.deliver with its content for each delivery.
func (c *conn) Deliver(ds []broker.Delivery) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.dead {
		return // the connection's Down returns them
	}
	sent := 0
	for i := range ds {
		d := &ds[i]
		cr := c.byID[d.Consumer]
		if cr == nil {
			continue
		}
		if cr.ch.closing {
			if cr.get != nil && !cr.answered && !cr.lost {
				// A get's message handed over after its channel's release,
				// which did not know of it: onGet returns it.
				cr.lost, cr.lostQTag = true, d.QTag
			}
			continue // the channel's cancel returns them
		}
		ch := cr.ch
		if cr.get != nil {
			if cr.got || cr.answered {
				continue // its cancel (requeue) returns it
			}
			cr.got = true
			ch.nextTag++
			cr.getTag, cr.getQTag = ch.nextTag, d.QTag
			ch.tags = append(ch.tags, tagEntry{q: cr.q, cid: cr.id, qtag: d.QTag, live: !cr.autoAck, get: true})
			b, st := method(c.out, ch.id, classBasic, 71)
			b = binary.BigEndian.AppendUint64(b, ch.nextTag)
			b = append(b, boolByte(d.DeliveryCount > 1))
			b = putShortstr(b, string(d.Msg.Exchange()))
			b = putShortstr(b, string(d.Msg.RoutingKey()))
			b = binary.BigEndian.AppendUint32(b, uint32(max(cr.q.ReadyCount(), 0)))
			b = endFrame(b, st)
			c.out = c.appendContent(b, ch.id, d.Msg, d.DeliveryCount)
			sent++
			continue
		}
		if !cr.autoAck && ch.globalMax > 0 && (ch.inflight >= int(ch.globalMax) || ch.stashHead < len(ch.stashQ)) {
			// Past the channel-wide prefetch: encoded now, sent on an ack.
			n := len(ch.stash)
			var tagAt int
			ch.stash, tagAt = c.appendDeliver(ch.stash, ch, cr, 0, d)
			ch.stashQ = append(ch.stashQ, stashed{off: n, end: len(ch.stash), tagAt: tagAt, cr: cr, qtag: d.QTag})
			c.stashBytes += len(ch.stash) - n
			continue
		}
		ch.nextTag++
		if cr.autoAck {
			ch.tags = append(ch.tags, tagEntry{})
			c.autoAcks = append(c.autoAcks, broker.SettleItem{Q: cr.q, Consumer: cr.id, Op: wire.SettleAck, QTag: d.QTag})
		} else {
			ch.tags = append(ch.tags, tagEntry{q: cr.q, cid: cr.id, qtag: d.QTag, live: true, gated: true})
			ch.inflight++
		}
		if cr.autoAck && len(ch.tags) == 1 {
			ch.tags, ch.tagBase = ch.tags[:0], ch.nextTag+1
		}
		c.out, _ = c.appendDeliver(c.out, ch, cr, ch.nextTag, d)
		sent++
	}
	c.delivered.Add(uint64(sent))
	c.flushLocked()
}

// appendDeliver appends basic.deliver with its content; tagAt is where
// its delivery tag is.
func (c *conn) appendDeliver(b []byte, ch *channel, cr *consumer, tag uint64, d *broker.Delivery) (_ []byte, tagAt int) {
	b, st := method(b, ch.id, classBasic, 60)
	b = putShortstr(b, cr.tag)
	tagAt = len(b)
	b = binary.BigEndian.AppendUint64(b, tag)
	b = append(b, boolByte(d.DeliveryCount > 1))
	b = putShortstr(b, string(d.Msg.Exchange()))
	b = putShortstr(b, string(d.Msg.RoutingKey()))
	b = endFrame(b, st)
	return c.appendContent(b, ch.id, d.Msg, d.DeliveryCount), tagAt
}

// flushStashLocked sends the deliveries waiting for the channel-wide
// prefetch that it now lets through. c.mu held.
func (c *conn) flushStashLocked(ch *channel) {
	sent := false
	for ch.stashHead < len(ch.stashQ) && (ch.globalMax == 0 || ch.inflight < int(ch.globalMax)) {
		s := &ch.stashQ[ch.stashHead]
		ch.stashHead++
		c.stashBytes -= s.end - s.off
		if s.dead || ch.closing {
			continue
		}
		ch.nextTag++
		binary.BigEndian.PutUint64(ch.stash[s.tagAt:], ch.nextTag)
		ch.tags = append(ch.tags, tagEntry{q: s.cr.q, cid: s.cr.id, qtag: s.qtag, live: true, gated: true})
		ch.inflight++
		c.out = append(c.out, ch.stash[s.off:s.end]...)
		c.delivered.Add(1)
		sent = true
	}
	if ch.stashHead == len(ch.stashQ) {
		ch.stash, ch.stashQ, ch.stashHead = ch.stash[:0], ch.stashQ[:0], 0
	}
	if sent && !c.dead {
		c.flushLocked()
	}
}

// unstashLocked takes back the waiting deliveries of cr (nil: all of the
// channel's), appending to items the settles that return them to their
// queues. c.mu held.
func (c *conn) unstashLocked(ch *channel, cr *consumer, items []broker.SettleItem) []broker.SettleItem {
	for i := ch.stashHead; i < len(ch.stashQ); i++ {
		s := &ch.stashQ[i]
		if s.dead || (cr != nil && s.cr != cr) {
			continue
		}
		s.dead = true
		items = append(items, broker.SettleItem{Q: s.cr.q, Consumer: s.cr.id, Op: wire.SettleRequeue, QTag: s.qtag})
	}
	if cr == nil {
		c.resetStashLocked(ch)
	}
	return items
}

// resetStashLocked forgets the channel's waiting deliveries. c.mu held.
func (c *conn) resetStashLocked(ch *channel) {
	for i := ch.stashHead; i < len(ch.stashQ); i++ {
		c.stashBytes -= ch.stashQ[i].end - ch.stashQ[i].off
	}
	ch.stash, ch.stashQ, ch.stashHead = nil, nil, 0
}

// forgetStashedLocked drops the waiting deliveries of consumer id (the
// broker cancelled it, or took one back: qtag, 0 for all). c.mu held.
func (c *conn) forgetStashedLocked(ch *channel, id queue.ConsumerID, qtag uint64) bool {
	for i := ch.stashHead; i < len(ch.stashQ); i++ {
		if s := &ch.stashQ[i]; !s.dead && s.cr.id == id && (qtag == 0 || s.qtag == qtag) {
			s.dead = true
			if qtag != 0 {
				return true
			}
		}
	}
	return false
}

// Subscribed answers basic.consume.
func (c *conn) Subscribed(id queue.ConsumerID, _ uint32, code wire.Code, reason string) {
	c.mu.Lock()
	cr := c.byID[id]
	if cr != nil && cr.subscribed != nil {
		defer close(cr.subscribed) // once its answer is written: onConsume's run goes on
	}
	if cr == nil {
		c.mu.Unlock()
		return
	}
	if code != wire.OK {
		// Forgotten even on a closing channel: the queue never had it,
		// so no ConsumerGone follows, and it counted against
		// max_consumers_per_connection for the connection's life.
		delete(c.byID, id)
		c.dropTagLocked(cr)
	}
	if cr.ch.closing {
		c.mu.Unlock()
		return
	}
	if code != wire.OK {
		c.mu.Unlock()
		ae := brokerErr(code, reason)
		if code == wire.ResourceLocked { // an exclusive consumer, or consumers where one would be
			ae = chErr(accessRefused, "ACCESS_REFUSED - "+c.rs("queue", broker.LocalName(cr.q.Name()))+" in exclusive use")
		}
		ae.class, ae.method = classBasic, 20
		if cr.get != nil { // a basic.get's (its get-empty is not sent: the channel is closing)
			ae.method = 70
		}
		c.closeChannelFromShard(cr.ch, ae)
		return
	}
	c.mu.Unlock()
	if !cr.noWait {
		c.replyTo(cr.ch, classBasic, 21, func(b []byte) []byte { return putShortstr(b, cr.tag) })
	}
}

// dropTagLocked frees cr's consumer tag on its channel if the tag is still
// cr's, and reports whether it was: once the client cancelled cr, it may
// have reused the tag for a new consumer, which a late answer about cr
// must not touch. c.mu held.
func (c *conn) dropTagLocked(cr *consumer) bool {
	if cur := cr.ch.consumers[cr.tag]; cur == nil || cur != cr {
		return false
	}
	delete(cr.ch.consumers, cr.tag)
	return true
}

// closeChannelFromShard closes a channel from a shard goroutine: the
// channel is claimed and channel.close sent at once (a client's close read
// after it is answered as one that crossed it); the consumers' cancels
// are submitted from another goroutine, since a Sink must not call back
// into the shard that calls it.
func (c *conn) closeChannelFromShard(ch *channel, ae *amqpError) {
	if r, ok := c.claimClose(ch, ae); ok {
		go c.submitRelease(r)
	}
}

// Cancelled tells the client the broker cancelled a consumer (a
// basic.consume's; a basic.get's is cancelled silently).
func (c *conn) Cancelled(id queue.ConsumerID, _ wire.Code, _ string) {
	c.mu.Lock()
	cr := c.byID[id]
	if cr == nil || cr.ch.closing {
		c.mu.Unlock()
		return
	}
	owned := c.dropTagLocked(cr) // false: the client cancelled it (basic.cancel), and the tag may be another's now
	c.forgetStashedLocked(cr.ch, id, 0)
	c.mu.Unlock()
	if cr.get != nil || !owned {
		// A basic.get's consumer (its message still unacked when the
		// queue went): no consumer to the client, which has no tag for
		// it; RabbitMQ sends nothing.
		return
	}
	c.replyTo(cr.ch, classBasic, 30, func(b []byte) []byte { return append(putShortstr(b, cr.tag), 1) })
}

// LeaseExpired: a delivery was taken back (consumer timeout); a late ack
// of its tag is ignored.
func (c *conn) LeaseExpired(id queue.ConsumerID, qtag uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	cr := c.byID[id]
	if cr == nil {
		return
	}
	ch := cr.ch
	for i := range ch.tags {
		if e := &ch.tags[i]; e.live && e.cid == id && e.qtag == qtag {
			e.q = nil // settled by the queue: an ack of it sends nothing
			if e.gated {
				e.gated = false
				ch.inflight--
				c.flushStashLocked(ch)
			}
			return
		}
	}
	c.forgetStashedLocked(ch, id, qtag)
}

// ConsumerGone forgets a consumer.
func (c *conn) ConsumerGone(id queue.ConsumerID) {
	c.mu.Lock()
	if cr := c.byID[id]; cr != nil {
		c.forgetStashedLocked(cr.ch, id, 0)
	}
	delete(c.byID, id)
	c.mu.Unlock()
}

func boolByte(v bool) byte {
	if v {
		return 1
	}
	return 0
}
