package amqp

import (
	"context"
	"encoding/binary"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/warren-mq/warren/broker"
	"github.com/warren-mq/warren/netio"
	"github.com/warren-mq/warren/wire"
)

// Races between a connection's reader (the loop, or an off-loop run:
// conn.handle) and a shard goroutine's Sink calls, on a connection
// without a socket: the test calls handle as the loop would, and the
// Sink from another goroutine at the same time, many rounds.

// raceListener is a broker with an AMQP listener, for connections built
// without a socket (raceConn).
func raceListener(t *testing.T) *Listener {
	t.Helper()
	srv, err := netio.Start(netio.Config{Addr: "127.0.0.1:0", Shards: 2, EventLoops: 1})
	if err != nil {
		t.Fatal(err)
	}
	l, err := Listen(srv, Config{Addr: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = l.Close()
		_ = srv.Close(ctx)
	})
	return l
}

// raceConn is an open connection with channel 1 open; step handles one
// frame on it as the loop does.
func raceConn(t *testing.T, l *Listener) (c *conn, ch *channel, step func(typ uint8, p []byte)) {
	t.Helper()
	c = newConn(l, netip.MustParseAddrPort("127.0.0.1:1"))
	c.user, c.channelMax = "guest", 2047
	c.opened.Store(true)
	c.state.Store(stOpen)
	step = func(typ uint8, p []byte) {
		t.Helper()
		if err := c.handle(typ, 1, p); err != nil {
			t.Fatal(err)
		}
	}
	step(frameMethod, method2(classChannel, 10, []byte{0}))
	c.mu.Lock()
	ch = c.channels[1]
	c.mu.Unlock()
	return c, ch, step
}

// shardClose closes ch as a shard does (a consume refused).
func shardClose(c *conn, ch *channel) {
	ae := chErr(accessRefused, "ACCESS_REFUSED - queue 'q' in exclusive use")
	ae.class, ae.method = classBasic, 20
	c.closeChannelFromShard(ch, ae)
}

func raceRounds() int {
	if testing.Short() {
		return 20
	}
	return 200
}

// A shard closes a channel while the loop reads acks on it. The close
// empties the channel's delivery tags; an ack the loop had seen on an
// open channel then indexed the empty tags (a panic on the event loop,
// every connection on it gone).
func TestShardCloseDuringAcks(t *testing.T) {
	l := raceListener(t)
	a := &broker.Arena{Buf: []byte("m")}
	m := a.Msg(nil, nil, nil, a.Buf, 0, 0)
	q, err := l.srv.DeclareQueueAs(&wire.QueueDeclare{Name: broker.QualifyName("", "q")}, 0, "guest")
	if err != nil {
		t.Fatal(err)
	}
	const n = 64
	for range raceRounds() {
		c, ch, step := raceConn(t, l)
		cr := &consumer{id: c.srv.NewConsumerID(), tag: "t", ch: ch, q: q, noWait: true}
		c.mu.Lock()
		ch.consumers["t"], c.byID[cr.id] = cr, cr
		c.mu.Unlock()
		ds := make([]broker.Delivery, n)
		for k := range ds {
			ds[k] = broker.Delivery{Consumer: cr.id, QTag: uint64(k + 1), Msg: &m, DeliveryCount: 1}
		}
		c.Deliver(ds)
		var wg sync.WaitGroup
		wg.Go(func() { shardClose(c, ch) })
		for tag := uint64(1); tag <= n; tag++ {
			step(frameMethod, method2(classBasic, 80, append(binary.BigEndian.AppendUint64(nil, tag), 0)))
		}
		wg.Wait()
		step(frameMethod, method2(classChannel, 41, nil))
		c.OnClose(nil, nil)
	}
}

// publishFrames are a basic.publish of a 1-byte body to queue q through
// the default exchange: method, header and body.
func publishFrames() (m, hdr, body []byte) {
	m = method2(classBasic, 40, []byte{0, 0, 0, 1, 'q', 0})
	hdr = binary.BigEndian.AppendUint16(nil, classBasic)
	hdr = append(hdr, 0, 0)
	hdr = binary.BigEndian.AppendUint64(hdr, 1)
	hdr = append(hdr, 0, 0) // no properties
	return m, hdr, []byte{'b'}
}

// replyConsume is basic.consume of amq.rabbitmq.reply-to, no-ack.
func replyConsume() []byte {
	args := []byte{0, 0, byte(len(replyQueue))}
	args = append(args, replyQueue...)
	args = append(args, 0, 2, 0, 0, 0, 0) // no tag; no-ack; no arguments
	return method2(classBasic, 20, args)
}

// A shard closes a channel that consumes direct replies while the loop
// reads publishes on it. The close took the channel's reply consumer
// (ch.reply = nil) while onHeader read it without the lock, between its
// look and its use: a data race, and a nil dereference on the event loop
// when the close fell between the two.
func TestShardCloseDuringReplyPublishes(t *testing.T) {
	l := raceListener(t)
	pm, hdr, body := publishFrames()
	for i := range raceRounds() {
		c, ch, step := raceConn(t, l)
		step(frameMethod, replyConsume())
		var wg sync.WaitGroup
		wg.Go(func() { shardClose(c, ch) })
		for range 32 {
			step(frameMethod, pm)
			step(frameHeader, hdr)
			step(frameBody, body)
		}
		wg.Wait()
		step(frameMethod, method2(classChannel, 41, nil))
		l.replyMu.Lock()
		n := len(l.replies)
		l.replyMu.Unlock()
		if n != 0 {
			t.Fatalf("round %d: %d reply consumers after their channel closed", i, n)
		}
		c.OnClose(nil, nil)
	}
}

// A shard closes a transactional channel while the loop reads publishes
// on it. The close drops the transaction's held publishes from the
// connection's count (txHeld, txHeldBytes); a publish the loop completed
// after handle saw the channel open was held all the same, on the closed
// channel, and counted for the connection's life: its transactions could
// hold that many fewer publishes before tx.commit.
func TestShardCloseDuringTxPublishes(t *testing.T) {
	l := raceListener(t)
	if _, err := l.srv.DeclareQueueAs(&wire.QueueDeclare{Name: broker.QualifyName("", "q")}, 0, "guest"); err != nil {
		t.Fatal(err)
	}
	pm, hdr, body := publishFrames()
	for i := range raceRounds() {
		c, ch, step := raceConn(t, l)
		step(frameMethod, method2(classTx, 10, nil))
		var wg sync.WaitGroup
		wg.Go(func() { shardClose(c, ch) })
		for range 32 {
			step(frameMethod, pm)
			step(frameHeader, hdr)
			step(frameBody, body)
		}
		wg.Wait()
		step(frameMethod, method2(classChannel, 41, nil))
		c.mu.Lock()
		held, bytes := c.txHeld, c.txHeldBytes
		c.mu.Unlock()
		if held != 0 || bytes != 0 {
			t.Fatalf("round %d: the connection's transactions hold %d publishes (%d bytes) after their channel closed", i, held, bytes)
		}
		c.OnClose(nil, nil)
	}
}
