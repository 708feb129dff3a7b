package amqp

import (
	"context"
	"encoding/binary"
	"net/netip"
	"strconv"
	"sync"
	"sync/atomic"
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

// afterClose returns the methods (class<<16|id) the connection's output
// has on channel chID after the channel's close: after the broker's
// channel.close, or after the close-ok answering the client's (but the
// close-ok to a client's close that crossed the broker's).
func afterClose(t *testing.T, c *conn, chID uint16) []uint32 {
	t.Helper()
	c.mu.Lock()
	out := append([]byte(nil), c.out...)
	c.mu.Unlock()
	closed := false
	var after []uint32
	for len(out) > 0 {
		if len(out) < 8 {
			t.Fatalf("a partial frame in the output: % x", out)
		}
		n := int(binary.BigEndian.Uint32(out[3:]))
		typ, ch, p := out[0], binary.BigEndian.Uint16(out[1:]), out[7:7+n]
		out = out[n+8:]
		if ch != chID {
			continue
		}
		var m uint32
		if typ == frameMethod {
			m = uint32(binary.BigEndian.Uint16(p))<<16 | uint32(binary.BigEndian.Uint16(p[2:]))
		}
		if closed && m != classChannel<<16|41 { // close-ok: a close of the client's that crossed the broker's
			after = append(after, m)
		}
		if m == classChannel<<16|40 || m == classChannel<<16|41 {
			closed = true
		}
	}
	return after
}

// openChannels opens channels 2..n on c (raceConn opened 1).
func openChannels(t *testing.T, c *conn, n int) []*channel {
	t.Helper()
	chs := make([]*channel, 0, n)
	for id := uint16(1); id <= uint16(n); id++ {
		if id > 1 {
			if err := c.handle(frameMethod, id, method2(classChannel, 10, []byte{0})); err != nil {
				t.Fatal(err)
			}
		}
		c.mu.Lock()
		chs = append(chs, c.channels[id])
		c.mu.Unlock()
	}
	return chs
}

// A shard answers queue.purges (the client sent many on each channel)
// while the client closes their channels.
// The answer looked at the channel (ch.closing, read without the lock: a
// data race with the close) and wrote purge-ok after unlocking: after
// the close-ok, on a channel the client has let go (amqp091-go closes
// the connection on a method for a closed channel), or on a new channel
// of the same id.
func TestPurgeAnswersDuringClientCloses(t *testing.T) {
	l := raceListener(t)
	const n = 32
	for i := range raceRounds() {
		c, _, _ := raceConn(t, l)
		chs := openChannels(t, c, n)
		var wg sync.WaitGroup
		var done atomic.Bool
		wg.Go(func() { // the answers to purges the client pipelined, until every channel is closed
			for !done.Load() {
				for _, ch := range chs {
					c.Answer((ch.gen&(1<<32-1))<<32|uint64(ch.id)<<8|ansPurge, broker.Result{N: 1})
				}
			}
		})
		for _, ch := range chs {
			if err := c.handle(frameMethod, ch.id, method2(classChannel, 40, []byte{0, 200, 0, 0, 0, 0, 0})); err != nil {
				t.Fatal(err)
			}
		}
		done.Store(true)
		wg.Wait()
		for _, ch := range chs {
			if after := afterClose(t, c, ch.id); len(after) > 0 {
				t.Fatalf("round %d: methods %x on channel %d after its close-ok", i, after, ch.id)
			}
		}
		c.OnClose(nil, nil)
	}
}

// The broker cancels consumers (their queue deleted) while the client
// closes their channels: basic.cancel, decided under the lock and written
// after it, went out after the close-ok.
func TestCancelledDuringClientCloses(t *testing.T) {
	l := raceListener(t)
	q, err := l.srv.DeclareQueueAs(&wire.QueueDeclare{Name: broker.QualifyName("", "q")}, 0, "guest")
	if err != nil {
		t.Fatal(err)
	}
	const n = 32
	for i := range raceRounds() {
		c, _, _ := raceConn(t, l)
		chs := openChannels(t, c, n)
		var crs []*consumer // 8 on each channel, cancelled a channel's after another's
		c.mu.Lock()
		for _, ch := range chs {
			for k := range 8 {
				cr := &consumer{id: c.srv.NewConsumerID(), tag: strconv.Itoa(k), ch: ch, q: q, noWait: true}
				ch.consumers[cr.tag], c.byID[cr.id] = cr, cr
				crs = append(crs, cr)
			}
		}
		c.mu.Unlock()
		var wg sync.WaitGroup
		wg.Go(func() {
			for _, cr := range crs {
				c.Cancelled(cr.id, wire.NotFound, "queue deleted")
			}
		})
		for _, ch := range chs {
			if err := c.handle(frameMethod, ch.id, method2(classChannel, 40, []byte{0, 200, 0, 0, 0, 0, 0})); err != nil {
				t.Fatal(err)
			}
		}
		wg.Wait()
		for _, ch := range chs {
			if after := afterClose(t, c, ch.id); len(after) > 0 {
				t.Fatalf("round %d: methods %x on channel %d after its close-ok", i, after, ch.id)
			}
		}
		c.OnClose(nil, nil)
	}
}

// A shard closes a channel (a no-wait consume refused) while the loop
// handles methods on it: their replies (and basic.return) went out after
// the broker's channel.close, where only its close-ok may follow (amqp091-go,
// having let the channel go at the close, closes the connection on them).
func TestRepliesAfterShardClose(t *testing.T) {
	l := raceListener(t)
	_, hdr, body := publishFrames()
	pm := method2(classBasic, 40, []byte{0, 0, 0, 7, 'n', 'o', 'w', 'h', 'e', 'r', 'e', 1})
	for i := range raceRounds() {
		c, ch, step := raceConn(t, l)
		var wg sync.WaitGroup
		wg.Go(func() { shardClose(c, ch) })
		for range 32 {
			step(frameMethod, method2(classBasic, 10, []byte{0, 0, 0, 0, 0, 10, 0})) // qos 10
			step(frameMethod, pm)                                                    // mandatory, unroutable: basic.return
			step(frameHeader, hdr)
			step(frameBody, body)
		}
		wg.Wait()
		if after := afterClose(t, c, 1); len(after) > 0 {
			t.Fatalf("round %d: methods %x on channel 1 after the broker's channel.close", i, after)
		}
		c.OnClose(nil, nil)
	}
}

// barrierSink waits for a queue's shard (a Sink for one CmdBarrier).
type barrierSink struct {
	broker.Sink
	done chan struct{}
}

func (b barrierSink) Answer(uint64, broker.Result) { close(b.done) }

// settled waits until q's shard has done everything submitted before.
func settled(t *testing.T, l *Listener, q *broker.Queue) {
	t.Helper()
	b := barrierSink{done: make(chan struct{})}
	l.srv.Submit(broker.Command{Kind: broker.CmdBarrier, Queue: q, Sink: b})
	select {
	case <-b.done:
	case <-time.After(10 * time.Second):
		t.Fatal("the queue's shard did not answer a barrier")
	}
}

// The socket goes (OnClose, on the loop) while an off-loop run handles
// basic.consumes. A consume the run registered before the close, and
// submitted after the connection's Down, left the queue a consumer of a
// connection that is gone: what the queue handed it stayed unacked, for
// no client, until the broker restarted.
func TestCloseDuringConsume(t *testing.T) {
	l := raceListener(t)
	q, err := l.srv.DeclareQueueAs(&wire.QueueDeclare{Name: broker.QualifyName("", "q")}, 0, "guest")
	if err != nil {
		t.Fatal(err)
	}
	consume := method2(classBasic, 20, []byte{0, 0, 1, 'q', 0, 8, 0, 0, 0, 0}) // no-wait, a generated tag
	for i := range raceRounds() {
		c, _, step := raceConn(t, l)
		var wg sync.WaitGroup
		wg.Go(func() { c.OnClose(nil, nil) })
		for range 16 {
			step(frameMethod, consume)
		}
		wg.Wait()
		settled(t, l, q)
		if n := q.ConsumerCount(); n != 0 {
			t.Fatalf("round %d: the queue has %d consumers of a closed connection", i, n)
		}
	}
}

// The socket goes (OnClose) while an off-loop run handles a basic.get. A
// get submitted after the connection's Down was handed the queue's head,
// for nobody (the connection dropped the delivery), and its consumer
// cancelled holding it: the message stayed unacked until the broker
// restarted.
func TestCloseDuringGet(t *testing.T) {
	l := raceListener(t)
	q, err := l.srv.DeclareQueueAs(&wire.QueueDeclare{Name: broker.QualifyName("", "q")}, 0, "guest")
	if err != nil {
		t.Fatal(err)
	}
	pm, hdr, body := publishFrames()
	get := method2(classBasic, 70, []byte{0, 0, 1, 'q', 0}) // with an ack
	for i := range raceRounds() {
		c, _, step := raceConn(t, l)
		for range 8 {
			step(frameMethod, pm)
			step(frameHeader, hdr)
			step(frameBody, body)
		}
		var wg sync.WaitGroup
		wg.Go(func() { c.OnClose(nil, nil) })
		for range 8 {
			step(frameMethod, get)
		}
		wg.Wait()
		settled(t, l, q)
		if n, want := q.ReadyCount(), int64(8*(i+1)); n != want { // 8 more each round
			t.Fatalf("round %d: %d messages ready after the getter closed, want %d", i, n, want)
		}
	}
}

// A shard closes a channel, or the socket goes (OnClose), while the
// reader handles basic.consume of amq.rabbitmq.reply-to (and its
// cancel, again and again). A reply consumer set up after the close had
// gathered the channel's was never forgotten: the listener's map of
// reply names kept it, and with it the connection, for the broker's life.
func TestCloseDuringReplyConsume(t *testing.T) {
	l := raceListener(t)
	cancel := method2(classBasic, 30, []byte{1, 'r', 0})
	consume := method2(classBasic, 20, append([]byte{0, 0, byte(len(replyQueue))}, append([]byte(replyQueue), 1, 'r', 2, 0, 0, 0, 0)...))
	for i := range raceRounds() {
		c, ch, step := raceConn(t, l)
		var wg sync.WaitGroup
		if i%2 == 0 {
			wg.Go(func() { shardClose(c, ch) })
		} else {
			wg.Go(func() { c.OnClose(nil, nil) })
		}
		for range 16 {
			step(frameMethod, consume)
			step(frameMethod, cancel)
		}
		wg.Wait()
		step(frameMethod, method2(classChannel, 41, nil))
		if i%2 == 0 {
			c.OnClose(nil, nil)
		}
		l.replyMu.Lock()
		n := len(l.replies)
		l.replyMu.Unlock()
		if n != 0 {
			t.Fatalf("round %d: %d reply consumers left after the connection closed", i, n)
		}
	}
}

// A shard closes a channel (another consume of it refused) while the
// reader handles basic.gets on it. A message the queue handed a get
// after the close (the first, or one more once the close returned the
// first) was given no tag (the channel closing, Deliver dropped it, as
// a consumer's, which the channel's cancel returns) and the get's
// consumer, cancelled without requeue, kept it: held, for no client,
// until the connection closed.
func TestShardCloseDuringGets(t *testing.T) {
	l := raceListener(t)
	q, err := l.srv.DeclareQueueAs(&wire.QueueDeclare{Name: broker.QualifyName("", "q")}, 0, "guest")
	if err != nil {
		t.Fatal(err)
	}
	pm, hdr, body := publishFrames()
	ae := chErr(accessRefused, "ACCESS_REFUSED - queue 'q' in exclusive use")
	ae.class, ae.method = classBasic, 20
	for i := range raceRounds() {
		c, ch, step := raceConn(t, l)
		for range 8 {
			step(frameMethod, pm)
			step(frameHeader, hdr)
			step(frameBody, body)
		}
		var wg sync.WaitGroup
		wg.Go(func() { c.closeChannel(ch, ae) }) // as a shard's close, its release submitted before it returns
		for range 8 {
			step(frameMethod, method2(classBasic, 70, []byte{0, 0, 1, 'q', 0})) // with an ack
		}
		wg.Wait()
		settled(t, l, q)
		if n := q.ReadyCount(); n != 8 {
			t.Fatalf("round %d: %d messages ready after the getter's channel closed, want 8", i, n)
		}
		step(frameMethod, method2(classChannel, 41, nil))
		c.OnClose(nil, nil)
		// The next round gets 8 of its own.
		settled(t, l, q)
		d, _, dstep := raceConn(t, l)
		for q.ReadyCount() > 0 {
			dstep(frameMethod, method2(classBasic, 70, []byte{0, 0, 1, 'q', 1})) // no-ack
			settled(t, l, q)
		}
		d.OnClose(nil, nil)
	}
}

// A shard confirms a transactional channel's committed publishes
// (Confirm reads ch.tx under c.mu) while the reader handles tx.select on
// it again, which wrote ch.tx without the lock: a data race.
func TestConfirmDuringTxSelect(t *testing.T) {
	l := raceListener(t)
	for range raceRounds() {
		c, ch, step := raceConn(t, l)
		step(frameMethod, method2(classTx, 10, nil))
		b := &broker.PublishBatch{Sink: c, Ch: ch.id, FirstSeq: (ch.gen&(1<<24-1))<<40 | 1, Codes: make([]uint32, 1)}
		var wg sync.WaitGroup
		wg.Go(func() {
			for range 32 {
				c.Confirm(b)
			}
		})
		for range 32 {
			step(frameMethod, method2(classTx, 10, nil))
		}
		wg.Wait()
		c.OnClose(nil, nil)
	}
}

// The socket goes (OnClose) while an off-loop run declares an exclusive
// queue. A declare whose queue reached its shard after the connection's
// Down was not deleted with its owner: no other connection could use it
// (RESOURCE_LOCKED) and it stayed until the broker restarted.
func TestCloseDuringExclusiveDeclare(t *testing.T) {
	l := raceListener(t)
	for i := range raceRounds() {
		c, _, step := raceConn(t, l)
		name := "x" + strconv.Itoa(i)
		args := append([]byte{0, 0, byte(len(name))}, name...)
		args = append(args, 4, 0, 0, 0, 0) // exclusive
		var wg sync.WaitGroup
		wg.Go(func() { c.OnClose(nil, nil) })
		step(frameMethod, method2(classQueue, 10, args))
		wg.Wait()
		if q := l.srv.LookupQueue(broker.QualifyName("", name)); q != nil {
			settled(t, l, q)
		}
		if q := l.srv.LookupQueue(broker.QualifyName("", name)); q != nil {
			t.Fatalf("round %d: exclusive queue %s outlived its connection", i, name)
		}
	}
}
