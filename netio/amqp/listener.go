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
// Each connection is served by two goroutines, a reader (blocking reads of
// whole frames, bounded by the negotiated frame-max) and a writer (one
// outbox, bounded, written in batches), not by gnet's event loops: gnet
// serves one listener per engine here, and sharing netio's loops would mean
// reshaping netio's OnTraffic around two protocols. Moving it onto a gnet
// engine of its own is open work (see README, AMQP 0-9-1).
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
	Logger                  *slog.Logger
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

	// Admission (admission.go), guarded by mu.
	unauthN            int
	waitHead, waitTail *conn // not yet past their credentials, oldest first
	perSource          map[netip.Addr]int
	refusers           atomic.Int32
	evictLog           ratelog.Limiter
	refuseLog          ratelog.Limiter

	met                              listenerMetrics
	closedPublished, closedDelivered uint64 // what closed connections counted (mu)

	// hookAtBound, if set (tests), hears a reader stop at the unconfirmed
	// bound with that many publishes in flight.
	hookAtBound func(inFlight int64)
}

// Listen starts accepting AMQP connections on cfg.Addr.
func Listen(srv *netio.Server, cfg Config) (*Listener, error) {
	cfg.fill()
	ln, err := net.Listen("tcp", cfg.Addr)
	if err != nil {
		return nil, err
	}
	l := &Listener{srv: srv, cfg: cfg, ln: ln, log: cfg.Logger, conns: map[*conn]struct{}{}, changed: make(chan struct{}),
		perSource: map[netip.Addr]int{}, evictLog: ratelog.Limiter{Every: 10 * time.Second}, refuseLog: ratelog.Limiter{Every: 10 * time.Second}}
	l.met.init(l)
	l.wg.Add(1)
	go l.accept()
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
		src := sourceOf(nc)
		l.mu.Lock()
		if l.closed {
			l.mu.Unlock()
			_ = nc.Close()
			continue
		}
		victim, refusal := l.admitLocked(src)
		if refusal != "" {
			l.mu.Unlock()
			l.refuse(nc, refusal)
			continue
		}
		c := newConn(l, nc)
		// The handshake deadline, set before the connection can be
		// evicted (evict moves it to now).
		_ = nc.SetReadDeadline(time.Now().Add(l.cfg.HandshakeTimeout))
		l.linkLocked(c, src)
		l.conns[c] = struct{}{}
		l.notifyLocked()
		l.wg.Add(1)
		l.mu.Unlock()
		if victim != nil {
			victim.evict()
		}
		go func() {
			defer l.wg.Done()
			c.serve()
			l.mu.Lock()
			l.forgetLocked(c)
			l.closedPublished += c.published.Load()
			l.closedDelivered += c.delivered.Load()
			delete(l.conns, c)
			l.notifyLocked()
			l.mu.Unlock()
		}()
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

// Close stops accepting, closes every connection with connection_forced
// and waits for their goroutines.
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
	for _, c := range conns {
		c.forceClose(connectionForced, "CONNECTION_FORCED - broker shutting down")
	}
	l.wg.Wait()
	return err
}
