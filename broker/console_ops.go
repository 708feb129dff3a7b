package broker

import (
	"context"
	"slices"

	"github.com/warren-mq/warren/queue"
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
	refs, _ := view.Table.Route(nil, exchange, []byte(rk), p.Headers)
	var tqs []*Queue
	for _, ref := range refs {
		if tq := view.Queue(ref); tq != nil {
			tqs = append(tqs, tq)
		}
	}
	if len(tqs) == 0 {
		return 0, nil
	}
	buf := make([]byte, 0, len(exchange)+len(rk)+len(props)+len(body))
	buf = append(append(append(append(buf, exchange...), rk...), props...), body...)
	i, j, k := len(exchange), len(exchange)+len(rk), len(exchange)+len(rk)+len(props)
	m := &StoredMsg{Exchange: buf[:i:i], RoutingKey: buf[i:j:j], Props: buf[j:k:k], Body: buf[k:], Arena: &Arena{}, Priority: priority}
	m.Arena.Cost = int64(cap(buf)) + StoredMsgOverhead + int64(len(tqs))*PlacementOverhead
	m.Arena.Refs.Store(int64(len(tqs)))
	b.AddStoredBytes(m.Arena.Cost)
	meta := queue.Message{Size: uint32(len(m.Body)), Priority: priority, DedupKey: DedupKey(p.MessageID)}
	if p.Has(wire.PropExpiration) {
		meta.ExpirationMs, meta.HasExpiration = p.ExpirationMs, true
	}
	rs := &replaySink{confirmed: make(chan *PublishBatch, 1)}
	batch := &PublishBatch{Sink: rs, Codes: make([]uint32, 1)}
	parts := make([][]EnqItem, len(b.shards))
	for _, tq := range tqs {
		parts[tq.shardIdx] = append(parts[tq.shardIdx], EnqItem{Q: tq, Msg: m, Meta: meta})
	}
	n := int32(1)
	for _, part := range parts {
		if len(part) > 0 {
			n++
		}
	}
	batch.Pending.Store(n)
	for _, part := range parts {
		if len(part) > 0 {
			b.Submit(Command{Kind: CmdPublish, Items: part, Batch: batch})
		}
	}
	batch.PartDone()
	select {
	case <-rs.confirmed:
	case <-ctx.Done():
		return 0, ctx.Err()
	}
	if code := wire.Code(batch.Codes[0]); code != wire.OK {
		return 0, reqErr(code, "a queue refused the message")
	}
	return len(tqs), nil
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
