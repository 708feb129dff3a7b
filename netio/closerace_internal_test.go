package netio

import (
	"context"
	"net"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/panjf2000/gnet/v2"
	"github.com/warren-mq/warren/broker"
	"github.com/warren-mq/warren/queue"
	"github.com/warren-mq/warren/wire"
)

// nullGC is a connection's socket that takes every write and sends
// nothing: the test calls the connection's handlers itself, as its loop
// and its control runs would.
type nullGC struct{ gnet.Conn }

func (nullGC) Context() any                                { return nil }
func (nullGC) RemoteAddr() net.Addr                        { return &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 1} }
func (nullGC) AsyncWrite([]byte, gnet.AsyncCallback) error { return nil }
func (nullGC) Close() error                                { return nil }
func (nullGC) Wake(gnet.AsyncCallback) error               { return nil }
func (nullGC) CloseWithCallback(gnet.AsyncCallback) error  { return nil }

// barrierSink waits for a queue's shard (a Sink for one CmdBarrier).
type barrierSink struct {
	broker.Sink
	done chan struct{}
}

func (b barrierSink) Answer(uint64, broker.Result) { close(b.done) }

// frameOf is body as a frame on channel ch, as the loop splits it.
func frameOf(t *testing.T, ch uint16, body wire.Body) wire.Frame {
	t.Helper()
	f, _, err := wire.Split(wire.AppendFrame(nil, ch, body), wire.DefaultMaxFrame)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// The socket goes (onClose, on the loop) while a control run handles
// SUBSCRIBEs. A subscribe the run registered before the close, and
// submitted after the connection's Down, left the queue a consumer of a
// connection that is gone: what the queue handed it stayed unacked, for
// no client, until the broker restarted.
func TestCloseDuringSubscribe(t *testing.T) {
	s, err := Start(Config{Addr: "127.0.0.1:0", Shards: 2, EventLoops: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = s.Close(ctx)
	})
	q, err := s.Broker.DeclareQueueAs(&wire.QueueDeclare{Name: broker.QualifyName("", "q")}, 0, "guest")
	if err != nil {
		t.Fatal(err)
	}
	rounds := 200
	if testing.Short() {
		rounds = 20
	}
	for i := range rounds {
		c := s.newConn(nullGC{})
		c.maxFrame, c.maxChannels, c.user = wire.DefaultMaxFrame, 16, "guest"
		c.opened.Store(true)
		c.state.Store(stOpen)
		if err := c.handle(frameOf(t, 1, &wire.ChannelOpen{Req: 1})); err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		wg.Go(c.onClose)
		for k := 0; k < 16 && c.state.Load() != stClosing; k++ { // as runControl goes through its run
			if err := c.handle(frameOf(t, 1, &wire.Subscribe{Req: uint32(k + 2), Queue: "q"})); err != nil && c.state.Load() != stClosing {
				t.Fatal(err)
			}
		}
		wg.Wait()
		b := barrierSink{done: make(chan struct{})}
		s.Submit(broker.Command{Kind: broker.CmdBarrier, Queue: q, Sink: b})
		select {
		case <-b.done:
		case <-time.After(10 * time.Second):
			t.Fatal("the queue's shard did not answer a barrier")
		}
		if n := q.ConsumerCount(); n != 0 {
			t.Fatalf("round %d: the queue has %d consumers of a closed connection", i, n)
		}
	}
}

// The socket goes (onClose) while a control run declares an exclusive
// queue. A queue that reached its shard (at the run's end) after the
// connection's Down was not deleted with its owner: no other connection
// could use it and it stayed until the broker restarted.
func TestCloseDuringExclusiveDeclare(t *testing.T) {
	s, err := Start(Config{Addr: "127.0.0.1:0", Shards: 2, EventLoops: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = s.Close(ctx)
	})
	rounds := 200
	if testing.Short() {
		rounds = 20
	}
	for i := range rounds {
		c := s.newConn(nullGC{})
		c.maxFrame, c.maxChannels, c.user = wire.DefaultMaxFrame, 16, "guest"
		c.opened.Store(true)
		c.state.Store(stOpen)
		if err := c.handle(frameOf(t, 1, &wire.ChannelOpen{Req: 1})); err != nil {
			t.Fatal(err)
		}
		name := "x" + strconv.Itoa(i)
		run := wire.AppendFrame(nil, 1, &wire.QueueDeclare{Req: 2, Name: name, Exclusive: true})
		var wg sync.WaitGroup
		wg.Go(c.onClose)
		c.runControl(run, wire.DefaultMaxFrame) // as the loop starts it, on a goroutine of its own
		wg.Wait()
		if q := s.LookupQueue(name); q != nil {
			b := barrierSink{done: make(chan struct{})}
			s.Submit(broker.Command{Kind: broker.CmdBarrier, Queue: q, Sink: b})
			select {
			case <-b.done:
			case <-time.After(10 * time.Second):
				t.Fatal("the queue's shard did not answer a barrier")
			}
		}
		if q := s.LookupQueue(name); q != nil {
			t.Fatalf("round %d: exclusive queue %s outlived its connection", i, name)
		}
	}
}

// recGC is a connection's socket that keeps what is written to it: the
// first write (the outbox's, with no callback the rest waits in c.out).
type recGC struct {
	nullGC
	mu  sync.Mutex
	out []byte
}

func (g *recGC) AsyncWrite(b []byte, _ gnet.AsyncCallback) error {
	g.mu.Lock()
	g.out = append(g.out, b...)
	g.mu.Unlock()
	return nil
}

// output is everything the connection wrote or holds to write.
func output(c *conn, g *recGC) []byte {
	g.mu.Lock()
	out := append([]byte(nil), g.out...)
	g.mu.Unlock()
	c.mu.Lock()
	out = append(out, c.out...)
	c.mu.Unlock()
	return out
}

// The broker cancels consumers (their queue deleted), and answers
// SUBSCRIBEs, while the client closes their channels. CANCELLED and
// SUBSCRIBE_OK, decided on an open channel under c.mu and sent after it,
// went out after the channel's CHANNEL_CLOSE_OK, which PROTOCOL.md §6
// rules out (a reopened channel of the same id, with a consumer of the
// same generated tag, took them for its own).
func TestSinkAnswersDuringChannelCloses(t *testing.T) {
	s, err := Start(Config{Addr: "127.0.0.1:0", Shards: 2, EventLoops: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = s.Close(ctx)
	})
	q, err := s.Broker.DeclareQueueAs(&wire.QueueDeclare{Name: broker.QualifyName("", "q")}, 0, "guest")
	if err != nil {
		t.Fatal(err)
	}
	const n = 32
	rounds := 200
	if testing.Short() {
		rounds = 20
	}
	for i := range rounds {
		g := &recGC{}
		c := s.newConn(g)
		c.maxFrame, c.maxChannels, c.user = wire.DefaultMaxFrame, n, "guest"
		c.opened.Store(true)
		c.state.Store(stOpen)
		var crs []*consumerRef
		for id := uint16(1); id <= n; id++ {
			if err := c.handle(frameOf(t, id, &wire.ChannelOpen{Req: 1})); err != nil {
				t.Fatal(err)
			}
			c.mu.Lock()
			ch := c.channels[id]
			ch.consumers = map[string]*consumerRef{}
			if c.byID == nil {
				c.byID = map[queue.ConsumerID]*consumerRef{}
			}
			for k := range 8 {
				cr := &consumerRef{id: s.NewConsumerID(), tag: strconv.Itoa(k), conn: c, ch: ch, q: q}
				ch.consumers[cr.tag], c.byID[cr.id] = cr, cr
				crs = append(crs, cr)
			}
			c.mu.Unlock()
		}
		var wg sync.WaitGroup
		wg.Go(func() {
			for k, cr := range crs {
				if k%2 == 0 {
					c.Cancelled(cr.id, wire.NotFound, "queue deleted")
				} else {
					c.Subscribed(cr.id, 2, wire.OK, "") // its queue's answer to the SUBSCRIBE
				}
			}
		})
		for id := uint16(1); id <= n; id++ {
			if err := c.handle(frameOf(t, id, &wire.ChannelClose{Code: 200})); err != nil {
				t.Fatal(err)
			}
		}
		wg.Wait()
		closed := map[uint16]bool{}
		for out := output(c, g); len(out) > 0; {
			f, m, err := wire.Split(out, wire.DefaultMaxFrame)
			if err != nil || m == 0 {
				t.Fatalf("round %d: the output does not split: %v", i, err)
			}
			out = out[m:]
			if closed[f.Channel] {
				t.Fatalf("round %d: %v on channel %d after its CHANNEL_CLOSE_OK", i, f.Type, f.Channel)
			}
			if f.Type == wire.TypeChannelCloseOK {
				closed[f.Channel] = true
			}
		}
		c.onClose()
	}
}
