package client

import (
	"context"
	"errors"
	"sync"
	"testing"

	"github.com/warren-mq/warren/wire"
)

// TestConfirmAfterLossNotReportedTwice: a connection can be torn down by
// its writer (a failed write) or heartbeater while the reader still
// dispatches CONFIRM frames it had read. Every sequence number still
// unconfirmed at the loss is reported lost once; a confirm for it read
// afterwards must not report it again, as acked.
func TestConfirmAfterLossNotReportedTwice(t *testing.T) {
	c := &Conn{channels: map[uint16]*Channel{}, done: make(chan struct{}), flowOn: true, settles: map[*Channel]struct{}{},
		maxFrame: wire.HardMaxFrame, opts: Options{ConfirmWindow: 100}}
	c.wcond = sync.NewCond(&c.wmu)
	ch := newChannel(c, 1)
	got := map[uint64][]error{}
	ch.NotifyConfirm(func(first, last uint64, err error) {
		for s := first; s <= last; s++ {
			got[s] = append(got[s], err)
		}
	})
	ctx := context.Background()
	for i := 0; i < 4; i++ {
		if _, err := ch.PublishAsync(ctx, "", Message{RoutingKey: "q", Body: []byte("x")}); err != nil {
			t.Fatal(err)
		}
	}
	ch.onConfirm(wire.ConfirmRange{First: 1, Last: 1}) // before the loss
	ch.fail(ErrConnectionLost)                         // 2..4 reported lost
	ch.onConfirm(wire.ConfirmRange{First: 2, Last: 3}) // read before the loss, dispatched after it
	ch.onConfirm(wire.ConfirmRange{First: 4, Last: 4, Code: wire.QueueFull})
	for s := uint64(1); s <= 4; s++ {
		errs := got[s]
		if len(errs) != 1 {
			t.Fatalf("seq %d reported %d times: %v", s, len(errs), errs)
		}
		if lost := errors.Is(errs[0], ErrConnectionLost); lost != (s > 1) {
			t.Errorf("seq %d reported as %v", s, errs[0])
		}
	}
}
