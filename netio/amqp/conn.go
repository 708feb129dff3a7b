package amqp

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"net/netip"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/panjf2000/gnet/v2"
	"github.com/warren-mq/warren/broker"
	"github.com/warren-mq/warren/netio"
	"github.com/warren-mq/warren/queue"
	"github.com/warren-mq/warren/wire"
)

var protocolHeader = []byte("AMQP\x00\x00\x09\x01")

// Connection states.
const (
	stHeader    uint32 = iota // waiting for the protocol header (and a PROXY header before it, if trusted)
	stHandshake               // connection.start sent: start-ok, tune-ok and open expected (conn.hs)
	stOpen
	stClosing // connection.close sent (or the socket is being closed): only close-ok is looked for
)

// Handshake steps (conn.hs), each answered by one off-loop run.
const (
	hsStartOK = iota
	hsTuneOK
	hsOpen
)

// conn is one AMQP connection, served by one of netio's event loops (a
// netio.FrontConn). The loop reads and decodes; the fast methods (publish
// with its content, ack, nack, reject, heartbeats) are handled on it, and
// every other method (declares, binds, consume, get, …, and the handshake)
// in a run off the loop (startRun), during which the loop reads nothing
// more of the connection, so frames keep their order. Fields the frame
// handlers use are owned by whichever of the two holds the connection (the
// busy flag hands it over); mu guards what shards, the tick and the write
// callback touch.
type conn struct {
	l   *Listener
	srv *netio.Server
	// pubPerm: whether user may publish to each exchange.
	pubPerm netio.PublishPerms
	id      uint64
	remote  string         // the client's address as "ip:port" (after a PROXY header, the one it names)
	src     netip.AddrPort // the same

	user  string
	vhost string // opened by connection.open (vhost.go); l.mu to change
	// exLocal, exQual: the last publish exchange and its internal name
	// (pubExchange).
	exLocal, exQual string
	admin           bool
	frameMax        uint32
	channelMax      uint16
	heartbeat       time.Duration // set before open-ok; read by the tick once stOpen
	hs              int           // handshake step

	// The method being handled, for the class and method ids of an error.
	curClass, curMethod uint16

	state      atomic.Uint32
	started    atomic.Bool // the protocol header was read
	opened     atomic.Bool // open-ok was sent: it may own queues and consumers
	busy       atomic.Bool // a run of frames is being handled off the loop
	timedOut   atomic.Bool // the tick closed it at the handshake deadline
	acceptedAt int64       // unix ms
	closeBy    atomic.Int64
	lastRecv   atomic.Int64 // unix ms
	lastSend   atomic.Int64

	// Reading paused (loop-owned but held, read by the tick): waitConfirm
	// at the unconfirmed bound (Confirm wakes the loop), alarmHeld by the
	// memory alarm (the tick wakes it), busyPaused behind a long off-loop
	// run.
	gate        netio.ReadGate
	paused      bool
	held        atomic.Bool
	waitConfirm atomic.Bool
	alarmHeld   atomic.Bool
	// While held, the buffered frames behind the held publish are
	// scanned for a channel.close or connection.close (closeBehind,
	// loop-owned): closeAhead, one was found, and the publishes before it
	// are read past the bound until it is reached; scanned, the bytes of
	// complete frames from the head scanned without finding one; scanNeed,
	// the bytes buffered before a scan can find more; aheadUsed, the bytes
	// read past the hold for closes since the connection was last not held
	// (at most closeScanBytes: closing channel after channel does not lift
	// the bound).
	closeAhead        bool
	scanned, scanNeed int
	aheadUsed         int
	proxyDone         bool // the PROXY header, if trusted peers are set, was read
	viaProxy          bool // the peer is a trusted proxy: a PROXY header may come first
	// refusal: the connection is refused (the per-source cap, on the
	// source a PROXY header named); it is told so in place of
	// connection.start.
	refusal string

	mu              sync.Mutex
	gc              gnet.Conn // set by OnOpen
	closeOnOpen     bool      // closed before the loop had it
	out             []byte
	spare, inflight []byte
	flushing        bool
	closeAfterFlush bool
	autoAcks        []broker.SettleItem // deliveries to auto-ack consumers, settled once written
	inflightAcks    []broker.SettleItem
	heldAcks        []broker.SettleItem // written, not settled: gnet holds over autoAckBufferedMax for the socket
	acksHeld        atomic.Bool
	dead            bool // the socket is gone, closing or over its outbox cap: drop output
	channels        map[uint16]*channel
	byID            map[queue.ConsumerID]*consumer
	chanGen         uint64
	flushedCB       gnet.AsyncCallback

	stopped     atomic.Bool // the connection is ending: waits in off-loop runs give up
	blockedCap  bool        // the client takes connection.blocked/unblocked
	unconfirmed atomic.Int64

	// Publish scratch (loop).
	routeBuf []queue.QueueRef
	parts    [][]broker.EnqItem
	ctagSeq  int

	stashBytes int // bytes waiting in the channels' stashes (mu)

	// partial: the body sizes the content headers of publishes not yet
	// complete announced, every channel together (each one's arena is
	// made that size at its header): at most maxPartial (publish.go).
	partial atomic.Int64

	txHeld, txHeldBytes int // publishes held by the channels' transactions (mu)

	sc pubScratch // parseHeader's buffers (loop)

	published, delivered atomic.Uint64 // metrics (messages)

	adm connAdmission // Listener.mu
}

type channel struct {
	id        uint16
	gen       uint64 // tells a reopened channel id from the one before (confirms)
	closing   bool   // the broker sent channel.close; waits for close-ok
	confirm   bool
	pubSeq    uint64 // last publish sequence number in confirm mode
	prefetch  uint16
	prefBytes uint32
	lastQueue string
	consumers map[string]*consumer
	tags      []tagEntry // delivery tags tagBase, tagBase+1, …
	tagBase   uint64
	nextTag   uint64
	pub       *pending // a basic.publish waiting for its content (&pubBuf)
	pubBuf    pending
	names     []byte // pubBuf's routing key (scratch)
	lastEx    string // the last publish's exchange

	// The channel-wide prefetch (basic.qos global=true; 0: none): at most
	// globalMax deliveries to its consumers with acks unacked at once.
	// Those past it wait here, encoded (a durable queue's message is valid
	// only during Deliver), their delivery tags given when they go out.
	// The waiting bytes count against the outbox cap.
	globalMax uint16
	inflight  int // unacked deliveries to consumers with acks (tags gated)
	stash     []byte
	stashQ    []stashed
	stashHead int

	// Transactions (tx.select; tx.go): publishes and settles held until
	// tx.commit, and the commits whose publishes their queues have not
	// all taken yet, oldest first (commit-ok goes out in order).
	tx        bool
	txPubs    []*pending
	txSettles []broker.SettleItem
	txGets    []int  // the txSettles of basic.get's messages
	txSeq     uint64 // the last commit's number
	txOpen    []txCommit

	reply *replyConsumer // its consumer of amq.rabbitmq.reply-to (replyto.go)
}

// stashed is a delivery waiting for the channel-wide prefetch.
type stashed struct {
	off, end, tagAt int // in channel.stash
	cr              *consumer
	qtag            uint64
	dead            bool // cancelled or taken back meanwhile
}

type consumer struct {
	id      queue.ConsumerID
	tag     string
	ch      *channel
	q       *broker.Queue
	autoAck bool
	noWait  bool
	// subscribed is closed once the queue's shard has answered the
	// basic.consume (consume-ok written); nil with no-wait.
	subscribed chan struct{}
	// A basic.get's consumer: get is closed once answered; got says a
	// message was handed over (its tags), answered that the answer went out.
	get           chan struct{}
	got, answered bool
	// lost: a message handed over once the channel was closing (no tag
	// given, no client has it): onGet returns it.
	lost            bool
	lostQTag        uint64
	getTag, getQTag uint64
}

type tagEntry struct {
	q     *broker.Queue
	cid   queue.ConsumerID
	qtag  uint64
	live  bool
	gated bool // counted in channel.inflight
	get   bool // a basic.get's: no consumer's cancel returns it
}

// pending is a basic.publish whose content is being read.
type pending struct {
	exchange  string
	key       []byte
	mandatory bool
	header    bool // the content header was read
	size      uint64
	in        inbound
	arena     []byte // exchange, key, properties, then the body as it arrives
	bodyAt    int
	held      int64 // size, counted in conn.partial while the body is awaited
}

var _ netio.FrontConn = (*conn)(nil)

func newConn(l *Listener, remote netip.AddrPort) *conn {
	now := time.Now().UnixMilli()
	c := &conn{l: l, srv: l.srv, id: l.srv.NewConnID(), remote: remote.String(), src: remote, acceptedAt: now, viaProxy: l.trusted(remote.Addr()),
		frameMax: l.cfg.FrameMax, channels: map[uint16]*channel{}, byID: map[queue.ConsumerID]*consumer{},
		parts: make([][]broker.EnqItem, l.srv.Shards())}
	c.flushedCB = c.flushed
	c.lastRecv.Store(now)
	c.lastSend.Store(now)
	return c
}

var errClientClosed = errors.New("amqp: the client closed the connection")

// errEvicted: the connection was closed to admit a newer one (its start-ok
// came too late).
var errEvicted = errors.New("amqp: evicted at the unauthenticated cap")

// OnOpen runs on the loop once the connection is enrolled.
func (c *conn) OnOpen(gc gnet.Conn) ([]byte, gnet.Action) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.gc = gc
	if c.closeOnOpen {
		return nil, gnet.Close
	}
	return nil, gnet.None
}

// OnClose runs on the loop when the socket is gone: what the connection
// held goes back to its queues, then it leaves the listener's count.
func (c *conn) OnClose(gnet.Conn, error) {
	c.stopped.Store(true)
	c.state.Store(stClosing)
	c.mu.Lock()
	c.dead = true
	var replies []*replyConsumer
	for _, ch := range c.channels {
		ch.closing = true
		if ch.reply != nil {
			replies = append(replies, ch.reply)
		}
	}
	c.mu.Unlock()
	for _, rc := range replies {
		c.dropReply(rc)
	}
	if c.opened.Load() {
		c.srv.Submit(broker.Command{Kind: broker.CmdDown, Owner: c.id})
	}
	c.l.forget(c)
}

// OnTraffic handles every complete frame buffered for the connection, on
// its loop.
func (c *conn) OnTraffic(gc gnet.Conn) gnet.Action {
	c.lastRecv.Store(time.Now().UnixMilli())
	if c.busy.Load() {
		// Its frames are being worked through off the loop; what follows
		// waits, and past busyPauseBytes it waits in the kernel.
		if gc.InboundBuffered() > busyPauseBytes {
			c.pause(gc)
		}
		return gnet.None
	}
	n := c.unconfirmed.Load()
	atBound := c.waitConfirm.Load() && n >= int64(c.l.cfg.MaxUnconfirmed)
	if (atBound || c.alarmHeld.Load() && c.srv.MemoryAlarm() && c.state.Load() == stOpen) && !c.closeBehind(gc) {
		if hook := c.l.hookAtBound.Load(); hook != nil && atBound {
			(*hook)(n)
		}
		c.holdReading(gc)
		return gnet.None
	}
	c.scanned, c.scanNeed = 0, 0 // the head moves on
	c.resume(gc)
	for {
		st := c.state.Load()
		if st == stHeader {
			if len(c.l.cfg.ProxyTrusted) > 0 && !c.proxyDone && !c.proxyStep(gc) {
				return gnet.None
			}
			buf, err := gc.Peek(len(protocolHeader))
			if err != nil {
				return gnet.None
			}
			if !bytes.Equal(buf, protocolHeader) {
				c.state.Store(stClosing)
				_, _ = gc.Discard(-1)
				c.mu.Lock()
				c.out = append(c.out, protocolHeader...)
				c.finishLocked()
				c.mu.Unlock()
				return gnet.None
			}
			_, _ = gc.Discard(len(protocolHeader))
			c.started.Store(true)
			if c.refusal != "" {
				c.sendConnClose(&amqpError{code: resourceError, text: c.refusal})
				return gnet.None
			}
			c.state.Store(stHandshake)
			c.hs = hsStartOK
			c.sendStart()
			continue
		}
		hdr, err := gc.Peek(7)
		if err != nil {
			return gnet.None
		}
		typ, chID := hdr[0], binary.BigEndian.Uint16(hdr[1:])
		n := binary.BigEndian.Uint32(hdr[3:])
		if uint64(n)+8 > uint64(c.frameMax) {
			if st == stClosing {
				_, _ = gc.Discard(-1)
				return gnet.None
			}
			c.fail(connErr(frameError, "FRAME_ERROR - frame of "+strconv.FormatUint(uint64(n)+8, 10)+" bytes is over the negotiated frame-max "+strconv.FormatUint(uint64(c.frameMax), 10)))
			_, _ = gc.Discard(-1)
			return gnet.None
		}
		size := int(n) + 8
		if gc.InboundBuffered() < size {
			return gnet.None
		}
		buf, err := gc.Peek(size)
		if err != nil {
			return gnet.None
		}
		p := buf[7 : 7+n]
		if st == stClosing {
			if typ == frameMethod && chID == 0 && len(p) >= 4 && binary.BigEndian.Uint16(p) == classConnection && binary.BigEndian.Uint16(p[2:]) == 51 {
				c.closeAfterOutput() // the close-ok we waited for
				_, _ = gc.Discard(-1)
				return gnet.None
			}
			_, _ = gc.Discard(size)
			continue
		}
		if buf[size-1] != frameEnd {
			c.fail(connErr(frameError, "FRAME_ERROR - frame end byte is 0x"+strconv.FormatUint(uint64(buf[size-1]), 16)+", want 0xce"))
			_, _ = gc.Discard(-1)
			return gnet.None
		}
		if c.closeAhead && isClose(typ, chID, p) {
			c.closeAhead = false // reached: publishes wait at the bound again
		}
		if st == stHandshake || slowFrame(typ, chID, p) {
			c.startRun(gc, st == stHandshake)
			return gnet.None
		}
		if typ == frameMethod && len(p) >= 4 && binary.BigEndian.Uint16(p) == classBasic && binary.BigEndian.Uint16(p[2:]) == 40 && c.mustWait(gc) {
			return gnet.None // the publish stays in the buffer
		}
		err = c.handle(typ, chID, p)
		_, _ = gc.Discard(size)
		if err != nil {
			c.fail(err)
			if c.state.Load() == stClosing {
				return gnet.None
			}
		}
	}
}

// busyPauseBytes: past this many bytes buffered behind an off-loop run,
// the socket leaves the read interest until the run is done.
const busyPauseBytes = 1 << 20

// offLoopMax bounds the frames one off-loop run takes.
const offLoopMax = 256

// slowFrame: a frame handled off the loop. Methods on channels other than
// publish, ack, reject and nack can take time (a topology change waits for
// the metadata log; basic.get for the queue's shard); content, heartbeats
// and connection methods on channel 0 are cheap.
func slowFrame(typ uint8, chID uint16, p []byte) bool {
	if typ != frameMethod || chID == 0 || len(p) < 4 {
		return false
	}
	if binary.BigEndian.Uint16(p) != classBasic {
		return true
	}
	switch binary.BigEndian.Uint16(p[2:]) {
	case 40, 80, 90, 120:
		return false
	}
	return true
}

// startRun copies the run of complete slow frames at the head of the
// inbound buffer (at least one; during the handshake exactly one) and
// handles them on a goroutine; the loop reads nothing more of the
// connection until it is done. Loop goroutine.
func (c *conn) startRun(gc gnet.Conn, handshake bool) {
	var run []byte
	for k := 0; k < offLoopMax; k++ {
		hdr, err := gc.Peek(7)
		if err != nil {
			break
		}
		n := binary.BigEndian.Uint32(hdr[3:])
		size := int(n) + 8
		if uint64(size) > uint64(c.frameMax) || gc.InboundBuffered() < size {
			break
		}
		buf, err := gc.Peek(size)
		if err != nil || buf[size-1] != frameEnd {
			break
		}
		if k > 0 && (handshake || !slowFrame(buf[0], binary.BigEndian.Uint16(buf[1:]), buf[7:7+n])) {
			break // the loop deals with it when it goes on
		}
		if c.closeAhead && isClose(buf[0], binary.BigEndian.Uint16(buf[1:]), buf[7:7+n]) {
			c.closeAhead = false // reached (in this run): publishes wait at the bound again
		}
		run = append(run, buf...)
		_, _ = gc.Discard(size)
	}
	c.busy.Store(true)
	go c.runOff(gc, run, handshake)
}

// runOff handles a run of frames as the loop would have, then wakes the
// loop to read on.
func (c *conn) runOff(gc gnet.Conn, run []byte, handshake bool) {
	defer func() {
		c.busy.Store(false)
		_ = gc.Wake(nil)
	}()
	for len(run) > 0 && c.state.Load() != stClosing {
		typ, chID := run[0], binary.BigEndian.Uint16(run[1:])
		n := int(binary.BigEndian.Uint32(run[3:]))
		p := run[7 : 7+n]
		run = run[n+8:]
		var err error
		if handshake {
			err = c.handshakeStep(typ, chID, p)
		} else {
			err = c.handle(typ, chID, p)
		}
		if err != nil {
			c.fail(err)
			return
		}
	}
}

// tick is the listener tick's look at one connection (its goroutine):
// the handshake deadline, a close-ok not coming, heartbeats both ways,
// the memory alarm clearing, auto-acks held.
func (c *conn) tick(now int64) {
	c.mu.Lock()
	gc := c.gc
	c.mu.Unlock()
	switch c.state.Load() {
	case stClosing:
		if by := c.closeBy.Load(); by != 0 && now > by {
			c.closeAfterOutput()
		}
		return
	case stHeader, stHandshake:
		if now-c.acceptedAt > c.l.cfg.HandshakeTimeout.Milliseconds() && c.timedOut.CompareAndSwap(false, true) {
			c.l.met.handshakeTimeouts.Inc()
			if c.started.Load() {
				c.sendConnClose(&amqpError{code: resourceError, text: c.l.handshakeReason(), class: classConnection})
			} else {
				c.closeNow()
			}
		}
		return
	}
	if gc == nil {
		return
	}
	if c.alarmHeld.Load() && !c.srv.MemoryAlarm() {
		_ = gc.Wake(nil)
	}
	if c.acksHeld.Load() {
		_ = gc.EventLoop().Execute(context.Background(), ackCheck{c})
	}
	hb := c.heartbeat.Milliseconds()
	if hb == 0 {
		return
	}
	if !c.busy.Load() && !c.held.Load() && now-c.lastRecv.Load() > 2*hb {
		c.l.log.Info("AMQP peer missed heartbeats", "conn", c.id)
		c.closeNow()
		return
	}
	if now-c.lastSend.Load() >= hb/2 {
		c.mu.Lock()
		c.out = append(c.out, frameHeartbeat, 0, 0, 0, 0, 0, 0, frameEnd)
		c.flushLocked()
		c.mu.Unlock()
	}
}

func (c *conn) handle(typ uint8, chID uint16, p []byte) error {
	switch typ {
	case frameHeartbeat:
		if chID != 0 {
			return connErr(frameError, "FRAME_ERROR - heartbeat on channel "+strconv.Itoa(int(chID)))
		}
		return nil
	case frameHeader, frameBody:
		c.mu.Lock()
		ch := c.channels[chID]
		closing := ch != nil && ch.closing // set by a shard too (claimClose)
		c.mu.Unlock()
		if ch == nil {
			return connErr(channelError, "CHANNEL_ERROR - content on channel "+strconv.Itoa(int(chID))+", which is not open")
		}
		if closing {
			c.dropPub(ch)
			return nil
		}
		if ch.pub == nil || (typ == frameBody) != ch.pub.header {
			return connErr(unexpectedFrame, "UNEXPECTED_FRAME - content frame on channel "+strconv.Itoa(int(chID))+" without a basic.publish before it")
		}
		if typ == frameHeader {
			return c.chanResult(ch, c.onHeader(ch, p))
		}
		return c.chanResult(ch, c.onBody(ch, p))
	case frameMethod:
	default:
		return connErr(frameError, "FRAME_ERROR - unknown frame type "+strconv.Itoa(int(typ)))
	}
	if len(p) < 4 {
		return errShort
	}
	class, id := binary.BigEndian.Uint16(p), binary.BigEndian.Uint16(p[2:])
	c.curClass, c.curMethod = class, id
	r := &reader{b: p[4:]}
	if chID == 0 {
		if class != classConnection {
			return connErr(commandInvalid, "COMMAND_INVALID - class "+strconv.Itoa(int(class))+" on channel 0")
		}
		switch id {
		case 50: // close
			c.sendCloseOK()
			return errClientClosed
		case 51: // close-ok to a close we did not send
			return errClientClosed
		}
		return connErr(commandInvalid, "COMMAND_INVALID - connection method "+strconv.Itoa(int(id))+" after the handshake")
	}
	c.mu.Lock()
	ch := c.channels[chID]
	closing := ch != nil && ch.closing // set by a shard too (claimClose)
	c.mu.Unlock()
	if class == classChannel && id == 10 { // open
		if ch != nil {
			return connErr(channelError, "CHANNEL_ERROR - second 'channel.open' seen on channel "+strconv.Itoa(int(chID)))
		}
		if chID > c.channelMax {
			return connErr(channelError, "CHANNEL_ERROR - channel "+strconv.Itoa(int(chID))+" is over the negotiated channel-max "+strconv.Itoa(int(c.channelMax)))
		}
		c.mu.Lock()
		c.chanGen++
		c.channels[chID] = &channel{id: chID, gen: c.chanGen, consumers: map[string]*consumer{}, tagBase: 1}
		b, st := method(c.out, chID, classChannel, 11)
		b = putLongstr(b, nil)
		c.out = endFrame(b, st)
		c.flushLocked()
		c.mu.Unlock()
		return nil
	}
	if ch == nil {
		return connErr(channelError, "CHANNEL_ERROR - expected 'channel.open' on channel "+strconv.Itoa(int(chID)))
	}
	if closing {
		c.dropPub(ch)
		// The broker sent channel.close: a client's channel.close that
		// crossed it is answered, and the channel is free only at the
		// client's close-ok (which it sends to the broker's close after
		// its own), as RabbitMQ's reader does; freed at the close, the
		// close-ok after it met no channel (504 CHANNEL_ERROR).
		switch {
		case class == classChannel && id == 40:
			c.reply(chID, classChannel, 41, nil)
		case class == classChannel && id == 41:
			c.mu.Lock()
			delete(c.channels, chID)
			c.mu.Unlock()
		}
		return nil // everything else on a closing channel is dropped
	}
	if ch.pub != nil {
		return connErr(unexpectedFrame, "UNEXPECTED_FRAME - a method on channel "+strconv.Itoa(int(chID))+" while a basic.publish's content was expected")
	}
	return c.chanResult(ch, c.onMethod(ch, class, id, r))
}

// chanResult turns a channel error into channel.close; a connection error
// goes up.
func (c *conn) chanResult(ch *channel, err error) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, errClientClosed) {
		return err
	}
	ae := errOf(err)
	if ae.class == 0 {
		cp := *ae // it may be a shared one (errSyntax)
		ae = &cp
		ae.class, ae.method = c.curClass, c.curMethod
	}
	if ae.conn || ae.code == notImplemented || ae.code >= 500 {
		ae.conn = true
		return ae
	}
	c.closeChannel(ch, ae)
	return nil
}

// closeChannel sends channel.close and returns what the channel's
// consumers held; nothing if the channel is closing already (the client's
// channel.close or another channel.close of the broker's came first).
// Safe from any goroutine but a shard's (it submits).
func (c *conn) closeChannel(ch *channel, ae *amqpError) {
	if r, ok := c.claimClose(ch, ae); ok {
		c.submitRelease(r)
	}
}

// claimClose marks ch closing and sends channel.close, if ch is open and
// still the channel of its id: the client's channel.close and the
// broker's both claim the channel under c.mu, and the loser sends nothing.
// Without it, a close a shard decided on (a consume refused) could go out
// after the client's own close was answered, on a freed or reused id, and
// the client's close-ok to it ended the connection (504, expected
// 'channel.open'). The pointer comparison tells a channel from a later
// one on the same id. It submits nothing: safe from a shard.
func (c *conn) claimClose(ch *channel, ae *amqpError) (release, bool) {
	c.mu.Lock()
	r, ok := c.releaseLocked(ch)
	if !ok {
		c.mu.Unlock()
		return r, false
	}
	b, st := method(c.out, ch.id, classChannel, 40)
	b = binary.BigEndian.AppendUint16(b, ae.code)
	b = putShortstr(b, ae.text)
	b = binary.BigEndian.AppendUint16(b, ae.class)
	b = binary.BigEndian.AppendUint16(b, ae.method)
	c.out = endFrame(b, st)
	c.flushLocked()
	c.mu.Unlock()
	c.dropReply(r.reply)
	return r, true
}

// dropPub lets go of the publish a closing channel was reading the content
// of. Only the loop (handle, and what it calls) touches ch.pub: a channel
// a shard closes mid-content keeps it until the channel's next frame,
// which the client sends (the rest of the body, or close-ok).
func (c *conn) dropPub(ch *channel) {
	if ch.pub != nil {
		c.dropPending(ch.pub)
		*ch.pub = pending{} // its arena with it (publish)
		ch.pub = nil
	}
}

// release is what a closed channel hands back: its consumers to cancel
// (with requeue) and the basic.gets' messages it did not ack.
type release struct {
	cons  []*consumer
	back  []broker.SettleItem
	reply *replyConsumer
}

// submitRelease returns what a closed channel held to its queues.
func (c *conn) submitRelease(r release) {
	if len(r.back) > 0 {
		c.srv.Submit(broker.Command{Kind: broker.CmdSettle, Settles: r.back})
	}
	for _, cr := range r.cons {
		c.srv.Submit(broker.Command{Kind: broker.CmdCancel, Queue: cr.q, Consumer: cr.id, Requeue: true})
	}
}

// releaseLocked marks a channel closing and takes what it holds: its
// consumers and what its basic.gets took and it did not ack (no
// consumer's cancel returns those). false: the channel was closing
// already, or is no longer the channel of its id. c.mu held.
func (c *conn) releaseLocked(ch *channel) (release, bool) {
	if ch.closing || c.channels[ch.id] != ch {
		return release{}, false
	}
	ch.closing = true
	// ch.pub is left to the loop (dropPub, at the channel's next frame):
	// a shard clearing it raced the loop between handle's look at it and
	// onBody's use (a nil dereference on the event loop).
	cons := make([]*consumer, 0, len(ch.consumers))
	for _, cr := range ch.consumers {
		cons = append(cons, cr)
	}
	// What no consumer's cancel returns: the basic.gets' unacked messages
	// and those of the consumers the client cancelled (a basic.cancel
	// leaves its deliveries unacked on the channel, as in RabbitMQ),
	// returned in the order they were delivered.
	// The channel's consumers as a set: a scan of them per delivery tag
	// was O(tags × consumers) on the event loop (136 ms for 20,000 tags
	// and 1,000 consumers, BenchmarkReleaseChannel).
	var live map[queue.ConsumerID]struct{}
	if len(ch.tags) > 0 && len(cons) > 0 {
		live = make(map[queue.ConsumerID]struct{}, len(cons))
		for _, cr := range cons {
			live[cr.id] = struct{}{}
		}
	}
	var back []broker.SettleItem
	for _, e := range ch.tags {
		if !e.live || e.q == nil {
			continue
		}
		if _, held := live[e.cid]; e.get || !held { // held: the consumer's cancel returns it
			back = append(back, broker.SettleItem{Q: e.q, Consumer: e.cid, Op: wire.SettleRequeue, QTag: e.qtag})
		}
	}
	requeueOrder(back)
	for _, i := range ch.txGets { // acked in a transaction not committed
		it := ch.txSettles[i]
		it.Op = wire.SettleRequeue
		back = append(back, it)
	}
	ch.consumers = nil
	ch.tags = nil
	c.resetStashLocked(ch)
	c.dropTxLocked(ch) // the other held settles: the consumers' cancels return those messages
	// ch.reply is left set, for the reader's eyes (onHeader reads it
	// without the lock; the shard clearing it raced that read): the
	// channel closing, sendReply delivers nothing to it, and dropReply,
	// given it here, forgets it (once: OnClose may give it again).
	return release{cons: cons, back: back, reply: ch.reply}, true
}

// requeueOrder orders requeue settlements so that their messages go back
// in the order they were delivered, before the queue's other messages, as
// RabbitMQ returns them: the queue puts each run of one consumer's it
// takes back at the head of its level, so the runs go last first (each
// still in ascending tags, which the shard joins into one command). Before,
// two basic.gets' messages requeued together came back in reverse. items
// of other ops are left as they are.
func requeueOrder(items []broker.SettleItem) {
	for i := range items {
		if items[i].Op != wire.SettleRequeue {
			return
		}
	}
	slices.Reverse(items)
	for i := 0; i < len(items); {
		j := i + 1
		for j < len(items) && items[j].Q == items[i].Q && items[j].Consumer == items[i].Consumer {
			j++
		}
		slices.Reverse(items[i:j])
		i = j
	}
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

// control brackets a topology request as netio does: with a metadata log,
// the reply goes out only once the change is durable.
func (c *conn) control(f func() error) error {
	c.srv.BeginControlRun()
	err := f()
	serr := c.srv.EndControlRun(c.id)
	if c.stopped.Load() && c.opened.Load() {
		// The connection is ending, and its Down may have reached the
		// shards before the queues this run declared (their shards have
		// them once the run ends): one more Down, after them, deletes an
		// exclusive one with its owner.
		c.srv.Submit(broker.Command{Kind: broker.CmdDown, Owner: c.id})
	}
	if serr != nil {
		return connErr(internalError, "INTERNAL_ERROR - the topology changes are not confirmed: "+serr.Error())
	}
	return err
}

func (c *conn) requester() broker.Requester {
	return broker.Requester{User: c.user, Admin: c.admin, Conn: c.id}
}
