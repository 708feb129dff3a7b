package netio

// The gnet event handler of the Server: the engine booted (OnBoot), a
// connection opened, closed or readable (OnOpen, OnClose, OnTraffic), and
// the tick off the loops (OnTick: handshake deadlines, heartbeats, the
// memory and disk alarms).

import (
	"context"
	"net"
	"time"

	"github.com/panjf2000/gnet/v2"
	"golang.org/x/sys/unix"

	"github.com/warren-mq/warren/wire"
)

// OnBoot records the bound address (the port may have been 0).
func (s *Server) OnBoot(eng gnet.Engine) gnet.Action {
	s.eng = eng
	if s.cfg.DisablePlain {
		s.booted <- nil
		return gnet.None
	}
	fd, err := eng.Dup()
	if err != nil {
		s.booted <- err
		return gnet.Shutdown
	}
	sa, err := unix.Getsockname(fd)
	_ = unix.Close(fd)
	if err != nil {
		s.booted <- err
		return gnet.Shutdown
	}
	switch a := sa.(type) {
	case *unix.SockaddrInet4:
		s.addr = &net.TCPAddr{IP: net.IP(a.Addr[:]), Port: a.Port}
	case *unix.SockaddrInet6:
		s.addr = &net.TCPAddr{IP: net.IP(a.Addr[:]), Port: a.Port}
	}
	s.log.Info("listening", "addr", s.addr.String())
	s.booted <- nil
	return gnet.None
}

func (s *Server) OnOpen(gc gnet.Conn) ([]byte, gnet.Action) {
	if s.closing.Load() {
		return nil, gnet.Close
	}
	if fc, ok := gc.Context().(FrontConn); ok { // another front's (Enroll)
		return fc.OnOpen(gc)
	}
	c := s.newConn(gc)
	if s.cfg.DisablePlain && c.tls == nil {
		return nil, gnet.Close // the private socket of an engine without a plain listener
	}
	s.connsMu.Lock()
	victim, refused := s.admitLocked(c)
	if refused != "" {
		s.connsMu.Unlock()
		s.log.Warn("connection refused", "remote", c.remote.String(), "reason", refused)
		return refusal(refused), gnet.Close
	}
	s.conns[c.id] = c
	s.connsMu.Unlock()
	gc.SetContext(c)
	if victim != nil {
		s.evicted(victim)
	}
	s.notifyChanged()
	return nil, gnet.None
}

func (s *Server) OnClose(gc gnet.Conn, err error) gnet.Action {
	c, _ := gc.Context().(*conn)
	if c == nil {
		switch p := gc.Context().(type) {
		case *tlsPeer: // refused in OnOpen
			p.brokerClosed()
		case FrontConn:
			p.OnClose(gc, err)
		}
		return gnet.None
	}
	if c.tls != nil {
		c.tls.brokerClosed()
	}
	// Its Down goes to the shards before it leaves the count: whoever sees
	// it gone (ConnectionCount, Connections, Changed) can rely on a
	// broker barrier to see what it held returned.
	c.onClose()
	s.connsMu.Lock()
	delete(s.conns, c.id)
	s.forgetLocked(c)
	s.connsMu.Unlock()
	s.notifyChanged()
	return gnet.None
}

func (s *Server) OnTraffic(gc gnet.Conn) gnet.Action {
	c, _ := gc.Context().(*conn)
	start := time.Now()
	if c == nil {
		fc, ok := gc.Context().(FrontConn)
		if !ok {
			return gnet.Close
		}
		a := fc.OnTraffic(gc)
		s.metrics.busyNanos.Add(int64(time.Since(start)))
		return a
	}
	a := c.onTraffic()
	s.metrics.busyNanos.Add(int64(time.Since(start)))
	return a
}

// OnTick runs off the loops: heartbeats, dead peers and memory flow control.
func (s *Server) OnTick() (time.Duration, gnet.Action) {
	s.loopsUpOnce.Do(func() { close(s.loopsUp) })
	now := s.nowMs()
	s.connsMu.Lock()
	conns := make([]*conn, 0, len(s.conns))
	for _, c := range s.conns {
		conns = append(conns, c)
	}
	s.connsMu.Unlock()
	for _, c := range conns {
		if st := c.state.Load(); st != stOpen {
			s.checkHandshake(c, st, now)
			continue
		}
		blocked := c.blocked.Load()
		if blocked && !s.memoryAlarm() {
			_ = c.gc.Wake(nil) // OnTraffic reads it again
		}
		if c.acksHeld.Load() {
			_ = c.gc.EventLoop().Execute(context.Background(), ackCheck{c})
		}
		hb := int64(c.heartbeatMs.Load())
		if hb == 0 {
			continue
		}
		// A blocked connection is not read: its heartbeats wait in the
		// socket, so it is not judged by them (the clock restarts when it
		// is read again).
		if !blocked && !c.ctlBusy.Load() && now-c.lastRecv.Load() > 2*hb {
			s.log.Info("peer missed heartbeats", "conn", c.id)
			c.closeWith(wire.HeartbeatTimeout, "no traffic for two heartbeat intervals")
			continue
		}
		if now-c.lastSend.Load() >= hb {
			c.send(0, &wire.Heartbeat{})
		}
	}
	disk := s.checkDisk()
	if s.checkFlow(conns) || disk {
		s.sendFlow(conns)
	}
	return s.cfg.TickInterval, gnet.None
}

// minHeartbeatMs is the shortest heartbeat interval a connection gets
// (PROTOCOL.md §5.4): two ticks, since the tick both sends heartbeats and
// judges peers, so a heartbeat goes out up to a tick after hb of silence,
// and that must stay well inside the peer's 2×hb.
func (s *Server) minHeartbeatMs() uint32 {
	return uint32(max(1, 2*s.cfg.TickInterval.Milliseconds()))
}
