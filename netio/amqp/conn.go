package amqp

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"net/netip"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/panjf2000/gnet/v2"
	"github.com/warren-mq/warren/broker"
	"github.com/warren-mq/warren/netio"
	"github.com/warren-mq/warren/queue"
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
