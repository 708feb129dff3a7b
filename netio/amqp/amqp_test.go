package amqp_test

import (
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"strconv"
	"testing"
	"time"

	amqp091 "github.com/rabbitmq/amqp091-go"
	"github.com/warren-mq/warren/netio"
	"github.com/warren-mq/warren/netio/amqp"
)

const deadline = 10 * time.Second

// start runs a broker with an AMQP listener on a free port.
func start(t testing.TB, cfg amqp.Config) (*netio.Server, *amqp.Listener, string) {
	return startWith(t, netio.Config{}, cfg)
}

func startWith(t testing.TB, ncfg netio.Config, cfg amqp.Config) (*netio.Server, *amqp.Listener, string) {
	t.Helper()
	ncfg.Addr, ncfg.Shards, ncfg.EventLoops = "127.0.0.1:0", 2, 1
	srv, err := netio.Start(ncfg)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Addr = "127.0.0.1:0"
	l, err := amqp.Listen(srv, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), deadline)
		defer cancel()
		_ = l.Close()
		_ = srv.Close(ctx)
	})
	return srv, l, "amqp://guest:guest@" + l.Addr().String() + "/"
}

func dial(t *testing.T, url string) (*amqp091.Connection, *amqp091.Channel) {
	t.Helper()
	c, err := amqp091.Dial(url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.CloseDeadline(time.Now().Add(deadline)) })
	ch, err := c.Channel()
	if err != nil {
		t.Fatal(err)
	}
	return c, ch
}

func recv(t *testing.T, ds <-chan amqp091.Delivery) amqp091.Delivery {
	t.Helper()
	select {
	case d, ok := <-ds:
		if !ok {
			t.Fatal("deliveries closed")
		}
		return d
	case <-time.After(deadline):
		t.Fatal("no delivery")
	}
	panic("unreachable")
}

func TestPublishConfirmConsumeAck(t *testing.T) {
	_, _, url := start(t, amqp.Config{})
	_, ch := dial(t, url)
	if err := ch.ExchangeDeclare("ex", "direct", false, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	q, err := ch.QueueDeclare("", false, true, true, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	if q.Name == "" {
		t.Fatal("server-named queue has no name")
	}
	if err := ch.QueueBind(q.Name, "k", "ex", false, nil); err != nil {
		t.Fatal(err)
	}
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	confirms := ch.NotifyPublish(make(chan amqp091.Confirmation, 4))
	big := make([]byte, 300_000) // spans several body frames
	for i := range big {
		big[i] = byte(i)
	}
	pub := amqp091.Publishing{ContentType: "text/plain", CorrelationId: "c1", ReplyTo: "r", MessageId: "m1",
		Headers: amqp091.Table{"h": "v", "n": int32(7)}, DeliveryMode: 2, Priority: 3, Timestamp: time.Unix(1700000000, 0), Body: big}
	if err := ch.PublishWithContext(context.Background(), "ex", "k", false, false, pub); err != nil {
		t.Fatal(err)
	}
	select {
	case c := <-confirms:
		if !c.Ack || c.DeliveryTag != 1 {
			t.Fatalf("confirm %+v, want ack of 1", c)
		}
	case <-time.After(deadline):
		t.Fatal("no confirm")
	}
	ds, err := ch.Consume(q.Name, "", false, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	d := recv(t, ds)
	if string(d.Body) != string(big) || d.ContentType != "text/plain" || d.CorrelationId != "c1" || d.ReplyTo != "r" ||
		d.MessageId != "m1" || d.Headers["h"] != "v" || d.DeliveryMode != 2 || d.Priority != 3 || !d.Timestamp.Equal(time.Unix(1700000000, 0)) ||
		d.Exchange != "ex" || d.RoutingKey != "k" || d.Redelivered {
		t.Fatalf("delivery differs: %+v (body %d bytes)", d, len(d.Body))
	}
	if err := d.Ack(false); err != nil {
		t.Fatal(err)
	}
	// The ack took: a passive declare after a purge of nothing shows 0.
	n, err := ch.QueuePurge(q.Name, false)
	if err != nil || n != 0 {
		t.Fatalf("purge: %d, %v", n, err)
	}
}

func TestNackRequeueRedelivered(t *testing.T) {
	_, _, url := start(t, amqp.Config{})
	_, ch := dial(t, url)
	q, err := ch.QueueDeclare("rq", false, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := ch.PublishWithContext(context.Background(), "", q.Name, false, false, amqp091.Publishing{Body: []byte("x")}); err != nil {
		t.Fatal(err)
	}
	ds, err := ch.Consume(q.Name, "c", false, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	d := recv(t, ds)
	if d.Redelivered {
		t.Fatal("first delivery marked redelivered")
	}
	if err := d.Nack(false, true); err != nil {
		t.Fatal(err)
	}
	d = recv(t, ds)
	if !d.Redelivered || string(d.Body) != "x" {
		t.Fatalf("requeued delivery: redelivered=%v body=%q", d.Redelivered, d.Body)
	}
	if err := d.Reject(false); err != nil {
		t.Fatal(err)
	}
}

func TestMandatoryReturn(t *testing.T) {
	_, _, url := start(t, amqp.Config{})
	_, ch := dial(t, url)
	returns := ch.NotifyReturn(make(chan amqp091.Return, 1))
	if err := ch.PublishWithContext(context.Background(), "amq.direct", "nowhere", true, false, amqp091.Publishing{Body: []byte("r")}); err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-returns:
		if r.ReplyCode != 312 || r.RoutingKey != "nowhere" || string(r.Body) != "r" {
			t.Fatalf("return %+v", r)
		}
	case <-time.After(deadline):
		t.Fatal("no basic.return")
	}
}

func TestPriorityOrdering(t *testing.T) {
	_, _, url := start(t, amqp.Config{})
	_, ch := dial(t, url)
	q, err := ch.QueueDeclare("pq", false, false, false, false, amqp091.Table{"x-max-priority": int32(10)})
	if err != nil {
		t.Fatal(err)
	}
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	for _, p := range []uint8{1, 9, 5} {
		dc, err := ch.PublishWithDeferredConfirmWithContext(context.Background(), "", q.Name, false, false, amqp091.Publishing{Priority: p, Body: []byte{p}})
		if err != nil {
			t.Fatal(err)
		}
		if ok, err := dc.WaitContext(context.Background()); !ok || err != nil {
			t.Fatal("not confirmed", err)
		}
	}
	ds, err := ch.Consume(q.Name, "", true, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []uint8{9, 5, 1} {
		if d := recv(t, ds); d.Body[0] != want {
			t.Fatalf("got priority %d, want %d", d.Body[0], want)
		}
	}
}

func TestDeadLetterXDeath(t *testing.T) {
	_, _, url := start(t, amqp.Config{})
	_, ch := dial(t, url)
	if _, err := ch.QueueDeclare("dlq", false, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	if err := ch.QueueBind("dlq", "dead", "amq.direct", false, nil); err != nil {
		t.Fatal(err)
	}
	_, err := ch.QueueDeclare("work", false, false, false, false, amqp091.Table{
		"x-dead-letter-exchange": "amq.direct", "x-dead-letter-routing-key": "dead"})
	if err != nil {
		t.Fatal(err)
	}
	if err := ch.PublishWithContext(context.Background(), "", "work", false, false, amqp091.Publishing{Body: []byte("d")}); err != nil {
		t.Fatal(err)
	}
	ds, err := ch.Consume("work", "", false, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := recv(t, ds).Reject(false); err != nil {
		t.Fatal(err)
	}
	dl, err := ch.Consume("dlq", "", true, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	d := recv(t, dl)
	deaths, ok := d.Headers["x-death"].([]interface{})
	if !ok || len(deaths) != 1 {
		t.Fatalf("x-death = %#v", d.Headers["x-death"])
	}
	x := deaths[0].(amqp091.Table)
	if x["queue"] != "work" || x["reason"] != "rejected" || x["count"] != int64(1) || x["exchange"] != "" {
		t.Fatalf("x-death entry %#v", x)
	}
	if keys, _ := x["routing-keys"].([]interface{}); len(keys) != 1 || keys[0] != "work" {
		t.Fatalf("x-death routing-keys %#v", x["routing-keys"])
	}
}

func amqpCode(err error) int {
	var e *amqp091.Error
	if errors.As(err, &e) {
		return e.Code
	}
	return -1
}

func TestRefusals(t *testing.T) {
	_, _, url := start(t, amqp.Config{})
	conn, ch := dial(t, url)
	_, err := ch.QueueDeclare("q", false, false, false, false, amqp091.Table{"x-queue-mode": "lazy"})
	if amqpCode(err) != 406 {
		t.Fatalf("unmapped argument: %v, want 406 precondition_failed", err)
	}
	ch, _ = conn.Channel()
	if _, err = ch.QueueDeclarePassive("nope", false, false, false, false, nil); amqpCode(err) != 404 {
		t.Fatalf("passive declare of a missing queue: %v, want 404", err)
	}
	// The connection survives channel errors.
	ch, err = conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ch.QueueDeclare("ok", false, false, true, false, nil); err != nil {
		t.Fatal(err)
	}
	// not_implemented is a connection error, as RabbitMQ sends it.
	if err := ch.Qos(1, 1, true); amqpCode(err) != 540 {
		t.Fatalf("basic.qos global with a prefetch size: %v, want 540 not_implemented", err)
	}
}

// rawConn speaks AMQP by hand up to connection.open-ok.
func rawConn(t *testing.T, addr string) net.Conn {
	t.Helper()
	nc, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = nc.Close() })
	_ = nc.SetDeadline(time.Now().Add(deadline))
	if _, err := nc.Write([]byte("AMQP\x00\x00\x09\x01")); err != nil {
		t.Fatal(err)
	}
	readMethod(t, nc) // start
	resp := "\x00guest\x00guest"
	var p []byte
	p = binary.BigEndian.AppendUint16(p, 10)
	p = binary.BigEndian.AppendUint16(p, 11)
	p = binary.BigEndian.AppendUint32(p, 0) // client properties: empty table
	p = append(p, 5)
	p = append(p, "PLAIN"...)
	p = binary.BigEndian.AppendUint32(p, uint32(len(resp)))
	p = append(p, resp...)
	p = append(p, 5)
	p = append(p, "en_US"...)
	writeFrame(t, nc, 1, 0, p)
	readMethod(t, nc) // tune
	p = binary.BigEndian.AppendUint16(nil, 10)
	p = binary.BigEndian.AppendUint16(p, 31)
	p = binary.BigEndian.AppendUint16(p, 0)
	p = binary.BigEndian.AppendUint32(p, 131072)
	p = binary.BigEndian.AppendUint16(p, 0)
	writeFrame(t, nc, 1, 0, p)
	p = binary.BigEndian.AppendUint16(nil, 10)
	p = binary.BigEndian.AppendUint16(p, 40)
	p = append(p, 1, '/', 0, 0)
	writeFrame(t, nc, 1, 0, p)
	if cm := readMethod(t, nc); cm != [2]uint16{10, 41} {
		t.Fatalf("want open-ok, got %v", cm)
	}
	return nc
}

func writeFrame(t *testing.T, w io.Writer, typ byte, ch uint16, payload []byte) {
	t.Helper()
	b := []byte{typ}
	b = binary.BigEndian.AppendUint16(b, ch)
	b = binary.BigEndian.AppendUint32(b, uint32(len(payload)))
	b = append(append(b, payload...), 0xCE)
	if _, err := w.Write(b); err != nil {
		t.Fatal(err)
	}
}

// readMethod reads frames until a method frame and returns its class and
// method ids; for connection.close it also checks nothing else.
func readMethod(t *testing.T, r io.Reader) [2]uint16 {
	t.Helper()
	cm, _ := readMethodPayload(t, r)
	return cm
}

func readMethodPayload(t *testing.T, r io.Reader) ([2]uint16, []byte) {
	t.Helper()
	for {
		var h [7]byte
		if _, err := io.ReadFull(r, h[:]); err != nil {
			t.Fatal(err)
		}
		n := binary.BigEndian.Uint32(h[3:])
		p := make([]byte, n+1)
		if _, err := io.ReadFull(r, p); err != nil {
			t.Fatal(err)
		}
		if h[0] == 1 {
			return [2]uint16{binary.BigEndian.Uint16(p), binary.BigEndian.Uint16(p[2:])}, p[4:n]
		}
	}
}

// expectConnClose reads a connection.close and returns its reply code.
func expectConnClose(t *testing.T, r io.Reader) uint16 {
	t.Helper()
	cm, p := readMethodPayload(t, r)
	if cm != [2]uint16{10, 50} {
		t.Fatalf("want connection.close, got %v", cm)
	}
	code := binary.BigEndian.Uint16(p)
	if w, ok := r.(io.Writer); ok { // close-ok
		writeFrame(t, w, 1, 0, []byte{0, 10, 0, 51})
	}
	return code
}

func TestBadFrames(t *testing.T) {
	srv, l, _ := start(t, amqp.Config{FrameMax: 131072})
	addr := l.Addr().String()
	t.Run("frame end", func(t *testing.T) {
		nc := rawConn(t, addr)
		b := []byte{8, 0, 0, 0, 0, 0, 0, 0x00} // heartbeat with a bad end byte
		_, _ = nc.Write(b)
		if code := expectConnClose(t, nc); code != 501 {
			t.Fatalf("code %d, want 501 frame_error", code)
		}
	})
	t.Run("oversize", func(t *testing.T) {
		nc := rawConn(t, addr)
		h := []byte{1, 0, 1}
		h = binary.BigEndian.AppendUint32(h, 1<<30)
		_, _ = nc.Write(h)
		if code := expectConnClose(t, nc); code != 501 {
			t.Fatalf("code %d, want 501 frame_error", code)
		}
	})
	t.Run("unopened channel", func(t *testing.T) {
		nc := rawConn(t, addr)
		p := binary.BigEndian.AppendUint16(nil, 60)
		p = binary.BigEndian.AppendUint16(p, 10) // basic.qos
		p = append(p, 0, 0, 0, 0, 0, 1, 0)
		writeFrame(t, nc, 1, 7, p)
		if code := expectConnClose(t, nc); code != 504 {
			t.Fatalf("code %d, want 504 channel_error", code)
		}
	})
	// A method frame too short for its class and method ids (0 to 3
	// bytes) is a frame_error; it panicked the event loop, ending the
	// broker, from any client past the handshake (found by FuzzConn).
	for n := range 4 {
		t.Run("method frame of "+strconv.Itoa(n)+" bytes", func(t *testing.T) {
			nc := rawConn(t, addr)
			writeFrame(t, nc, 1, 1, make([]byte, n))
			if code := expectConnClose(t, nc); code != 501 {
				t.Fatalf("code %d, want 501 frame_error", code)
			}
		})
	}
	// None of them is still held.
	ctx, cancel := context.WithTimeout(context.Background(), deadline)
	defer cancel()
	if err := l.WaitConnections(ctx, 0); err != nil {
		t.Fatalf("connections still held: %d (%v)", l.ConnectionCount(), err)
	}
	_ = srv
}

func TestConnectionBounds(t *testing.T) {
	_, l, url := start(t, amqp.Config{ChannelMax: 4, MaxUnconfirmed: 2})
	cfg := amqp091.Config{ChannelMax: 100}
	c, err := amqp091.DialConfig(url, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for i := 0; i < 4; i++ {
		if _, err := c.Channel(); err != nil {
			t.Fatalf("channel %d: %v", i+1, err)
		}
	}
	// channel-max was negotiated down to 4: a fifth is refused by the
	// client library itself, so ask by hand.
	nc := rawConn(t, l.Addr().String())
	for id := uint16(1); id <= 5; id++ {
		p := binary.BigEndian.AppendUint16(nil, 20)
		p = binary.BigEndian.AppendUint16(p, 10)
		p = append(p, 0)
		writeFrame(t, nc, 1, id, p)
		if id <= 4 {
			if cm := readMethod(t, nc); cm != [2]uint16{20, 11} {
				t.Fatalf("channel %d: got %v, want open-ok", id, cm)
			}
		}
	}
	if code := expectConnClose(t, nc); code != 504 {
		t.Fatalf("channel over channel-max: code %d, want 504 channel_error", code)
	}
	if l.MaxUnconfirmed() != 2 {
		t.Fatalf("unconfirmed bound %d", l.MaxUnconfirmed())
	}
}

func TestMessageSizeBound(t *testing.T) {
	_, _, url := start(t, amqp.Config{MaxMessageSize: 1000})
	conn, ch := dial(t, url)
	closed := ch.NotifyClose(make(chan *amqp091.Error, 1))
	if err := ch.PublishWithContext(context.Background(), "", "any", false, false, amqp091.Publishing{Body: make([]byte, 1001)}); err != nil {
		t.Fatal(err)
	}
	select {
	case e := <-closed:
		if e == nil || e.Code != 406 {
			t.Fatalf("channel closed with %v, want 406", e)
		}
	case <-time.After(deadline):
		t.Fatal("an oversize message did not close the channel")
	}
	if conn.IsClosed() {
		t.Fatal("a channel error closed the connection")
	}
}

// A consumer that does not read cannot make the broker hold more than the
// outbox cap for it: past it the connection is closed and its deliveries
// go back to the queue.
func TestOutboxBound(t *testing.T) {
	srv, l, url := startWith(t, netio.Config{MaxOutboundBytes: 256 << 10}, amqp.Config{})
	_, ch := dial(t, url)
	if _, err := ch.QueueDeclare("big", false, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	body := make([]byte, 16<<10)
	const n = 1000 // 16 MiB: more than the socket buffers and the cap
	var last *amqp091.DeferredConfirmation
	for i := 0; i < n; i++ {
		dc, err := ch.PublishWithDeferredConfirmWithContext(context.Background(), "", "big", false, false, amqp091.Publishing{Body: body})
		if err != nil {
			t.Fatal(err)
		}
		last = dc
	}
	if ok, err := last.WaitContext(context.Background()); !ok || err != nil {
		t.Fatal("not confirmed", err)
	}
	// A raw consumer that never reads.
	nc := rawConn(t, l.Addr().String())
	p := binary.BigEndian.AppendUint16(nil, 20)
	p = binary.BigEndian.AppendUint16(p, 10)
	writeFrame(t, nc, 1, 1, append(p, 0))
	p = binary.BigEndian.AppendUint16(nil, 60)
	p = binary.BigEndian.AppendUint16(p, 20)
	p = append(p, 0, 0, 3, 'b', 'i', 'g', 0, 0, 0, 0, 0, 0)
	writeFrame(t, nc, 1, 1, p)
	ctx, cancel := context.WithTimeout(context.Background(), deadline)
	defer cancel()
	if err := l.WaitConnections(ctx, 1); err != nil {
		t.Fatalf("the stalled consumer's connection is still open: %v", err)
	}
	// Everything is back in the queue.
	q, err := ch.QueueDeclarePassive("big", false, false, false, false, nil)
	if err != nil || q.Messages != n {
		t.Fatalf("queue holds %d ready (%v), want %d", q.Messages, err, n)
	}
	_ = srv
}

// Under the memory alarm a publishing connection is not read, and is told
// so with connection.blocked; once the alarm clears, connection.unblocked.
func TestBlockedUnderMemoryAlarm(t *testing.T) {
	_, _, url := startWith(t, netio.Config{MemoryHighWater: 256 << 10}, amqp.Config{})
	conn, ch := dial(t, url)
	blocked := conn.NotifyBlocked(make(chan amqp091.Blocking, 4))
	if _, err := ch.QueueDeclare("fill", false, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	body := make([]byte, 64<<10)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := 0; i < 6; i++ { // the sixth finds five over the watermark
			if ch.PublishWithContext(context.Background(), "", "fill", false, false, amqp091.Publishing{Body: body}) != nil {
				return
			}
		}
	}()
	want := func(active bool) {
		t.Helper()
		select {
		case b := <-blocked:
			if b.Active != active {
				t.Fatalf("blocking %+v, want active=%v", b, active)
			}
		case <-time.After(deadline):
			t.Fatalf("no connection.blocked/unblocked (active=%v)", active)
		}
	}
	want(true)
	_, other := dial(t, url)
	if _, err := other.QueuePurge("fill", false); err != nil {
		t.Fatal(err)
	}
	want(false)
	select {
	case <-done:
	case <-time.After(deadline):
		t.Fatal("the publisher is still held after the alarm cleared")
	}
}

// What a closed channel's consumer held goes back, and is redelivered.
func TestRedeliveryOnChannelClose(t *testing.T) {
	_, _, url := start(t, amqp.Config{})
	conn, ch := dial(t, url)
	if _, err := ch.QueueDeclare("rc", false, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	if err := ch.PublishWithContext(context.Background(), "", "rc", false, false, amqp091.Publishing{Body: []byte("once")}); err != nil {
		t.Fatal(err)
	}
	ds, err := ch.Consume("rc", "", false, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	if d := recv(t, ds); d.Redelivered {
		t.Fatal("first delivery marked redelivered")
	}
	if err := ch.Close(); err != nil {
		t.Fatal(err)
	}
	ch2, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	ds, err = ch2.Consume("rc", "", false, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	if d := recv(t, ds); !d.Redelivered || string(d.Body) != "once" {
		t.Fatalf("after the channel closed: redelivered=%v body=%q", d.Redelivered, d.Body)
	}
}

// An exclusive queue is another connection's to use only: 405.
func TestExclusiveLocked(t *testing.T) {
	_, _, url := start(t, amqp.Config{})
	_, ch := dial(t, url)
	q, err := ch.QueueDeclare("", false, true, true, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	_, other := dial(t, url)
	if _, err := other.Consume(q.Name, "", false, false, false, false, nil); amqpCode(err) != 405 {
		t.Fatalf("consume from another connection's exclusive queue: %v, want 405 resource_locked", err)
	}
}

func TestBasicGet(t *testing.T) {
	_, _, url := start(t, amqp.Config{})
	_, ch := dial(t, url)
	if _, err := ch.QueueDeclare("g", false, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	if _, ok, err := ch.Get("g", false); ok || err != nil {
		t.Fatalf("get on an empty queue: ok=%v err=%v, want get-empty", ok, err)
	}
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	for _, b := range []string{"a", "b"} {
		dc, err := ch.PublishWithDeferredConfirmWithContext(context.Background(), "", "g", false, false, amqp091.Publishing{Body: []byte(b)})
		if err != nil {
			t.Fatal(err)
		}
		if ok, err := dc.WaitContext(context.Background()); !ok || err != nil {
			t.Fatal("not confirmed", err)
		}
	}
	d, ok, err := ch.Get("g", false)
	if !ok || err != nil || string(d.Body) != "a" || d.MessageCount != 1 {
		t.Fatalf("get: ok=%v err=%v body=%q count=%d", ok, err, d.Body, d.MessageCount)
	}
	if err := d.Ack(false); err != nil {
		t.Fatal(err)
	}
	d, ok, err = ch.Get("g", true)
	if !ok || err != nil || string(d.Body) != "b" {
		t.Fatalf("no-ack get: ok=%v err=%v body=%q", ok, err, d.Body)
	}
	if _, ok, err := ch.Get("g", false); ok || err != nil {
		t.Fatalf("get after both were taken: ok=%v err=%v, want get-empty", ok, err)
	}
}

// A queue deleted while a basic.get's message is unacked sends no
// basic.cancel: a get is no consumer to the client. The broker used to
// cancel the get's internal consumer with an empty consumer tag, which
// pika 1.2 does not know (a KeyError on the empty tag in its dispatcher: it closed the
// connection); RabbitMQ sends nothing. Found by driving a cluster with pika.
func TestDeleteDuringGetSendsNoCancel(t *testing.T) {
	_, _, url := start(t, amqp.Config{})
	conn, ch := dial(t, url)
	if _, err := ch.QueueDeclare("gd", false, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	publishAll(t, ch, "gd", "m0")
	gc, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	cancels := gc.NotifyCancel(make(chan string, 4))
	d, ok, err := gc.Get("gd", false)
	if !ok || err != nil {
		t.Fatalf("get: ok=%v err=%v", ok, err)
	}
	// The cancel, if any, is written before the delete's answer on the
	// same connection, and amqp091-go dispatches frames in order.
	if _, err := ch.QueueDelete("gd", false, false, false); err != nil {
		t.Fatal(err)
	}
	if _, err := gc.QueueDeclarePassive("amq.rabbitmq.reply-to", false, false, false, false, nil); err != nil {
		t.Fatal(err) // a round trip on the getter's channel, which stays open
	}
	if err := d.Ack(false); err != nil { // its tag is still the channel's, as in RabbitMQ
		t.Fatal(err)
	}
	if _, err := gc.QueueDeclarePassive("amq.rabbitmq.reply-to", false, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	select {
	case tag := <-cancels:
		t.Fatalf("basic.cancel %q sent for a get", tag)
	default:
	}
}
