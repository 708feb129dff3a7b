package netio_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"os/exec"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/warren-mq/warren/client"
	"github.com/warren-mq/warren/internal/testcerts"
	"github.com/warren-mq/warren/internal/tlsfiles"
	"github.com/warren-mq/warren/netio"
	"github.com/warren-mq/warren/netio/warrentest"
	"github.com/warren-mq/warren/wire"
	"golang.org/x/crypto/bcrypt"
)

// tlsEnv is a CA, a server certificate it signed, and the server's
// tls.Config (client certificates optional, verified against the CA).
type tlsEnv struct {
	ca     *testcerts.CA
	server *testcerts.Leaf
	cfg    *tls.Config
}

func newTLSEnv(t *testing.T) *tlsEnv {
	ca := testcerts.NewCA(t, "warren test CA")
	srv := ca.Server(t, "warren test server")
	return &tlsEnv{ca: ca, server: srv, cfg: &tls.Config{
		MinVersion: tls.VersionTLS10, Certificates: []tls.Certificate{srv.TLS},
		ClientCAs: ca.Pool(), ClientAuth: tls.VerifyClientCertIfGiven,
	}}
}

// startTLS starts a broker with the TLS listener on a free port (and the
// plain one, unless cfg says otherwise).
func startTLS(t *testing.T, env *tlsEnv, cfg *netio.Config) *netio.Server {
	t.Helper()
	if cfg == nil {
		cfg = &netio.Config{}
	}
	cfg.TLSAddr = "127.0.0.1:0"
	cfg.TLSConfig = env.cfg
	return warrentest.StartServer(t, cfg)
}

// clientTLS trusts env's CA and presents cert, if any.
func (env *tlsEnv) clientTLS(cert *testcerts.Leaf) *tls.Config {
	c := &tls.Config{RootCAs: env.ca.Pool()}
	if cert != nil {
		c.Certificates = []tls.Certificate{cert.TLS}
	}
	return c
}

func tlsURL(s *netio.Server, userinfo string) string {
	return "warrens://" + userinfo + s.TLSAddr().String()
}

// rawTLS opens a TLS connection and completes the TLS handshake, sending
// nothing of the protocol.
func rawTLS(t *testing.T, s *netio.Server, cfg *tls.Config) *rawConn {
	t.Helper()
	nc, err := tls.Dial("tcp", s.TLSAddr().String(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nc.Close() })
	return &rawConn{t: t, nc: nc}
}

func appUser(t *testing.T, name string) netio.User {
	h, err := bcrypt.GenerateFromPassword([]byte("secret"), bcrypt.MinCost)
	must(t, err)
	return netio.User{Name: name, PasswordHash: string(h)}
}

// TLS end to end through the SDK: warrens://, a custom CA, PLAIN; the
// connection's address is the client's, not the terminator's.
func TestTLSEndToEnd(t *testing.T) {
	env := newTLSEnv(t)
	s := startTLS(t, env, nil)
	ctx := ctxT(t)
	c, err := client.Dial(ctx, tlsURL(s, "guest:guest@"), client.Options{TLS: env.clientTLS(nil)})
	if err != nil {
		t.Fatalf("dial over TLS: %v", err)
	}
	defer c.Close()
	ch := channel(t, c)
	if _, err := ch.DeclareQueue(ctx, "tls", client.QueueOptions{}); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 100; i++ {
		ch.PublishAsync(ctx, "", client.Message{RoutingKey: "tls", Body: bytes.Repeat([]byte{byte(i)}, 100+i*50)})
	}
	if err := ch.WaitConfirms(ctx); err != nil {
		t.Fatal(err)
	}
	cs, err := ch.Consume(ctx, "tls", client.ConsumeOptions{Prefetch: 10})
	must(t, err)
	for i := 0; i < 100; i++ {
		d := recv(t, cs)
		if len(d.Body) != 100+i*50 || d.Body[0] != byte(i) {
			t.Fatalf("message %d: %d bytes starting %d", i, len(d.Body), d.Body[0])
		}
		d.Ack()
	}
	infos := s.Connections()
	if len(infos) != 1 || !strings.HasPrefix(infos[0].Remote, "127.0.0.1:") || !infos[0].TLS {
		t.Fatalf("connections %+v, want one TLS connection from 127.0.0.1", infos)
	}
	// TLS 1.1 is refused, whatever the broker's tls.Config allows.
	old := env.clientTLS(nil)
	old.MinVersion, old.MaxVersion = tls.VersionTLS10, tls.VersionTLS11
	if _, err := client.Dial(ctx, tlsURL(s, "guest:guest@"), client.Options{TLS: old}); err == nil {
		t.Fatal("a TLS 1.1 client was accepted")
	}
	// Without the CA the server's certificate is not trusted.
	if _, err := client.Dial(ctx, tlsURL(s, "guest:guest@")); err == nil {
		t.Fatal("dialled a server whose CA the client does not trust")
	}
	// The plain listener still serves.
	aliveCheck(t, s, channel(t, dial(t, s)))
}

// Mutual TLS: a client certificate from the broker's CA authenticates with
// EXTERNAL as the user named by its subject CN; one from another CA fails
// the TLS handshake; a CN without a user, and EXTERNAL without a
// certificate, are auth_failed.
func TestTLSClientCertificates(t *testing.T) {
	env := newTLSEnv(t)
	s := startTLS(t, env, &netio.Config{Users: []netio.User{appUser(t, "app")}})
	ctx := ctxT(t)

	c, err := client.Dial(ctx, tlsURL(s, ""), client.Options{TLS: env.clientTLS(env.ca.Client(t, "app"))})
	if err != nil {
		t.Fatalf("EXTERNAL with a certificate for app: %v", err)
	}
	aliveCheck(t, s, channel(t, c))
	found := false
	for _, ci := range s.Connections() {
		found = found || (ci.User == "app" && ci.TLS)
	}
	if !found {
		t.Fatalf("no TLS connection of user app: %+v", s.Connections())
	}
	c.Close()

	// A certificate from another CA: Go's client does not even offer it
	// (the broker's CA list does not name its issuer), so EXTERNAL is not
	// offered; presented anyway, the TLS handshake fails.
	other := testcerts.NewCA(t, "another CA").Client(t, "app")
	if _, err := client.Dial(ctx, tlsURL(s, ""), client.Options{TLS: env.clientTLS(other)}); err == nil || !strings.Contains(err.Error(), "EXTERNAL") {
		t.Fatalf("a certificate from another CA: %v, want an error saying the broker does not offer EXTERNAL", err)
	}
	forced := env.clientTLS(nil)
	forced.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &other.TLS, nil }
	if _, err := client.Dial(ctx, tlsURL(s, ""), client.Options{TLS: forced}); err == nil {
		t.Fatal("a certificate from another CA was accepted")
	}
	// The client may read the broker's alert before the broker counts it.
	waitFor(t, s, "warren_tls_handshake_failures_total 1", func() bool { return metricValue(s, "warren_tls_handshake_failures_total") == 1 })
	_, err = client.Dial(ctx, tlsURL(s, ""), client.Options{TLS: env.clientTLS(env.ca.Client(t, "nobody"))})
	if wire.CodeOf(err) != wire.AuthFailed {
		t.Fatalf("EXTERNAL for a CN with no user: %v, want auth_failed", err)
	}

	// HELLO offers EXTERNAL only with a verified certificate; asked for
	// without one, it is refused.
	r := rawTLS(t, s, env.clientTLS(nil))
	r.write(wire.Preamble[:])
	h, ok := r.read().(*wire.Hello)
	if !ok || len(h.Mechanisms) != 1 || h.Mechanisms[0] != "PLAIN" {
		t.Fatalf("HELLO without a client certificate: %+v, want mechanisms [PLAIN]", h)
	}
	r.write(wire.AppendFrame(nil, 0, &wire.Auth{Mechanism: "EXTERNAL", MaxFrame: wire.MinMaxFrame}))
	r.expectClose(wire.AuthFailed)

	r = rawTLS(t, s, env.clientTLS(env.ca.Client(t, "app")))
	r.write(wire.Preamble[:])
	h, ok = r.read().(*wire.Hello)
	if !ok || strings.Join(h.Mechanisms, ",") != "PLAIN,EXTERNAL" {
		t.Fatalf("HELLO with a client certificate: %+v, want mechanisms [PLAIN EXTERNAL]", h)
	}
	// An authorization identity other than the certificate's CN is refused.
	r.write(wire.AppendFrame(nil, 0, &wire.Auth{Mechanism: "EXTERNAL", Response: []byte("admin"), MaxFrame: wire.MinMaxFrame}))
	r.expectClose(wire.AuthFailed)

	// On the plain port there is no certificate: EXTERNAL is refused.
	p := rawOpen(t, s.Addr().String())
	p.hello()
	p.write(wire.AppendFrame(nil, 0, &wire.Auth{Mechanism: "EXTERNAL", MaxFrame: wire.MinMaxFrame}))
	p.expectClose(wire.AuthFailed)
}

// --listen off: only the TLS port serves.
func TestTLSOnly(t *testing.T) {
	env := newTLSEnv(t)
	s := startTLS(t, env, &netio.Config{DisablePlain: true})
	if s.Addr() != nil {
		t.Fatalf("plain listener at %v with DisablePlain", s.Addr())
	}
	c, err := client.Dial(ctxT(t), tlsURL(s, "guest:guest@"), client.Options{TLS: env.clientTLS(nil)})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	aliveCheck(t, s, channel(t, c))
}

// The bounds on connections before they authenticate hold over TLS: the
// handshake deadline (a TCP connection that never starts TLS, one that
// finishes TLS but sends no preamble), the unauthenticated cap and the
// per-source cap, counted by the client's address across both ports.
func TestTLSConnectionBounds(t *testing.T) {
	env := newTLSEnv(t)
	t.Run("handshake deadline", func(t *testing.T) {
		cfg := shortHandshake(nil)
		s := startTLS(t, env, cfg)
		start := time.Now()
		r := rawOpen(t, s.TLSAddr().String()) // TCP only: no ClientHello
		if b := r.read(); b != nil {
			t.Fatalf("got %T, want the socket closed", b)
		}
		// The broker counts in whole milliseconds (accept and now): up
		// to 1 ms early by the test's clock is the deadline kept.
		if el := time.Since(start); el < cfg.HandshakeTimeout-time.Millisecond {
			t.Fatalf("closed after %v, before the %v deadline", el, cfg.HandshakeTimeout)
		}
		start = time.Now()
		r = rawTLS(t, s, env.clientTLS(nil))
		r.hello()
		r.expectCloseWith(wire.ResourceLimit, "handshake")
		// The broker counts in whole milliseconds (accept and now): up
		// to 1 ms early by the test's clock is the deadline kept.
		if el := time.Since(start); el < cfg.HandshakeTimeout-time.Millisecond {
			t.Fatalf("closed after %v, before the %v deadline", el, cfg.HandshakeTimeout)
		}
		if v := metricValue(s, "warren_handshake_timeouts_total"); v != 2 {
			t.Fatalf("warren_handshake_timeouts_total %v, want 2", v)
		}
	})
	t.Run("unauthenticated cap", func(t *testing.T) {
		s := startTLS(t, env, &netio.Config{MaxUnauthenticated: 3})
		var idle []*rawConn
		for i := 0; i < 3; i++ {
			r := rawTLS(t, s, env.clientTLS(nil))
			r.write(wire.Preamble[:4]) // the TLS handshake done, the preamble never finished
			idle = append(idle, r)
		}
		waitFor(t, s, "3 unauthenticated connections", func() bool { return metricValue(s, "warren_connections_unauthenticated") == 3 })
		c, err := client.Dial(ctxT(t), tlsURL(s, "guest:guest@"), client.Options{TLS: env.clientTLS(nil)})
		if err != nil {
			t.Fatalf("a real client locked out by idle TLS sockets: %v", err)
		}
		defer c.Close()
		idle[0].expectCloseWith(wire.ResourceLimit, "unauthenticated")
		if v := metricValue(s, `warren_connections_refused_total{reason="unauthenticated"}`); v != 1 {
			t.Fatalf(`refused_total{reason="unauthenticated"} %v, want 1`, v)
		}
	})
	t.Run("per-source cap", func(t *testing.T) {
		s := startTLS(t, env, &netio.Config{MaxConnectionsPerSource: 2})
		dial(t, s) // plain, from 127.0.0.1
		c, err := client.Dial(ctxT(t), tlsURL(s, "guest:guest@"), client.Options{TLS: env.clientTLS(nil)})
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if _, err := client.Dial(ctxT(t), tlsURL(s, "guest:guest@"), client.Options{TLS: env.clientTLS(nil)}); err == nil {
			t.Fatal("a third connection from 127.0.0.1 (over TLS) was admitted with a per-source cap of 2")
		}
		if v := metricValue(s, `warren_connections_refused_total{reason="per_source"}`); v != 1 {
			t.Fatalf(`refused_total{reason="per_source"} %v, want 1`, v)
		}
		if n := s.ConnectionCount(); n != 2 {
			t.Fatalf("%d connections, want 2", n)
		}
	})
}

// waitFor waits (on Changed, with a deadline) until cond holds.
func waitFor(t *testing.T, s *netio.Server, what string, cond func() bool) {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		ch := s.Changed()
		if cond() {
			return
		}
		select {
		case <-ch:
		case <-deadline:
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

// Flow control over TLS: a publisher that ignores FLOW(active=false) is
// blocked as on the plain port: the broker stops reading, the terminator
// stops reading the TLS socket behind it, and the client's writes stall
// with what it wrote bounded; after a purge it is read again and
// confirmed.
func TestTLSFlowIgnoringPublisherIsBlocked(t *testing.T) {
	const watermark = 4 << 20
	env := newTLSEnv(t)
	s := startTLS(t, env, &netio.Config{MemoryHighWater: watermark, TickInterval: 10 * time.Millisecond})
	ctx := ctxT(t)
	good := channel(t, dial(t, s))
	if _, err := good.DeclareQueue(ctx, "flood", client.QueueOptions{}); err != nil {
		t.Fatal(err)
	}
	r := rawTLS(t, s, env.clientTLS(nil))
	r.write(wire.Preamble[:])
	if _, ok := r.read().(*wire.Hello); !ok {
		t.Fatal("no HELLO")
	}
	r.write(guestAuth())
	if _, ok := r.read().(*wire.OpenOK); !ok {
		t.Fatal("no OPEN_OK")
	}
	var id uint64
	for _, ci := range s.Connections() {
		if ci.TLS {
			id = ci.ID
		}
	}
	r.write(wire.AppendFrame(nil, 1, &wire.ChannelOpen{Req: 1}))
	if _, ok := r.read().(*wire.OKReply); !ok {
		t.Fatal("no CHANNEL_OPEN reply")
	}
	w := watchRaw(r)
	const limit = 64 << 20
	stalls := make(chan int, 1)
	var stop atomic.Bool
	writerDone := make(chan error, 1)
	var lastSeq atomic.Uint64
	go func() {
		body := make([]byte, 1024)
		seq, written := uint64(1), 0
		var frame []byte
		for written < limit && !stop.Load() {
			var mark wire.BatchMark
			frame, mark = wire.BeginPublish(frame[:0], 1, seq, nil)
			for i := 0; i < 32; i++ {
				frame = wire.AppendMessage(frame, &wire.Message{RoutingKey: []byte("flood"), Body: body})
			}
			frame = mark.End(frame, 32)
			seq += 32
			for rest := frame; len(rest) > 0; {
				// Past the watermark's worth a write that makes no
				// progress for a second is taken as held back (before
				// it, a slow broker is just slow).
				if written > watermark {
					_ = r.nc.SetWriteDeadline(time.Now().Add(time.Second))
				}
				n, err := r.nc.Write(rest)
				written += n
				rest = rest[n:]
				var ne net.Error
				if errors.As(err, &ne) && ne.Timeout() {
					// A tls.Conn is broken after a timed-out write: report
					// the stall and stop.
					stalls <- written
					writerDone <- nil
					return
				}
				if err != nil {
					writerDone <- err
					return
				}
			}
			lastSeq.Store(seq - 1)
		}
		writerDone <- errors.New("wrote 64 MiB against a 4 MiB watermark without being held back")
	}()
	var written int
	select {
	case written = <-stalls:
	case err := <-writerDone:
		t.Fatalf("the TLS publisher was never held back: %v", err)
	case <-time.After(60 * time.Second):
		t.Fatal("writes never stalled")
	}
	if err := <-writerDone; err != nil {
		t.Fatal(err)
	}
	waitFor(t, s, "the TLS publisher's connection to be blocked", func() bool {
		ci, ok := connInfo(s, id)
		return ok && ci.Blocked
	})
	stored := metricValue(s, "warren_stored_message_bytes")
	t.Logf("writes stalled after %d bytes; stored %.0f bytes", written, stored)
	if stored > watermark {
		t.Fatalf("stored %.0f bytes with a watermark of %d", stored, watermark)
	}
	if written > 4*watermark {
		t.Fatalf("the client wrote %d bytes before being held back", written)
	}
	// Purge: it is read again and what it wrote whole is confirmed.
	want := lastSeq.Load()
	deadline := time.After(20 * time.Second)
	for w.maxConfirmed.Load() < want {
		if _, err := good.PurgeQueue(ctx, "flood"); err != nil {
			t.Fatal(err)
		}
		select {
		case <-w.confirmed:
		case <-deadline:
			t.Fatalf("confirmed up to %d of %d after the purge", w.maxConfirmed.Load(), want)
		}
	}
}

// A certificate renewed on disk is used for new connections after a
// reload; the connections made before it stay up.
func TestTLSCertificateReload(t *testing.T) {
	env := newTLSEnv(t)
	dir := t.TempDir()
	certFile, keyFile := env.server.Write(t, dir, "server")
	l, err := tlsfiles.Load(tlsfiles.Files{Cert: certFile, Key: keyFile})
	must(t, err)
	env.cfg = l.Config()
	s := startTLS(t, env, nil)
	ctx := ctxT(t)
	serverCN := func() string {
		nc, err := tls.Dial("tcp", s.TLSAddr().String(), env.clientTLS(nil))
		must(t, err)
		defer nc.Close()
		return nc.ConnectionState().PeerCertificates[0].Subject.CommonName
	}
	old, err := client.Dial(ctx, tlsURL(s, "guest:guest@"), client.Options{TLS: env.clientTLS(nil)})
	must(t, err)
	defer old.Close()
	oldCh := channel(t, old)
	if cn := serverCN(); cn != "warren test server" {
		t.Fatalf("server CN %q", cn)
	}
	renewed := env.ca.Server(t, "renewed")
	renewed.Write(t, dir, "server")
	must(t, l.Reload())
	if cn := serverCN(); cn != "renewed" {
		t.Fatalf("after the reload new connections see %q, want the renewed certificate", cn)
	}
	aliveCheck(t, s, oldCh) // the connection made before it is still up
	// A bad file keeps the old certificate.
	testcerts.WriteFile(t, keyFile, []byte("not a key"))
	if err := l.Reload(); err == nil {
		t.Fatal("a reload of a broken key succeeded")
	}
	if cn := serverCN(); cn != "renewed" {
		t.Fatalf("after a failed reload: %q", cn)
	}
}

// openssl s_client speaks to the TLS port: the preamble in, HELLO out.
func TestTLSOpenSSLClient(t *testing.T) {
	bin, err := exec.LookPath("openssl")
	if err != nil {
		t.Skip("openssl not installed")
	}
	env := newTLSEnv(t)
	s := startTLS(t, env, nil)
	dir := t.TempDir()
	caFile := dir + "/ca.pem"
	testcerts.WriteFile(t, caFile, env.ca.CertPEM)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, "s_client", "-connect", s.TLSAddr().String(), "-CAfile", caFile,
		"-verify_return_error", "-quiet", "-no_ign_eof")
	in, err := cmd.StdinPipe()
	must(t, err)
	out, err := cmd.StdoutPipe()
	must(t, err)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	must(t, cmd.Start())
	_, _ = in.Write(wire.Preamble[:])
	b := firstFrameOf(out)
	in.Close()
	_ = cmd.Wait()
	h, ok := b.(*wire.Hello)
	if !ok || h.Product != "warren" {
		t.Fatalf("openssl s_client got %#v, want HELLO; stderr:\n%s", b, stderr.String())
	}
	if !strings.Contains(stderr.String(), "verify return:1") {
		t.Fatalf("openssl did not verify the chain:\n%s", stderr.String())
	}
}

// firstFrameOf reads the first frame from r; nil if r ends first.
func firstFrameOf(r io.Reader) wire.Body {
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
		m, err := r.Read(tmp)
		if err != nil {
			return nil
		}
		buf = append(buf, tmp[:m]...)
	}
}
