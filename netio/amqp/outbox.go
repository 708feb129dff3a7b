package amqp

// The connection's outbox written to the socket, one write in flight
// (flushLocked, flushed), cut off past the outbound byte cap, and the
// auto-ack deliveries settled once their bytes are written (ackCheck).

import (
	"context"
	"time"

	"github.com/panjf2000/gnet/v2"
	"github.com/warren-mq/warren/broker"
)

// flushLocked starts a write of the outbox if none is in flight (one at a
// time; what is appended meanwhile goes with the next); past the outbox cap
// the connection is dropped (resource_limit), so a client that does not
// read cannot make the broker hold more. c.mu held.
func (c *conn) flushLocked() {
	if c.dead {
		return
	}
	if len(c.out)+c.stashBytes > c.srv.MaxOutboundBytes() {
		c.l.log.Warn("closing AMQP connection over its outbound byte cap", "conn", c.id, "bytes", len(c.out))
		c.out = c.out[:0]
		c.dead = true
		c.stopped.Store(true)
		if c.gc != nil {
			_ = c.gc.Close()
		} else {
			c.closeOnOpen = true
		}
		return
	}
	if c.flushing || len(c.out) == 0 || c.gc == nil {
		return
	}
	c.flushing = true
	c.inflight, c.out = c.out, c.spare[:0]
	c.spare = nil
	c.inflightAcks, c.autoAcks = c.autoAcks, c.inflightAcks[:0]
	c.lastSend.Store(time.Now().UnixMilli())
	if err := c.gc.AsyncWrite(c.inflight, c.flushedCB); err != nil {
		c.flushing = false
	}
}

// flushed runs on the loop once the in-flight bytes are in the socket (or
// gnet's buffer): it recycles the buffer, settles the auto-ack deliveries
// that went out and starts the next write.
func (c *conn) flushed(gc gnet.Conn, err error) error {
	if c.paused {
		_ = c.gate.Set(gc, false) // gnet re-arms reading when a write has to wait
	}
	// gnet takes what the socket cannot (its buffer has no bound): a peer
	// that stops reading shows up here, and is cut off past the cap.
	if err == nil && gc.OutboundBuffered() > c.srv.MaxOutboundBytes() {
		c.l.log.Warn("closing an AMQP connection that stopped reading", "conn", c.id, "buffered", gc.OutboundBuffered())
		c.mu.Lock()
		c.dead, c.flushing = true, false
		c.out, c.inflight = c.out[:0], nil
		c.mu.Unlock()
		c.stopped.Store(true)
		_ = gc.Close()
		return nil
	}
	c.mu.Lock()
	c.spare, c.inflight = c.inflight[:0], nil
	acks := c.inflightAcks
	c.inflightAcks = nil
	c.flushing = false
	if err == nil && !c.closeAfterFlush {
		c.flushLocked()
	} else if c.closeAfterFlush && len(c.out) > 0 && err == nil {
		// the final frames appended behind the write in flight
		c.flushing = true
		c.inflight, c.out = c.out, nil
		if gc.AsyncWrite(c.inflight, c.flushedCB) != nil {
			c.flushing = false
		}
	}
	if c.closeAfterFlush && !c.flushing {
		c.closeAfterFlush = false
		_ = gc.CloseWithCallback(nil)
	}
	// Auto-ack deliveries are settled once their bytes are (nearly) in the
	// socket: while gnet holds over autoAckBufferedMax for it they wait,
	// so a stalled reader holds its window and the queue keeps the rest. A
	// failed write settles nothing: the connection's Down returns them.
	var held []broker.SettleItem
	switch {
	case err != nil || c.dead && c.gc == nil:
		acks = acks[:0]
	case gc.OutboundBuffered() > autoAckBufferedMax:
		c.heldAcks = append(c.heldAcks, acks...)
		acks = acks[:0]
		if len(c.heldAcks) > 0 {
			c.acksHeld.Store(true)
		}
	case len(c.heldAcks) > 0:
		held, c.heldAcks = c.heldAcks, nil
		c.acksHeld.Store(false)
	}
	c.mu.Unlock()
	if len(held) > 0 {
		c.srv.Submit(broker.Command{Kind: broker.CmdSettle, Settles: held})
	}
	if len(acks) > 0 {
		c.srv.Submit(broker.Command{Kind: broker.CmdSettle, Settles: acks}) // copied by the broker
	}
	c.mu.Lock()
	if c.inflightAcks == nil {
		c.inflightAcks = acks[:0]
	}
	c.mu.Unlock()
	return nil
}

// autoAckBufferedMax bounds the output gnet may hold for a connection
// while its auto-ack deliveries are still settled as written.
const autoAckBufferedMax = 256 << 10

// ackCheck settles held auto-acks once gnet's buffer for the connection is
// back under autoAckBufferedMax. Runs on the connection's loop (the tick
// asks for it).
type ackCheck struct{ c *conn }

func (a ackCheck) Run(context.Context) error {
	c := a.c
	c.mu.Lock()
	if c.dead || len(c.heldAcks) == 0 || c.gc.OutboundBuffered() > autoAckBufferedMax {
		c.mu.Unlock()
		return nil
	}
	held := c.heldAcks
	c.heldAcks = nil
	c.acksHeld.Store(false)
	c.mu.Unlock()
	c.srv.Submit(broker.Command{Kind: broker.CmdSettle, Settles: held})
	return nil
}

// reply sends a method whose arguments fill appends (nil: none). On a
// channel, only its close-ok goes out once it is closing or gone: a
// shard's channel.close may overtake the method a reply answers, and a
// client takes nothing else on a channel after its close (amqp091-go
// closes the connection on a method for a channel it let go). Decided
// under the lock the reply is written with; the loop's channel of an id
// is the one its methods are on (only the loop opens and frees them).
func (c *conn) reply(chID uint16, class, id uint16, fill func([]byte) []byte) {
	c.mu.Lock()
	if ch := c.channels[chID]; chID == 0 || class == classChannel && id == 41 || ch != nil && !ch.closing {
		c.replyLocked(chID, class, id, fill)
	}
	c.mu.Unlock()
}

// replyTo is reply from a shard, to a method on ch: nothing if ch is
// closing, or is no longer the channel of its id (the client closed it,
// and may have opened another on the id).
func (c *conn) replyTo(ch *channel, class, id uint16, fill func([]byte) []byte) {
	c.mu.Lock()
	if !ch.closing && c.channels[ch.id] == ch {
		c.replyLocked(ch.id, class, id, fill)
	}
	c.mu.Unlock()
}

// replyLocked writes a reply. c.mu held.
func (c *conn) replyLocked(chID uint16, class, id uint16, fill func([]byte) []byte) {
	b, st := method(c.out, chID, class, id)
	if fill != nil {
		b = fill(b)
	}
	c.out = endFrame(b, st)
	c.flushLocked()
}
