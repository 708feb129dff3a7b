package netio_test

import (
	"context"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/warren-mq/warren/client"
	"github.com/warren-mq/warren/internal/freeport"
	"github.com/warren-mq/warren/netio"
	"github.com/warren-mq/warren/netio/warrentest"
	"github.com/warren-mq/warren/wire"
)

// rawOpen connects without sending anything.
func rawOpen(t *testing.T, addr string) *rawConn {
	t.Helper()
	nc, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nc.Close() })
	return &rawConn{t: t, nc: nc}
}

// hello sends the preamble and reads HELLO.
func (r *rawConn) hello() {
	r.t.Helper()
	r.write(wire.Preamble[:])
	if b, ok := r.read().(*wire.Hello); !ok {
		r.t.Fatalf("got %T, want HELLO", b)
	}
}

func guestAuth() []byte {
	return wire.AppendFrame(nil, 0, &wire.Auth{Mechanism: "PLAIN", Response: wire.PlainResponse("guest", "guest"), MaxFrame: wire.MinMaxFrame})
}

// expectCloseWith reads up to a CLOSE and checks its code and reason.
func (r *rawConn) expectCloseWith(code wire.Code, reason string) {
	r.t.Helper()
	b := r.read()
	c, ok := b.(*wire.Close)
	if !ok {
		r.t.Fatalf("got %T, want CLOSE %v", b, code)
	}
	if c.Code != code || !strings.Contains(c.Reason, reason) {
		r.t.Fatalf("CLOSE %v %q, want %v with %q", c.Code, c.Reason, code, reason)
	}
	if r.read() != nil {
		r.t.Fatal("socket still open after CLOSE")
	}
}

// Item 7: a broker stopped gracefully with clients connected can be started
// again on the same port at once (SO_REUSEADDR: the closed connections sit
// in TIME_WAIT on the broker's port).
func TestRestartOnSamePortWithClientsConnected(t *testing.T) {
	// Outside the ephemeral range: a freed ephemeral port may be taken
	// by any 127.0.0.1:0 listener or dial before the restart.
	first, err := freeport.Addr()
	if err != nil {
		t.Fatal(err)
	}
	s, err := netio.Start(netio.Config{Addr: first})
	if err != nil {
		t.Fatal(err)
	}
	addr := s.Addr().String()
	ctx := ctxT(t)
	var conns []*client.Conn
	for i := 0; i < 3; i++ {
		c, err := client.Dial(ctx, "warren://guest:guest@"+addr)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := channel(t, c).DeclareQueue(ctx, "q", client.QueueOptions{}); err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
	}
	if err := s.Close(ctx); err != nil { // what SIGTERM does
		t.Fatal(err)
	}
	for _, c := range conns {
		select {
		case <-c.Done():
		case <-ctx.Done():
			t.Fatal("client not closed by the shutdown")
		}
	}
	s2, err := netio.Start(netio.Config{Addr: addr})
	if err != nil {
		t.Fatalf("restart at once on the same port: %v", err)
	}
	defer s2.Close(context.Background())
	c, err := client.Dial(ctx, "warren://guest:guest@"+addr)
	if err != nil {
		t.Fatal(err)
	}
	c.Close()
}

// Item 28: an unspecified listen address ("[::]" or "0.0.0.0") is
// dual-stack, as Go's net.Listen (and so warrend's HTTP port) makes it.
func TestListenUnspecifiedIsDualStack(t *testing.T) {
	for _, addr := range []string{"[::]:0", "0.0.0.0:0"} {
		s := warrentest.StartServer(t, &netio.Config{Addr: addr})
		port := strconv.Itoa(s.Addr().(*net.TCPAddr).Port)
		for _, host := range []string{"127.0.0.1", "::1"} {
			nc, err := net.DialTimeout("tcp", net.JoinHostPort(host, port), 10*time.Second)
			if err != nil {
				t.Fatalf("listening on %s: dial %s: %v", addr, host, err)
			}
			r := &rawConn{t: t, nc: nc}
			r.hello()
			nc.Close()
		}
	}
}

func shortHandshake(extra func(*netio.Config)) *netio.Config {
	cfg := &netio.Config{HandshakeTimeout: 300 * time.Millisecond, TickInterval: 10 * time.Millisecond}
	if extra != nil {
		extra(cfg)
	}
	return cfg
}

// Item 8: a connection that does not reach OPEN_OK within the handshake
// deadline is closed, whatever it sends meanwhile; an authenticated one is
// not touched.
func TestHandshakeDeadline(t *testing.T) {
	cfg := shortHandshake(nil)
	s := warrentest.StartServer(t, cfg)
	good := dial(t, s)
	goodCh := channel(t, good)

	t.Run("partial preamble", func(t *testing.T) {
		start := time.Now()
		r := rawOpen(t, s.Addr().String())
		r.write(wire.Preamble[:4])
		if b := r.read(); b != nil {
			t.Fatalf("got %T, want the socket closed", b)
		}
		// The broker counts in whole milliseconds (accept and now):
		// up to 1 ms early by the test's clock is the deadline kept.
		if el := time.Since(start); el < cfg.HandshakeTimeout-time.Millisecond {
			t.Fatalf("closed after %v, before the %v deadline", el, cfg.HandshakeTimeout)
		}
	})
	t.Run("never authenticates", func(t *testing.T) {
		start := time.Now()
		r := rawOpen(t, s.Addr().String())
		r.hello()
		r.expectCloseWith(wire.ResourceLimit, "handshake")
		// The broker counts in whole milliseconds (accept and now):
		// up to 1 ms early by the test's clock is the deadline kept.
		if el := time.Since(start); el < cfg.HandshakeTimeout-time.Millisecond {
			t.Fatalf("closed after %v, before the %v deadline", el, cfg.HandshakeTimeout)
		}
	})
	t.Run("extension frames before auth", func(t *testing.T) {
		r := rawOpen(t, s.Addr().String())
		r.hello()
		stop := make(chan struct{})
		done := make(chan struct{})
		go func() { // keeps sending ignorable frames: not a sign of progress
			defer close(done)
			tk := time.NewTicker(10 * time.Millisecond)
			defer tk.Stop()
			ext := []byte{0, 0, 0, 0, byte(wire.IgnorableMin), 0, 0, 0}
			for {
				select {
				case <-stop:
					return
				case <-tk.C:
					if _, err := r.nc.Write(ext); err != nil {
						return
					}
				}
			}
		}()
		r.expectCloseWith(wire.ResourceLimit, "handshake")
		close(stop)
		r.nc.Close()
		<-done
	})
	t.Run("slowloris", func(t *testing.T) {
		r := rawOpen(t, s.Addr().String())
		r.hello()
		auth := wire.AppendFrame(nil, 0, &wire.Auth{Mechanism: "PLAIN", Response: wire.PlainResponse("guest", "guest"),
			Product: strings.Repeat("p", 200), MaxFrame: wire.MinMaxFrame})
		done := make(chan struct{})
		go func() { // one byte every 10ms: the AUTH would take over 2s
			defer close(done)
			tk := time.NewTicker(10 * time.Millisecond)
			defer tk.Stop()
			for i := range auth {
				<-tk.C
				if _, err := r.nc.Write(auth[i : i+1]); err != nil {
					return
				}
			}
		}()
		r.expectCloseWith(wire.ResourceLimit, "handshake")
		r.nc.Close() // the writer stops at its next byte
		<-done
	})
	aliveCheck(t, s, goodCh)
}

// firstFrame reads the first frame a socket gets; a nil body: closed
// without one (or the 10s safety net passed).
func firstFrame(nc net.Conn) wire.Body {
	_ = nc.SetReadDeadline(time.Now().Add(10 * time.Second))
	var buf []byte
	tmp := make([]byte, 4096)
	for {
		f, n, err := wire.Split(buf, wire.HandshakeMaxFrame)
		if err != nil {
			return nil
		}
		if n > 0 {
			b, _ := wire.Decode(f, wire.HandshakeMaxFrame, nil)
			return b
		}
		m, err := nc.Read(tmp)
		if err != nil {
			return nil
		}
		buf = append(buf, tmp[:m]...)
	}
}

// Item 9: unauthenticated connections have a cap of their own. Idle
// sockets at the cap cannot lock out a real client: the oldest idle one is
// closed (with a CLOSE saying why) to admit a newcomer.
func TestIdleSocketsDoNotLockOutClients(t *testing.T) {
	s := warrentest.StartServer(t, &netio.Config{MaxUnauthenticated: 5})
	closes := make(chan wire.Body, 10)
	for i := 0; i < 10; i++ {
		r := rawOpen(t, s.Addr().String())
		go func() { closes <- firstFrame(r.nc) }()
	}
	expectCloses := func(n int) {
		t.Helper()
		for i := 0; i < n; i++ {
			b := <-closes
			c, ok := b.(*wire.Close)
			if !ok || c.Code != wire.ResourceLimit || !strings.Contains(c.Reason, "unauthenticated") {
				t.Fatalf("an idle socket got %#v, want CLOSE resource_limit naming the unauthenticated cap", b)
			}
		}
	}
	expectCloses(5) // the five oldest made room for the next five
	if v := metricValue(s, "warren_connections_unauthenticated"); v != 5 {
		t.Fatalf("warren_connections_unauthenticated %v, want the cap of 5", v)
	}
	c := dial(t, s) // a real client still gets in...
	aliveCheck(t, s, channel(t, c))
	expectCloses(1) // ...in place of the oldest idle socket
	if v := metricValue(s, `warren_connections_refused_total{reason="unauthenticated"}`); v != 6 {
		t.Fatalf(`warren_connections_refused_total{reason="unauthenticated"} %v, want 6`, v)
	}
}

// Item 9: a connection over MaxConnections is refused with a CLOSE saying
// why, not a bare reset.
func TestConnectionCapRefusesWithReason(t *testing.T) {
	s := warrentest.StartServer(t, &netio.Config{MaxConnections: 1})
	dial(t, s)
	_, err := client.Dial(ctxT(t), warrentest.URL(s))
	if wire.CodeOf(err) != wire.ResourceLimit || !strings.Contains(err.Error(), "connection limit") {
		t.Fatalf("over MaxConnections: %v, want resource_limit naming the connection limit", err)
	}
	r := rawOpen(t, s.Addr().String())
	r.write(wire.Preamble[:])
	r.expectCloseWith(wire.ResourceLimit, "connection limit")
}

// Item 9: the optional per-source cap.
func TestPerSourceConnectionCap(t *testing.T) {
	s := warrentest.StartServer(t, &netio.Config{MaxConnectionsPerSource: 2})
	dial(t, s)
	dial(t, s)
	_, err := client.Dial(ctxT(t), warrentest.URL(s))
	if wire.CodeOf(err) != wire.ResourceLimit || !strings.Contains(err.Error(), "127.0.0.1") {
		t.Fatalf("third connection from one address: %v, want resource_limit naming the address", err)
	}
	if v := metricValue(s, `warren_connections_refused_total{reason="per_source"}`); v != 1 {
		t.Fatalf(`warren_connections_refused_total{reason="per_source"} %v, want 1`, v)
	}
}

func proxyServer(t *testing.T, trusted string, extra func(*netio.Config)) *netio.Server {
	cfg := &netio.Config{ProxyTrusted: []netip.Prefix{netip.MustParsePrefix(trusted)}}
	if extra != nil {
		extra(cfg)
	}
	return warrentest.StartServer(t, cfg)
}

// proxyV2 builds a PROXY protocol v2 header (command PROXY, TCP over the
// addresses' family) or, with a zero src, a LOCAL one.
func proxyV2(src, dst netip.AddrPort) []byte {
	b := []byte("\r\n\r\n\x00\r\nQUIT\n")
	if !src.IsValid() {
		return append(b, 0x20, 0x00, 0, 0)
	}
	var addrs []byte
	fam := byte(0x11)
	if src.Addr().Is4() {
		a, d := src.Addr().As4(), dst.Addr().As4()
		addrs = append(append(addrs, a[:]...), d[:]...)
	} else {
		fam = 0x21
		a, d := src.Addr().As16(), dst.Addr().As16()
		addrs = append(append(addrs, a[:]...), d[:]...)
	}
	addrs = append(addrs, byte(src.Port()>>8), byte(src.Port()), byte(dst.Port()>>8), byte(dst.Port()))
	b = append(b, 0x21, fam, byte(len(addrs)>>8), byte(len(addrs)))
	return append(b, addrs...)
}

func remoteOf(s *netio.Server) []string {
	var out []string
	for _, c := range s.Connections() {
		out = append(out, c.Remote)
	}
	return out
}

// Item 15: behind a trusted proxy, the PROXY header's source address is the
// connection's: guest is loopback-only by the real client's address.
func TestProxyProtocol(t *testing.T) {
	s := proxyServer(t, "127.0.0.0/8", nil) // one broker for the three (each start and stop costs 0.5s)
	t.Run("v1", func(t *testing.T) { testProxyProtocolV1(t, s) })
	t.Run("v2", func(t *testing.T) { testProxyProtocolV2(t, s) })
	t.Run("malformed header", func(t *testing.T) { testProxyProtocolMalformedHeader(t, s) })
}

func testProxyProtocolV1(t *testing.T, s *netio.Server) {
	r := rawOpen(t, s.Addr().String())
	r.write([]byte("PROXY TCP4 203.0.113.7 127.0.0.1 40001 5680\r\n"))
	r.hello()
	if got := remoteOf(s); !slices.Contains(got, "203.0.113.7:40001") {
		t.Fatalf("connections %v, want the proxied source 203.0.113.7:40001", got)
	}
	r.write(guestAuth())
	r.expectCloseWith(wire.AuthFailed, "")

	// A proxied loopback client is a loopback client.
	r = rawOpen(t, s.Addr().String())
	r.write([]byte("PROXY TCP6 ::1 ::1 40002 5680\r\n"))
	r.hello()
	r.write(guestAuth())
	if b, ok := r.read().(*wire.OpenOK); !ok {
		t.Fatalf("got %T, want OPEN_OK for guest proxied from ::1", b)
	}
}

func testProxyProtocolV2(t *testing.T, s *netio.Server) {
	dst := netip.MustParseAddrPort("127.0.0.1:5680")
	r := rawOpen(t, s.Addr().String())
	r.write(proxyV2(netip.MustParseAddrPort("198.51.100.9:41000"), dst))
	r.hello()
	if got := remoteOf(s); !slices.Contains(got, "198.51.100.9:41000") {
		t.Fatalf("connections %v, want the proxied source 198.51.100.9:41000", got)
	}
	r.write(guestAuth())
	r.expectCloseWith(wire.AuthFailed, "")

	r = rawOpen(t, s.Addr().String())
	r.write(proxyV2(netip.MustParseAddrPort("[2001:db8::5]:41001"), netip.MustParseAddrPort("[2001:db8::1]:5680")))
	r.hello()
	r.write(guestAuth())
	r.expectCloseWith(wire.AuthFailed, "")

	// LOCAL (the proxy's own health check): the peer's address stands.
	r = rawOpen(t, s.Addr().String())
	r.write(proxyV2(netip.AddrPort{}, netip.AddrPort{}))
	r.hello()
	r.write(guestAuth())
	if b, ok := r.read().(*wire.OpenOK); !ok {
		t.Fatalf("got %T, want OPEN_OK for a LOCAL header from loopback", b)
	}
}

// Item 15: only trusted peers may send a PROXY header, or anyone could claim
// to be 127.0.0.1; direct clients from elsewhere work as before.
func TestProxyProtocolUntrustedSourceRefused(t *testing.T) {
	s := proxyServer(t, "10.0.0.0/8", nil)
	r := rawOpen(t, s.Addr().String())
	r.write([]byte("PROXY TCP4 127.0.0.1 127.0.0.1 40001 5680\r\n"))
	r.write(wire.Preamble[:])
	r.expectCloseWith(wire.AuthFailed, "PROXY")

	r = rawOpen(t, s.Addr().String())
	r.write(proxyV2(netip.MustParseAddrPort("127.0.0.1:1"), netip.MustParseAddrPort("127.0.0.1:5680")))
	r.write(wire.Preamble[:])
	r.expectCloseWith(wire.AuthFailed, "PROXY")

	dial(t, s) // a direct client from an untrusted address is served as before
}

func testProxyProtocolMalformedHeader(t *testing.T, s *netio.Server) {
	for _, h := range []string{
		"PROXY TCP4 999.0.113.7 127.0.0.1 40001 5680\r\n",
		"PROXY TCP4 203.0.113.7 127.0.0.1 70000 5680\r\n",
		"PROXY TCP4 2001:db8::1 127.0.0.1 1 5680\r\n",
		"PROXY TCP4 203.0.113.7\r\n",
		"PROXY " + strings.Repeat("x", 120),
		"\r\n\r\n\x00\r\nQUIT\n\x22\x11\x00\x0c" + strings.Repeat("\x00", 12),
		"\r\n\r\n\x00\r\nQUIT\n\x21\x11\x00\x04" + strings.Repeat("\x00", 4),
	} {
		r := rawOpen(t, s.Addr().String())
		r.write([]byte(h))
		r.expectCloseWith(wire.FrameError, "PROXY")
	}
}

// Item 15 with item 9: the per-source cap counts the proxied source.
func TestPerSourceCapUsesProxiedSource(t *testing.T) {
	s := proxyServer(t, "127.0.0.0/8", func(c *netio.Config) { c.MaxConnectionsPerSource = 1 })
	a := rawOpen(t, s.Addr().String())
	a.write([]byte("PROXY TCP4 203.0.113.7 127.0.0.1 40001 5680\r\n"))
	a.hello()
	b := rawOpen(t, s.Addr().String())
	b.write([]byte("PROXY TCP4 203.0.113.8 127.0.0.1 40001 5680\r\n"))
	b.hello()
	c := rawOpen(t, s.Addr().String())
	c.write([]byte("PROXY TCP4 203.0.113.7 127.0.0.1 40002 5680\r\n"))
	c.write(wire.Preamble[:])
	c.expectCloseWith(wire.ResourceLimit, "203.0.113.7")
}

// Without PROXY configured, a PROXY header is a bad preamble, as before.
func TestProxyHeaderWithoutProxyConfigured(t *testing.T) {
	s := warrentest.StartServer(t, nil)
	r := rawOpen(t, s.Addr().String())
	r.write([]byte("PROXY TCP4 127.0.0.1 127.0.0.1 40001 5680\r\n"))
	_ = r.nc.SetReadDeadline(time.Now().Add(10 * time.Second))
	got := make([]byte, 16)
	n, _ := r.nc.Read(got)
	if string(got[:n]) != string(wire.Preamble[:]) {
		t.Fatalf("got %q, want the broker's preamble (bad_version)", got[:n])
	}
}
