package client

import (
	"sync"
	"testing"

	"github.com/warren-mq/warren/wire"
)

// TestSettleFramesWithinMaxFrame: queued settlements that do not merge
// (acks and rejects in turn, an entry each) go out in SETTLE frames within
// the connection's max_frame. Split at 65,535 entries only, 5,000 made one
// frame of 105 KB, which a broker with a max_frame of 64 KiB refused
// (frame_too_large), ending the connection.
func TestSettleFramesWithinMaxFrame(t *testing.T) {
	c := &Conn{channels: map[uint16]*Channel{}, done: make(chan struct{}), flowOn: true, settles: map[*Channel]struct{}{}, maxFrame: wire.MinMaxFrame}
	c.wcond = sync.NewCond(&c.wmu)
	ch := newChannel(c, 1)
	c.channels[1] = ch
	const n = 5_000
	for tag := uint64(1); tag <= n; tag++ {
		op := wire.SettleAck
		if tag%2 == 0 {
			op = wire.SettleReject
		}
		ch.settleQ = append(ch.settleQ, wire.Settlement{Op: op, First: tag, Last: tag})
	}
	c.settles[ch] = struct{}{}
	c.flushSettlesLocked()
	got := 0
	for buf := c.wbuf; len(buf) > 0; {
		f, used, err := wire.Split(buf, wire.MinMaxFrame)
		if err != nil || used == 0 {
			t.Fatalf("after %d settlements: %v (a frame over max_frame %d, or cut)", got, err, wire.MinMaxFrame)
		}
		var b wire.SettleBatch
		if err := wire.DecodeSettle(f, &b); err != nil {
			t.Fatal(err)
		}
		for i := range b.Count {
			var s wire.Settlement
			b.At(i, &s)
			if s.First != uint64(got+1) {
				t.Fatalf("settlement %d is for tag %d", got, s.First)
			}
			got++
		}
		buf = buf[used:]
	}
	if got != n {
		t.Fatalf("%d settlements in the frames, want %d", got, n)
	}
}
