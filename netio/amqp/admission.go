package amqp

import (
	"bytes"
	"encoding/binary"
	"io"
	"net"
	"net/netip"
	"strconv"
	"time"
)

// Bounds on AMQP connections before they are open, as netio applies them to
// its own (netio/connlimits.go), with the same settings but counted
// separately (an AMQP connection counts against the AMQP front's caps):
//
//   - Handshake deadline (Config.HandshakeTimeout): a connection that has
//     not reached open-ok this long after accept is closed, whatever it
//     sent meanwhile; once it has sent the protocol header it is told why
//     with connection.close 506 RESOURCE_ERROR, before that the socket is
//     just closed.
//   - Unauthenticated cap (Config.MaxUnauthenticated): a connection counts
//     from accept until open-ok. At the cap, a newcomer is admitted by
//     closing the oldest connection that has not sent its credentials
//     (start-ok) yet; only when every one has sent them is the newcomer
//     refused.
//   - Per-source cap (Config.MaxConnectionsPerSource, off by default). A
//     trusted proxy's connection (Config.ProxyTrusted) is counted on the
//     client's address its PROXY header names, once it is read
//     (conn.proxyStep); refused then, it gets the 506 in place of
//     connection.start.
//
// A refused newcomer gets connection.close 506 with the reason in place of
// connection.start (after its protocol header, read for at most a second
// by one of at most maxRefusers goroutines; past that the socket is just
// closed), so clients report why instead of a reset. The bookkeeping runs
// under Listener.mu once per accept, start-ok, open-ok and close.

// maxRefusers bounds the goroutines telling refused connections why.
const maxRefusers = 64

// connAdmission is a connection's share of the bookkeeping (Listener.mu).
type connAdmission struct {
	src          netip.Addr
	srcCounted   bool
	unauth       bool // counted in Listener.unauthN
	waiting      bool // linked: has not sent its credentials yet
	evicted      bool // closed to admit a newer connection
	wprev, wnext *conn
}

// admitLocked decides on a new connection from src: "" admits it (victim,
// if not nil, is to be closed to make room), anything else is why it is
// refused. l.mu held.
func (l *Listener) admitLocked(src netip.Addr) (victim *conn, refusal string) {
	if len(l.conns) >= l.cfg.MaxConnections {
		l.met.refusedMax.Inc()
		return nil, "RESOURCE_ERROR - connection limit of " + strconv.Itoa(l.cfg.MaxConnections) + " reached (max_connections)"
	}
	if r := l.overSourceLocked(src); r != "" && !l.trusted(src) { // a proxy's: counted on the client's address (admitSource)
		return nil, r
	}
	if l.unauthN >= l.cfg.MaxUnauthenticated {
		if l.waitHead == nil {
			l.met.refusedUnauth.Inc()
			return nil, "RESOURCE_ERROR - too many unauthenticated connections (max_unauthenticated_connections " +
				strconv.Itoa(l.cfg.MaxUnauthenticated) + "), each past its credentials: try again shortly"
		}
		victim = l.waitHead
		l.releaseUnauthLocked(victim)
		victim.adm.evicted = true
		l.met.refusedUnauth.Inc()
	}
	return victim, ""
}

// overSourceLocked: the refusal of one more connection from src at the
// per-source cap, "" under it. l.mu held.
func (l *Listener) overSourceLocked(src netip.Addr) string {
	if m := l.cfg.MaxConnectionsPerSource; m > 0 && l.perSource[src] >= m {
		l.met.refusedPerSource.Inc()
		return "RESOURCE_ERROR - connection limit of " + strconv.Itoa(m) + " per source address reached for " +
			src.String() + " (max_connections_per_source)"
	}
	return ""
}

// trusted: src is a trusted proxy (Config.ProxyTrusted).
func (l *Listener) trusted(src netip.Addr) bool {
	for _, p := range l.cfg.ProxyTrusted {
		if p.Contains(src) {
			return true
		}
	}
	return false
}

// admitSource counts a proxied connection against its client's address
// (c.src, from the PROXY header, or the proxy's own without one): the
// refusal past the per-source cap, "" if admitted. Loop goroutine.
func (l *Listener) admitSource(c *conn) string {
	l.mu.Lock()
	defer l.mu.Unlock()
	if r := l.overSourceLocked(c.src.Addr()); r != "" {
		return r
	}
	l.countSourceLocked(c, c.src.Addr())
	return ""
}

func (l *Listener) countSourceLocked(c *conn, src netip.Addr) {
	if l.cfg.MaxConnectionsPerSource > 0 {
		c.adm.src = src
		l.perSource[src]++
		c.adm.srcCounted = true
	}
}

// linkLocked counts an admitted connection. l.mu held.
func (l *Listener) linkLocked(c *conn, src netip.Addr) {
	a := &c.adm
	if !c.viaProxy {
		l.countSourceLocked(c, src)
	}
	a.unauth, a.waiting = true, true
	a.wprev = l.waitTail
	if l.waitTail != nil {
		l.waitTail.adm.wnext = c
	} else {
		l.waitHead = c
	}
	l.waitTail = c
	l.unauthN++
}

func (l *Listener) unlinkLocked(c *conn) {
	a := &c.adm
	if !a.waiting {
		return
	}
	if a.wprev != nil {
		a.wprev.adm.wnext = a.wnext
	} else {
		l.waitHead = a.wnext
	}
	if a.wnext != nil {
		a.wnext.adm.wprev = a.wprev
	} else {
		l.waitTail = a.wprev
	}
	a.wprev, a.wnext, a.waiting = nil, nil, false
}

func (l *Listener) releaseUnauthLocked(c *conn) {
	l.unlinkLocked(c)
	if c.adm.unauth {
		c.adm.unauth = false
		l.unauthN--
	}
}

// forgetLocked releases what a closed connection counted against.
func (l *Listener) forgetLocked(c *conn) {
	l.releaseUnauthLocked(c)
	if c.vhost != "" {
		l.srv.CloseVhost(c.vhost)
	}
	if c.adm.srcCounted {
		if n := l.perSource[c.adm.src] - 1; n > 0 {
			l.perSource[c.adm.src] = n
		} else {
			delete(l.perSource, c.adm.src)
		}
		c.adm.srcCounted = false
	}
}

// credentialsSent: c's start-ok arrived; it is no longer one to close at
// the cap. False: it was closed to admit a newer connection meanwhile.
func (l *Listener) credentialsSent(c *conn) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if c.adm.evicted {
		return false
	}
	l.unlinkLocked(c)
	return true
}

// opened: c reached open-ok.
func (l *Listener) opened(c *conn) {
	l.mu.Lock()
	l.releaseUnauthLocked(c)
	l.mu.Unlock()
}

func (l *Listener) evictedConn(c *conn) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return c.adm.evicted
}

func (l *Listener) unauthReason() string {
	return "RESOURCE_ERROR - too many unauthenticated connections (max_unauthenticated_connections " +
		strconv.Itoa(l.cfg.MaxUnauthenticated) + "): the oldest that has not sent its credentials is closed to admit a new one"
}

func (l *Listener) handshakeReason() string {
	return "RESOURCE_ERROR - handshake not completed within " + l.cfg.HandshakeTimeout.String() +
		" (handshake_timeout_ms): send start-ok, tune-ok and open without delay"
}

// refuse tells a refused connection why, in place of connection.start,
// on a goroutine of its own (at most maxRefusers at once, for a second
// each; past that the socket is just closed).
func (l *Listener) refuse(nc net.Conn, reason string) {
	if ok, n := l.refuseLog.Allow(time.Now()); ok {
		l.log.Info("AMQP connection refused", "remote", nc.RemoteAddr().String(), "reason", reason, "more_since_last_line", n)
	}
	if l.refusers.Add(1) > maxRefusers {
		l.refusers.Add(-1)
		_ = nc.Close()
		return
	}
	l.wg.Add(1)
	go func() {
		defer l.wg.Done()
		defer l.refusers.Add(-1)
		defer nc.Close()
		_ = nc.SetDeadline(time.Now().Add(time.Second))
		var hdr [8]byte
		if _, err := io.ReadFull(nc, hdr[:]); err != nil || !bytes.Equal(hdr[:], protocolHeader) {
			return
		}
		b, st := method(nil, 0, classConnection, 50)
		b = binary.BigEndian.AppendUint16(b, resourceError)
		b = putShortstr(b, reason)
		b = append(b, 0, 0, 0, 0)
		if _, err := nc.Write(endFrame(b, st)); err != nil {
			return
		}
		// Until its close-ok or EOF: closing with its bytes unread would
		// reset the connection, and the client might lose the reason.
		_, _ = io.Copy(io.Discard, io.LimitReader(nc, 64<<10))
	}()
}

// addrPortOf is a connection's peer address, unmapped.
func addrPortOf(nc net.Conn) netip.AddrPort {
	if a, ok := nc.RemoteAddr().(*net.TCPAddr); ok {
		ap := a.AddrPort()
		return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
	}
	return netip.AddrPort{}
}
