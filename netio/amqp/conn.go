package amqp

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/warren-mq/warren/broker"
	"github.com/warren-mq/warren/netio"
	"github.com/warren-mq/warren/queue"
	"github.com/warren-mq/warren/wire"
)

var protocolHeader = []byte("AMQP\x00\x00\x09\x01")

// conn is one AMQP connection. The reader goroutine (serve) owns the
// handshake fields and reading; mu guards what shards and the writer touch.
type conn struct {
	l   *Listener
	srv *netio.Server
	// pubPerm: whether user may publish to each exchange (the reader's).
	pubPerm netio.PublishPerms
	nc      net.Conn
	br      *bufio.Reader
	id      uint64

	user       string
	admin      bool
	frameMax   uint32
	channelMax uint16
	heartbeat  time.Duration
	buf        []byte // the reader's frame buffer

	// The method being handled, for the class and method ids of an error.
	curClass, curMethod uint16

	mu        sync.Mutex
	out       []byte
	autoAcks  []broker.SettleItem // written auto-ack deliveries, settled once written
	dead      bool                // the socket is gone or over its outbox cap: drop output
	finishing bool                // write what is queued, then stop
	channels  map[uint16]*channel
	byID      map[queue.ConsumerID]*consumer
	chanGen   uint64

	wake       chan struct{} // the writer has output (cap 1)
	writerDone chan struct{}
	lastWrite  atomic.Int64 // unix ms

	stopped     atomic.Bool // the connection is ending: waits in the reader give up
	blockedCap  bool        // the client takes connection.blocked/unblocked
	unconfirmed atomic.Int64
	confirmed   chan struct{} // a confirm arrived (cap 1)

	// Publish scratch (reader goroutine).
	routeBuf []queue.QueueRef
	parts    [][]broker.EnqItem
	ctagSeq  int

	stashBytes int // bytes waiting in the channels' stashes (mu)

	sc pubScratch // parseHeader's buffers (reader goroutine)

	published, delivered atomic.Uint64 // metrics (messages)

	started bool          // the protocol header was read (reader goroutine)
	adm     connAdmission // Listener.mu
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
	// A basic.get's consumer: get is closed once answered; got says a
	// message was handed over (its tags), answered that the answer went out.
	get             chan struct{}
	got, answered   bool
	getTag, getQTag uint64
}

type tagEntry struct {
	q     *broker.Queue
	cid   queue.ConsumerID
	qtag  uint64
	live  bool
	gated bool // counted in channel.inflight
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
}

func newConn(l *Listener, nc net.Conn) *conn {
	return &conn{l: l, srv: l.srv, nc: nc, br: bufio.NewReaderSize(nc, 64<<10), id: l.srv.NewConnID(),
		frameMax: l.cfg.FrameMax, channels: map[uint16]*channel{}, byID: map[queue.ConsumerID]*consumer{},
		wake: make(chan struct{}, 1), writerDone: make(chan struct{}), confirmed: make(chan struct{}, 1),
		parts: make([][]broker.EnqItem, l.srv.Shards())}
}

// serve runs the connection to its end.
func (c *conn) serve() {
	go c.writer()
	opened := false
	defer func() {
		c.finish()
		if opened {
			c.mu.Lock()
			for _, ch := range c.channels {
				ch.closing = true
			}
			c.mu.Unlock()
			c.srv.Submit(broker.Command{Kind: broker.CmdDown, Owner: c.id})
		}
	}()
	// The handshake deadline was set at accept.
	if err := c.handshake(); err != nil {
		switch {
		case c.l.evictedConn(c):
			err = errEvicted
			if c.started {
				err = connErr(resourceError, c.l.unauthReason())
			}
		case isTimeout(err):
			c.l.met.handshakeTimeouts.Inc()
			if c.started {
				err = connErr(resourceError, c.l.handshakeReason())
			}
		}
		c.fail(err)
		return
	}
	opened = true
	_ = c.nc.SetReadDeadline(time.Time{})
	c.l.opened(c)
	for {
		if c.heartbeat > 0 {
			_ = c.nc.SetReadDeadline(time.Now().Add(2 * c.heartbeat))
		}
		typ, chID, p, err := c.readFrame()
		if err == nil {
			err = c.handle(typ, chID, p)
		}
		if err != nil {
			if errors.Is(err, errClientClosed) {
				return
			}
			c.fail(err)
			return
		}
	}
}

var errClientClosed = errors.New("amqp: the client closed the connection")

// errEvicted: the connection was closed to admit a newer one (its start-ok
// came too late).
var errEvicted = errors.New("amqp: evicted at the unauthenticated cap")

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// fail ends the connection after err: a protocol error is told to the
// client with connection.close (its close-ok is awaited briefly), an I/O
// error just closes.
func (c *conn) fail(err error) {
	var ae *amqpError
	if !errors.As(err, &ae) {
		return // I/O: nobody to tell
	}
	if ae.class == 0 {
		ae.class, ae.method = c.curClass, c.curMethod
	}
	c.sendConnClose(ae)
	// Wait briefly for close-ok, discarding everything else.
	_ = c.nc.SetReadDeadline(time.Now().Add(time.Second))
	for {
		typ, chID, p, err := c.readFrame()
		if err != nil {
			return
		}
		if typ == frameMethod && chID == 0 && len(p) >= 4 && binary.BigEndian.Uint16(p) == classConnection && binary.BigEndian.Uint16(p[2:]) == 51 {
			return
		}
	}
}

func (c *conn) sendConnClose(ae *amqpError) {
	c.l.log.Info("AMQP connection error", "conn", c.id, "code", ae.code, "text", ae.text)
	c.mu.Lock()
	b, st := method(c.out, 0, classConnection, 50)
	b = binary.BigEndian.AppendUint16(b, ae.code)
	b = putShortstr(b, ae.text)
	b = binary.BigEndian.AppendUint16(b, ae.class)
	b = binary.BigEndian.AppendUint16(b, ae.method)
	c.out = endFrame(b, st)
	c.flushLocked()
	c.mu.Unlock()
}

// forceClose closes the connection from the broker's side (shutdown).
func (c *conn) forceClose(code uint16, text string) {
	c.stopped.Store(true)
	c.sendConnClose(&amqpError{code: code, text: text, conn: true})
	c.mu.Lock()
	c.finishing = true
	c.mu.Unlock()
	c.signal()
	select {
	case <-c.writerDone:
	case <-time.After(5 * time.Second):
	}
	_ = c.nc.Close()
}

// finish writes what is queued, then closes the socket.
func (c *conn) finish() {
	c.stopped.Store(true)
	_ = c.nc.SetWriteDeadline(time.Now().Add(5 * time.Second)) // a peer that does not read cannot hold us
	c.mu.Lock()
	c.finishing = true
	c.mu.Unlock()
	c.signal()
	<-c.writerDone
	_ = c.nc.Close()
}

func (c *conn) signal() {
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

// flushLocked wakes the writer; past the outbox cap the connection is
// dropped (resource_limit), so a client that does not read cannot make the
// broker hold more. c.mu held.
func (c *conn) flushLocked() {
	if len(c.out)+c.stashBytes > c.srv.MaxOutboundBytes() && !c.dead {
		c.dead = true
		c.l.log.Warn("closing AMQP connection over its outbound byte cap", "conn", c.id, "bytes", len(c.out))
		c.out = c.out[:0]
		c.stopped.Store(true)
		go c.nc.Close()
		return
	}
	c.signal()
}

// writer writes the outbox in batches, sends heartbeats when idle and
// settles auto-ack deliveries once they are written.
func (c *conn) writer() {
	defer close(c.writerDone)
	var spare []byte
	var tick <-chan time.Time
	var ticker *time.Ticker
	defer func() {
		if ticker != nil {
			ticker.Stop()
		}
	}()
	hbSet := false
	for {
		select {
		case <-c.wake:
		case <-tick:
			if time.Now().UnixMilli()-c.lastWrite.Load() >= c.heartbeat.Milliseconds()/2 {
				c.mu.Lock()
				c.out = append(c.out, frameHeartbeat, 0, 0, 0, 0, 0, 0, frameEnd)
				c.mu.Unlock()
			}
		}
		if !hbSet && c.heartbeatSet() {
			hbSet = true
			ticker = time.NewTicker(c.heartbeat / 2)
			tick = ticker.C
		}
		c.mu.Lock()
		buf, acks, finishing, dead := c.out, c.autoAcks, c.finishing, c.dead
		c.out, c.autoAcks = spare[:0], nil
		c.mu.Unlock()
		if len(buf) > 0 && !dead {
			if finishing {
				_ = c.nc.SetWriteDeadline(time.Now().Add(5 * time.Second))
			}
			if _, err := c.nc.Write(buf); err != nil {
				c.mu.Lock()
				c.dead = true
				c.mu.Unlock()
				c.stopped.Store(true)
				_ = c.nc.Close()
			}
			c.lastWrite.Store(time.Now().UnixMilli())
		}
		spare = buf
		if len(acks) > 0 {
			c.srv.Submit(broker.Command{Kind: broker.CmdSettle, Settles: acks})
		}
		if finishing {
			return
		}
	}
}

// heartbeatSet: the handshake has fixed a heartbeat (read by the writer
// after a wake; the handshake sets it before it sends open-ok).
func (c *conn) heartbeatSet() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.heartbeat > 0
}

// readFrame reads one whole frame; its payload is valid until the next.
func (c *conn) readFrame() (typ uint8, ch uint16, payload []byte, err error) {
	var h [7]byte
	if _, err = io.ReadFull(c.br, h[:]); err != nil {
		return
	}
	typ, ch = h[0], binary.BigEndian.Uint16(h[1:])
	n := binary.BigEndian.Uint32(h[3:])
	if uint64(n)+8 > uint64(c.frameMax) {
		return 0, 0, nil, connErr(frameError, "FRAME_ERROR - frame of "+strconv.FormatUint(uint64(n)+8, 10)+" bytes is over the negotiated frame-max "+strconv.FormatUint(uint64(c.frameMax), 10))
	}
	if cap(c.buf) < int(n)+1 {
		c.buf = make([]byte, n+1)
	}
	c.buf = c.buf[:n+1]
	if _, err = io.ReadFull(c.br, c.buf); err != nil {
		return
	}
	if c.buf[n] != frameEnd {
		return 0, 0, nil, connErr(frameError, "FRAME_ERROR - frame end byte is 0x"+strconv.FormatUint(uint64(c.buf[n]), 16)+", want 0xce")
	}
	return typ, ch, c.buf[:n], nil
}

// readMethod reads the next frame and wants the given connection method.
func (c *conn) readMethod(class, id uint16) (*reader, error) {
	for {
		typ, ch, p, err := c.readFrame()
		if err != nil {
			return nil, err
		}
		if typ == frameHeartbeat {
			continue
		}
		if typ != frameMethod || ch != 0 || len(p) < 4 {
			return nil, connErr(unexpectedFrame, "UNEXPECTED_FRAME - expected a connection method during the handshake")
		}
		cl, m := binary.BigEndian.Uint16(p), binary.BigEndian.Uint16(p[2:])
		c.curClass, c.curMethod = cl, m
		if cl == classConnection && m == 50 { // close during the handshake
			c.sendCloseOK()
			return nil, errClientClosed
		}
		if cl != class || m != id {
			return nil, connErr(commandInvalid, "COMMAND_INVALID - expected connection method "+strconv.Itoa(int(id))+" during the handshake")
		}
		return &reader{b: p[4:]}, nil
	}
}

func (c *conn) sendCloseOK() {
	c.mu.Lock()
	b, st := method(c.out, 0, classConnection, 51)
	c.out = endFrame(b, st)
	c.flushLocked()
	c.mu.Unlock()
}

func (c *conn) handshake() error {
	var hdr [8]byte
	if _, err := io.ReadFull(c.br, hdr[:]); err != nil {
		return err
	}
	if !bytes.Equal(hdr[:], protocolHeader) {
		c.mu.Lock()
		c.out = append(c.out, protocolHeader...)
		c.mu.Unlock()
		return errors.New("amqp: wrong protocol header")
	}
	c.started = true
	// connection.start
	c.mu.Lock()
	b, st := method(c.out, 0, classConnection, 10)
	b = append(b, 0, 9)
	b = putTable(b, wire.Table{
		{Key: "product", Value: wire.String("Warren")},
		{Key: "version", Value: wire.String(netio.Version)},
		{Key: "platform", Value: wire.String("Go")},
		{Key: "capabilities", Value: wire.TableValue(wire.Table{
			{Key: "publisher_confirms", Value: wire.Bool(true)},
			{Key: "basic.nack", Value: wire.Bool(true)},
			{Key: "consumer_cancel_notify", Value: wire.Bool(true)},
			{Key: "exchange_exchange_bindings", Value: wire.Bool(true)},
			{Key: "per_consumer_qos", Value: wire.Bool(true)},
			{Key: "connection.blocked", Value: wire.Bool(true)},
		})},
	})
	b = putLongstr(b, []byte("PLAIN AMQPLAIN"))
	b = putLongstr(b, []byte("en_US"))
	c.out = endFrame(b, st)
	c.flushLocked()
	c.mu.Unlock()

	r, err := c.readMethod(classConnection, 11) // start-ok
	if err != nil {
		return err
	}
	if !c.l.credentialsSent(c) {
		return errEvicted
	}
	props := r.table() // client properties
	if v, ok := props.Get("capabilities"); ok && v.Kind == wire.KindTable {
		if b, ok := v.Table.Get("connection.blocked"); ok && b.Kind == wire.KindBool && b.Int == 1 {
			c.blockedCap = true
		}
	}
	mech := r.shortstr()
	resp := r.longstr()
	r.shortstr() // locale
	if r.err != nil {
		return r.err
	}
	var user, pass string
	ok := false
	switch mech {
	case "PLAIN":
		parts := bytes.SplitN(resp, []byte{0}, 3)
		if len(parts) == 3 {
			user, pass, ok = string(parts[1]), string(parts[2]), true
		}
	case "AMQPLAIN":
		if t, err := parseTable(resp, 0); err == nil {
			l, _ := t.Get("LOGIN")
			p, _ := t.Get("PASSWORD")
			user, pass, ok = string(l.Bytes), string(p.Bytes), true
		}
	default:
		return connErr(accessRefused, "ACCESS_REFUSED - unsupported mechanism "+strconv.Quote(mech)+": use PLAIN or AMQPLAIN")
	}
	remote := c.nc.RemoteAddr().String()
	if !ok {
		return connErr(accessRefused, "ACCESS_REFUSED - malformed "+mech+" response")
	}
	tags, authed := c.srv.Authenticate(user, pass, remote)
	if !authed {
		return connErr(accessRefused, "ACCESS_REFUSED - "+c.srv.AuthRefusal(user, remote))
	}
	c.user = user
	for _, t := range tags {
		if t == "administrator" {
			c.admin = true
		}
	}
	// connection.tune
	c.mu.Lock()
	b, st = method(c.out, 0, classConnection, 30)
	b = binary.BigEndian.AppendUint16(b, c.l.cfg.ChannelMax)
	b = binary.BigEndian.AppendUint32(b, c.l.cfg.FrameMax)
	b = binary.BigEndian.AppendUint16(b, c.l.cfg.Heartbeat)
	c.out = endFrame(b, st)
	c.flushLocked()
	c.mu.Unlock()

	r, err = c.readMethod(classConnection, 31) // tune-ok
	if err != nil {
		return err
	}
	chMax, fMax, hb := r.u16(), r.u32(), r.u16()
	if r.err != nil {
		return r.err
	}
	c.channelMax = c.l.cfg.ChannelMax
	if chMax != 0 && chMax < c.channelMax {
		c.channelMax = chMax
	}
	if fMax != 0 && fMax < frameMinSize {
		return connErr(frameError, "FRAME_ERROR - frame-max "+strconv.Itoa(int(fMax))+" is below the least, 4096")
	}
	if fMax != 0 && fMax < c.frameMax {
		c.frameMax = fMax
	}
	r, err = c.readMethod(classConnection, 40) // open
	if err != nil {
		return err
	}
	vhost := r.shortstr()
	if r.err != nil {
		return r.err
	}
	if vhost != "/" && vhost != "" {
		return connErr(notAllowed, "NOT_ALLOWED - vhost "+strconv.Quote(vhost)+" not found: Warren has one virtual host, \"/\"")
	}
	c.mu.Lock()
	if hb != 0 {
		c.heartbeat = time.Duration(hb) * time.Second
	}
	b, st = method(c.out, 0, classConnection, 41)
	b = putShortstr(b, "")
	c.out = endFrame(b, st)
	c.flushLocked()
	c.mu.Unlock()
	return nil
}

// handle handles one frame of an open connection.
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
		c.mu.Unlock()
		if ch == nil {
			return connErr(channelError, "CHANNEL_ERROR - content on channel "+strconv.Itoa(int(chID))+", which is not open")
		}
		if ch.closing {
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
	if ch.closing {
		if class == classChannel && (id == 41 || id == 40) {
			if id == 40 {
				c.reply(chID, classChannel, 41, nil)
			}
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
// consumers held. Safe from any goroutine but a shard's (it submits).
func (c *conn) closeChannel(ch *channel, ae *amqpError) {
	cons := c.releaseChannel(ch)
	c.mu.Lock()
	b, st := method(c.out, ch.id, classChannel, 40)
	b = binary.BigEndian.AppendUint16(b, ae.code)
	b = putShortstr(b, ae.text)
	b = binary.BigEndian.AppendUint16(b, ae.class)
	b = binary.BigEndian.AppendUint16(b, ae.method)
	c.out = endFrame(b, st)
	c.flushLocked()
	c.mu.Unlock()
	for _, cr := range cons {
		c.srv.Submit(broker.Command{Kind: broker.CmdCancel, Queue: cr.q, Consumer: cr.id, Requeue: true})
	}
}

// releaseChannel marks a channel closing and returns its consumers.
func (c *conn) releaseChannel(ch *channel) []*consumer {
	c.mu.Lock()
	defer c.mu.Unlock()
	ch.closing = true
	ch.pub = nil
	cons := make([]*consumer, 0, len(ch.consumers))
	for _, cr := range ch.consumers {
		cons = append(cons, cr)
	}
	ch.consumers = nil
	ch.tags = nil
	c.resetStashLocked(ch)
	return cons
}

// reply sends a method whose arguments fill appends (nil: none).
func (c *conn) reply(ch uint16, class, id uint16, fill func([]byte) []byte) {
	c.mu.Lock()
	b, st := method(c.out, ch, class, id)
	if fill != nil {
		b = fill(b)
	}
	c.out = endFrame(b, st)
	c.flushLocked()
	c.mu.Unlock()
}

// control brackets a topology request as netio does: with a metadata log,
// the reply goes out only once the change is durable.
func (c *conn) control(f func() error) error {
	c.srv.BeginControlRun()
	err := f()
	if serr := c.srv.EndControlRun(); serr != nil {
		return connErr(internalError, "INTERNAL_ERROR - the metadata log stopped: "+serr.Error())
	}
	return err
}

func (c *conn) requester() broker.Requester {
	return broker.Requester{User: c.user, Admin: c.admin, Conn: c.id}
}
