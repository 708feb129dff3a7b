package client_test

import (
	"context"
	"errors"
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/warren-mq/warren/client"
	"github.com/warren-mq/warren/internal/freeport"
	"github.com/warren-mq/warren/netio"
	"github.com/warren-mq/warren/netio/warrentest"
)

// nodesURL is a URL that names every server, in order.
func nodesURL(addrs ...string) string {
	return "warren://guest:guest@" + strings.Join(addrs, ",")
}

// deadAddr is a loopback address nothing listens on: connecting to it is
// refused at once.
func deadAddr(t *testing.T) string {
	t.Helper()
	// Outside the ephemeral range: a freed ephemeral port may be taken
	// by any 127.0.0.1:0 listener or dial, and then answer.
	addr, err := freeport.Addr()
	must(t, err)
	return addr
}

func TestDialTriesNodesInOrder(t *testing.T) {
	s := warrentest.StartServer(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	dead := deadAddr(t)

	c, err := client.Dial(ctx, nodesURL(dead, s.Addr().String()))
	must(t, err)
	defer c.Close()
	if c.Addr() != s.Addr().String() {
		t.Fatalf("connected to %s, want %s", c.Addr(), s.Addr())
	}

	// None answers: the error names every node's failure.
	dead2 := deadAddr(t)
	_, err = client.Dial(ctx, nodesURL(dead, dead2))
	if err == nil {
		t.Fatal("dialled two dead nodes")
	}
	for _, want := range []string{"no node of 2 answered", dead, dead2} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
	if !errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("error %v is not ECONNREFUSED", err)
	}
}

// A node that accepts the TCP connection and never answers the handshake
// gets its share of the context's time, not all of it.
func TestDialPassesOverASilentNode(t *testing.T) {
	s := warrentest.StartServer(t, nil)
	silent, err := net.Listen("tcp", "127.0.0.1:0") // the kernel completes the TCP handshake; nobody speaks
	must(t, err)
	defer silent.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Second)
	defer cancel()
	c, err := client.Dial(ctx, nodesURL(silent.Addr().String(), s.Addr().String()))
	must(t, err)
	defer c.Close()
	if c.Addr() != s.Addr().String() {
		t.Fatalf("connected to %s, want %s", c.Addr(), s.Addr())
	}
}

func closeServer(t *testing.T, s *netio.Server) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	must(t, s.Close(ctx))
}

// The node a Session is on goes away: the Session moves to the next node,
// declares its topology there and resumes its consumer, and again when
// that one goes.
func TestSessionFailsOverToAnotherNode(t *testing.T) {
	servers := []*netio.Server{warrentest.StartServer(t, nil), warrentest.StartServer(t, nil), warrentest.StartServer(t, nil)}
	addrs := []string{servers[0].Addr().String(), servers[1].Addr().String(), servers[2].Addr().String()}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	sess, err := client.Connect(ctx, nodesURL(addrs...))
	must(t, err)
	defer sess.Close()
	reconnected := make(chan int, 4)
	sess.OnReconnect = func(n int) { reconnected <- n }
	if sess.Addr() != addrs[0] {
		t.Fatalf("session on %s, want the first node %s", sess.Addr(), addrs[0])
	}
	must(t, sess.DeclareExchange(ctx, "events", "topic", client.ExchangeOptions{}))
	_, err = sess.DeclareQueue(ctx, "orders", client.QueueOptions{})
	must(t, err)
	must(t, sess.Bind(ctx, client.Binding{Source: "events", Destination: "orders", RoutingKey: "order.*"}))
	got := make(chan string, 10)
	must(t, sess.Consume(ctx, "orders", client.ConsumeOptions{Prefetch: 10}, func(d *client.Delivery) {
		got <- string(d.Body)
		d.Ack()
	}))
	must(t, sess.Publish(ctx, "events", client.Message{RoutingKey: "order.created", Body: []byte("on node 1")}))
	expect(t, got, "on node 1")

	for i, want := range []string{"on node 2", "on node 3"} {
		closeServer(t, servers[i])
		select {
		case <-reconnected:
		case <-ctx.Done():
			t.Fatalf("no reconnect after node %d closed", i+1)
		}
		if sess.Addr() != addrs[i+1] {
			t.Fatalf("session on %s after node %d closed, want %s", sess.Addr(), i+1, addrs[i+1])
		}
		// The exchange, queue and binding are new on this node, and the
		// consumer is on it: otherwise the message is not delivered.
		must(t, sess.Publish(ctx, "events", client.Message{RoutingKey: "order.paid", Body: []byte(want)}))
		expect(t, got, want)
		if qs := servers[i+1].Broker.Queues(); len(qs) != 1 || qs[0].Consumers != 1 {
			t.Fatalf("node %d holds queues %+v, want orders with 1 consumer", i+2, qs)
		}
	}
	if sess.Reconnects() != 2 {
		t.Fatalf("reconnects %d", sess.Reconnects())
	}
}

// Publishing through a failover: every publish PublishAsync took is
// confirmed or reported lost, on the node it went to, and publishing goes
// on on the next node.
func TestSessionReportsUnconfirmedAcrossFailover(t *testing.T) {
	s1, s2 := warrentest.StartServer(t, nil), warrentest.StartServer(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	sess, err := client.Connect(ctx, nodesURL(s1.Addr().String(), s2.Addr().String()))
	must(t, err)
	defer sess.Close()
	_, err = sess.DeclareQueue(ctx, "q", client.QueueOptions{})
	must(t, err)

	var mu sync.Mutex
	var taken, acked, lost, target int
	all := make(chan struct{})
	sess.NotifyConfirm(func(first, last uint64, err error) {
		mu.Lock()
		defer mu.Unlock()
		n := int(last - first + 1)
		switch {
		case err == nil:
			acked += n
		case errors.Is(err, client.ErrConnectionLost):
			lost += n
		default:
			t.Errorf("seq %d..%d: %v", first, last, err)
		}
		if target > 0 && acked+lost == target {
			close(all)
		}
	})
	refused := 0
	var switched bool
	for i := 0; i < 30000; i++ {
		if i == 10000 {
			for _, c := range s1.Connections() {
				s1.CloseConnection(c.ID, "test")
			}
			closeServer(t, s1)
		}
		if _, err := sess.PublishAsync(ctx, "", client.Message{RoutingKey: "q", Body: []byte("x")}); err != nil {
			refused++ // taken by neither node, and said so here
			continue
		}
		mu.Lock()
		taken++
		mu.Unlock()
		switched = switched || sess.Addr() == s2.Addr().String()
	}
	mu.Lock()
	target = taken
	if acked+lost == target {
		close(all)
	}
	mu.Unlock()
	select {
	case <-all:
	case <-ctx.Done():
		mu.Lock()
		defer mu.Unlock()
		t.Fatalf("%d publishes taken, %d confirmed and %d reported lost", taken, acked, lost)
	}
	if !switched {
		t.Fatal("no publish went to node 2")
	}
	if n := len(s2.Broker.Queues()); n != 1 {
		t.Fatalf("node 2 holds %d queues", n)
	}
	t.Logf("%d taken (%d confirmed, %d reported lost), %d refused by PublishAsync", taken, acked, lost, refused)
}

// Close stops a reconnect in flight: a session closed while it waits on a
// silent node neither waits out that node's share of the time nor goes on
// to connect to the next one.
func TestSessionCloseStopsAReconnect(t *testing.T) {
	a, b := warrentest.StartServer(t, nil), warrentest.StartServer(t, nil)
	silent, err := net.Listen("tcp", "127.0.0.1:0")
	must(t, err)
	defer silent.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	sess, err := client.Connect(ctx, nodesURL(a.Addr().String(), silent.Addr().String(), b.Addr().String()))
	must(t, err)
	closeServer(t, a)
	// The reconnect tries the silent node next, with a third of its 10 s.
	nc, err := silent.Accept()
	must(t, err)
	defer nc.Close()
	must(t, sess.Close())
	// The client hangs up on the silent node at once, not after its share.
	must(t, nc.SetReadDeadline(time.Now().Add(2*time.Second)))
	if _, err := io.Copy(io.Discard, nc); err != nil { // nil at EOF
		t.Fatalf("the closed session still waits on the silent node: %v", err)
	}
	if n := b.ConnectionCount(); n != 0 {
		t.Fatalf("the closed session connected to the next node (%d connections)", n)
	}
}

// A node that answers but refuses the topology (here a queue of the same
// name declared otherwise) is passed over: the next round starts after it.
func TestSessionPassesOverANodeThatRefusesTheTopology(t *testing.T) {
	servers := []*netio.Server{warrentest.StartServer(t, nil), warrentest.StartServer(t, nil), warrentest.StartServer(t, nil)}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	other, err := client.Dial(ctx, warrentest.URL(servers[1]))
	must(t, err)
	och, err := other.Channel(ctx)
	must(t, err)
	_, err = och.DeclareQueue(ctx, "orders", client.QueueOptions{AutoDelete: true})
	must(t, err)
	// och keeps the auto-delete queue alive on node 2.

	sess, err := client.Connect(ctx, nodesURL(servers[0].Addr().String(), servers[1].Addr().String(), servers[2].Addr().String()))
	must(t, err)
	defer sess.Close()
	reconnected := make(chan int, 4)
	sess.OnReconnect = func(n int) { reconnected <- n }
	_, err = sess.DeclareQueue(ctx, "orders", client.QueueOptions{})
	must(t, err)
	closeServer(t, servers[0])
	select {
	case attempt := <-reconnected:
		if attempt != 2 {
			t.Errorf("reconnected at attempt %d, want 2 (node 2 refused the first)", attempt)
		}
	case <-ctx.Done():
		t.Fatal("no reconnect")
	}
	if got, want := sess.Addr(), servers[2].Addr().String(); got != want {
		t.Fatalf("session on %s, want node 3 %s", got, want)
	}
}

// A Session consumer's handler runs one delivery at a time across a
// failover too: the consumer restarted on the next node waits until the
// handler is done with what the lost connection had delivered.
func TestSessionHandlerNotConcurrentAcrossFailover(t *testing.T) {
	s1, s2 := warrentest.StartServer(t, nil), warrentest.StartServer(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	sess, err := client.Connect(ctx, nodesURL(s1.Addr().String(), s2.Addr().String()))
	must(t, err)
	defer sess.Close()
	reconnected := make(chan int, 4)
	sess.OnReconnect = func(n int) { reconnected <- n }
	_, err = sess.DeclareQueue(ctx, "jobs", client.QueueOptions{})
	must(t, err)
	var active atomic.Int32
	inFirst, release := make(chan struct{}), make(chan struct{})
	got := make(chan string, 4)
	must(t, sess.Consume(ctx, "jobs", client.ConsumeOptions{Prefetch: 10}, func(d *client.Delivery) {
		if n := active.Add(1); n != 1 {
			t.Errorf("%d handler calls at once", n)
		}
		if string(d.Body) == "first" {
			close(inFirst)
			<-release
		}
		active.Add(-1)
		got <- string(d.Body)
	}))
	must(t, sess.Publish(ctx, "", client.Message{RoutingKey: "jobs", Body: []byte("first")}))
	wait(t, ctx, inFirst, "the first handler call")
	closeServer(t, s1)
	wait(t, ctx, reconnected, "the reconnect")
	must(t, sess.Publish(ctx, "", client.Message{RoutingKey: "jobs", Body: []byte("second")}))
	// Until node 2 has handed "second" to the session's consumer.
	q := s2.Broker.LookupQueue("jobs")
	for q.ReadyCount() != 0 {
		select {
		case <-ctx.Done():
			t.Fatal("node 2 never delivered")
		case <-time.After(time.Millisecond): // polling the counter, not a sync sleep
		}
	}
	select {
	case g := <-got:
		t.Fatalf("%q handled while the first call still runs", g)
	default:
	}
	close(release)
	expect(t, got, "first")
	expect(t, got, "second")
}
