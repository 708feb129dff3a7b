package amqp

// Holding a connection's reading: at its bound of unconfirmed publishes or
// under the memory alarm (mustWait), reading a close buffered behind the
// held publish all the same (closeBehind), and the socket's read interest
// (holdReading, pause, resume). All of it runs on the connection's loop.

import (
	"encoding/binary"
	"time"

	"github.com/panjf2000/gnet/v2"
)

// mustWait: a publish must not be read now, the connection being at its
// bound of unconfirmed publishes (Confirm wakes it) or the memory alarm on
// (the tick wakes it); reading pauses meanwhile. Loop goroutine.
func (c *conn) mustWait(gc gnet.Conn) bool {
	if c.closeAhead {
		return false // a close is buffered behind it: read on to it
	}
	if n := c.unconfirmed.Load(); n >= int64(c.l.cfg.MaxUnconfirmed) {
		if hook := c.l.hookAtBound.Load(); hook != nil {
			(*hook)(n)
		}
		c.waitConfirm.Store(true)
		if c.unconfirmed.Load() >= int64(c.l.cfg.MaxUnconfirmed) { // else a confirm came in between
			if c.closeBehind(gc) {
				return false
			}
			c.holdReading(gc)
			return true
		}
		c.waitConfirm.Store(false)
	}
	if c.srv.MemoryAlarm() {
		if !c.alarmHeld.Load() {
			c.alarmHeld.Store(true)
			c.sendBlocked(true)
		}
		if c.closeBehind(gc) {
			return false
		}
		c.holdReading(gc)
		return true
	}
	if c.alarmHeld.Load() {
		c.alarmHeld.Store(false)
		c.sendBlocked(false)
	}
	c.aheadUsed = 0 // not held: the next hold may read ahead to a close again
	return false
}

// closeScanBytes bounds what a held connection reads ahead of its held
// publish looking for a close (closeBehind): past it reading pauses, and
// a close further behind waits for the confirms as everything else does.
// It bounds the whole hold too: what is read past it for every close
// found until the connection is no longer held (aheadUsed).
const closeScanBytes = 64 << 10

// isClose: a channel.close or a connection.close frame.
func isClose(typ uint8, chID uint16, p []byte) bool {
	if typ != frameMethod || len(p) < 4 {
		return false
	}
	class, method := binary.BigEndian.Uint16(p), binary.BigEndian.Uint16(p[2:])
	return chID == 0 && class == classConnection && method == 50 || chID != 0 && class == classChannel && method == 40
}

// closeBehind reports whether a channel.close or connection.close is
// buffered behind the frame held at the head (a publish at the
// unconfirmed bound or under the memory alarm): then the frames before it
// are read past the hold, so that the client's close is read, and
// answered, without waiting for confirms that may be long in coming. The
// publishes so read are what the connection has buffered already (at most
// closeScanBytes). Each frame is scanned once while the head is held.
// Loop goroutine.
func (c *conn) closeBehind(gc gnet.Conn) bool {
	if c.closeAhead {
		return true
	}
	total := gc.InboundBuffered()
	if c.scanNeed < 0 || total < c.scanNeed {
		return false // nothing new to scan, or past closeScanBytes
	}
	buf, err := gc.Peek(min(total, closeScanBytes-c.aheadUsed))
	if err != nil {
		return false
	}
	off := c.scanned
	for {
		if len(buf)-off < 7 {
			c.scanNeed = off + 7
			break
		}
		n := binary.BigEndian.Uint32(buf[off+3:])
		if uint64(n)+8 > uint64(c.frameMax) {
			c.scanNeed = -1 // the loop refuses it when it gets there
			return false
		}
		size := int(n) + 8
		if len(buf)-off < size {
			c.scanNeed = off + size
			break
		}
		if isClose(buf[off], binary.BigEndian.Uint16(buf[off+1:]), buf[off+7:off+7+int(n)]) {
			// From here the head moves on: the next hold scans anew,
			// within what is left of closeScanBytes.
			c.aheadUsed += off + size
			c.closeAhead, c.scanned, c.scanNeed = true, 0, 0
			return true
		}
		off += size
		c.scanned = off
	}
	if c.scanNeed > closeScanBytes-c.aheadUsed {
		c.scanNeed = -1
	}
	return false
}

// holdReading holds the frame at the head of a connection held at the
// unconfirmed bound or by the memory alarm: the socket is read on while
// closeBehind may still find a close behind it (less than closeScanBytes
// buffered; its heartbeats are seen arriving), else paused. Loop
// goroutine.
func (c *conn) holdReading(gc gnet.Conn) {
	if c.scanNeed < 0 || gc.InboundBuffered() >= closeScanBytes-c.aheadUsed {
		c.pause(gc)
		return
	}
	if c.paused { // read again: as resume, but still waiting for confirms
		c.paused = false
		c.held.Store(false)
		_ = c.gate.Set(gc, true)
		c.lastRecv.Store(time.Now().UnixMilli())
	}
}

// pause takes the socket out of the loop's read interest (again: gnet
// re-arms it when a write has to wait). Loop goroutine.
func (c *conn) pause(gc gnet.Conn) {
	c.paused = true
	c.held.Store(true)
	_ = c.gate.Set(gc, false)
	if gc.InboundBuffered() > int(c.frameMax)+busyPauseBytes+4<<20 {
		// Only where reads cannot be paused, or a client that keeps the
		// broker writing to it fast.
		c.l.log.Warn("closing an AMQP connection that kept sending while it was not read", "conn", c.id, "buffered", gc.InboundBuffered())
		c.sendConnClose(&amqpError{code: resourceError, text: "RESOURCE_ERROR - kept sending while the broker did not read the connection"})
	}
}

// resume reads the socket again. Loop goroutine.
func (c *conn) resume(gc gnet.Conn) {
	if !c.paused {
		return
	}
	c.paused = false
	c.held.Store(false)
	c.waitConfirm.Store(false)
	_ = c.gate.Set(gc, true)
	// Its heartbeats were not read meanwhile: the clock restarts.
	c.lastRecv.Store(time.Now().UnixMilli())
}

// sendBlocked sends connection.blocked or unblocked, to a client that
// takes them.
func (c *conn) sendBlocked(on bool) {
	if !c.blockedCap {
		return
	}
	if on {
		why := "low on memory" // RabbitMQ's words
		if c.srv.DiskAlarm() {
			why = "low on disk"
		}
		c.reply(0, classConnection, 60, func(b []byte) []byte { return putShortstr(b, why) })
		return
	}
	c.reply(0, classConnection, 61, nil)
}
