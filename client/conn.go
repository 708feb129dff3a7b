// Package client is the Go SDK for Warren: connect, declare topology,
// publish with confirms, consume with acks. It speaks the wire protocol of
// spec/PROTOCOL.md over a plain net.Conn.
//
// Publishing is asynchronous and batched: PublishAsync appends the message
// to an open batch and returns; one writer goroutine sends whatever has
// accumulated whenever the socket is free, so a plain loop of publishes
// goes out as large PUBLISH frames. Confirms arrive as ranges and are
// delivered to Publish waiters and NotifyConfirm handlers. Acks are batched
// the same way: Delivery.Ack only records the tag; the writer sends them as
// ranges.
//
// A URL is warren://user:pass@host:port/vhost (warrens:// over TLS; ports
// 5680 and 5681 by default, guest/guest and the vhost "/" when left out).
// Its host part may list several nodes of a cluster, comma-separated:
// warren://app:secret@h1:5680,h2:5690,h3:5700/staging, with the same
// credentials, vhost and TLS settings for all. Dial connects to the first
// that answers, in order; a Session (Connect) fails over between them when
// its node goes, and restores its topology and consumers on the next.
package client

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/warren-mq/warren/wire"
)

// Error is a protocol error from the broker, with its stable code.
type Error = wire.Error

// ErrClosed is returned for operations on a closed connection or channel.
var ErrClosed = errors.New("client: closed")

// ErrConnectionLost is the error of every publish that was not confirmed
// when its connection went away: it may or may not have been taken.
var ErrConnectionLost = errors.New("client: connection lost before the broker confirmed")

// Options tune a connection. Zero values take the defaults.
type Options struct {
	Heartbeat     time.Duration // proposed; 10s. Negative disables.
	MaxFrame      uint32        // proposed; the broker's
	ConfirmWindow int           // unconfirmed publishes per channel before PublishAsync blocks; 10000
	Name          string        // client product name sent to the broker
	// TLS configures warrens:// connections (nil: the system's roots).
	// RootCAs trusts a private CA; Certificates presents a client
	// certificate: with one, and no user in the URL, the client
	// authenticates with EXTERNAL as the certificate's subject CN when the
	// broker offers it. ServerName defaults to the URL's host. LoadTLS
	// builds one from PEM files.
	TLS *tls.Config
	// Vhost is the virtual host to open ("" or "/": the default). The
	// URL's path names one too (warren://host/staging; "/" written %2F),
	// as an AMQP URI does; this field, when set, wins.
	Vhost string
}

// Conn is a connection to a broker. It is safe for concurrent use.
type Conn struct {
	nc   net.Conn
	opts Options
	addr string // the node's host:port
	node int    // its index in the URL's node list

	maxFrame    uint32
	maxChannels uint16
	heartbeat   time.Duration
	ID          uint64 // the broker's connection id

	wmu      sync.Mutex
	wcond    *sync.Cond
	wbuf     []byte
	wspare   []byte
	open     *Channel // channel with an open publish batch at the end of wbuf
	settles  map[*Channel]struct{}
	closing  bool
	lastSend atomic.Int64
	lastRecv atomic.Int64

	mu       sync.Mutex
	channels map[uint16]*Channel
	nextCh   uint16
	err      error
	shut     bool
	done     chan struct{}
	flowOn   bool
	flowCond *sync.Cond

	scratch []byte // writer-owned
}

// ParseURL splits warren://user:pass@host:port (or warrens://, the same
// over TLS) into its parts (port 5680, or 5681 for warrens://, by default;
// guest/guest when no user is given). Of a URL that names several nodes it
// returns the first node's address.
func ParseURL(raw string) (addr, user, pass string, err error) {
	u, err := parseURL(raw)
	if err != nil {
		return "", "", "", err
	}
	return u.nodes[0].addr, u.user, u.pass, nil
}

// urlForm is the URL's grammar, for errors.
const urlForm = "warren://[user:pass@]host[:port][,host[:port]...][/vhost] (warrens:// for TLS)"

type parsedURL struct {
	nodes      []node // at least one
	user, pass string
	vhost      string // the path, without its leading "/"
	tls        bool   // warrens://
	userGiven  bool
}

// node is one broker address of a URL.
type node struct {
	addr string // host:port, the port defaulted
	host string // the host alone: TLS verifies the server's name against it
}

// parseURL reads a warren:// or warrens:// URL whose host part may be a
// comma-separated list of nodes (as RabbitMQ's and NATS's clients take
// them). Each node is parsed as a URL of its own with the shared scheme,
// userinfo and path, so a node is whatever net/url accepts as a host (a
// name, an IPv4 address, a bracketed IPv6 one, with or without a port).
func parseURL(raw string) (parsedURL, error) {
	var p parsedURL
	scheme, rest, ok := strings.Cut(raw, "://")
	if !ok {
		return p, fmt.Errorf("client: bad url: want %s", urlForm)
	}
	port := "5680"
	switch strings.ToLower(scheme) {
	case "warren":
	case "warrens":
		p.tls, port = true, "5681"
	default:
		return p, fmt.Errorf("client: url scheme must be warren:// or warrens:// (TLS), got %q", scheme)
	}
	// The authority ends where the path, query or fragment starts, and its
	// userinfo at its last "@", as net/url reads them: a comma in a
	// password or a path is theirs, not the node list's.
	end := strings.IndexAny(rest, "/?#")
	if end < 0 {
		end = len(rest)
	}
	authority, tail := rest[:end], rest[end:]
	userinfo, hostList := "", authority
	if i := strings.LastIndex(authority, "@"); i >= 0 {
		userinfo, hostList = authority[:i+1], authority[i+1:]
	}
	hosts := strings.Split(hostList, ",")
	for i, h := range hosts {
		where := ""
		if len(hosts) > 1 {
			if h == "" {
				return p, fmt.Errorf("client: bad url: node %d of %d is empty (want %s)", i+1, len(hosts), urlForm)
			}
			where = fmt.Sprintf(": node %d of %d (%q)", i+1, len(hosts), h)
		}
		u, err := url.Parse(scheme + "://" + userinfo + h + tail)
		if err != nil {
			var ue *url.Error
			if errors.As(err, &ue) {
				err = ue.Err // ue.URL would print the password
			}
			return p, fmt.Errorf("client: bad url%s: %w", where, err)
		}
		if u.Hostname() == "" {
			return p, fmt.Errorf("client: bad url%s: names no host (want %s)", where, urlForm)
		}
		n := node{host: u.Hostname(), addr: u.Host}
		if u.Port() == "" {
			n.addr = net.JoinHostPort(n.host, port)
		} else if pn, err := strconv.Atoi(u.Port()); err != nil || pn < 1 || pn > 65535 {
			return p, fmt.Errorf("client: bad url%s: port %s is not in 1..65535", where, u.Port())
		}
		p.nodes = append(p.nodes, n)
		if i == 0 {
			p.user, p.pass = "guest", "guest"
			if u.User != nil {
				p.userGiven = true
				p.user = u.User.Username()
				p.pass, _ = u.User.Password()
			}
			p.vhost = strings.TrimPrefix(u.Path, "/") // decoded: %2F is "/"
		}
	}
	return p, nil
}

// Dial connects and authenticates. The context bounds the whole attempt.
//
// A URL that names several nodes (warren://u:p@h1:5680,h2:5690/vhost) is
// tried node by node, in order, until one completes the handshake: a node
// that refuses the connection, times out or fails the handshake is passed
// over, and the error, if none answers, names each node's failure (an
// errors.Is or errors.As reaches every one of them). When the context has
// a deadline, each node gets an equal share of the time left (at least
// minNodeDial), as net.Dialer shares it among a name's addresses, so one
// silent node does not use up the rest's time; without a deadline, a node
// that never answers holds Dial until the system gives up connecting.
func Dial(ctx context.Context, rawURL string, opts ...Options) (*Conn, error) {
	pu, err := parseURL(rawURL)
	if err != nil {
		return nil, err
	}
	var o Options
	if len(opts) > 0 {
		o = opts[0]
	}
	return dialNodes(ctx, &pu, o.withDefaults(&pu), 0)
}

func (o Options) withDefaults(pu *parsedURL) Options {
	if o.Heartbeat == 0 {
		o.Heartbeat = 10 * time.Second
	}
	if o.ConfirmWindow <= 0 {
		o.ConfirmWindow = 10000
	}
	if o.Name == "" {
		o.Name = "warren-go"
	}
	if o.Vhost == "" {
		o.Vhost = pu.vhost
	}
	return o
}

// minNodeDial is the least time a node of several gets when the context's
// deadline is shared among them (net.Dialer's saneMinimum).
const minNodeDial = 2 * time.Second

// dialNodes tries pu's nodes in order from first, wrapping around, and
// returns the first connection made.
func dialNodes(ctx context.Context, pu *parsedURL, o Options, first int) (*Conn, error) {
	n := len(pu.nodes)
	if n == 1 {
		return dialNode(ctx, pu, 0, o)
	}
	var errs []error
	for k := 0; k < n; k++ {
		i := (first + k) % n
		nctx, cancel := ctx, context.CancelFunc(func() {})
		if dl, ok := ctx.Deadline(); ok && k < n-1 {
			share := time.Until(dl) / time.Duration(n-k)
			if share < minNodeDial {
				share = minNodeDial
			}
			nctx, cancel = context.WithTimeout(ctx, share)
		}
		c, err := dialNode(nctx, pu, i, o)
		cancel()
		if err == nil {
			return c, nil
		}
		errs = append(errs, fmt.Errorf("%s: %w", pu.nodes[i].addr, err))
		if ctx.Err() != nil {
			break
		}
	}
	format := "client: no node of %d answered: " + strings.TrimSuffix(strings.Repeat("%w; ", len(errs)), "; ")
	args := []any{n}
	for _, e := range errs {
		args = append(args, e)
	}
	return nil, fmt.Errorf(format, args...)
}

// dialNode connects to pu's node i and completes the handshake.
func dialNode(ctx context.Context, pu *parsedURL, i int, o Options) (*Conn, error) {
	nd := pu.nodes[i]
	var d net.Dialer
	nc, err := d.DialContext(ctx, "tcp", nd.addr)
	if err != nil {
		return nil, err
	}
	external := false
	if pu.tls {
		cfg := o.TLS.Clone()
		if cfg == nil {
			cfg = &tls.Config{}
		}
		if cfg.ServerName == "" {
			cfg.ServerName = nd.host
		}
		external = !pu.userGiven && (len(cfg.Certificates) > 0 || cfg.GetClientCertificate != nil)
		tc := tls.Client(nc, cfg)
		if err := tc.HandshakeContext(ctx); err != nil {
			nc.Close()
			return nil, fmt.Errorf("client: TLS handshake with %s: %w", nd.addr, err)
		}
		nc = tc
	}
	c := &Conn{nc: nc, opts: o, addr: nd.addr, node: i, channels: map[uint16]*Channel{}, done: make(chan struct{}), flowOn: true, settles: map[*Channel]struct{}{}}
	c.wcond = sync.NewCond(&c.wmu)
	c.flowCond = sync.NewCond(&c.mu)
	if dl, ok := ctx.Deadline(); ok {
		_ = nc.SetDeadline(dl)
	}
	stop := context.AfterFunc(ctx, func() { _ = nc.SetDeadline(time.Unix(1, 0)) })
	err = c.handshake(pu.user, pu.pass, external)
	stop()
	if err != nil {
		nc.Close()
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, err
	}
	_ = nc.SetDeadline(time.Time{})
	now := time.Now().UnixNano()
	c.lastSend.Store(now)
	c.lastRecv.Store(now)
	go c.writer()
	go c.reader()
	if c.heartbeat > 0 {
		go c.heartbeater()
	}
	return c, nil
}

// Addr is the address (host:port) of the node this connection is to: of a
// URL that names several, the one that answered.
func (c *Conn) Addr() string { return c.addr }

// readFrame reads one whole frame (handshake only; later the reader loop
// buffers).
func readFrame(nc net.Conn, buf []byte, limit uint32) (wire.Frame, []byte, error) {
	hdr := buf[:wire.HeaderSize]
	if _, err := ioReadFull(nc, hdr); err != nil {
		return wire.Frame{}, buf, err
	}
	size := wire.FrameSize(hdr)
	if uint64(size) > uint64(limit) {
		return wire.Frame{}, buf, &wire.Error{Code: wire.FrameTooLarge, Reason: "handshake frame too large"}
	}
	if cap(buf) < size {
		nb := make([]byte, size)
		copy(nb, hdr)
		buf = nb
	}
	buf = buf[:size]
	if _, err := ioReadFull(nc, buf[wire.HeaderSize:]); err != nil {
		return wire.Frame{}, buf, err
	}
	f, _, err := wire.Split(buf, limit)
	return f, buf, err
}

func ioReadFull(nc net.Conn, b []byte) (int, error) {
	n := 0
	for n < len(b) {
		m, err := nc.Read(b[n:])
		n += m
		if err != nil {
			return n, err
		}
	}
	return n, nil
}

func (c *Conn) handshake(user, pass string, external bool) error {
	if _, err := c.nc.Write(wire.Preamble[:]); err != nil {
		return err
	}
	buf := make([]byte, 512)
	f, buf, err := readFrame(c.nc, buf, wire.HandshakeMaxFrame)
	if err != nil {
		return fmt.Errorf("client: reading HELLO: %w", err)
	}
	body, err := wire.Decode(f, wire.HandshakeMaxFrame, nil)
	if err != nil {
		return err
	}
	hello, ok := body.(*wire.Hello)
	if cl, isClose := body.(*wire.Close); isClose {
		// Refused in place of HELLO (a connection limit, say).
		return &wire.Error{Code: cl.Code, Reason: cl.Reason}
	}
	if !ok {
		return fmt.Errorf("client: expected HELLO, got %v", f.Type)
	}
	hb := uint32(0)
	if c.opts.Heartbeat > 0 {
		hb = uint32(c.opts.Heartbeat / time.Millisecond)
	}
	auth := &wire.Auth{Mechanism: "PLAIN", Response: wire.PlainResponse(user, pass), Product: c.opts.Name,
		Version: "0.1.0", MaxFrame: c.opts.MaxFrame, HeartbeatMs: hb}
	if external {
		if !slices.Contains(hello.Mechanisms, "EXTERNAL") {
			// Go sends no certificate the server's CA list does not name,
			// and the broker offers EXTERNAL only for a verified one.
			return errors.New("client: the broker does not offer EXTERNAL: it has no verified client certificate for this connection " +
				"(a certificate from a CA it trusts, tls_ca), or put a user and password in the URL")
		}
		auth.Mechanism, auth.Response = "EXTERNAL", nil // the certificate's CN is the user
	}
	if v := c.opts.Vhost; v != "" && v != "/" {
		// Sent only to a broker that reads it (spec §5.2.1).
		if !slices.Contains(hello.Capabilities, wire.CapVhosts) {
			return fmt.Errorf("client: virtual host %q asked for, and the broker has no virtual hosts (its HELLO does not list %q)", v, wire.CapVhosts)
		}
		auth.Vhost = v
	}
	if _, err := c.nc.Write(wire.AppendFrame(nil, 0, auth)); err != nil {
		return err
	}
	f, _, err = readFrame(c.nc, buf, wire.HandshakeMaxFrame)
	if err != nil {
		return fmt.Errorf("client: reading OPEN_OK: %w", err)
	}
	body, err = wire.Decode(f, wire.HandshakeMaxFrame, nil)
	if err != nil {
		return err
	}
	switch b := body.(type) {
	case *wire.OpenOK:
		c.ID, c.maxFrame, c.maxChannels = b.ConnectionID, b.MaxFrame, b.MaxChannels
		c.heartbeat = time.Duration(b.HeartbeatMs) * time.Millisecond
		return nil
	case *wire.Close:
		return &wire.Error{Code: b.Code, Reason: b.Reason}
	}
	return fmt.Errorf("client: expected OPEN_OK, got %v", f.Type)
}

// Done is closed when the connection is closed; Err then says why.
func (c *Conn) Done() <-chan struct{} { return c.done }

// Err returns why the connection closed: nil while open, ErrClosed after
// Close, or the failure that ended it.
func (c *Conn) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

// Close closes the connection cleanly: pending frames are flushed, CLOSE is
// sent and the socket closed.
func (c *Conn) Close() error {
	c.wmu.Lock()
	if c.closing {
		c.wmu.Unlock()
		<-c.done
		return nil
	}
	c.sealLocked()
	c.flushSettlesLocked()
	c.wbuf = wire.AppendFrame(c.wbuf, 0, &wire.Close{Code: wire.OK})
	c.closing = true
	c.wcond.Broadcast()
	c.wmu.Unlock()
	select {
	case <-c.done:
	case <-time.After(5 * time.Second):
		c.shutdown(ErrClosed)
	}
	return nil
}

// shutdown tears the connection down once, failing everything pending.
func (c *Conn) shutdown(err error) {
	c.mu.Lock()
	if c.shut {
		c.mu.Unlock()
		return
	}
	c.shut = true
	c.err = err
	chans := make([]*Channel, 0, len(c.channels))
	for _, ch := range c.channels {
		chans = append(chans, ch)
	}
	c.flowCond.Broadcast()
	c.mu.Unlock()
	c.wmu.Lock()
	c.closing = true
	c.wcond.Broadcast()
	c.wmu.Unlock()
	_ = c.nc.Close()
	lost := ErrConnectionLost
	if err != nil && !errors.Is(err, ErrClosed) {
		lost = fmt.Errorf("%w: %w", ErrConnectionLost, err)
	}
	for _, ch := range chans {
		ch.fail(lost)
	}
	// Done closes last: by then every waiter and handler has been told.
	close(c.done)
}

// writer sends whatever accumulated, whenever the socket is free.
func (c *Conn) writer() {
	for {
		c.wmu.Lock()
		for len(c.wbuf) == 0 && len(c.settles) == 0 && c.open == nil && !c.closing {
			c.wcond.Wait()
		}
		c.sealLocked()
		c.flushSettlesLocked()
		out := c.wbuf
		c.wbuf = c.wspare[:0]
		closing := c.closing
		c.wmu.Unlock()
		if len(out) > 0 {
			if _, err := c.nc.Write(out); err != nil {
				c.shutdown(fmt.Errorf("client: write: %w", err))
				return
			}
			c.lastSend.Store(time.Now().UnixNano())
		}
		c.wmu.Lock()
		c.wspare = out[:0]
		c.wmu.Unlock()
		if closing {
			select {
			case <-c.done:
				return
			default:
			}
			c.wmu.Lock()
			empty := len(c.wbuf) == 0
			c.wmu.Unlock()
			if empty {
				// Wait for CLOSE_OK (the reader shuts down), but not forever.
				select {
				case <-c.done:
				case <-time.After(2 * time.Second):
					c.shutdown(ErrClosed)
				}
				return
			}
		}
	}
}

// sendFrame queues one control frame. c.wmu must not be held.
func (c *Conn) sendFrame(ch uint16, b wire.Body) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if c.closing {
		return c.closedErr()
	}
	c.sealLocked()
	// Settlements queued before this frame go before it: the broker
	// applies frames in the order it reads them.
	c.flushSettlesLocked()
	c.wbuf = wire.AppendFrame(c.wbuf, ch, b)
	c.wcond.Signal()
	return nil
}

func (c *Conn) closedErr() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err != nil {
		return c.err
	}
	return ErrClosed
}

func (c *Conn) heartbeater() {
	t := time.NewTicker(c.heartbeat / 2)
	defer t.Stop()
	for {
		select {
		case <-c.done:
			return
		case <-t.C:
		}
		now := time.Now().UnixNano()
		if now-c.lastRecv.Load() > int64(2*c.heartbeat) {
			c.shutdown(&wire.Error{Code: wire.HeartbeatTimeout, Reason: "no traffic from the broker for two heartbeat intervals"})
			return
		}
		if now-c.lastSend.Load() >= int64(c.heartbeat/2) {
			_ = c.sendFrame(0, &wire.Heartbeat{})
		}
	}
}

// Channel opens a new channel.
func (c *Conn) Channel(ctx context.Context) (*Channel, error) {
	c.mu.Lock()
	if c.err != nil {
		c.mu.Unlock()
		return nil, c.err
	}
	var id uint16
	for i := 0; i < int(c.maxChannels); i++ {
		c.nextCh = c.nextCh%c.maxChannels + 1
		if _, used := c.channels[c.nextCh]; !used {
			id = c.nextCh
			break
		}
	}
	if id == 0 {
		c.mu.Unlock()
		return nil, errors.New("client: no free channel id")
	}
	ch := newChannel(c, id)
	c.channels[id] = ch
	c.mu.Unlock()
	if _, err := ch.request(ctx, func(req uint32) wire.Body { return &wire.ChannelOpen{Req: req} }); err != nil {
		c.mu.Lock()
		delete(c.channels, id)
		c.mu.Unlock()
		return nil, err
	}
	return ch, nil
}

// FlowPaused reports whether the broker has asked this connection to stop
// publishing (FLOW active=false); publishes block until it resumes.
func (c *Conn) FlowPaused() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return !c.flowOn
}

// LoadTLS builds a tls.Config for Options.TLS from PEM files: caFile (a
// private CA to trust instead of the system's roots; "" keeps them) and
// certFile with keyFile (a client certificate for mutual TLS; "" for
// none).
func LoadTLS(caFile, certFile, keyFile string) (*tls.Config, error) {
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if caFile != "" {
		b, err := os.ReadFile(caFile)
		if err != nil {
			return nil, fmt.Errorf("client: CA file: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(b) {
			return nil, fmt.Errorf("client: CA file %s holds no PEM certificate", caFile)
		}
		cfg.RootCAs = pool
	}
	if (certFile == "") != (keyFile == "") {
		return nil, errors.New("client: a client certificate needs both its file and its key's")
	}
	if certFile != "" {
		cert, err := tls.LoadX509KeyPair(certFile, keyFile)
		if err != nil {
			return nil, fmt.Errorf("client: client certificate: %w", err)
		}
		cfg.Certificates = []tls.Certificate{cert}
	}
	return cfg, nil
}
