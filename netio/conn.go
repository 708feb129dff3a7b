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
	"golang.org/x/sys/unix"
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

type channel struct {
	id        uint16
	nextSeq   uint64                  // loop-owned: the next publish sequence number
	consumers map[string]*consumerRef // active consumers by tag (mu)
	all       []*consumerRef          // every consumer until the channel closes (mu)
	closed    bool                    // (mu)
	nextTag   uint64                  // last delivery tag given (mu)
	tagBase   uint64                  // tag of tags[head] (mu)
	tags      []tagEntry              // (mu)
	head      int
	ctagSeq   int
	// owed counts what shards still owe this channel: CONFIRMs of its
	// publish batches and answers to its requests (passive declare,
	// delete, purge). While it is not 0 the channel keeps its id, and the
	// frame that ends it (CHANNEL_CLOSE_OK to the client's close, or the
	// broker's own CHANNEL_CLOSE) waits in endFrame, so nothing of this
	// channel can arrive after it, on a channel the client reopened with
	// the same id (PROTOCOL.md §6). A confirm a queue's backlog holds
	// back is not waited for: once the channel has ended (ended, set with
	// closed) its shards confirm it at once (CmdReleaseEnded), its
	// messages being in their queues (§8.2).
	owed      atomic.Int32
	ended     atomic.Bool // PublishBatch.Ended of the channel's batches
	endFrame  wire.Body   // (mu) the held end, sent when owed reaches 0
	endForget bool        // (mu) endFrame answers the client's close: drop the id once it is sent
}

const (
	tagLive uint8 = iota
	tagSettled
	tagExpired
	tagAuto
)

type tagEntry struct {
	c     *consumerRef
	qtag  uint64
	state uint8
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

func newChannel(id uint16) *channel {
	return &channel{id: id, nextSeq: 1, tagBase: 1} // consumers: made at the first
}

func (ch *channel) pushTag(e tagEntry) { ch.tags = append(ch.tags, e) }

func (ch *channel) tagAt(t uint64) *tagEntry {
	if t < ch.tagBase || t-ch.tagBase >= uint64(len(ch.tags)-ch.head) {
		return nil
	}
	return &ch.tags[ch.head+int(t-ch.tagBase)]
}

// compact drops settled entries from the front.
func (ch *channel) compact() {
	for ch.head < len(ch.tags) && ch.tags[ch.head].state != tagLive {
		ch.tags[ch.head] = tagEntry{}
		ch.head++
		ch.tagBase++
	}
	if ch.head == len(ch.tags) {
		ch.tags, ch.head = ch.tags[:0], 0
	} else if ch.head > 1024 && ch.head > len(ch.tags)/2 {
		n := copy(ch.tags, ch.tags[ch.head:])
		ch.tags, ch.head = ch.tags[:n], 0
	}
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
		if err := c.srv.EndControlRun(c.id); err != nil {
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

func (c *conn) onChannelOpen(f wire.Frame) error {
	body, err := wire.Decode(f, c.maxFrame, nil)
	if err != nil {
		return err
	}
	if f.Channel > c.maxChannels {
		return &wire.Error{Code: wire.ChannelError, Reason: "channel id over the negotiated maximum"}
	}
	c.mu.Lock()
	if _, ok := c.channels[f.Channel]; ok {
		c.mu.Unlock()
		return &wire.Error{Code: wire.ChannelError, Reason: "channel already open"}
	}
	c.channels[f.Channel] = newChannel(f.Channel)
	c.mu.Unlock()
	c.srv.metrics.channels.Add(1)
	c.send(f.Channel, &wire.OKReply{Req: body.(*wire.ChannelOpen).Req})
	return nil
}

// closeChannel closes a channel from the broker's side with an error.
func (c *conn) closeChannel(id uint16, code wire.Code, reason string) {
	c.mu.Lock()
	ch := c.channels[id]
	c.mu.Unlock()
	if ch == nil {
		return
	}
	c.closeChannelNow(ch)
	c.mu.Lock()
	c.endChannelLocked(ch, &wire.ChannelClose{Code: code, Reason: reason}, false)
	c.mu.Unlock()
}

// endChannelLocked sends the frame that ends a closed channel (forget: it
// answers the client's CHANNEL_CLOSE, so the id is free once it is sent),
// or holds it until the shards have paid what they owe the channel
// (paidLocked). c.mu must be held.
func (c *conn) endChannelLocked(ch *channel, end wire.Body, forget bool) {
	if ch.owed.Load() > 0 {
		ch.endFrame, ch.endForget = end, forget
		return
	}
	if forget && c.channels[ch.id] == ch {
		delete(c.channels, ch.id)
	}
	if !c.closed {
		c.out = wire.AppendFrame(c.out, ch.id, end)
		c.flushLocked()
	}
}

// paidLocked counts one answer owed to channel id as sent (a CONFIRM, a
// request's reply), and sends the channel's held end once nothing more is
// owed. The id still names the channel that was owed: it is not freed
// while anything is. c.mu must be held.
func (c *conn) paidLocked(id uint16) {
	ch := c.channels[id]
	if ch == nil || ch.owed.Add(-1) > 0 || ch.endFrame == nil {
		return
	}
	end, forget := ch.endFrame, ch.endForget
	ch.endFrame = nil
	c.endChannelLocked(ch, end, forget)
}

// closeChannelNow marks a channel closed, returns what its consumers
// held, and has the shards confirm its batches that queues over their
// soft limit hold back: the frame that ends the channel waits for them.
func (c *conn) closeChannelNow(ch *channel) {
	c.mu.Lock()
	if ch.closed {
		c.mu.Unlock()
		return
	}
	ch.closed = true
	ch.ended.Store(true) // before the release: a part held after it is not held
	all := ch.all
	ch.all, ch.consumers, ch.tags, ch.head = nil, nil, nil, 0
	c.mu.Unlock()
	c.srv.metrics.channels.Add(-1)
	if ch.owed.Load() > 0 {
		c.srv.Submit(broker.Command{Kind: broker.CmdReleaseEnded})
	}
	for _, cr := range all {
		cr := cr
		c.srv.Submit(broker.Command{Kind: broker.CmdCancel, Queue: cr.q, Consumer: cr.id, Requeue: true})
	}
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
