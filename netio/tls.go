package netio

import (
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"net/netip"
	"os"
	"sync"
	"time"

	"github.com/panjf2000/gnet/v2"
	"golang.org/x/sys/unix"
)

// TLS on the native protocol (Config.TLSAddr).
//
// gnet has no TLS, and the connection code (conn.go) is written against
// gnet's connection: its loop reads, the epoll pause of flow control
// (pause.go), the outbox's AsyncWrite. So TLS is terminated in front of
// the loops and the plaintext is handed to them as one more gnet
// connection, served by the same code as a plain one:
//
//	client ══TLS══ tlsFront (crypto/tls, 2 goroutines) ── socketpair ── gnet loop: conn (as plain)
//
// For each accepted TCP connection the front makes a Unix socket pair and
// enrolls one end in the engine (gnet.Engine.Register) before the TLS
// handshake starts, carrying a tlsPeer (the client's address, later its
// certificate's CN) as the connection's context. No socket is listening
// for that end, so nothing else can connect to it or claim to be a TLS
// client; the client's address comes from the TCP connection, as on the
// plain port (no PROXY header, nothing to trust). Because the broker sees
// the connection from accept on, every bound on connections before they
// authenticate counts it exactly as a plain one:
//
//   - the handshake deadline runs from accept and covers the TLS handshake
//     too: past it the broker closes its end, and the front closes the
//     TCP connection at once if the TLS handshake is not done (the client
//     could not read a CLOSE frame before it);
//   - the unauthenticated cap and its eviction of the oldest idle
//     connection, and max_connections, apply unchanged (an evicted
//     connection whose TLS handshake is not done is closed the same way);
//   - the per-source cap counts the client's address across both ports.
//     A TLS connection refused at accept is closed during its TLS
//     handshake, without the CLOSE frame a plain one gets (the reason is
//     logged and counted in warren_connections_refused_total);
//   - flow control: when the loop stops reading a blocked connection, the
//     socket pair's buffers fill, the front's write into it blocks, it
//     stops reading the TLS connection and TCP holds the client back. The
//     front holds at most its copy buffer, one TLS record and the pair's
//     kernel buffers per connection.
//
// The cost is a copy through the socket pair and two goroutines per TLS
// connection, besides the encryption (BENCHMARKS.md measures it). The
// certificates come from Config.TLSConfig for each handshake, so a reload
// (internal/tlsfiles, SIGHUP in warrend) never touches an established
// connection. With a verified client certificate HELLO also offers
// EXTERNAL, which authenticates as the user named by the certificate's
// subject CN.

// tlsFront accepts TLS connections and feeds their plaintext to the loops.
type tlsFront struct {
	srv  *Server
	ln   net.Listener
	cfg  *tls.Config
	wg   sync.WaitGroup
	stop chan struct{} // closed by close: the loops may never come up
	done chan struct{} // closed when accept returns
}

// tlsPeer is one TLS client as the broker sees it (conn.tls) and the
// front serves it.
type tlsPeer struct {
	remote netip.AddrPort
	raw    net.Conn // the client's TCP connection

	mu         sync.Mutex
	handshaken bool
	closed     bool   // the broker closed its end
	cn         string // the verified client certificate's subject CN; "" without one
}

// tlsFlushGrace bounds how long the front keeps writing to a client what
// the broker sent last (a CLOSE) once the broker has closed its end: a
// client that does not read cannot hold the socket longer.
const tlsFlushGrace = 5 * time.Second

// tlsCopyBuffer is the front's buffer per direction of a connection.
const tlsCopyBuffer = 32 << 10

// certCN is the peer's verified CN ("" without a verified certificate).
func (p *tlsPeer) certCN() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.cn
}

// brokerClosed runs on the loop when the broker side of p is closed:
// before the TLS handshake is done the client's socket closes at once,
// after it the front has tlsFlushGrace to write what is left.
func (p *tlsPeer) brokerClosed() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closed = true
	if !p.handshaken {
		_ = p.raw.Close()
		return
	}
	_ = p.raw.SetWriteDeadline(time.Now().Add(tlsFlushGrace))
}

func (s *Server) startTLS() error {
	if s.cfg.TLSConfig == nil {
		return errors.New("netio: TLSAddr is set without a TLSConfig (a certificate and its key)")
	}
	ln, err := net.Listen("tcp", s.cfg.TLSAddr)
	if err != nil {
		return err
	}
	f := &tlsFront{srv: s, ln: ln, cfg: atLeastTLS12(s.cfg.TLSConfig), stop: make(chan struct{}), done: make(chan struct{})}
	s.tls = f
	s.log.Info("listening (TLS)", "addr", ln.Addr().String())
	go f.accept()
	return nil
}

// atLeastTLS12 is cfg with TLS 1.2 as its minimum version, also in the
// configs its GetConfigForClient returns.
func atLeastTLS12(cfg *tls.Config) *tls.Config {
	cfg = cfg.Clone()
	cfg.MinVersion = max(cfg.MinVersion, tls.VersionTLS12)
	if get := cfg.GetConfigForClient; get != nil {
		cfg.GetConfigForClient = func(hello *tls.ClientHelloInfo) (*tls.Config, error) {
			c, err := get(hello)
			if c != nil && c.MinVersion < tls.VersionTLS12 {
				c = c.Clone()
				c.MinVersion = tls.VersionTLS12
			}
			return c, err
		}
	}
	return cfg
}

// TLSAddr is the address of the TLS listener; nil without one.
func (s *Server) TLSAddr() net.Addr {
	if s.tls == nil {
		return nil
	}
	return s.tls.ln.Addr()
}

func (f *tlsFront) accept() {
	defer close(f.done)
	// Connections are enrolled in the loops only once they run (the first
	// tick): before that the engine's loop list is still being built.
	select {
	case <-f.srv.loopsUp:
	case <-f.stop:
		return
	}
	var backoff time.Duration
	for {
		raw, err := f.ln.Accept()
		if err != nil {
			if f.srv.closing.Load() || errors.Is(err, net.ErrClosed) {
				return
			}
			// Out of file descriptors, say: wait a little, as net/http does.
			backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
			f.srv.log.Warn("TLS accept failed", "err", err, "retry_in", backoff)
			time.Sleep(backoff)
			continue
		}
		backoff = 0
		f.wg.Add(1)
		go f.serve(raw)
	}
}

// serve enrolls raw's broker side, runs the TLS handshake and copies
// between the two until either side closes.
func (f *tlsFront) serve(raw net.Conn) {
	defer f.wg.Done()
	p := &tlsPeer{raw: raw}
	if a, ok := raw.RemoteAddr().(*net.TCPAddr); ok {
		ap := a.AddrPort()
		p.remote = netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
	}
	ours, theirs, err := socketPair()
	if err != nil {
		f.srv.log.Warn("TLS connection dropped: no socket pair", "remote", p.remote.String(), "err", err)
		_ = raw.Close()
		return
	}
	defer ours.Close()
	res, err := f.srv.eng.Register(gnet.NewNetConnContext(gnet.NewContext(context.Background(), p), theirs))
	if err == nil {
		r := <-res
		err = r.Err
	}
	_ = theirs.Close() // gnet serves its own copy of the descriptor
	if err != nil {
		if !f.srv.closing.Load() {
			f.srv.log.Warn("TLS connection dropped: cannot hand it to an event loop", "remote", p.remote.String(), "err", err)
		}
		_ = raw.Close()
		return
	}
	// The broker's handshake deadline bounds the TLS handshake (it closes
	// its end, and brokerClosed the socket); this one only backs it up.
	_ = raw.SetDeadline(time.Now().Add(2 * f.srv.cfg.HandshakeTimeout))
	tc := tls.Server(raw, f.cfg)
	if err := tc.Handshake(); err != nil {
		f.srv.metrics.tlsHandshakeFailures.Inc()
		f.srv.log.Debug("TLS handshake failed", "remote", p.remote.String(), "err", err)
		_ = raw.Close()
		f.srv.notifyChanged()
		return
	}
	st := tc.ConnectionState()
	p.mu.Lock()
	if p.closed { // closed by the broker during the handshake
		p.mu.Unlock()
		_ = raw.Close()
		return
	}
	p.handshaken = true
	if len(st.VerifiedChains) > 0 {
		p.cn = st.PeerCertificates[0].Subject.CommonName
	}
	_ = raw.SetDeadline(time.Time{})
	p.mu.Unlock()

	// Client to broker: when the client is done, the broker reads EOF
	// (and closes its end, which ends the other direction).
	f.wg.Add(1)
	go func() {
		defer f.wg.Done()
		buf := make([]byte, tlsCopyBuffer)
		_, _ = io.CopyBuffer(onlyWriter{ours}, tc, buf)
		if uc, ok := ours.(*net.UnixConn); ok {
			_ = uc.CloseWrite()
		}
	}()
	// Broker to client, until the broker closes its end.
	buf := make([]byte, tlsCopyBuffer)
	_, err = io.CopyBuffer(tc, onlyReader{ours}, buf)
	if err == nil {
		_ = tc.Close() // close_notify, then the socket
	} else {
		_ = raw.Close()
	}
}

// onlyWriter and onlyReader hide ReadFrom and WriteTo, so io.CopyBuffer
// uses the front's buffer.
type onlyWriter struct{ io.Writer }
type onlyReader struct{ io.Reader }

// socketPair makes a connected pair of Unix stream sockets.
func socketPair() (ours, theirs net.Conn, err error) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, nil, err
	}
	var conns [2]net.Conn
	for i, fd := range fds {
		f := os.NewFile(uintptr(fd), "warren-tls-pair")
		conns[i], err = net.FileConn(f)
		_ = f.Close()
		if err != nil {
			if i == 1 {
				_ = conns[0].Close()
			} else {
				_ = unix.Close(fds[1])
			}
			return nil, nil, err
		}
	}
	return conns[0], conns[1], nil
}

// close stops accepting and waits (within ctx) for the front's goroutines,
// which end once the broker has closed every connection.
func (f *tlsFront) close() {
	close(f.stop)
	_ = f.ln.Close()
}

func (f *tlsFront) wait(ctx context.Context) {
	<-f.done
	done := make(chan struct{})
	go func() {
		f.wg.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-ctx.Done():
	}
}
