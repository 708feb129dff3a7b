// Package httpbound bounds what clients of warrend's HTTP listeners (the
// web console, the admin API, /metrics and the probes) can make it hold:
// connections, and the time a connection may take to send its request or
// to read its response, or stay idle between requests.
//
//   - Connections (Limits.MaxConns, every listener of a Bound together):
//     counted from accept to close. At the cap, the oldest connection with
//     no request in progress (one that has not sent its request line yet,
//     or is idle between requests) is closed to admit the newcomer, so
//     idle sockets cannot lock real clients out; only when every connection
//     is serving a request is the newcomer refused, with a 503 whose body
//     names the limit. An eviction looks at each connection at most once.
//   - Headers: ReadHeaderTimeout (5 s) and MaxHeaderBytes (64 KiB; 431
//     past it) on the server.
//   - A request's body must arrive within Limits.Timeout of its headers
//     (the connection's read deadline, set only for a request with a body:
//     net/http reads ahead for the next request meanwhile, and a deadline
//     there would cancel the request's context), then the deadline goes.
//   - A response must be written within Limits.Timeout of its first byte
//     (a handler may wait longer before it answers: a decommission waits
//     up to 10 minutes), so a client that does not read its response lets
//     go of what it holds (a listing of every queue) at the latest then.
//   - Idle between requests: Limits.Timeout (the server's IdleTimeout).
//
// Never ReadTimeout or WriteTimeout on the server: the first cancels the
// context of a request that takes longer than it, the second would cut
// the long handlers' answers.
package httpbound

import (
	"io"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"
)

// Limits are the bounds; zero values take the defaults noted.
type Limits struct {
	MaxConns int           // connections at once, every listener together; 1,000
	Timeout  time.Duration // body, response, idle; 60 s
}

func (l *Limits) fill() {
	if l.MaxConns <= 0 {
		l.MaxConns = 1000
	}
	if l.Timeout <= 0 {
		l.Timeout = 60 * time.Second
	}
}

// Bound holds the connection count of the listeners it wraps.
type Bound struct {
	lim Limits

	mu    sync.Mutex
	n     int // connections open
	conns map[*conn]struct{}
	// head, tail: the connections with no request in progress, oldest
	// first (new ones, and those idle between requests).
	head, tail *conn
	// evicted counts connections closed to make room, refused those
	// refused (tests read them).
	evicted, refused int
}

// New makes a Bound.
func New(lim Limits) *Bound {
	lim.fill()
	return &Bound{lim: lim, conns: map[*conn]struct{}{}}
}

// Limits are the bounds in force (defaults filled in).
func (b *Bound) Limits() Limits { return b.lim }

// Counts reports the connections open, evicted and refused so far.
func (b *Bound) Counts() (open, evicted, refused int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.n, b.evicted, b.refused
}

// Server sets the server's header bounds, idle timeout and connection
// state hook, and wraps its handler in b.Handler.
func (b *Bound) Server(hs *http.Server) *http.Server {
	hs.ReadHeaderTimeout = 5 * time.Second
	hs.MaxHeaderBytes = 64 << 10
	hs.IdleTimeout = b.lim.Timeout
	hs.ConnState = b.connState
	hs.Handler = b.Handler(hs.Handler)
	return hs
}

// Listener wraps ln: its connections count against the cap.
func (b *Bound) Listener(ln net.Listener) net.Listener { return &listener{Listener: ln, b: b} }

type listener struct {
	net.Listener
	b *Bound
}

// conn is an accepted connection: it leaves the count when it closes.
type conn struct {
	net.Conn
	b          *Bound
	once       sync.Once
	waiting    bool // in the list: no request in progress (b.mu)
	prev, next *conn
}

func (c *conn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() {
		b := c.b
		b.mu.Lock()
		b.unlinkLocked(c)
		delete(b.conns, c)
		b.n--
		b.mu.Unlock()
	})
	return err
}

func (b *Bound) linkLocked(c *conn) {
	if c.waiting {
		return
	}
	c.waiting = true
	c.prev, c.next = b.tail, nil
	if b.tail != nil {
		b.tail.next = c
	} else {
		b.head = c
	}
	b.tail = c
}

func (b *Bound) unlinkLocked(c *conn) {
	if !c.waiting {
		return
	}
	c.waiting = false
	if c.prev != nil {
		c.prev.next = c.next
	} else {
		b.head = c.next
	}
	if c.next != nil {
		c.next.prev = c.prev
	} else {
		b.tail = c.prev
	}
	c.prev, c.next = nil, nil
}

func (l *listener) Accept() (net.Conn, error) {
	for {
		nc, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		b := l.b
		c := &conn{Conn: nc, b: b}
		b.mu.Lock()
		var victim *conn
		if b.n >= b.lim.MaxConns {
			victim = b.head
			if victim == nil {
				b.refused++
				b.mu.Unlock()
				go b.refuse(nc)
				continue
			}
			b.unlinkLocked(victim)
			b.evicted++
		}
		b.n++
		b.conns[c] = struct{}{}
		b.linkLocked(c)
		b.mu.Unlock()
		if victim != nil {
			_ = victim.Close() // counted out by its Close; its server goroutine sees the error
		}
		return c, nil
	}
}

// refuse answers a connection past the cap with a 503 naming the limit,
// then closes it (within a second: it is not waited for).
func (b *Bound) refuse(nc net.Conn) {
	msg := "connection limit of " + strconv.Itoa(b.lim.MaxConns) + " HTTP connections reached (max_http_connections), every one serving a request: try again shortly\n"
	_ = nc.SetWriteDeadline(time.Now().Add(time.Second))
	_, _ = nc.Write([]byte("HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\nRetry-After: 1\r\nContent-Length: " +
		strconv.Itoa(len(msg)) + "\r\n\r\n" + msg))
	_ = nc.Close()
}

// connState moves a connection in or out of the list of those that may be
// evicted.
func (b *Bound) connState(nc net.Conn, st http.ConnState) {
	c := unwrap(nc)
	if c == nil {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if _, ok := b.conns[c]; !ok {
		return // closed already
	}
	switch st {
	case http.StateActive, http.StateHijacked:
		b.unlinkLocked(c)
	case http.StateIdle:
		b.unlinkLocked(c) // to the tail: idle since now
		b.linkLocked(c)
	}
}

// unwrap finds the conn under a connection net/http hands the hook (a
// *tls.Conn over it on the HTTPS listener).
func unwrap(nc net.Conn) *conn {
	for {
		switch v := nc.(type) {
		case *conn:
			return v
		case interface{ NetConn() net.Conn }:
			nc = v.NetConn()
		default:
			return nil
		}
	}
}

// Handler bounds the time to read a request's body and to write its
// response (Limits.Timeout each).
func (b *Bound) Handler(h http.Handler) http.Handler {
	d := b.lim.Timeout
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rc := http.NewResponseController(w)
		_ = rc.SetWriteDeadline(time.Time{}) // the previous response's
		if r.Body != nil && r.Body != http.NoBody {
			_ = rc.SetReadDeadline(time.Now().Add(d))
			r.Body = &body{ReadCloser: r.Body, rc: rc}
		}
		bw := &boundWriter{ResponseWriter: w, rc: rc, d: d}
		h.ServeHTTP(bw, r)
		bw.start() // net/http writes what the handler did not
	})
}

// body clears the read deadline once the body is read to its end (a
// handler that stops before leaves it: net/http then discards the rest
// under it).
type body struct {
	io.ReadCloser
	rc      *http.ResponseController
	cleared bool
}

func (rb *body) Read(p []byte) (int, error) {
	n, err := rb.ReadCloser.Read(p)
	if err == io.EOF { // not on a timeout: net/http's discard of the rest runs under the deadline
		rb.done()
	}
	return n, err
}

func (rb *body) Close() error { return rb.ReadCloser.Close() }

// done drops the read deadline: net/http reads ahead for the next request
// from here on, and a deadline passing there cancels this one's context.
func (rb *body) done() {
	if !rb.cleared {
		rb.cleared = true
		_ = rb.rc.SetReadDeadline(time.Time{})
	}
}

// boundWriter sets the write deadline at the response's first byte.
type boundWriter struct {
	http.ResponseWriter
	rc      *http.ResponseController
	d       time.Duration
	started bool
}

func (w *boundWriter) start() {
	if !w.started {
		w.started = true
		_ = w.rc.SetWriteDeadline(time.Now().Add(w.d))
	}
}

func (w *boundWriter) WriteHeader(code int) {
	w.start()
	w.ResponseWriter.WriteHeader(code)
}

func (w *boundWriter) Write(p []byte) (int, error) {
	w.start()
	return w.ResponseWriter.Write(p)
}

// Flush passes a flush on (http.Flusher), after starting the deadline.
func (w *boundWriter) Flush() {
	w.start()
	_ = http.NewResponseController(w.ResponseWriter).Flush()
}

// Unwrap lets http.ResponseController reach the connection's writer.
func (w *boundWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }
