package amqp

// Closing a connection: after an error (fail: connection.close for a
// protocol error, its close-ok awaited closeWaitMs), from the broker's
// side (forceClose, evict), once the output is written (closeAfterOutput,
// finishLocked) or at once (closeNow); and the close-ok sent.

import (
	"encoding/binary"
	"errors"
	"time"
)

// fail ends the connection after err: a protocol error is told to the
// client with connection.close (its close-ok is awaited for a second),
// anything else just closes once the output is written.
func (c *conn) fail(err error) {
	var ae *amqpError
	if !errors.As(err, &ae) {
		c.closeAfterOutput() // client closed, evicted, I/O: nobody to tell
		return
	}
	if ae.class == 0 {
		cp := *ae // it may be a shared one (errSyntax)
		ae = &cp
		ae.class, ae.method = c.curClass, c.curMethod
	}
	c.sendConnClose(ae)
}

// sendConnClose sends connection.close and waits (closeWaitMs) for its
// close-ok, reading nothing else. Any goroutine.
func (c *conn) sendConnClose(ae *amqpError) {
	if c.state.Swap(stClosing) == stClosing {
		c.mu.Lock()
		done := c.dead
		c.mu.Unlock()
		if done {
			return
		}
	}
	c.stopped.Store(true)
	c.closeBy.Store(time.Now().UnixMilli() + closeWaitMs)
	c.l.log.Info("AMQP connection error", "conn", c.id, "code", ae.code, "text", ae.text)
	c.mu.Lock()
	c.out = appendClose(c.out, 0, classConnection, 50, ae)
	c.flushLocked()
	c.mu.Unlock()
}

// appendClose appends a close method (connection.close, or channel.close
// on chID) telling ae: reply code and text, and the failing method's class
// and method ids.
func appendClose(dst []byte, chID, class, id uint16, ae *amqpError) []byte {
	b, st := method(dst, chID, class, id)
	b = binary.BigEndian.AppendUint16(b, ae.code)
	b = putShortstr(b, ae.text)
	b = binary.BigEndian.AppendUint16(b, ae.class)
	b = binary.BigEndian.AppendUint16(b, ae.method)
	return endFrame(b, st)
}

// closeWaitMs: how long a connection.close waits for its close-ok.
const closeWaitMs = 1000

// forceClose closes the connection from the broker's side (shutdown).
func (c *conn) forceClose(code uint16, text string) {
	c.sendConnClose(&amqpError{code: code, text: text, conn: true})
	c.closeAfterOutput()
}

// closeAfterOutput closes the socket once what is queued is written. Any
// goroutine.
func (c *conn) closeAfterOutput() {
	c.stopped.Store(true)
	c.state.Store(stClosing)
	c.mu.Lock()
	c.finishLocked()
	c.mu.Unlock()
}

// finishLocked drops further output and closes the socket after what is
// queued. c.mu held.
func (c *conn) finishLocked() {
	if c.dead && c.gc != nil {
		return
	}
	c.flushLocked()
	c.dead = true
	if c.gc == nil {
		c.closeOnOpen = true
		return
	}
	if c.flushing {
		c.closeAfterFlush = true // flushed closes, after our bytes
		return
	}
	_ = c.gc.CloseWithCallback(nil)
}

// closeNow closes the socket without writing what is queued. Any goroutine.
func (c *conn) closeNow() {
	c.stopped.Store(true)
	c.state.Store(stClosing)
	c.mu.Lock()
	c.dead = true
	gc := c.gc
	if gc == nil {
		c.closeOnOpen = true
	}
	c.mu.Unlock()
	if gc != nil {
		_ = gc.Close()
	}
}

// evict closes c, the oldest connection waiting to send its credentials,
// to admit a newer one, telling the client why if it sent its protocol
// header.
func (c *conn) evict() {
	if ok, n := c.l.evictLog.Allow(time.Now()); ok {
		c.l.log.Info("AMQP connection not yet authenticated closed to admit a new one (max_unauthenticated_connections)",
			"max_unauthenticated_connections", c.l.cfg.MaxUnauthenticated, "more_since_last_line", n)
	}
	if c.started.Load() {
		c.sendConnClose(&amqpError{code: resourceError, text: c.l.unauthReason(), class: classConnection, method: 11})
		return
	}
	c.closeNow()
}

func (c *conn) sendCloseOK() {
	c.mu.Lock()
	b, st := method(c.out, 0, classConnection, 51)
	c.out = endFrame(b, st)
	c.flushLocked()
	c.mu.Unlock()
}
