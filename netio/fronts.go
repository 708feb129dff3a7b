package netio

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"strconv"

	"github.com/panjf2000/gnet/v2"
)

// What another protocol front (netio/amqp) uses of the server beside the
// broker core it embeds: the same connection ids, users, limits and memory
// alarm as the native protocol.

// NewConnID gives out a connection id from the native connections'
// sequence: owners of exclusive queues and consumers (broker Down) are
// unique across fronts.
func (s *Server) NewConnID() uint64 { return s.connSeq.Add(1) }

// MemoryAlarm reports whether publishers must wait (the memory alarm is
// on, or the stored bytes are over the high-watermark).
func (s *Server) MemoryAlarm() bool { return s.memoryAlarm() }

// DiskAlarm reports whether the disk alarm is on (free disk space below
// the limit): with MemoryAlarm, why publishers wait.
func (s *Server) DiskAlarm() bool { return s.diskAlarm.Load() }

// MaxPrefetch is the cap on a consumer's unacked deliveries.
func (s *Server) MaxPrefetch() uint32 { return s.cfg.MaxPrefetch }

// MaxConsumersPerConnection is the cap on one connection's consumers
// (Config.MaxConsumersPerConnection).
func (s *Server) MaxConsumersPerConnection() int { return s.cfg.MaxConsumersPerConnection }

// ConsumerLimitReason is the refusal of a consumer past that cap, the
// connection having n.
func (s *Server) ConsumerLimitReason(n int) string {
	return "consumer limit reached: this connection has " + strconv.Itoa(n) + " consumers, its max_consumers_per_connection" +
		" (a cancelled consumer counts until its deliveries are settled; raise it with \"max_consumers_per_connection\"" +
		" in the config file, or cancel some)"
}

// MaxOutboundBytes is the per-connection outbox cap.
func (s *Server) MaxOutboundBytes() int { return s.cfg.MaxOutboundBytes }

// IsAdmin reports whether user has the administrator tag (or is guest).
func (s *Server) IsAdmin(user string) bool { return s.isAdmin(user) }

// Another front's connections are served by the native engine's loops
// (Enroll): the Server's event handler passes their events to the
// FrontConn carried as the connection's context, so one set of loops (and
// one busy-ratio metric) serves every protocol.

// FrontConn is a connection of another protocol front. Its methods run on
// the connection's event loop, with gnet's rules: OnTraffic loops over the
// complete frames buffered and leaves the rest; bytes from Peek/Next die at
// Discard.
type FrontConn interface {
	OnOpen(gc gnet.Conn) (out []byte, action gnet.Action)
	OnTraffic(gc gnet.Conn) gnet.Action
	OnClose(gc gnet.Conn, err error)
}

// ReadGate takes one connection's socket out of its loop's read interest
// and puts it back (the native protocol's flow control, pause.go), for a
// front's connection. The zero value is ready; one per connection.
type ReadGate struct{ epfd int }

// ErrClosing: the server is closing (or closed) and takes no connection.
var ErrClosing = errors.New("netio: the server is closing")

// Enroll hands nc, an accepted TCP connection, to an event loop with fc as
// its handler; it returns once fc.OnOpen has run (or the connection could
// not be enrolled; nc is closed either way: the loop serves its own copy
// of the descriptor).
func (s *Server) Enroll(nc net.Conn, fc FrontConn) error {
	defer nc.Close()
	select {
	case <-s.loopsUp: // the engine's loop list is built (first tick)
	case <-s.stopped:
		return ErrClosing
	}
	if s.closing.Load() {
		return ErrClosing
	}
	res, err := s.eng.Register(gnet.NewNetConnContext(gnet.NewContext(context.Background(), fc), nc))
	if err != nil {
		return err
	}
	select {
	case r := <-res:
		return r.Err
	case <-s.stopped:
		return ErrClosing
	}
}

// ParseProxyHeader reads a PROXY protocol header (v1 or v2, proxyproto.go)
// at the start of b, for another front's listener. isProxy: b starts, or
// may start (too few bytes to tell), with a PROXY signature; then n == 0
// with a nil error means more bytes are needed. src is invalid for a
// header that names no client (v1 UNKNOWN, v2 LOCAL): the peer's own
// address stands.
func ParseProxyHeader(b []byte) (isProxy bool, n int, src netip.AddrPort, err error) {
	switch proxySignature(b) {
	case sigNone:
		return false, 0, src, nil
	case sigPartial:
		return true, 0, src, nil
	}
	n, src, err = parseProxyHeader(b)
	return true, n, src, err
}
