package amqp

import (
	"bytes"
	"testing"
	"time"

	amqp091 "github.com/rabbitmq/amqp091-go"
	"github.com/warren-mq/warren/netio"
)

// A client that stops sending (no frame, no heartbeat) is closed once
// two heartbeat intervals pass without a frame from it, and not before;
// while it is silent the broker sends heartbeats of its own every half
// interval. The tick takes the time as an input: the test hands it
// times past the connection's last frame instead of waiting (the
// listener's own tick, on the wall clock, is 10 s from acting).
func TestMissedHeartbeatsClose(t *testing.T) {
	cc, _, c := sinkBrokerWith(t, netio.Config{}, amqp091.Config{Heartbeat: 10 * time.Second})
	if c.heartbeat != 10*time.Second {
		t.Fatalf("negotiated heartbeat %v, want the client's 10s", c.heartbeat)
	}
	closed := cc.NotifyClose(make(chan *amqp091.Error, 1))
	hb := c.heartbeat.Milliseconds()
	last := c.lastRecv.Load()
	// Nothing sent for half an interval (the last send moved back, as
	// the wall clock stamps a send): a heartbeat goes out.
	sent := c.lastSend.Load() - hb/2
	c.lastSend.Store(sent)
	c.tick(sent + hb/2)
	c.mu.Lock()
	// Written (the send stamped), or queued behind a write in flight.
	queued := bytes.HasSuffix(c.out, []byte{frameHeartbeat, 0, 0, 0, 0, 0, 0, frameEnd})
	c.mu.Unlock()
	if got := c.lastSend.Load(); got == sent && !queued {
		t.Fatal("no heartbeat sent after half an interval of silence")
	}
	c.tick(last + 2*hb) // two intervals exactly: still open
	if c.state.Load() == stClosing || cc.IsClosed() {
		t.Fatal("closed at two heartbeat intervals of silence; the bound is past two")
	}
	// Just past two intervals since the last frame: closed. The last
	// frame is read afresh each time (the client may have sent one, a
	// heartbeat of its own, while a loaded machine ran this slowly).
	deadline := time.Now().Add(10 * time.Second)
	for {
		c.tick(c.lastRecv.Load() + 2*hb + 1)
		select {
		case <-closed:
			return
		case <-time.After(50 * time.Millisecond): // polling with a deadline: the close goes through gnet
		}
		if time.Now().After(deadline) {
			t.Fatal("the connection was not closed after two heartbeat intervals without a frame")
		}
	}
}
