package netio

import (
	"net"
	"net/netip"
	"strconv"
	"time"

	"github.com/VictoriaMetrics/metrics"
	"github.com/warren-mq/warren/internal/ratelog"
	"github.com/warren-mq/warren/wire"
)

// Bounds on connections before they authenticate.
//
//   - Handshake deadline (Config.HandshakeTimeout): a connection that has
//     not reached OPEN_OK this long after accept is closed by the tick,
//     whatever it sent meanwhile (a partial preamble, extension frames, an
//     AUTH one byte at a time). Past the preamble it gets CLOSE
//     resource_limit saying why; before it, the socket is just closed (the
//     peer may not speak Warren at all).
//   - Unauthenticated cap (Config.MaxUnauthenticated), below the overall
//     MaxConnections: a connection counts from accept until OPEN_OK. At the
//     cap, a newcomer is admitted by closing the oldest connection still
//     waiting for its preamble or AUTH (CLOSE resource_limit), so idle
//     sockets cannot lock real clients out: a real client spends one round
//     trip there, an idle socket its whole life. Only when every
//     unauthenticated connection has sent its credentials (being checked)
//     is the newcomer refused instead. An eviction is constant work, as a
//     flood makes one per accept: the connections still waiting for their
//     preamble or AUTH are a list, oldest first, that a connection leaves
//     when it sends AUTH (it stays counted until OPEN_OK or its close), so
//     the head is the one to close; evictions are logged as a rate-limited
//     summary and counted in warren_connections_refused_total
//     {reason="unauthenticated"}.
//   - Per-source cap (Config.MaxConnectionsPerSource, off by default): the
//     connections from one IP address, by the PROXY header's source when
//     there is one.
//
// A refused connection gets CLOSE resource_limit with the reason as the
// answer to its preamble (in place of HELLO), then the socket closes: never a
// bare reset. The bookkeeping is guarded by Server.connsMu and runs once
// per accept, authentication and close, never per frame.
type admission struct {
	unauthN                int   // connections not yet at OPEN_OK
	unauthHead, unauthTail *conn // those waiting for their preamble or AUTH, oldest first
	perSource              map[netip.Addr]int
	// examined counts the connections looked at to choose the ones to
	// close at the cap, evicted those closed (tests read them: choosing
	// one must not depend on how many connections there are).
	examined, evicted int

	refusedMax, refusedPerSource, refusedUnauth, refusedProxy *metrics.Counter
	handshakeTimeouts                                         *metrics.Counter
	evictLog                                                  ratelog.Limiter
}

// connAdmission is a connection's share of the admission bookkeeping.
type connAdmission struct {
	openedMs int64
	// remote is the client's address: the peer's, or the source a trusted
	// proxy's PROXY header gave. Unmapped (an IPv4 client of a dual-stack
	// listener is its IPv4 address). Read once on the loop at accept: gnet
	// clears RemoteAddr on close. Written on the loop under mu (a PROXY
	// header), read by the loop and, under mu, by Connections.
	remote netip.AddrPort
	// viaProxy: the peer is a trusted proxy, so a PROXY header may come
	// before the preamble and the source is known only after it.
	viaProxy  bool
	proxyDone bool // loop-owned: the PROXY header (if any) has been read

	// guarded by Server.connsMu
	unauth       bool // counted in admission.unauthN
	waiting      bool // linked in the list: waiting for its preamble or AUTH
	srcCounted   bool // counted in admission.perSource
	uprev, unext *conn
}

func (a *admission) init(set *metrics.Set, unauthN func() float64) {
	a.perSource = map[netip.Addr]int{}
	a.evictLog = ratelog.Limiter{Every: 10 * time.Second}
	a.refusedMax = set.NewCounter(`warren_connections_refused_total{reason="max_connections"}`)
	a.refusedPerSource = set.NewCounter(`warren_connections_refused_total{reason="per_source"}`)
	a.refusedUnauth = set.NewCounter(`warren_connections_refused_total{reason="unauthenticated"}`)
	a.refusedProxy = set.NewCounter(`warren_connections_refused_total{reason="proxy_untrusted"}`)
	a.handshakeTimeouts = set.NewCounter("warren_handshake_timeouts_total")
	set.NewGauge("warren_connections_unauthenticated", unauthN)
}

// remoteAddr reads remote from outside the connection's loop.
func (c *conn) remoteAddr() netip.AddrPort {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.remote
}

func (s *Server) unauthenticatedCount() float64 {
	s.connsMu.Lock()
	defer s.connsMu.Unlock()
	return float64(s.adm.unauthN)
}

// initAdmission sets a new connection's address fields.
func (s *Server) initAdmission(c *conn) {
	c.openedMs = s.nowMs()
	if p, ok := c.gc.Context().(*tlsPeer); ok { // from the TLS front: the client's address is the TCP peer's
		c.tls = p
		c.remote = p.remote
	} else if a, ok := c.gc.RemoteAddr().(*net.TCPAddr); ok {
		ap := a.AddrPort()
		c.remote = netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
	}
	c.loopback = c.remote.Addr().IsLoopback()
	if c.tls != nil {
		return // the PROXY protocol is the plain port's (a proxy that sends it does not pass TLS through)
	}
	for _, p := range s.cfg.ProxyTrusted {
		if p.Contains(c.remote.Addr()) {
			c.viaProxy = true
			break
		}
	}
}

// admitLocked decides on a new connection: "" admits it (victim, if not
// nil, is to be closed to make room), anything else is the reason it is
// refused. s.connsMu must be held.
func (s *Server) admitLocked(c *conn) (victim *conn, refusal string) {
	a := &s.adm
	if len(s.conns) >= s.cfg.MaxConnections {
		a.refusedMax.Inc()
		return nil, "connection limit of " + strconv.Itoa(s.cfg.MaxConnections) + " reached (max_connections)"
	}
	if !c.viaProxy {
		if r := s.admitSourceLocked(c); r != "" {
			return nil, r
		}
	}
	if a.unauthN >= s.cfg.MaxUnauthenticated {
		// The head is the oldest waiting for its preamble or AUTH, unless
		// it is already closing (handshake deadline, bad preamble): such a
		// one is let go of here, so each connection is examined at most
		// once however many there are.
		for a.unauthN >= s.cfg.MaxUnauthenticated && a.unauthHead != nil {
			v := a.unauthHead
			a.examined++
			s.releaseUnauthLocked(v)
			if st := v.state.Load(); st == stPreamble || st == stAuth {
				victim = v
				a.evicted++
				a.refusedUnauth.Inc()
			}
		}
		if a.unauthN >= s.cfg.MaxUnauthenticated {
			if c.srcCounted {
				s.releaseSourceLocked(c)
			}
			a.refusedUnauth.Inc()
			return nil, s.unauthReason()
		}
	}
	c.unauth, c.waiting = true, true
	c.uprev = a.unauthTail
	if a.unauthTail != nil {
		a.unauthTail.unext = c
	} else {
		a.unauthHead = c
	}
	a.unauthTail = c
	a.unauthN++
	return victim, ""
}

// evicted closes victim, the connection admitLocked chose to make room:
// a CLOSE with the reason, and a log line at most every 10 s that says
// how many.
func (s *Server) evicted(victim *conn) {
	victim.closeWith(wire.ResourceLimit, s.unauthReason())
	if ok, n := s.adm.evictLog.Allow(time.UnixMilli(s.nowMs())); ok {
		s.log.Info("unauthenticated connection closed to admit a new one (max_unauthenticated_connections)",
			"max_unauthenticated_connections", s.cfg.MaxUnauthenticated, "more_since_last_line", n)
	}
}

func (s *Server) unauthReason() string {
	return "too many unauthenticated connections (max_unauthenticated_connections " + strconv.Itoa(s.cfg.MaxUnauthenticated) +
		"): the oldest that has not sent its credentials is closed to admit a new one"
}

// admitSourceLocked counts c against its source address's cap. s.connsMu
// must be held.
func (s *Server) admitSourceLocked(c *conn) string {
	if s.cfg.MaxConnectionsPerSource <= 0 {
		return ""
	}
	src := c.remote.Addr()
	if s.adm.perSource[src] >= s.cfg.MaxConnectionsPerSource {
		s.adm.refusedPerSource.Inc()
		return "connection limit of " + strconv.Itoa(s.cfg.MaxConnectionsPerSource) + " per source address reached for " +
			src.String() + " (max_connections_per_source)"
	}
	s.adm.perSource[src]++
	c.srcCounted = true
	return ""
}

func (s *Server) releaseSourceLocked(c *conn) {
	src := c.remote.Addr()
	if n := s.adm.perSource[src] - 1; n > 0 {
		s.adm.perSource[src] = n
	} else {
		delete(s.adm.perSource, src)
	}
	c.srcCounted = false
}

// unlinkLocked takes c off the list of connections waiting for their
// preamble or AUTH. s.connsMu must be held.
func (s *Server) unlinkLocked(c *conn) {
	if !c.waiting {
		return
	}
	a := &s.adm
	if c.uprev != nil {
		c.uprev.unext = c.unext
	} else {
		a.unauthHead = c.unext
	}
	if c.unext != nil {
		c.unext.uprev = c.uprev
	} else {
		a.unauthTail = c.uprev
	}
	c.uprev, c.unext, c.waiting = nil, nil, false
}

// releaseUnauthLocked stops counting c as unauthenticated. s.connsMu must
// be held.
func (s *Server) releaseUnauthLocked(c *conn) {
	s.unlinkLocked(c)
	if c.unauth {
		c.unauth = false
		s.adm.unauthN--
	}
}

// credentialsSent runs on the loop when c's AUTH arrives: c is no longer
// one to close at the cap (its check is bounded by the handshake deadline
// and the password-check slots). False: c was closed to admit a newer
// connection meanwhile, and the AUTH is to be ignored.
func (s *Server) credentialsSent(c *conn) bool {
	s.connsMu.Lock()
	defer s.connsMu.Unlock()
	if !c.unauth {
		return false
	}
	s.unlinkLocked(c)
	return true
}

// authenticated runs when c reaches OPEN_OK.
func (s *Server) authenticated(c *conn) {
	s.connsMu.Lock()
	s.releaseUnauthLocked(c)
	s.connsMu.Unlock()
	s.notifyChanged()
}

// forgetLocked releases what c counted against. s.connsMu must be held.
func (s *Server) forgetLocked(c *conn) {
	s.releaseUnauthLocked(c)
	if c.srcCounted {
		s.releaseSourceLocked(c)
	}
}

// refusal is the CLOSE a refused connection gets in place of HELLO.
func refusal(reason string) []byte {
	return wire.AppendFrame(nil, 0, &wire.Close{Code: wire.ResourceLimit, Reason: reason})
}

// checkHandshake closes c if it is past the handshake deadline (called by
// the tick for connections not yet open).
func (s *Server) checkHandshake(c *conn, st uint32, nowMs int64) {
	if st == stClosing || nowMs-c.openedMs < s.cfg.HandshakeTimeout.Milliseconds() {
		return
	}
	s.adm.handshakeTimeouts.Inc()
	s.log.Info("handshake deadline passed: closing", "conn", c.id, "remote", c.remoteAddr().String(), "state", st)
	if st == stPreamble {
		// No preamble yet: the peer may not speak Warren; just close.
		c.state.Store(stClosing)
		c.mu.Lock()
		c.closed = true
		c.mu.Unlock()
		_ = c.gc.Close()
		return
	}
	c.closeWith(wire.ResourceLimit, "handshake not completed within "+s.cfg.HandshakeTimeout.String()+
		" (handshake_timeout_ms): send AUTH right after HELLO")
}

// proxyStep reads a PROXY protocol header at the start of a connection
// when the PROXY protocol is on. It reports whether the preamble may be
// read now; false: wait for more bytes, or the connection was refused.
func (c *conn) proxyStep() bool {
	n := c.gc.InboundBuffered()
	if n == 0 {
		return false
	}
	b, err := c.gc.Peek(n)
	if err != nil {
		return false
	}
	if !c.viaProxy {
		// Only a trusted proxy may say where a client comes from, or any
		// client could claim to be 127.0.0.1.
		switch proxySignature(b) {
		case sigPartial:
			return false
		case sigProxy:
			c.srv.adm.refusedProxy.Inc()
			c.srv.log.Warn("PROXY header from an untrusted address: refused", "conn", c.id, "remote", c.remote.String())
			c.closeWith(wire.AuthFailed, "PROXY protocol header from "+c.remote.Addr().String()+
				", which is not a trusted proxy (proxy_protocol_trusted)")
			return false
		}
		c.proxyDone = true
		return true
	}
	var hlen int
	var src netip.AddrPort
	switch proxySignature(b) {
	case sigPartial:
		return false
	case sigProxy:
		hlen, src, err = parseProxyHeader(b)
		if hlen == 0 && err == nil {
			return false // wait for the rest (the handshake deadline bounds it)
		}
	}
	// sigNone: a trusted peer may also connect directly, without a header.
	if err != nil {
		c.srv.metrics.protocolErrors.Inc()
		c.closeWith(wire.FrameError, "malformed PROXY header: "+err.Error())
		return false
	}
	_, _ = c.gc.Discard(hlen)
	if src.IsValid() {
		c.mu.Lock() // Connections reads remote under it
		c.remote = netip.AddrPortFrom(src.Addr().Unmap(), src.Port())
		c.mu.Unlock()
		c.loopback = c.remote.Addr().IsLoopback()
	}
	c.proxyDone = true
	c.srv.connsMu.Lock()
	r := c.srv.admitSourceLocked(c)
	c.srv.connsMu.Unlock()
	if r != "" {
		c.closeWith(wire.ResourceLimit, r)
		return false
	}
	return true
}

// handshakeTimeoutDefault is Config.HandshakeTimeout's default.
const handshakeTimeoutDefault = 10 * time.Second
