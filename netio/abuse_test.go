package netio_test

import (
	"context"
	"errors"
	"net"
	"sync"
	"testing"
	"time"

	"golang.org/x/crypto/bcrypt"

	"github.com/warren-mq/warren/client"
	"github.com/warren-mq/warren/netio"
	"github.com/warren-mq/warren/netio/warrentest"
	"github.com/warren-mq/warren/wire"
)

// rawConn is a hand-driven protocol peer for abuse tests.
type rawConn struct {
	t   *testing.T
	nc  net.Conn
	buf []byte
}

// rawHello connects, sends the preamble and reads HELLO.
func rawHello(t *testing.T, s *netio.Server) *rawConn {
	t.Helper()
	nc, err := net.Dial("tcp", s.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nc.Close() })
	r := &rawConn{t: t, nc: nc}
	r.write(wire.Preamble[:])
	if _, ok := r.read().(*wire.Hello); !ok {
		t.Fatal("no HELLO")
	}
	return r
}

// rawDial is rawHello, then AUTH as guest (asking heartbeatMs) and OPEN_OK.
func rawDial(t *testing.T, s *netio.Server, heartbeatMs uint32) *rawConn {
	t.Helper()
	r := rawHello(t, s)
	r.write(wire.AppendFrame(nil, 0, &wire.Auth{Mechanism: "PLAIN", Response: wire.PlainResponse("guest", "guest"), MaxFrame: wire.MinMaxFrame, HeartbeatMs: heartbeatMs}))
	if _, ok := r.read().(*wire.OpenOK); !ok {
		t.Fatal("no OPEN_OK")
	}
	return r
}

func (r *rawConn) write(b []byte) {
	r.t.Helper()
	if _, err := r.nc.Write(b); err != nil {
		r.t.Fatal(err)
	}
}

// read returns the next frame's body, or nil when the broker closed the
// socket; no frame within 10 s fails the test.
func (r *rawConn) read() wire.Body {
	r.t.Helper()
	_, b, err := r.next()
	if err != nil {
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			r.t.Fatal("timed out waiting for a frame")
		}
		return nil
	}
	return b
}

// next returns the next frame's channel and body, or the socket's read
// error (the broker closed it, or no frame within 10 s).
func (r *rawConn) next() (ch uint16, b wire.Body, err error) {
	r.t.Helper()
	return r.nextWithin(wire.HardMaxFrame)
}

// nextWithin is next for a peer whose max_frame is limit: a frame over it
// fails the test (such a peer refuses it: frame_too_large).
func (r *rawConn) nextWithin(limit uint32) (ch uint16, b wire.Body, err error) {
	r.t.Helper()
	_ = r.nc.SetReadDeadline(time.Now().Add(10 * time.Second))
	for {
		f, n, err := wire.Split(r.buf, limit)
		if err != nil {
			r.t.Fatalf("a frame over max_frame %d: %v", limit, err)
		}
		if n > 0 {
			b, err := wire.Decode(f, limit, nil)
			if err != nil {
				r.t.Fatal(err)
			}
			r.buf = r.buf[n:]
			return f.Channel, b, nil
		}
		tmp := make([]byte, 64<<10)
		m, err := r.nc.Read(tmp)
		if err != nil {
			return 0, nil, err
		}
		r.buf = append(r.buf, tmp[:m]...)
	}
}

func (r *rawConn) expectClose(code wire.Code) {
	r.t.Helper()
	for {
		b := r.read()
		if b == nil {
			r.t.Fatalf("socket closed without CLOSE %v", code)
		}
		if c, ok := b.(*wire.Close); ok {
			if c.Code != code {
				r.t.Fatalf("CLOSE %v (%s), want %v", c.Code, c.Reason, code)
			}
			if r.read() != nil {
				r.t.Fatal("socket still open after CLOSE")
			}
			return
		}
	}
}

// aliveCheck proves another client still works end to end.
func aliveCheck(t *testing.T, s *netio.Server, ch *client.Channel) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := ch.DeclareQueue(ctx, "alive", client.QueueOptions{}); err != nil {
		t.Fatalf("healthy client broken: %v", err)
	}
	if err := ch.Publish(ctx, "", client.Message{RoutingKey: "alive", Body: []byte("ok")}); err != nil {
		t.Fatalf("healthy client broken: %v", err)
	}
}

func TestMalformedAndOversizeFrames(t *testing.T) {
	s := warrentest.StartServer(t, nil)
	good := channel(t, dial(t, s))

	cases := []struct {
		name  string
		bytes []byte
		code  wire.Code
	}{
		{"oversize", append(le32(wire.MinMaxFrame), byte(wire.TypePublish), 0, 1, 0), wire.FrameTooLarge},
		{"unknown type", []byte{0, 0, 0, 0, 0x7f, 0, 0, 0}, wire.UnknownFrameType},
		{"bad flags", []byte{0, 0, 0, 0, byte(wire.TypeHeartbeat), 0x80, 0, 0}, wire.BadFlags},
		{"truncated payload", append(append(le32(3), byte(wire.TypeClose), 0, 0, 0), 1, 2, 3), wire.FrameError},
		{"server frame from client", wire.AppendFrame(nil, 0, &wire.Hello{}), wire.UnexpectedFrame},
		{"channel not open", wire.AppendFrame(nil, 9, &wire.QueuePurge{Req: 1, Name: "x"}), wire.ChannelError},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := rawDial(t, s, 0)
			r.write(c.bytes)
			r.expectClose(c.code)
			aliveCheck(t, s, good)
		})
	}
}

func TestChannelErrorClosesOnlyTheChannel(t *testing.T) {
	s := warrentest.StartServer(t, nil)
	r := rawDial(t, s, 0)
	r.write(wire.AppendFrame(nil, 1, &wire.ChannelOpen{Req: 1}))
	r.write(wire.AppendFrame(nil, 2, &wire.ChannelOpen{Req: 2}))
	r.read()
	r.read()
	// A settle of a tag never delivered closes channel 1 only.
	r.write(wire.AppendSettle(nil, 1, []wire.Settlement{{Op: wire.SettleAck, First: 5, Last: 5}}))
	cc, ok := r.read().(*wire.ChannelClose)
	if !ok || cc.Code != wire.UnknownDeliveryTag {
		t.Fatalf("got %+v, want CHANNEL_CLOSE unknown_delivery_tag", cc)
	}
	r.write(wire.AppendFrame(nil, 1, &wire.ChannelCloseOK{}))
	r.write(wire.AppendFrame(nil, 2, &wire.QueueDeclare{Req: 3, Name: "still-here"}))
	if ok, isOK := r.read().(*wire.QueueDeclareOK); !isOK || ok.Name != "still-here" {
		t.Fatalf("channel 2 broken: %+v", ok)
	}
	// A publish with the wrong sequence number: sequence_error on that channel.
	b, mark := wire.BeginPublish(nil, 2, 7, nil)
	b = wire.AppendMessage(b, &wire.Message{RoutingKey: []byte("still-here"), Body: []byte("x")})
	r.write(mark.End(b, 1))
	if cc, ok := r.read().(*wire.ChannelClose); !ok || cc.Code != wire.SequenceError {
		t.Fatalf("got %+v, want sequence_error", cc)
	}
}

func TestRequestErrorsKeepTheChannel(t *testing.T) {
	s := warrentest.StartServer(t, nil)
	ctx := ctxT(t)
	ch := channel(t, dial(t, s))
	_, err := ch.PurgeQueue(ctx, "missing")
	if wire.CodeOf(err) != wire.NotFound {
		t.Fatalf("got %v", err)
	}
	_, err = ch.DeclareQueue(ctx, "q", client.QueueOptions{Args: wire.Table{{Key: "max-lenght", Value: wire.Int(5)}}})
	if wire.CodeOf(err) != wire.InvalidArgument {
		t.Fatalf("misspelt argument: got %v", err)
	}
	_, err = ch.DeclareQueue(ctx, "q", client.QueueOptions{})
	must(t, err)
	_, err = ch.DeclareQueue(ctx, "q", client.QueueOptions{Durable: true})
	if wire.CodeOf(err) != wire.PreconditionFailed {
		t.Fatalf("redeclare with other settings: got %v", err)
	}
	aliveCheck(t, s, ch)
}

func TestWrongCredentialsRefused(t *testing.T) {
	// The lowest bcrypt cost keeps the test fast (an unknown user costs as
	// much as a known one, so both pay it).
	h, err := bcrypt.GenerateFromPassword([]byte("s3cret"), bcrypt.MinCost)
	must(t, err)
	pw := string(h)
	s := warrentest.StartServer(t, &netio.Config{Users: []netio.User{{Name: "app", PasswordHash: pw}}})
	ctx := ctxT(t)
	_, err = client.Dial(ctx, "warren://app:wrong@"+s.Addr().String())
	if wire.CodeOf(err) != wire.AuthFailed {
		t.Fatalf("wrong password: got %v", err)
	}
	_, err = client.Dial(ctx, "warren://nobody:x@"+s.Addr().String())
	if wire.CodeOf(err) != wire.AuthFailed {
		t.Fatalf("unknown user: got %v", err)
	}
	c, err := client.Dial(ctx, "warren://app:s3cret@"+s.Addr().String())
	must(t, err)
	c.Close()
}

func TestGuestOnlyFromLoopbackUnlessDisabled(t *testing.T) {
	s := warrentest.StartServer(t, &netio.Config{DisableGuest: true})
	_, err := client.Dial(ctxT(t), warrentest.URL(s))
	if wire.CodeOf(err) != wire.AuthFailed {
		t.Fatalf("guest with guest disabled: got %v", err)
	}
}

func TestDeadPeerDetectedByHeartbeat(t *testing.T) {
	s := warrentest.StartServer(t, &netio.Config{TickInterval: 10 * time.Millisecond})
	ctx := ctxT(t)
	ch := channel(t, dial(t, s))
	ch.DeclareQueue(ctx, "hb", client.QueueOptions{})
	must(t, ch.Publish(ctx, "", client.Message{RoutingKey: "hb", Body: []byte("m")}))
	// A raw peer negotiates 100ms heartbeats, takes a delivery and goes
	// silent without closing its socket.
	r := rawDial(t, s, 100)
	r.write(wire.AppendFrame(nil, 1, &wire.ChannelOpen{Req: 1}))
	r.read()
	r.write(wire.AppendFrame(nil, 1, &wire.Subscribe{Req: 2, Queue: "hb", PrefetchCount: 1}))
	for {
		if _, ok := r.read().(*wire.Deliver); ok {
			break
		}
	}
	start := time.Now()
	r.expectClose(wire.HeartbeatTimeout)
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("dead peer detected after %v", d)
	}
	// Its CLOSE is written before the broker lets go of the connection:
	// wait for that (its Down submitted), then for the shards.
	until(t, s, "the dead peer's connection to go", func() bool { return s.ConnectionCount() == 1 })
	settled(t, s)
	if q := queueStats(s, "hb"); q.Ready != 1 || q.Unacked != 0 {
		t.Fatalf("queue hb: ready %d unacked %d, want the delivery back (1 0)", q.Ready, q.Unacked)
	}
}

func TestThousandConnections(t *testing.T) {
	s := warrentest.StartServer(t, nil)
	ctx := ctxT(t)
	const n = 1000
	conns := make([]*client.Conn, n)
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range conns {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			c, err := client.Dial(ctx, warrentest.URL(s), client.Options{Heartbeat: -1})
			if err != nil {
				errs <- err
				return
			}
			conns[i] = c
		}(i)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if got := s.ConnectionCount(); got != n {
		t.Fatalf("%d connections, want %d", got, n)
	}
	// Every one of them works.
	for i := 0; i < n; i += 97 {
		ch := channel(t, conns[i])
		if _, err := ch.DeclareQueue(ctx, "", client.QueueOptions{Exclusive: true}); err != nil {
			t.Fatal(err)
		}
	}
	var cw sync.WaitGroup
	for _, c := range conns {
		cw.Add(1)
		go func() { defer cw.Done(); c.Close() }()
	}
	cw.Wait()
	until(t, s, "every connection to close", func() bool { return s.ConnectionCount() == 0 })
}

func le32(v uint32) []byte { return []byte{byte(v), byte(v >> 8), byte(v >> 16), byte(v >> 24)} }

func TestConnectionAndChannelLimits(t *testing.T) {
	s := warrentest.StartServer(t, &netio.Config{MaxConnections: 2, MaxChannels: 2})
	ctx := ctxT(t)
	a := dial(t, s)
	dial(t, s)
	if _, err := client.Dial(ctx, warrentest.URL(s)); err == nil {
		t.Fatal("a third connection was accepted over MaxConnections=2")
	}
	// The client honours the negotiated channel limit...
	channel(t, a)
	channel(t, a)
	if _, err := a.Channel(ctx); err == nil {
		t.Fatal("a third channel was opened over MaxChannels=2")
	}
	// ...and the broker enforces it on a client that does not.
	a.Close()
	until(t, s, "the first connection to close", func() bool { return s.ConnectionCount() == 1 })
	r := rawDial(t, s, 0)
	r.write(wire.AppendFrame(nil, 3, &wire.ChannelOpen{Req: 1}))
	r.expectClose(wire.ChannelError)
}

func TestUnlimitedPrefetchIsCapped(t *testing.T) {
	s := warrentest.StartServer(t, &netio.Config{MaxPrefetch: 5})
	ctx := ctxT(t)
	ch := channel(t, dial(t, s))
	ch.DeclareQueue(ctx, "capped", client.QueueOptions{})
	for i := 0; i < 20; i++ {
		ch.PublishAsync(ctx, "", client.Message{RoutingKey: "capped", Body: []byte("x")})
	}
	must(t, ch.WaitConfirms(ctx))
	if _, err := ch.Consume(ctx, "capped", client.ConsumeOptions{}); err != nil { // prefetch 0: "unlimited"
		t.Fatal(err)
	}
	settled(t, s) // the deliveries were made when the consumer subscribed
	if q := queueStats(s, "capped"); q.Unacked != 5 || q.Ready != 15 {
		t.Fatalf("queue capped: unacked %d ready %d, want 5 and 15", q.Unacked, q.Ready)
	}
}

// TestSlowReaderIsCutOff: an auto-ack consumer that stops reading cannot
// make the broker buffer without bound; its connection is closed and
// other clients carry on.
func TestSlowReaderIsCutOff(t *testing.T) {
	s := warrentest.StartServer(t, &netio.Config{MaxOutboundBytes: 1 << 20})
	ctx := ctxT(t)
	good := channel(t, dial(t, s))
	good.DeclareQueue(ctx, "flood", client.QueueOptions{})
	r := rawDial(t, s, 0)
	r.write(wire.AppendFrame(nil, 1, &wire.ChannelOpen{Req: 1}))
	r.read()
	r.write(wire.AppendFrame(nil, 1, &wire.Subscribe{Req: 2, Queue: "flood", AutoAck: true}))
	r.read() // SUBSCRIBE_OK; from now on it reads nothing
	// Each delivery batch stays under the outbox cap, so only gnet's own
	// buffer (the socket is full) grows past it; the auto-ack window (1,000
	// deliveries of 4 KiB) is larger than the cap.
	body := make([]byte, 4096)
	for i := 0; i < 25_000 && s.ConnectionCount() > 1; i++ { // 100 MB at most
		if _, err := good.PublishAsync(ctx, "", client.Message{RoutingKey: "flood", Body: body}); err != nil {
			t.Fatal(err)
		}
	}
	until(t, s, "the slow reader to be cut off", func() bool { return s.ConnectionCount() == 1 })
	aliveCheck(t, s, good)
}
