package netio

import (
	"context"
	"errors"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/panjf2000/gnet/v2"
	"github.com/warren-mq/warren/broker"
	"github.com/warren-mq/warren/queue"
	"github.com/warren-mq/warren/wire"
)

// Confirm writes a CONFIRM frame for the batch: one range per run of equal
// codes (Sink).
func (c *conn) Confirm(b *broker.PublishBatch) {
	var ranges [16]wire.ConfirmRange
	rs := ranges[:0]
	start := 0
	for i := 1; i <= len(b.Codes); i++ {
		if i == len(b.Codes) || atomic.LoadUint32(&b.Codes[i]) != atomic.LoadUint32(&b.Codes[start]) {
			rs = append(rs, wire.ConfirmRange{First: b.FirstSeq + uint64(start), Last: b.FirstSeq + uint64(i-1), Code: wire.Code(atomic.LoadUint32(&b.Codes[start]))})
			start = i
		}
	}
	// Counted before the frame is queued: a client that has its confirm
	// must find it in the metrics.
	if !b.Start.IsZero() {
		c.srv.metrics.confirmLatency.UpdateDuration(b.Start)
	}
	c.mu.Lock()
	if !c.closed {
		// As many frames as the ranges need: a frame holds at most 65,535,
		// and within the client's max_frame (a batch whose outcomes
		// alternate has a range per message).
		per := min(wire.MaxConfirmRanges, (int(c.maxFrame)-wire.HeaderSize-2)/wire.ConfirmRangeSize)
		for len(rs) > 0 {
			n := min(len(rs), per)
			c.out = wire.AppendConfirm(c.out, b.Ch, rs[:n])
			rs = rs[n:]
		}
		c.srv.metrics.confirmed.Add(len(b.Codes))
		c.flushLocked()
	}
	c.paidLocked(b.Ch)
	c.mu.Unlock()
}

// send appends one frame and schedules a flush. Safe from any goroutine.
func (c *conn) send(ch uint16, body wire.Body) {
	c.mu.Lock()
	if !c.closed {
		c.out = wire.AppendFrame(c.out, ch, body)
		c.flushLocked()
	}
	c.mu.Unlock()
}

// reasonOf is the text for an ERROR or CLOSE frame: a protocol error's
// reason alone, since its code travels in the frame's own field (err.Error()
// would say "wire: not_found: …", which the client wraps again).
func reasonOf(err error) string {
	var we *wire.Error
	if errors.As(err, &we) {
		return we.Reason
	}
	return err.Error()
}

func (c *conn) sendError(ch uint16, req uint32, code wire.Code, msg string) {
	if len(msg) > 1000 {
		msg = msg[:1000]
	}
	c.send(ch, &wire.ErrorReply{Req: req, Code: code, Message: msg})
}

// Subscribed answers a SUBSCRIBE once its queue has the consumer, or
// forgets the consumer it refused (Sink).
func (c *conn) Subscribed(id queue.ConsumerID, req uint32, code wire.Code, reason string) {
	c.mu.Lock()
	cr := c.byID[id]
	if cr != nil && code != wire.OK {
		delete(c.byID, id)
		if cr.ch.consumers[cr.tag] == cr {
			delete(cr.ch.consumers, cr.tag)
		}
	}
	// Decided and written under one hold of c.mu: nothing of a channel
	// follows its end (PROTOCOL.md §6), and a close in between came first.
	switch {
	case cr == nil, cr.ch.closed, c.closed: // its client discards the answer, and the id may be reused
	case code == wire.OK:
		c.out = wire.AppendFrame(c.out, cr.ch.id, &wire.SubscribeOK{Req: req, ConsumerTag: cr.tag})
		c.flushLocked()
	default:
		if len(reason) > 1000 {
			reason = reason[:1000]
		}
		c.out = wire.AppendFrame(c.out, cr.ch.id, &wire.ErrorReply{Req: req, Code: code, Message: reason})
		c.flushLocked()
	}
	c.mu.Unlock()
}

// Cancelled tells a consumer the broker cancelled it (Sink), and frees its
// tag on the channel, as the client does on CANCELLED: a SUBSCRIBE may
// reuse it at once. A consumer the client cancelled first (its tag freed,
// maybe reused) is told nothing: the CANCELLED would name the tag's new
// consumer.
func (c *conn) Cancelled(id queue.ConsumerID, code wire.Code, reason string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	cr := c.byID[id]
	if cr == nil || cr.ch.closed || cr.ch.consumers[cr.tag] != cr {
		return
	}
	delete(cr.ch.consumers, cr.tag)
	if !c.closed { // written under the lock it was decided with: a channel's close in between came first (PROTOCOL.md §6)
		c.out = wire.AppendFrame(c.out, cr.ch.id, &wire.Cancelled{ConsumerTag: cr.tag, Code: code, Reason: reason})
		c.flushLocked()
	}
}

// ConsumerGone drops what the connection kept for a consumer its queue
// forgot (Sink).
func (c *conn) ConsumerGone(id queue.ConsumerID) {
	c.mu.Lock()
	if cr := c.byID[id]; cr != nil {
		delete(c.byID, id)
		clear(cr.chTags)
	}
	c.mu.Unlock()
}

// flushLocked starts a write of the outbox if none is in flight. One write
// is in flight per connection; what is appended meanwhile goes with the
// next. c.mu must be held.
func (c *conn) flushLocked() {
	if len(c.out) > c.srv.cfg.MaxOutboundBytes && !c.closed {
		c.closed = true
		c.srv.log.Warn("closing connection over its outbound byte cap", "conn", c.id, "bytes", len(c.out))
		c.out = c.out[:0]
		go c.gc.Close()
		return
	}
	if c.flushing || len(c.out) == 0 || (c.holdOut && !c.closed) {
		return
	}
	c.flushing = true
	c.inflight, c.out = c.out, c.spare[:0]
	c.spare = nil
	c.inflightAcks, c.autoAcks = c.autoAcks, c.ackSpare[:0]
	c.ackSpare = nil
	c.lastSend.Store(c.srv.nowMs())
	if err := c.gc.AsyncWrite(c.inflight, c.flushedCB); err != nil {
		c.flushing = false
	}
}

// flushed runs on the loop once the in-flight bytes are in the socket (or
// gnet's buffer). It recycles the buffer, settles the auto-ack deliveries
// that went out, and starts the next write.
func (c *conn) flushed(gc gnet.Conn, err error) error {
	if c.blocked.Load() {
		c.pauseRead() // gnet re-arms reading when a write has to wait
	} else if c.ctlPaused {
		c.stopReading() // the same, but not a publisher's fault: no cap
	}
	c.gnetBuffered.Store(int64(gc.OutboundBuffered()))
	// gnet takes what the socket cannot (its buffer has no bound): a peer
	// that stops reading shows up here. Past the cap it is cut off, rather
	// than let it grow the broker's memory.
	if err == nil && gc.OutboundBuffered() > c.srv.cfg.MaxOutboundBytes {
		c.srv.log.Warn("closing a connection that stopped reading", "conn", c.id, "buffered", gc.OutboundBuffered())
		c.mu.Lock()
		c.closed = true
		c.out, c.inflight, c.flushing = c.out[:0], nil, false
		c.mu.Unlock()
		_ = gc.Close()
		return nil
	}
	c.mu.Lock()
	c.spare, c.inflight = c.inflight[:0], nil
	acks := c.inflightAcks
	c.inflightAcks = nil
	c.flushing = false
	if err == nil {
		c.flushLocked()
	}
	if c.closeAfterFlush && (c.flushing || len(c.out) == 0 || err != nil) {
		c.closeAfterFlush = false
		_ = c.gc.CloseWithCallback(nil) // after the final write just queued
	}
	// Auto-ack deliveries are settled once their bytes are (nearly) in the
	// socket, not when gnet has buffered them: while the output is over
	// autoAckBufferedMax they are held, so a reader that stalls holds at
	// most its window and the queue keeps the rest. A failed write settles
	// nothing: the connection is closing and Down returns them.
	var held []broker.SettleItem
	if err == nil && len(c.heldAcks)+len(acks) > 0 {
		if gc.OutboundBuffered() > autoAckBufferedMax {
			c.heldAcks = append(c.heldAcks, acks...)
			acks = acks[:0]
			c.scheduleAckCheckLocked()
		} else if len(c.heldAcks) > 0 {
			held, c.heldAcks = c.heldAcks, nil
			c.acksHeld.Store(false)
		}
	} else if err != nil {
		acks = acks[:0]
	}
	c.mu.Unlock()
	if len(held) > 0 {
		c.srv.settleAcross(held, len(held)) // the older ones first (auto-acks: one delivery each)
	}
	if len(acks) > 0 {
		c.srv.settleAcross(acks, len(acks)) // copies what it keeps
	}
	c.mu.Lock()
	if c.ackSpare == nil {
		c.ackSpare = acks[:0]
	}
	c.mu.Unlock()
	return nil
}

// autoAckBufferedMax bounds the output gnet may hold for a connection
// (bytes the socket has not taken) while its auto-ack deliveries are still
// settled as written. Past it they wait: a consumer that reads slowly gets
// its window and no more, and the queue keeps the rest.
const autoAckBufferedMax = 256 << 10

// scheduleAckCheckLocked makes sure held auto-acks are looked at again:
// the next write's callback does it, and when nothing is being written
// (the window is full) the tick asks the loop to (ackCheck). c.mu held.
func (c *conn) scheduleAckCheckLocked() { c.acksHeld.Store(true) }

// ackCheck settles held auto-acks once gnet's buffer for the connection is
// back under autoAckBufferedMax. Runs on the connection's loop.
type ackCheck struct{ c *conn }

func (a ackCheck) Run(context.Context) error {
	c := a.c
	c.mu.Lock()
	if c.closed || len(c.heldAcks) == 0 || c.gc.OutboundBuffered() > autoAckBufferedMax {
		c.mu.Unlock()
		return nil
	}
	held := c.heldAcks
	c.heldAcks = nil
	c.acksHeld.Store(false)
	c.gnetBuffered.Store(int64(c.gc.OutboundBuffered()))
	c.mu.Unlock()
	c.srv.settleAcross(held, len(held))
	return nil
}

// Deliver encodes one shard's deliveries for this connection: one DELIVER
// frame per run of deliveries to the same consumer (more where a run would
// pass the connection's max_frame), channel tags assigned in order, all
// under one lock (Sink). Called on the shard goroutine.
//
// A message whose delivery alone would pass max_frame (one published over
// AMQP, whose content frames carry up to its max message size; a client
// that negotiated a smaller max_frame than the publisher's) is not sent:
// the client would end the connection on the frame (frame_too_large),
// and the message, requeued, would do it again at each reconnect. Its
// consumer is cancelled (CANCELLED, frame_too_large) and the message goes
// back to the queue, for a consumer that can take it.
func (c *conn) Deliver(ds []broker.Delivery) {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return // the connection's Down returns them
	}
	var back []broker.SettleItem // to consumers the client cancelled
	var cancels []broker.Command // consumers that cannot take a message (max_frame)
	maxFrame := int(c.maxFrame)
	for start := 0; start < len(ds); {
		id := ds[start].Consumer
		end := start + 1
		for end < len(ds) && ds[end].Consumer == id {
			end++
		}
		cr := c.byID[id]
		if cr == nil || cr.ch.closed {
			start = end
			continue // the channel's cancel returns them
		}
		if cr.cancelled {
			// Made after the client's CANCEL was answered and before its
			// queue applied it (a durable queue's cancel waits for the log):
			// the client expects nothing more for the consumer, so they go
			// back to the queue now, not when the channel closes.
			for _, d := range ds[start:end] {
				back = append(back, broker.SettleItem{Q: cr.q, Consumer: cr.id, Op: wire.SettleRequeue, QTag: d.QTag})
			}
			start = end
			continue
		}
		ch := cr.ch
		frame := len(c.out)
		out, mark := wire.BeginDeliver(c.out, ch.id, cr.tagBytes)
		n := 0
		for i, d := range ds[start:end] {
			msg := d.Msg
			var fl wire.DeliveryFlags
			if d.DeliveryCount > 1 {
				fl |= wire.Redelivered
			}
			if msg.Flags&wire.Persistent != 0 {
				fl |= wire.DeliveredPersistent
			}
			wd := wire.Delivery{Flags: fl, Priority: msg.Priority, DeliveryCount: d.DeliveryCount, FailedCount: d.FailedCount,
				Exchange: short(msg.Exchange()), RoutingKey: short(msg.RoutingKey()), Properties: msg.Props(), Body: msg.Body()}
			size := wire.DeliverySize(&wd)
			if n > 0 && len(out)-frame+size > maxFrame {
				out = mark.End(out, uint32(n))
				c.srv.metrics.delivered.Add(n)
				frame = len(out)
				out, mark = wire.BeginDeliver(out, ch.id, cr.tagBytes)
				n = 0
			}
			if len(out)-frame+size > maxFrame {
				// Alone too large for the client: nothing of it is sent.
				out = out[:frame]
				cr.cancelled = true
				delete(ch.consumers, cr.tag)
				reason := "a message of " + strconv.Itoa(len(msg.Body())) + " bytes does not fit this connection's max_frame (" +
					strconv.Itoa(maxFrame) + " bytes): consumer cancelled, the message stays in the queue"
				out = wire.AppendFrame(out, ch.id, &wire.Cancelled{ConsumerTag: cr.tag, Code: wire.FrameTooLarge, Reason: reason})
				cancels = append(cancels, broker.Command{Kind: broker.CmdCancel, Queue: cr.q, Consumer: cr.id})
				for _, d := range ds[start+i : end] {
					back = append(back, broker.SettleItem{Q: cr.q, Consumer: cr.id, Op: wire.SettleRequeue, QTag: d.QTag})
				}
				if ok, sup := c.srv.bigDeliveryLog.Allow(time.Now()); ok {
					c.srv.log.Warn("consumer cancelled: a message too large for its connection's max_frame (published over AMQP, or with a larger max_frame)",
						"conn", c.id, "consumer", cr.tag, "body_bytes", len(msg.Body()), "max_frame", maxFrame, "suppressed_since_last", sup)
				}
				break
			}
			ch.nextTag++
			wd.Tag = ch.nextTag
			out = wire.AppendDelivery(out, &wd)
			n++
			if cr.autoAck {
				ch.pushTag(tagEntry{state: tagAuto})
				c.autoAcks = append(c.autoAcks, broker.SettleItem{Q: cr.q, Consumer: cr.id, Op: wire.SettleAck, QTag: d.QTag})
			} else {
				ch.pushTag(tagEntry{c: cr, qtag: d.QTag})
				if cr.chTags != nil {
					cr.chTags[d.QTag] = wd.Tag // kept only where leases can expire
				}
			}
		}
		if n > 0 {
			c.out = mark.End(out, uint32(n))
			c.srv.metrics.delivered.Add(n)
		} else {
			c.out = out
		}
		start = end
	}
	c.flushLocked()
	c.mu.Unlock()
	for _, cmd := range cancels {
		c.srv.Submit(cmd) // before the requeues: the queue does not hand them to the consumer again
	}
	c.srv.settleAcross(back, 0)
}

// LeaseExpired tells a consumer a delivery was taken back (Sink).
func (c *conn) LeaseExpired(id queue.ConsumerID, qtag uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	cr := c.byID[id]
	if cr == nil {
		return
	}
	chTag, ok := cr.chTags[qtag]
	if !ok {
		return
	}
	delete(cr.chTags, qtag)
	if c.closed || cr.ch.closed {
		return
	}
	if e := cr.ch.tagAt(chTag); e != nil && e.state == tagLive {
		e.state = tagExpired
	}
	c.out = wire.AppendFrame(c.out, cr.ch.id, &wire.LeaseExpired{ConsumerTag: cr.tag, Tags: []uint64{chTag}})
	c.flushLocked()
}

// short cuts a stored name to the 255 bytes of a frame's short string, as
// the AMQP front writes it: a message stored before the admin API's
// publish bounded its routing key may hold a longer one, which
// wire.AppendDelivery would panic on.
func short(b []byte) []byte {
	if len(b) > wire.MaxNameLen {
		return b[:wire.MaxNameLen]
	}
	return b
}
