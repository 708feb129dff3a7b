package netio

import (
	"net"
	"sync"
	"testing"
	"time"

	"github.com/warren-mq/warren/broker"
	"github.com/warren-mq/warren/wire"
)

// TestPassiveDeclareAnsweredByOwner: a passive QUEUE_DECLARE is answered by
// the queue's owner after everything submitted to it before (the
// connection's settlements among them), so a client that sent settlements
// knows, once the reply comes, that they have taken effect (warrenctl
// consume --reject relies on it: its dead letters are then on their way
// ahead of anything submitted to the dead-letter queue later). The owner is
// held busy: the reply to a later passive exchange declare, which the
// connection answers itself, must come first.
func TestPassiveDeclareAnsweredByOwner(t *testing.T) {
	s, err := Start(Config{Addr: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close(t.Context()) })
	nc, err := net.Dial("tcp", s.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	var buf []byte
	next := func() wire.Body {
		t.Helper()
		_ = nc.SetReadDeadline(time.Now().Add(10 * time.Second))
		tmp := make([]byte, 64<<10)
		for {
			f, n, err := wire.Split(buf, wire.HardMaxFrame)
			if err != nil {
				t.Fatal(err)
			}
			if n > 0 {
				b, err := wire.Decode(f, wire.HardMaxFrame, nil)
				if err != nil {
					t.Fatal(err)
				}
				buf = buf[n:]
				if _, hello := b.(*wire.Hello); hello {
					continue
				}
				return b
			}
			m, err := nc.Read(tmp)
			if err != nil {
				t.Fatalf("reading: %v", err)
			}
			buf = append(buf, tmp[:m]...)
		}
	}
	write := func(b []byte) {
		t.Helper()
		if _, err := nc.Write(b); err != nil {
			t.Fatal(err)
		}
	}
	var b []byte
	b = append(b, wire.Preamble[:]...)
	b = wire.AppendFrame(b, 0, &wire.Auth{Mechanism: "PLAIN", Response: wire.PlainResponse("guest", "guest"), MaxFrame: wire.MinMaxFrame})
	b = wire.AppendFrame(b, 1, &wire.ChannelOpen{Req: 1})
	b = wire.AppendFrame(b, 1, &wire.QueueDeclare{Req: 2, Name: "orders"})
	write(b)
	if r, ok := next().(*wire.OpenOK); !ok {
		t.Fatalf("got %#v, want OPEN_OK", r)
	}
	if r, ok := next().(*wire.OKReply); !ok || r.Req != 1 {
		t.Fatalf("got %#v, want OK to CHANNEL_OPEN", r)
	}
	if r, ok := next().(*wire.QueueDeclareOK); !ok || r.Req != 2 {
		t.Fatalf("got %#v, want QUEUE_DECLARE_OK", r)
	}

	// Hold the queue's owner busy until the connection has answered a
	// request sent after the passive declare.
	q := s.LookupQueue("orders")
	held, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	free := func() { once.Do(func() { close(release) }) }
	defer free()
	s.Submit(broker.Command{Kind: broker.CmdBarrier, Queue: q, Sink: holdSink{held: held, release: release}})
	<-held
	b = wire.AppendFrame(nil, 1, &wire.QueueDeclare{Req: 3, Name: "orders", Passive: true})
	b = wire.AppendFrame(b, 1, &wire.ExchangeDeclare{Req: 4, Name: "amq.direct", Kind: wire.ExchangeDirect, Passive: true})
	write(b)
	switch r := next().(type) {
	case *wire.OKReply:
		if r.Req != 4 {
			t.Fatalf("got OK to request %d, want the OK to the passive exchange declare (4)", r.Req)
		}
	case *wire.QueueDeclareOK:
		t.Fatalf("the passive QUEUE_DECLARE was answered (%+v) while the queue's owner was still busy with work submitted before it", *r)
	default:
		t.Fatalf("got %#v, want OK to the passive exchange declare", r)
	}
	free()
	if r, ok := next().(*wire.QueueDeclareOK); !ok || r.Req != 3 || r.Name != "orders" {
		t.Fatalf("got %#v, want QUEUE_DECLARE_OK to the passive declare", r)
	}
}

// holdSink holds the shard that answers it until release is closed.
type holdSink struct {
	broker.Sink
	held, release chan struct{}
}

func (h holdSink) Answer(uint64, broker.Result) { close(h.held); <-h.release }
