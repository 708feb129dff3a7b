package netio

import (
	"errors"
	"strconv"
	"sync"
	"sync/atomic"

	"github.com/panjf2000/gnet/v2"
	"github.com/warren-mq/warren/broker"
	"github.com/warren-mq/warren/queue"
	"github.com/warren-mq/warren/wire"
)

const (
	stPreamble uint32 = iota
	stAuth
	stAuthPending // credentials being checked off the loop
	stOpen
	stClosing
)

// conn is one client connection. Loop-owned fields are touched only by its
// event loop; the outbox and the channels' tag state are guarded by mu.
type conn struct {
	srv      *Server
	gc       gnet.Conn
	id       uint64
	loopback bool     // the client's address (remote) is a loopback one
	tls      *tlsPeer // set when it came through the TLS listener (tls.go)
	state    atomic.Uint32
	opened   atomic.Bool // it passed AUTH: it may own queues and consumers
	connAdmission

	maxFrame    uint32
	maxChannels uint16
	heartbeatMs atomic.Uint32
	user        string
	vhost       string // the vhost it opened ("" before AUTH, or if it was refused)
	// pubPerm: whether user may publish to each exchange (event loop only).
	pubPerm  PublishPerms
	lastRecv atomic.Int64
	lastSend atomic.Int64
	// blocked: the loop has stopped reading the socket (memory alarm).
	blocked atomic.Bool
	// gnetBuffered: bytes in gnet's outbound buffer (the socket took
	// none of them yet) after the last write, for ConnInfo.
	gnetBuffered atomic.Int64
	acksHeld     atomic.Bool // heldAcks is not empty: the tick checks it

	// ctlBusy: a run of its control requests is being handled off the
	// loop (runControl); the loop reads none of its frames meanwhile.
	ctlBusy atomic.Bool

	// ctlPeak: the most its inbound buffer held while control requests
	// were handled off the loop (tests check the bound).
	ctlPeak atomic.Int64

	// loop-owned
	ctlPaused bool // reading paused: a control run has more than ctlPauseBytes waiting behind it
	epfd      int  // the loop's epoll fd (0: not looked up yet, -1: unavailable)
	dec       wire.Decompressor
	ls        *loopScratch // nil until its first PUBLISH or SETTLE (loopScratch)

	mu       sync.Mutex
	channels map[uint16]*channel
	byID     map[queue.ConsumerID]*consumerRef // every consumer its queue still has
	out      []byte
	spare    []byte
	inflight []byte
	flushing bool
	holdOut  bool // a control run is in progress: no write starts (runControl)
	closed   bool // no more frames are accepted (the outbox still drains)
	// closeAfterFlush: close the socket when the in-flight write and the
	// final frames behind it are out.
	closeAfterFlush bool
	autoAcks        []broker.SettleItem
	heldAcks        []broker.SettleItem // written, not settled: the output is over autoAckBufferedMax
	inflightAcks    []broker.SettleItem
	ackSpare        []broker.SettleItem
	flushedCB       gnet.AsyncCallback
}

// loopScratch is a connection's loop-owned scratch for PUBLISH and SETTLE
// frames (376 bytes, most of them pointers), allocated at the first such
// frame: an idle connection does not carry it, so 10,000 of them give the
// collector less to mark (BENCHMARKS.md, scale).
type loopScratch struct {
	// pubEx: the last publish exchange, as sent and internal (pubExchange).
	pubEx struct {
		set             bool
		local, internal string
	}
	routeBuf []queue.QueueRef
	memo     routeMemo // routes of this PUBLISH batch's keys
	parts    [][]broker.EnqItem
	group    grouper             // groupByQueue's scratch
	settles  []broker.SettleItem // onSettle's scratch (the broker copies what it keeps)
}

// scratch is c's loopScratch, allocated at the first call. Event loop only.
func (c *conn) scratch() *loopScratch {
	if c.ls == nil {
		c.ls = &loopScratch{parts: make([][]broker.EnqItem, c.srv.Shards())}
	}
	return c.ls
}

// consumerRef is one consumer, as its connection knows it. chTags is
// guarded by the connection's mu.
type consumerRef struct {
	id       queue.ConsumerID
	tag      string
	tagBytes []byte
	conn     *conn
	ch       *channel
	q        *broker.Queue
	autoAck  bool
	chTags   map[uint64]uint64 // queue tag → channel tag, for lease expiry
	// cancelled: the client's CANCEL was answered (c.mu). Deliveries the
	// queue makes before it applies the cancel go back to it (Deliver):
	// nothing is sent for the consumer after its OK.
	cancelled bool
}

func (s *Server) newConn(gc gnet.Conn) *conn {
	c := &conn{srv: s, gc: gc, id: s.connSeq.Add(1), channels: map[uint16]*channel{}} // byID: made at the first consumer
	s.initAdmission(c)
	c.flushedCB = c.flushed
	c.lastRecv.Store(s.nowMs())
	c.lastSend.Store(s.nowMs())
	return c
}

// protoError closes the connection with a CLOSE frame carrying err's code.
func (c *conn) protoError(err error) gnet.Action {
	code, reason := wire.CodeOf(err), reasonOf(err)
	if code.Scope() != wire.ScopeConnection {
		code, reason = wire.InternalError, err.Error()
	}
	c.srv.metrics.protocolErrors.Inc()
	c.srv.log.Debug("protocol error", "conn", c.id, "err", err)
	c.closeWith(code, reason)
	return gnet.None
}

// closeWith sends CLOSE and closes the socket once it is written. Safe from
// any goroutine.
func (c *conn) closeWith(code wire.Code, reason string) {
	c.state.Store(stClosing)
	if len(reason) > 1000 {
		reason = reason[:1000]
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return
	}
	c.out = wire.AppendFrame(c.out, 0, &wire.Close{Code: code, Reason: reason})
	c.finishLocked()
}

// finishLocked refuses further frames and closes the socket once
// everything already in the outbox (ending with CLOSE or CLOSE_OK) is
// written. c.mu must be held.
func (c *conn) finishLocked() {
	c.closed = true
	c.flushLocked()
	if c.flushing && len(c.out) > 0 {
		// A write is in flight and ours waits behind it: flushed closes.
		c.closeAfterFlush = true
		return
	}
	_ = c.gc.CloseWithCallback(nil) // queued after the write that carries our frame
}

// onTraffic decodes every complete frame buffered for the connection.
func (c *conn) onTraffic() gnet.Action {
	if c.blocked.Load() && !c.unblock() {
		return gnet.None
	}
	c.lastRecv.Store(c.srv.nowMs())
	if c.ctlBusy.Load() {
		// Its control requests are being worked through off the loop;
		// what follows them waits, and past ctlPauseBytes it waits in the
		// kernel (the socket leaves the read interest).
		c.gateCtlRead()
		return gnet.None
	}
	for {
		switch c.state.Load() {
		case stClosing:
			_, _ = c.gc.Discard(-1)
			return gnet.None
		case stAuthPending:
			return gnet.None // read on once the credentials are checked
		case stPreamble:
			if len(c.srv.cfg.ProxyTrusted) > 0 && !c.proxyDone && !c.proxyStep() {
				return gnet.None
			}
			buf, err := c.gc.Peek(len(wire.Preamble))
			if err != nil {
				return gnet.None
			}
			if _, _, err := wire.CheckPreamble(buf); err != nil {
				c.srv.log.Debug("bad preamble", "conn", c.id)
				c.state.Store(stClosing)
				_ = c.gc.AsyncWrite(wire.Preamble[:], nil)
				_ = c.gc.CloseWithCallback(nil)
				return gnet.None
			}
			_, _ = c.gc.Discard(len(wire.Preamble))
			c.state.Store(stAuth)
			mechs := []string{"PLAIN"}
			if c.tls != nil && c.tls.certCN() != "" {
				mechs = append(mechs, "EXTERNAL")
			}
			c.send(0, &wire.Hello{
				Product: "warren", Version: Version, Mechanisms: mechs,
				Capabilities: []string{"compression.s2", "compression.zstd", wire.CapVhosts},
				MaxFrame:     c.srv.cfg.MaxFrame, MaxChannels: c.srv.cfg.MaxChannels, HeartbeatMs: c.srv.cfg.HeartbeatMs,
			})
			continue
		}
		limit := uint32(wire.HandshakeMaxFrame)
		if c.state.Load() == stOpen {
			limit = c.maxFrame
		}
		hdr, err := c.gc.Peek(wire.HeaderSize)
		if err != nil {
			return c.needMore()
		}
		size := wire.FrameSize(hdr)
		if uint64(size) > uint64(limit) {
			return c.protoError(&wire.Error{Code: wire.FrameTooLarge, Reason: "frame of " + strconv.Itoa(size) + " bytes over the maximum " + strconv.Itoa(int(limit))})
		}
		if c.gc.InboundBuffered() < size {
			return c.needMore()
		}
		buf, err := c.gc.Peek(size)
		if err != nil {
			return c.needMore()
		}
		f, n, err := wire.Split(buf, limit)
		if err != nil {
			return c.protoError(err)
		}
		if f.Type == wire.TypePublish && c.srv.publishMustWait(publishCost(f)) {
			// Publishing while the alarm is on: stop reading until it
			// clears. The frame stays in the inbound buffer.
			c.block()
			return gnet.None
		}
		if isControl(f.Type) && c.state.Load() == stOpen {
			c.startControl(limit)
			c.gateCtlRead()
			return gnet.None
		}
		if !f.Type.Ignorable() {
			if err := c.handle(f); err != nil {
				if a := c.fail(f.Channel, err); a != gnet.None {
					return a
				}
			}
		}
		_, _ = c.gc.Discard(n)
		if c.state.Load() == stClosing {
			return gnet.None
		}
	}
}

// fail answers an error by its scope.
func (c *conn) fail(ch uint16, err error) gnet.Action {
	var we *wire.Error
	if !errors.As(err, &we) {
		we = &wire.Error{Code: wire.InternalError, Reason: err.Error()}
	}
	switch we.Code.Scope() {
	case wire.ScopeChannel:
		c.closeChannel(ch, we.Code, we.Reason)
	default:
		return c.protoError(we)
	}
	return gnet.None
}

var (
	errUnexpected = func(t wire.Type) error {
		return &wire.Error{Code: wire.UnexpectedFrame, Reason: "unexpected " + t.String() + " frame"}
	}
	errChannelNotOpen = &wire.Error{Code: wire.ChannelError, Reason: "channel not open"}
)

// requestErr wraps a request-scoped failure so handle can reply to it.
type requestErr struct {
	req uint32
	err error
}

func (c *conn) handle(f wire.Frame) error {
	if f.Type.Direction()&wire.ClientToServer == 0 || !f.Type.ChannelOK(f.Channel) {
		return errUnexpected(f.Type)
	}
	if f.Type == wire.TypeClose || f.Type == wire.TypeCloseOK || f.Type == wire.TypeHeartbeat {
		if _, err := wire.Decode(f, wire.HandshakeMaxFrame, nil); err != nil {
			return err
		}
	}
	st := c.state.Load()
	if st != stOpen {
		switch {
		case st == stAuth && f.Type == wire.TypeAuth:
			return c.onAuth(f)
		case f.Type == wire.TypeClose:
			c.closeOK() // before OPEN_OK too: CLOSE is answered with CLOSE_OK (PROTOCOL.md §5.5)
			return nil
		}
		return errUnexpected(f.Type)
	}
	switch f.Type {
	case wire.TypeHeartbeat:
		return nil
	case wire.TypeClose:
		c.closeOK()
		return nil
	case wire.TypeCloseOK:
		_ = c.gc.Close()
		return nil
	case wire.TypeAuth, wire.TypeAuthResponse:
		return errUnexpected(f.Type)
	case wire.TypeChannelOpen:
		return c.onChannelOpen(f)
	}
	c.mu.Lock()
	ch := c.channels[f.Channel]
	closed := ch != nil && ch.closed
	c.mu.Unlock()
	if ch == nil {
		return errChannelNotOpen
	}
	if closed {
		// Closed, and its end is sent or held: drop everything but the
		// frames that end it.
		if f.Type != wire.TypeChannelCloseOK && f.Type != wire.TypeChannelClose {
			return nil
		}
		c.mu.Lock()
		defer c.mu.Unlock()
		switch {
		case ch.endForget:
			// The client closed it and waits for our CHANNEL_CLOSE_OK.
		case ch.endFrame != nil:
			// Our CHANNEL_CLOSE is held (answers still owed) and the
			// client closes it too: it gets CHANNEL_CLOSE_OK instead, once
			// the answers are out. A CHANNEL_CLOSE_OK answers nothing yet.
			if f.Type == wire.TypeChannelCloseOK {
				return errUnexpected(f.Type)
			}
			ch.endFrame, ch.endForget = &wire.ChannelCloseOK{}, true
		default:
			// Our CHANNEL_CLOSE went out: its answer, or a crossing close.
			delete(c.channels, f.Channel)
			if f.Type == wire.TypeChannelClose && !c.closed {
				c.out = wire.AppendFrame(c.out, f.Channel, &wire.ChannelCloseOK{})
				c.flushLocked()
			}
		}
		return nil
	}
	switch f.Type {
	case wire.TypePublish:
		return c.onPublish(ch, f)
	case wire.TypeSettle:
		return c.onSettle(ch, f)
	case wire.TypeChannelClose:
		c.closeChannelNow(ch)
		c.mu.Lock()
		c.endChannelLocked(ch, &wire.ChannelCloseOK{}, true)
		c.mu.Unlock()
		return nil
	case wire.TypeChannelCloseOK:
		return errUnexpected(f.Type)
	}
	body, err := wire.Decode(f, c.maxFrame, &c.dec)
	if err != nil {
		return err
	}
	if err := c.onRequest(ch, body); err != nil {
		var re *requestErr
		if errors.As(err, &re) {
			c.sendError(ch.id, re.req, wire.CodeOf(re.err), reasonOf(re.err))
			return nil
		}
		return err
	}
	return nil
}

// closeOK answers the peer's CLOSE: CLOSE_OK, then the socket closes once
// it is written; nothing else is read or sent.
func (c *conn) closeOK() {
	c.state.Store(stClosing)
	c.mu.Lock()
	if !c.closed {
		c.out = wire.AppendFrame(c.out, 0, &wire.CloseOK{})
		c.finishLocked()
	}
	c.mu.Unlock()
}

// onClose runs when the socket is gone: everything the connection held goes
// back to its queues.
func (c *conn) onClose() {
	c.state.Store(stClosing)
	if c.blocked.Swap(false) {
		c.srv.metrics.blocked.Add(-1)
	}
	c.mu.Lock()
	c.closed = true
	n := 0
	for _, ch := range c.channels {
		if !ch.closed {
			n++
		}
		ch.closed = true
		ch.ended.Store(true) // the Down releases what backlogs hold of it
	}
	vhost := c.vhost // set under mu by open, once
	c.mu.Unlock()
	c.srv.metrics.channels.Add(int64(-n))
	if vhost != "" {
		c.srv.CloseVhost(vhost)
	}
	if !c.opened.Load() {
		// Never authenticated, so it owns no queue, consumer or delivery:
		// a Down would be a pass over every queue of every shard for
		// nothing, once per socket of an idle-socket flood.
		return
	}
	c.srv.downs.Add(1)
	c.srv.Submit(broker.Command{Kind: broker.CmdDown, Owner: c.id}) // to every shard
}

func (e *requestErr) Error() string { return e.err.Error() }
func (e *requestErr) Unwrap() error { return e.err }
