package broker

import (
	"context"
	"slices"

	"github.com/warren-mq/warren/wire"
)

// PublishOne publishes one message to exchange with routing key rk, in
// process, as a publisher's confirmed publish would go: props is the
// property block (without its u16 length; nil for none), and a death
// history in it is dropped as the connection layer drops a publisher's.
// It waits until every queue the message was routed to has taken it, and
// returns how many queues that was (0: routed nowhere, nothing stored).
// A queue that refuses it (overflow reject-publish) is an error.
//
// It is the admin API's "publish a test message": one message, no hot
// path; the broker's memory alarm is the caller's to check.
func (b *Broker) PublishOne(ctx context.Context, exchange, rk string, props, body []byte, priority uint8) (int, error) {
	if len(rk) > wire.MaxNameLen {
		// As both protocols bound it: a death record holds the key as a
		// short string, and a durable queue's log form its length in 16
		// bits.
		return 0, reqErr(wire.InvalidArgument, "routing key of %d bytes: at most %d", len(rk), wire.MaxNameLen)
	}
	var p wire.Properties
	if err := wire.ParseProperties(props, &p); err != nil {
		return 0, reqErr(wire.InvalidArgument, "bad message properties: %v", err)
	}
	if p.Has(wire.PropDeaths) {
		p.Present &^= 1 << wire.PropDeaths
		props = wire.AppendProperties(nil, &p)[2:]
		_ = wire.ParseProperties(props, &p)
	}
	view := b.View()
	if !view.Table.HasExchange(exchange) {
		return 0, reqErr(wire.ExchangeNotFound, "no exchange %q", exchange)
	}
	if view.Table.IsInternal(exchange) {
		return 0, reqErr(wire.ExchangeInternal, "exchange %q is internal: publishers cannot send to it", exchange)
	}
	rs := &replaySink{confirmed: make(chan *PublishBatch, 1)}
	n, code, err := b.publishCopy(ctx, view, rs, exchange, rk, props, &p, body, 0, priority)
	if err != nil {
		return 0, err
	}
	if code != wire.OK {
		return 0, reqErr(code, "a queue refused the message")
	}
	return n, nil
}

// AppendQueueStats appends every queue's counts to dst in no particular
// order: Queues without its sort, for a caller that sorts (or filters)
// them its own way, such as the admin API's queue pages.
func (b *Broker) AppendQueueStats(dst []QueueStats) []QueueStats {
	qs := b.topo.snapshotQueues()
	dst = slices.Grow(dst, len(qs))
	for _, q := range qs {
		dst = append(dst, statsOf(q))
	}
	return dst
}
