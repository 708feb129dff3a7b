package amqp

import (
	"context"
	"encoding/binary"
	"net/netip"
	"strconv"
	"testing"
	"time"

	"github.com/warren-mq/warren/broker"
	"github.com/warren-mq/warren/netio"
	"github.com/warren-mq/warren/queue"
	"github.com/warren-mq/warren/wire"
)

// benchConn is a connection with channel 1 open, served by nobody: the
// benchmarks call its reader's and the broker's entry points directly.
func benchConn(b *testing.B) (*conn, *netio.Server) { return benchConnT(b) }

func benchConnT(b testing.TB) (*conn, *netio.Server) {
	b.Helper()
	srv, err := netio.Start(netio.Config{Addr: "127.0.0.1:0", Shards: 1, EventLoops: 1})
	if err != nil {
		b.Fatal(err)
	}
	l, err := Listen(srv, Config{Addr: "127.0.0.1:0"})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = l.Close()
		_ = srv.Close(ctx)
	})
	c := newConn(l, netip.MustParseAddrPort("127.0.0.1:1"))
	c.user = "guest"
	c.channels[1] = &channel{id: 1, gen: 1, consumers: map[string]*consumer{}, tagBase: 1}
	return c, srv
}

func benchMethod(class, id uint16, args []byte) []byte {
	p := binary.BigEndian.AppendUint16(nil, class)
	p = binary.BigEndian.AppendUint16(p, id)
	return append(p, args...)
}

// BenchmarkPublish: basic.publish, its content header (content type,
// delivery mode, a header) and a 100-byte body, routed to a queue of
// max-length 1000 (drop-head), not in confirm mode.
func BenchmarkPublish(b *testing.B) {
	c, srv := benchConn(b)
	if _, err := srv.DeclareQueueAs(&wire.QueueDeclare{Name: "bq", Args: wire.Table{{Key: "max-length", Value: wire.Int(1000)}}}, c.id, "guest"); err != nil {
		b.Fatal(err)
	}
	pub := benchMethod(classBasic, 40, []byte{0, 0, 0, 2, 'b', 'q', 0})
	hdr := binary.BigEndian.AppendUint16(nil, classBasic)
	hdr = append(hdr, 0, 0)
	hdr = binary.BigEndian.AppendUint64(hdr, 100)
	hdr = binary.BigEndian.AppendUint16(hdr, flContentType|flHeaders|flDeliveryMode)
	hdr = putShortstr(hdr, "text/plain")
	hdr = putTable(hdr, wire.Table{{Key: "k", Value: wire.String("v")}})
	hdr = append(hdr, 2)
	body := make([]byte, 100)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if err := c.handle(frameMethod, 1, pub); err != nil {
			b.Fatal(err)
		}
		if err := c.handle(frameHeader, 1, hdr); err != nil {
			b.Fatal(err)
		}
		if err := c.handle(frameBody, 1, body); err != nil {
			b.Fatal(err)
		}
	}
}

// autoAckConsumer adds an auto-ack consumer (id 1, tag ctag) on c's
// channel 1.
func autoAckConsumer(c *conn) {
	ch := c.channels[1]
	cr := &consumer{id: 1, tag: "ctag", ch: ch, autoAck: true}
	ch.consumers["ctag"] = cr
	c.byID[cr.id] = cr
}

// deliverDropped delivers ds on c and drops what it wrote and the
// auto-acks it noted.
func deliverDropped(c *conn, ds []broker.Delivery) {
	c.Deliver(ds)
	c.mu.Lock()
	c.out, c.autoAcks = c.out[:0], c.autoAcks[:0]
	c.mu.Unlock()
}

// BenchmarkDeliver: one basic.deliver with its content (content type,
// delivery mode, a header, a 100-byte body) to an auto-ack consumer.
func BenchmarkDeliver(b *testing.B) {
	c, _ := benchConn(b)
	autoAckConsumer(c)
	var p wire.Properties
	p.ContentType = []byte("text/plain")
	p.Set(wire.PropContentType)
	p.Headers = wire.AppendTable(nil, wire.Table{{Key: "k", Value: wire.String("v")}})[4:]
	p.Set(wire.PropHeaders)
	sm := broker.NewStoredMsg([]byte("ex"), []byte("key"), wire.AppendProperties(nil, &p)[2:], make([]byte, 100), wire.Persistent, 0)
	ds := []broker.Delivery{{Consumer: queue.ConsumerID(1), Msg: sm, DeliveryCount: 1}}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		ds[0].QTag = uint64(i + 1)
		deliverDropped(c, ds)
	}
}

// The deliver path allocates nothing in steady state, headers included
// (read in place from the stored message, written straight as AMQP).
func TestDeliverAllocs(t *testing.T) {
	c, _ := benchConnT(t)
	autoAckConsumer(c)
	var p wire.Properties
	p.ContentType = []byte("text/plain")
	p.Set(wire.PropContentType)
	p.Headers = wire.AppendTable(nil, wire.Table{{Key: "k", Value: wire.String("v")}, {Key: "n", Value: wire.Int(7)}})[4:]
	p.Set(wire.PropHeaders)
	p.ExpirationMs = 60000
	p.Set(wire.PropExpiration)
	sm := broker.NewStoredMsg([]byte("ex"), []byte("key"), wire.AppendProperties(nil, &p)[2:], make([]byte, 100), wire.Persistent, 0)
	ds := []broker.Delivery{{Consumer: queue.ConsumerID(1), Msg: sm, DeliveryCount: 2}}
	tag := uint64(0)
	n := testing.AllocsPerRun(1000, func() {
		tag++
		ds[0].QTag = tag
		deliverDropped(c, ds)
	})
	if n != 0 {
		t.Fatalf("%v allocations per delivery, want 0", n)
	}
}

// A publish allocates twice in steady state: its bytes (the arena the
// queue keeps) and one block for its stored message, arena, batch and
// shard item; the content header's properties and headers are built in
// the connection's scratch.
func TestPublishAllocs(t *testing.T) {
	c, srv := benchConnT(t)
	if _, err := srv.DeclareQueueAs(&wire.QueueDeclare{Name: "bq", Args: wire.Table{{Key: "max-length", Value: wire.Int(100)}}}, c.id, "guest"); err != nil {
		t.Fatal(err)
	}
	if err := srv.DeclareExchangeAs(&wire.ExchangeDeclare{Name: "bx", Kind: wire.ExchangeDirect}, "guest"); err != nil {
		t.Fatal(err)
	}
	if err := srv.BindAs(&wire.Bind{Source: "bx", Destination: "bq", RoutingKey: "k"}, broker.Requester{User: "guest", Admin: true, Conn: c.id}); err != nil {
		t.Fatal(err)
	}
	pub := benchMethod(classBasic, 40, []byte{0, 0, 2, 'b', 'x', 1, 'k', 0})
	hdr := binary.BigEndian.AppendUint16(nil, classBasic)
	hdr = append(hdr, 0, 0)
	hdr = binary.BigEndian.AppendUint64(hdr, 100)
	hdr = binary.BigEndian.AppendUint16(hdr, flContentType|flHeaders|flDeliveryMode|flMessageID)
	hdr = putShortstr(hdr, "text/plain")
	hdr = putTable(hdr, wire.Table{{Key: "k", Value: wire.String("v")}, {Key: "n", Value: wire.Int(7)}})
	hdr = append(hdr, 2)
	hdr = putShortstr(hdr, "id-1")
	body := make([]byte, 100)
	n := testing.AllocsPerRun(2000, func() {
		if err := c.handle(frameMethod, 1, pub); err != nil {
			t.Fatal(err)
		}
		if err := c.handle(frameHeader, 1, hdr); err != nil {
			t.Fatal(err)
		}
		if err := c.handle(frameBody, 1, body); err != nil {
			t.Fatal(err)
		}
	})
	if n > 2 {
		t.Fatalf("%v allocations per publish, want at most 2 (its bytes and its block)", n)
	}
}

// BenchmarkReleaseChannel: what a channel with 1,000 consumers, each
// holding 10 unacked deliveries (plus as many of consumers the client
// cancelled), hands back at its close, on the connection's event loop.
func BenchmarkReleaseChannel(b *testing.B) {
	c, _ := benchConn(b)
	const consumers, each = 1000, 10
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		ch := &channel{id: 1, gen: 1, consumers: make(map[string]*consumer, consumers), tagBase: 1}
		for k := 0; k < 2*consumers; k++ {
			id := queue.ConsumerID(k + 1)
			if k < consumers { // the others the client cancelled
				ch.consumers[strconv.Itoa(k)] = &consumer{id: id, tag: strconv.Itoa(k), ch: ch}
			}
			for j := 0; j < each; j++ {
				ch.tags = append(ch.tags, tagEntry{q: &broker.Queue{}, cid: id, qtag: uint64(j + 1), live: true})
			}
		}
		c.mu.Lock()
		c.channels[1] = ch
		b.StartTimer()
		r, ok := c.releaseLocked(ch)
		c.mu.Unlock()
		if !ok || len(r.back) != consumers*each || len(r.cons) != consumers {
			b.Fatalf("released %v: %d consumers, %d deliveries back", ok, len(r.cons), len(r.back))
		}
	}
}
