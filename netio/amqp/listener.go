// Package amqp is Warren's AMQP 0-9-1 front: a second protocol beside the
// native one (package netio), over the same broker core, the same users,
// connection ids, memory alarm and per-consumer prefetch cap. It turns AMQP
// methods into the broker's commands (broker.Submit, DeclareQueueAs, BindAs,
// …) and implements broker.Sink, turning effects into AMQP frames.
//
// It lives under netio because it is a connection layer like netio's own
// and uses the netio.Server it runs beside (users, ids, limits); nothing
// below netio imports it.
//
// Connections are served by the native protocol's gnet event loops: the
// listener accepts (one goroutine), applies the admission bounds and hands
// each connection to netio's engine (netio.Server.Enroll), which passes its
// events to the connection (a netio.FrontConn, conn.go). On the loop:
// reading, framing, publishes with their content, acks, heartbeats; the
// output goes out through one outbox per connection, one write in flight
// (gnet's AsyncWrite). Methods that may wait (topology changes, which wait
// for the metadata log; basic.get; the handshake's authentication) run off
// the loop, in order, while the loop reads nothing more of that
// connection. One tick goroutine per listener (tickInterval) looks after
// deadlines: the handshake's, heartbeats, a close-ok not coming.
//
// Files: conn.go the connection and its frames on the loop, handshake.go
// its handshake, hold.go its reading held at the unconfirmed bound or
// under the memory alarm (and connection.blocked), outbox.go its output
// written, close.go its closing, methods.go a method's dispatch by class
// (and the channel and confirm classes), exchange.go, queue.go, basic.go
// and tx.go those classes' methods, publish.go a publish's content and
// routing, sink.go what the shards send back (confirms, deliveries,
// consumers).
package amqp

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/warren-mq/warren/internal/ratelog"
	"github.com/warren-mq/warren/netio"
)

// Config is the AMQP front's configuration; zero values take the defaults
// noted.
type Config struct {
	Addr             string        // "127.0.0.1:5672"; port 0 picks a free one
	FrameMax         uint32        // proposed frame-max; 131072 (the least is 4096)
	ChannelMax       uint16        // proposed channel-max; 2047
	Heartbeat        uint16        // proposed heartbeat, seconds; 60
	MaxConnections   int           // AMQP connections at once; 10000
	MaxMessageSize   int           // a message's body; 16 MiB
	MaxUnconfirmed   int           // a connection's publishes not yet taken by their queues; 10000
	HandshakeTimeout time.Duration // from accept to connection.open-ok; 10s
	// MaxUnauthenticated caps the connections not yet at open-ok; 1000.
	MaxUnauthenticated int
	// MaxConnectionsPerSource caps the connections from one IP address;
	// 0: no cap.
	MaxConnectionsPerSource int
	// ProxyTrusted lists the peers (CIDRs) whose PROXY protocol header (v1
	// or v2) is read before the protocol header, as on the native
	// listener; empty: the PROXY protocol is off.
	ProxyTrusted []netip.Prefix
	Logger       *slog.Logger
}

func (c *Config) fill() {
	if c.Addr == "" {
		c.Addr = "127.0.0.1:5672"
	}
	if c.FrameMax == 0 {
		c.FrameMax = 131072
	}
	if c.FrameMax < frameMinSize {
		c.FrameMax = frameMinSize
	}
	if c.ChannelMax == 0 {
		c.ChannelMax = 2047
	}
	if c.Heartbeat == 0 {
		c.Heartbeat = 60
	}
	if c.MaxConnections <= 0 {
		c.MaxConnections = 10000
	}
	if c.MaxMessageSize <= 0 {
		c.MaxMessageSize = 16 << 20
	}
	if c.MaxUnconfirmed <= 0 {
		c.MaxUnconfirmed = 10000
	}
	if c.HandshakeTimeout <= 0 {
		c.HandshakeTimeout = 10 * time.Second
	}
	if c.MaxUnauthenticated <= 0 {
		c.MaxUnauthenticated = 1000
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
}

// Listener accepts AMQP connections for a netio.Server.
type Listener struct {
	srv *netio.Server
	cfg Config
	ln  net.Listener
	log *slog.Logger

	mu      sync.Mutex
	conns   map[*conn]struct{}
	closed  bool
	changed chan struct{} // closed when the connection count changes
	wg      sync.WaitGroup
	stop    chan struct{} // closed by Close: the tick ends

	// Admission (admission.go), guarded by mu.
	unauthN            int
	waitHead, waitTail *conn // not yet past their credentials, oldest first
	perSource          map[netip.Addr]int
	refusers           atomic.Int32
	evictLog           ratelog.Limiter
	refuseLog          ratelog.Limiter

	met                              listenerMetrics
	closedPublished, closedDelivered uint64 // what closed connections counted (mu)

	// Direct reply-to (replyto.go): the reply consumers by their names.
	replyMu sync.Mutex
	replies map[string]*replyConsumer

	// hookAtBound, if set (tests), hears a connection hold what it read
	// at the unconfirmed bound, with that many publishes in flight (loop).
	hookAtBound atomic.Pointer[func(inFlight int64)]
	// beforeOpen, if set (tests), runs as a connection is about to be
	// marked open, its vhost admitted and open-ok not yet sent.
	beforeOpen atomic.Pointer[func(user string)]
}

// tickInterval: how often the listener's tick looks at its connections.
const tickInterval = 100 * time.Millisecond

// Listen starts accepting AMQP connections on cfg.Addr.
func Listen(srv *netio.Server, cfg Config) (*Listener, error) {
	cfg.fill()
	ln, err := net.Listen("tcp", cfg.Addr)
	if err != nil {
		return nil, err
	}
	l := &Listener{srv: srv, cfg: cfg, ln: ln, log: cfg.Logger, conns: map[*conn]struct{}{}, replies: map[string]*replyConsumer{}, changed: make(chan struct{}),
		stop: make(chan struct{}), perSource: map[netip.Addr]int{}, evictLog: ratelog.Limiter{Every: 10 * time.Second},
		refuseLog: ratelog.Limiter{Every: 10 * time.Second}}
	l.met.init(l)
	l.followDeletes()
	l.wg.Add(2)
	go l.accept()
	go l.tick()
	l.log.Info("AMQP 0-9-1 listening", "addr", ln.Addr().String())
	return l, nil
}

// Addr is the address it listens on.
func (l *Listener) Addr() net.Addr { return l.ln.Addr() }

// MaxUnconfirmed is the bound on one connection's publishes in flight.
func (l *Listener) MaxUnconfirmed() int { return l.cfg.MaxUnconfirmed }

func (l *Listener) accept() {
	defer l.wg.Done()
	for {
		nc, err := l.ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			l.log.Warn("AMQP accept", "err", err)
			time.Sleep(10 * time.Millisecond) // EMFILE and the like: do not spin
			continue
		}
		remote := addrPortOf(nc)
		l.mu.Lock()
		if l.closed {
			l.mu.Unlock()
			_ = nc.Close()
			continue
		}
		victim, refusal := l.admitLocked(remote.Addr())
		if refusal != "" {
			l.mu.Unlock()
			l.refuse(nc, refusal)
			continue
		}
		c := newConn(l, remote)
		l.linkLocked(c, remote.Addr())
		l.conns[c] = struct{}{}
		l.notifyLocked()
		l.mu.Unlock()
		if victim != nil {
			victim.evict()
		}
		if err := l.srv.Enroll(nc, c); err != nil {
			if !errors.Is(err, netio.ErrClosing) {
				l.log.Warn("AMQP connection dropped: cannot hand it to an event loop", "remote", remote.String(), "err", err)
			}
			c.stopped.Store(true)
			l.forget(c)
		}
	}
}

// forget drops a connection whose socket is gone.
func (l *Listener) forget(c *conn) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, ok := l.conns[c]; !ok {
		return
	}
	l.forgetLocked(c)
	l.closedPublished += c.published.Load()
	l.closedDelivered += c.delivered.Load()
	delete(l.conns, c)
	l.notifyLocked()
}

// tick looks after every connection's deadlines (conn.tick) until Close.
func (l *Listener) tick() {
	defer l.wg.Done()
	t := time.NewTicker(tickInterval)
	defer t.Stop()
	var conns []*conn
	for {
		select {
		case <-l.stop:
			return
		case <-t.C:
		}
		l.mu.Lock()
		conns = conns[:0]
		for c := range l.conns {
			conns = append(conns, c)
		}
		l.mu.Unlock()
		now := time.Now().UnixMilli()
		for _, c := range conns {
			c.tick(now)
		}
		clear(conns)
	}
}

func (l *Listener) notifyLocked() {
	close(l.changed)
	l.changed = make(chan struct{})
}

// ConnectionCount is the number of AMQP connections being served.
func (l *Listener) ConnectionCount() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.conns)
}

// WaitConnections waits until at most n connections are being served.
func (l *Listener) WaitConnections(ctx context.Context, n int) error {
	for {
		l.mu.Lock()
		count, ch := len(l.conns), l.changed
		l.mu.Unlock()
		if count <= n {
			return nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// closeGrace bounds how long Close waits for its connections' sockets to
// close (their connection.close written).
const closeGrace = 5 * time.Second

// Close stops accepting, closes every connection with connection_forced
// and waits for them to be gone (for closeGrace at most).
func (l *Listener) Close() error {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return nil
	}
	l.closed = true
	conns := make([]*conn, 0, len(l.conns))
	for c := range l.conns {
		conns = append(conns, c)
	}
	l.mu.Unlock()
	err := l.ln.Close()
	close(l.stop)
	for _, c := range conns {
		c.forceClose(connectionForced, "CONNECTION_FORCED - broker shutting down")
	}
	ctx, cancel := context.WithTimeout(context.Background(), closeGrace)
	defer cancel()
	if werr := l.WaitConnections(ctx, 0); werr != nil {
		l.mu.Lock()
		for c := range l.conns {
			c.closeNow()
		}
		l.mu.Unlock()
	}
	l.wg.Wait()
	return err
}
