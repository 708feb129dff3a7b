package netio

// A publisher blocked by the memory alarm: its socket out of the loop's
// read interest (pause.go) until the alarm clears (block, pauseRead,
// unblock), and closed if its inbound buffer grows past blockedInboundCap
// anyway.

import (
	"errors"

	"github.com/warren-mq/warren/wire"
	"golang.org/x/sys/unix"
)

// block stops reading the connection: it published while the memory alarm
// was on, whether or not it had seen FLOW(active=false) yet (as RabbitMQ
// blocks publishing connections). Its socket leaves the loop's read
// interest, so the kernel's buffers fill and TCP holds the client back;
// what gnet had already read waits in its inbound buffer. Loop goroutine.
func (c *conn) block() {
	if !c.blocked.Load() {
		c.blocked.Store(true)
		c.srv.metrics.blocked.Add(1)
		c.srv.log.Debug("publisher blocked by the memory alarm", "conn", c.id)
		c.srv.notifyChanged()
	}
	c.pauseRead()
}

// blockedInboundCap bounds what a blocked connection's inbound buffer may
// hold: a frame being read when it was blocked, plus the reads gnet makes
// when it re-arms the socket after a write drains (256 KiB each, taken
// back at once). Only a client that also keeps the broker writing to it,
// fast, can get there; it is closed rather than buffered without bound.
func (c *conn) blockedInboundCap() int { return int(c.maxFrame) + 4<<20 }

// pauseRead (re)takes a blocked connection's socket out of the loop's
// read interest, and closes it past blockedInboundCap. gnet re-arms
// reading when a pending write drains or has to wait, so this runs again
// from OnTraffic and from the write callback while blocked.
func (c *conn) pauseRead() {
	c.stopReading()
	if c.gc.InboundBuffered() > c.blockedInboundCap() {
		c.srv.log.Warn("closing a blocked publisher that kept sending", "conn", c.id, "buffered", c.gc.InboundBuffered())
		c.closeWith(wire.ResourceLimit, "kept publishing while blocked by the memory alarm")
	}
}

// stopReading (re)takes the socket out of the loop's read interest, and
// reports whether it could (a socket being closed counts as paused).
// Loop goroutine.
func (c *conn) stopReading() bool {
	if err := c.setReadInterest(false); err != nil && !errors.Is(err, unix.ENOENT) && !errors.Is(err, unix.EBADF) {
		c.srv.log.Debug("cannot pause reading; the inbound buffer holds the frames", "conn", c.id, "err", err)
		return false
	}
	return true
}

// unblock reads the connection again once the alarm is off, and reports
// whether it may be read now. Loop goroutine (OnTraffic, woken by the tick).
func (c *conn) unblock() bool {
	if c.state.Load() == stClosing {
		return true // onTraffic discards
	}
	if c.srv.memoryAlarm() {
		c.pauseRead()
		return false
	}
	if err := c.setReadInterest(true); err != nil && !errors.Is(err, unix.ENOENT) && !errors.Is(err, unix.EBADF) {
		c.srv.log.Debug("cannot resume reading", "conn", c.id, "err", err)
	}
	// Its heartbeats were not read while blocked: the clock restarts.
	c.lastRecv.Store(c.srv.nowMs())
	c.blocked.Store(false)
	c.srv.metrics.blocked.Add(-1)
	c.srv.log.Debug("publisher unblocked", "conn", c.id)
	c.srv.notifyChanged()
	return true
}
