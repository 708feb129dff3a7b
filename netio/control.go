package netio

// Control runs: a connection's control-plane requests handled off its
// event loop, a run at a time, its socket paused while too much waits
// behind a run (gateCtlRead, startControl, runControl).

import (
	"errors"
	"strconv"

	"github.com/panjf2000/gnet/v2"
	"github.com/warren-mq/warren/broker"
	"github.com/warren-mq/warren/wire"
	"golang.org/x/sys/unix"
)

// Control-plane requests (declares, deletes, purges, binds, subscribes,
// cancels) can cost time proportional to the topology (each declare or
// bind rebuilds the routing view), so they are not worked through on the
// event loop, where a storm of them would hold up every other connection
// of that loop: deliveries, confirms and heartbeats. The loop hands a run
// of up to ctlBatchMax of them to a goroutine and reads nothing more from
// the connection until it is done (so the connection's frames keep their
// order); the goroutine wakes the loop to go on.
//
// A client may pipeline as many control requests as it likes: while more
// than ctlPauseBytes of its frames wait in the inbound buffer, the broker
// stops reading its socket (TCP holds the rest back in the client) and
// reads again once a run has taken the buffer back under ctlPauseBytes, or
// it holds no whole frame to work on. A
// run takes at least enough frames to bring the buffer back under
// ctlPauseBytes, so what gnet reads when it re-arms the socket by itself
// (once per write that had to wait, 256 KiB at most) cannot pile up from
// run to run: the inbound buffer stays within ctlPauseBytes plus a few
// reads and a frame, however much the client writes.
const (
	ctlBatchMax   = 256
	ctlPauseBytes = 1 << 20 // buffered behind a running batch before the socket is paused
)

// gateCtlRead stops reading the socket while more than ctlPauseBytes wait
// in the inbound buffer behind a control run, and reads it again once
// they do not. Loop goroutine.
func (c *conn) gateCtlRead() {
	n := c.gc.InboundBuffered()
	if int64(n) > c.ctlPeak.Load() {
		c.ctlPeak.Store(int64(n))
	}
	if n > ctlPauseBytes {
		c.ctlPaused = true
		// Again each time: gnet re-arms reading when a write drains.
		if !c.stopReading() && n > c.blockedInboundCap() {
			// Only where reads cannot be paused (pause_other.go).
			c.srv.log.Warn("closing a connection that pipelined more than its inbound buffer may hold", "conn", c.id, "buffered", n)
			c.closeWith(wire.ResourceLimit, "over "+strconv.Itoa(c.blockedInboundCap())+" bytes of requests sent ahead of their answers, and this broker cannot pause reading a connection (built without gnet's default Linux poller): wait for answers before sending more")
		}
		return
	}
	c.resumeCtlRead()
}

// needMore is onTraffic's answer when the inbound buffer holds no whole
// frame: the socket must be read, so a pause for control runs ends.
func (c *conn) needMore() gnet.Action {
	c.resumeCtlRead()
	return gnet.None
}

// resumeCtlRead ends a pause for control runs (not one for the memory
// alarm). Loop goroutine.
func (c *conn) resumeCtlRead() {
	if !c.ctlPaused {
		return
	}
	c.ctlPaused = false
	if !c.blocked.Load() {
		if err := c.setReadInterest(true); err != nil && !errors.Is(err, unix.ENOENT) && !errors.Is(err, unix.EBADF) {
			c.srv.log.Debug("cannot resume reading", "conn", c.id, "err", err)
		}
	}
}

func isControl(t wire.Type) bool {
	switch t {
	case wire.TypeExchangeDeclare, wire.TypeExchangeDelete, wire.TypeQueueDeclare, wire.TypeQueueDelete,
		wire.TypeQueuePurge, wire.TypeBind, wire.TypeUnbind, wire.TypeSubscribe, wire.TypeCancel:
		return true
	}
	return false
}

// startControl copies the run of complete control frames at the head of
// the inbound buffer (at least one) and works through them off the loop.
// Loop goroutine.
func (c *conn) startControl(limit uint32) {
	var run []byte
	for n := 0; n < ctlBatchMax || c.gc.InboundBuffered() > ctlPauseBytes; n++ {
		hdr, err := c.gc.Peek(wire.HeaderSize)
		if err != nil {
			break
		}
		size := wire.FrameSize(hdr)
		if uint64(size) > uint64(limit) || c.gc.InboundBuffered() < size {
			break
		}
		buf, err := c.gc.Peek(size)
		if err != nil {
			break
		}
		f, m, err := wire.Split(buf, limit)
		if err != nil || !isControl(f.Type) {
			break // the loop deals with it when it goes on
		}
		run = append(run, buf[:m]...)
		_, _ = c.gc.Discard(m)
	}
	c.ctlBusy.Store(true)
	go c.runControl(run, limit)
}

// runControl handles a run of control frames, as the loop would have, and
// wakes the loop to read on. The loop does not touch the connection's
// frames (nor c.dec) meanwhile.
func (c *conn) runControl(run []byte, limit uint32) {
	// The run's topology changes reach the routing view once, at its end
	// (topology.changedLocked); its replies (and anything else for this
	// connection) wait in the outbox until then.
	c.srv.BeginControlRun()
	c.mu.Lock()
	c.holdOut = true
	c.mu.Unlock()
	defer func() {
		err := c.srv.EndControlRun(c.id)
		if c.state.Load() == stClosing && c.opened.Load() {
			// The connection is ending, and its Down may have reached the
			// shards before the queues this run declared (their shards
			// have them once the run ends): one more Down, after them,
			// deletes an exclusive one with its owner.
			c.srv.downs.Add(1)
			c.srv.Submit(broker.Command{Kind: broker.CmdDown, Owner: c.id})
		}
		if err != nil {
			// The run's changes may not be on disk: its replies must not
			// claim them. The connection goes without them.
			c.srv.log.Error("topology changes not written; closing the connection without its replies", "conn", c.id, "err", err)
			c.state.Store(stClosing)
			c.mu.Lock()
			c.holdOut, c.closed = false, true
			c.out = c.out[:0]
			c.mu.Unlock()
			go c.gc.Close()
			c.ctlBusy.Store(false)
			_ = c.gc.Wake(nil)
			return
		}
		c.mu.Lock()
		c.holdOut = false
		c.flushLocked()
		c.mu.Unlock()
		c.ctlBusy.Store(false)
		_ = c.gc.Wake(nil)
	}()
	for len(run) > 0 && c.state.Load() != stClosing {
		f, n, err := wire.Split(run, limit)
		if err != nil || n == 0 {
			break // checked by startControl
		}
		if err := c.handle(f); err != nil {
			c.fail(f.Channel, err)
		}
		run = run[n:]
	}
}
