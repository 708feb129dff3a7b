package netio_test

import (
	"strings"
	"testing"

	"github.com/warren-mq/warren/client"
	"github.com/warren-mq/warren/netio/warrentest"
	"github.com/warren-mq/warren/wire"
)

// TestSubscribeConsumerTimeoutOverRawProtocol: SUBSCRIBE's argument
// consumer-timeout-ms gives one consumer an ack timeout on a queue that has
// none (issue 11 item 5); a delivery it holds past it is taken back with
// LEASE_EXPIRED and redelivered. A bad value is refused with
// invalid_argument and a message naming the argument.
func TestSubscribeConsumerTimeoutOverRawProtocol(t *testing.T) {
	s := warrentest.StartServer(t, nil)
	ch := channel(t, dial(t, s))
	_, err := ch.DeclareQueue(ctxT(t), "work", client.QueueOptions{})
	must(t, err)
	must(t, ch.Publish(ctxT(t), "", client.Message{RoutingKey: "work", Body: []byte("job")}))

	r := rawDial(t, s, 0)
	r.write(wire.AppendFrame(nil, 1, &wire.ChannelOpen{Req: 9}))
	if ok, isOK := r.read().(*wire.OKReply); !isOK || ok.Req != 9 {
		t.Fatal("no OK for CHANNEL_OPEN")
	}
	r.write(wire.AppendFrame(nil, 1, &wire.Subscribe{Req: 1, Queue: "work", PrefetchCount: 1,
		Args: wire.Table{{Key: "consumer-timeout-ms", Value: wire.Int(0)}}}))
	if e, ok := r.read().(*wire.ErrorReply); !ok || e.Code != wire.InvalidArgument || !strings.Contains(e.Message, "consumer-timeout-ms") {
		t.Fatalf("consumer-timeout-ms 0: got %+v, want invalid_argument naming the argument", e)
	}
	r.write(wire.AppendFrame(nil, 1, &wire.Subscribe{Req: 2, Queue: "work", PrefetchCount: 1,
		Args: wire.Table{{Key: "consumer-timeout-ms", Value: wire.Int(50)}}}))
	var first, expired, again bool
	for !(first && expired && again) {
		switch b := r.read().(type) {
		case *wire.SubscribeOK:
		case *wire.ErrorReply:
			t.Fatalf("subscribe with consumer-timeout-ms 50: %v %s", b.Code, b.Message)
		case *wire.Deliver:
			if !first {
				first = true
			} else if expired {
				again = true
			}
		case *wire.LeaseExpired:
			if !first {
				t.Fatal("LEASE_EXPIRED before any delivery")
			}
			expired = true
		case nil:
			t.Fatal("connection closed")
		}
	}
}
