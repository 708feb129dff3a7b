package client

import (
	"sync"
	"testing"

	"github.com/warren-mq/warren/wire"
)

// TestRequestAfterSettleKeepsOrder: a request sent after a settlement on a
// channel goes on the wire after it. The broker applies frames in the order
// it reads them, so a request that overtook a queued settlement (a passive
// declare used to wait for settlements, a cancel, a close) would act before
// it. The writer goroutine is not started: what sendFrame queues is read
// from the write buffer as the writer would take it.
func TestRequestAfterSettleKeepsOrder(t *testing.T) {
	c := &Conn{channels: map[uint16]*Channel{}, done: make(chan struct{}), flowOn: true, settles: map[*Channel]struct{}{}}
	c.wcond = sync.NewCond(&c.wmu)
	ch := newChannel(c, 1)
	if err := ch.settle(wire.SettleReject, 1, 1, 0); err != nil {
		t.Fatal(err)
	}
	if err := c.sendFrame(1, &wire.QueueDeclare{Req: 7, Name: "orders", Passive: true}); err != nil {
		t.Fatal(err)
	}
	c.wmu.Lock()
	c.sealLocked()
	c.flushSettlesLocked()
	out := c.wbuf
	c.wmu.Unlock()
	var got []wire.Type
	for len(out) > 0 {
		f, n, err := wire.Split(out, wire.HardMaxFrame)
		if err != nil || n == 0 {
			t.Fatalf("write buffer: %v (n %d)", err, n)
		}
		got = append(got, f.Type)
		out = out[n:]
	}
	if len(got) != 2 || got[0] != wire.TypeSettle || got[1] != wire.TypeQueueDeclare {
		t.Fatalf("frames written in the order %v, want SETTLE then QUEUE_DECLARE", got)
	}
}
