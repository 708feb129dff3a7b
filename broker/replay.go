package broker

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/warren-mq/warren/queue"
	"github.com/warren-mq/warren/wire"
)

// ErrUnroutable stops a replay whose target no longer routes anywhere.
var ErrUnroutable = errors.New("broker: replayed message was unroutable; left in the dead-letter queue")

// ReplayResult says what a replay did.
type ReplayResult struct {
	Moved   int // republished and taken out of the dead-letter queue
	Skipped int // with no death history: left in the queue
	Missing int // ReplaySelected: ids the queue no longer held (taken meanwhile)
}

// MaxReplayIDs is the most messages one ReplaySelected names, and how deep
// into the queue it looks for them: as many as a peek shows.
const MaxReplayIDs = 10000

// replayIdle is how long a replay waits for the next message before it
// decides the queue holds fewer than it counted (others consumed them).
const replayIdle = 2 * time.Second

// Replay moves up to count messages (all ready ones if count is 0) from a
// dead-letter queue back to the exchange and routing key they died from
// (their newest death record), at most rate per second if rate > 0. It
// runs in process: a consumer of the broker's own on the queue, and each
// message republished through the broker with its death history intact.
//
// It is at-least-once: a message leaves the dead-letter queue (is acked
// there) only once every queue its republish was routed to has taken it;
// one that routes nowhere (ErrUnroutable) or is refused stops the replay,
// and it and the rest stay where they were.
func (b *Broker) Replay(ctx context.Context, name string, count int, rate float64) (ReplayResult, error) {
	return b.replay(ctx, name, count, nil, rate)
}

// ReplaySelected is Replay of the messages with the given ids (Message.ID,
// as PeekQueue shows them), wherever they are among the first
// MaxReplayIDs of the queue, in queue order. The messages ahead of and
// between them are held by the replay's consumer until it ends and then
// returned to the queue in their order, as a cancelled consumer's are: their
// failed count rises by one (a queue with a delivery limit counts that).
// Ids the queue no longer holds are counted as Missing.
func (b *Broker) ReplaySelected(ctx context.Context, name string, ids []uint64, rate float64) (ReplayResult, error) {
	if len(ids) == 0 {
		return ReplayResult{}, reqErr(wire.InvalidArgument, "no message ids to replay: name them (the ids a peek shows)")
	}
	if len(ids) > MaxReplayIDs {
		return ReplayResult{}, reqErr(wire.InvalidArgument, "%d message ids to replay: at most %d at a time", len(ids), MaxReplayIDs)
	}
	want := make(map[uint64]bool, len(ids))
	for _, id := range ids {
		want[id] = true
	}
	return b.replay(ctx, name, 0, want, rate)
}

// replay is Replay (want nil) or ReplaySelected (want the ids yet to find;
// it is consumed).
func (b *Broker) replay(ctx context.Context, name string, count int, want map[uint64]bool, rate float64) (res ReplayResult, err error) {
	q := b.LookupQueue(name)
	if q == nil {
		return res, reqErr(wire.NotFound, "no queue %q", name)
	}
	// target: how many messages to take (Replay), or to look through
	// (ReplaySelected: every one it takes is held until the end, so
	// the prefetch covers them all).
	target := int(q.ReadyCount())
	prefetch := min(target, 256)
	if want != nil {
		target = min(target, MaxReplayIDs)
		prefetch = target
		defer func() { res.Missing = len(want) }()
	} else if count > 0 && count < target {
		target = count
	}
	if target == 0 {
		return res, nil
	}
	rs := &replaySink{wake: make(chan struct{}, 1), confirmed: make(chan *PublishBatch, 1), subscribed: make(chan Result, 1)}
	id := b.NewConsumerID()
	b.Submit(Command{Kind: CmdSubscribe, Queue: q, Sink: rs, Spec: queue.ConsumerSpec{ID: id, Prefetch: uint32(prefetch)}})
	select {
	case r := <-rs.subscribed:
		if err := r.Err(); err != nil {
			return res, err
		}
	case <-ctx.Done():
		// It may still subscribe: cancel it all the same.
		b.Submit(Command{Kind: CmdCancel, Queue: q, Consumer: id, Requeue: true})
		return res, ctx.Err()
	}
	// Whatever it holds and did not ack (skipped, not selected, refused,
	// not reached) goes back to the queue.
	defer b.Submit(Command{Kind: CmdCancel, Queue: q, Consumer: id, Requeue: true})
	start := time.Now()
	for seen := 0; seen < target && (want == nil || len(want) > 0); seen++ {
		var d Delivery
		var ok bool
		d, ok, err = rs.next(ctx)
		if err != nil {
			return res, err
		}
		if !ok {
			return res, nil // fewer messages than counted (consumed by others meanwhile)
		}
		if want != nil {
			if !want[d.MsgID] {
				continue
			}
			delete(want, d.MsgID)
		}
		var props wire.Properties
		var deaths []wire.Death
		if wire.ParseProperties(d.Msg.Props(), &props) == nil && props.Has(wire.PropDeaths) {
			deaths, _ = wire.DecodeDeaths(props.Deaths)
		}
		if len(deaths) == 0 || len(deaths[0].RoutingKeys) == 0 {
			res.Skipped++
			continue
		}
		if rate > 0 {
			if wait := time.Until(start.Add(time.Duration(float64(res.Moved) / rate * float64(time.Second)))); wait > 0 {
				select {
				case <-time.After(wait):
				case <-ctx.Done():
					return res, ctx.Err()
				}
			}
		}
		if err := b.republish(ctx, rs, d.Msg, &props, deaths[0], VhostOf(q.name)); err != nil {
			return res, err
		}
		b.Submit(Command{Kind: CmdSettle, Settles: []SettleItem{{Q: q, Consumer: id, Op: wire.SettleAck, QTag: d.QTag}}})
		res.Moved++
	}
	return res, nil
}

// republish publishes a copy of msg to the exchange and routing key of
// death, as a mandatory publish would go, and waits until every queue it
// was routed to has taken it.
func (b *Broker) republish(ctx context.Context, rs *replaySink, msg *StoredMsg, props *wire.Properties, death wire.Death, vhost string) error {
	view := b.View()
	ex := QualifyName(vhost, death.Exchange) // the history names it in the queue's vhost
	if !view.Table.HasExchange(ex) {
		return reqErr(wire.ExchangeNotFound, "no exchange %q to replay to", death.Exchange)
	}
	if view.Table.IsInternal(ex) {
		return reqErr(wire.ExchangeInternal, "exchange %q is internal", death.Exchange)
	}
	n, code, err := b.publishCopy(ctx, view, rs, ex, death.RoutingKeys[0], msg.Props(), props, msg.Body(), msg.Flags&^wire.Mandatory, msg.Priority)
	switch {
	case err != nil:
		return err
	case n == 0:
		return ErrUnroutable
	case code != wire.OK:
		return reqErr(code, "a queue refused the replayed message")
	}
	return nil
}

// publishCopy routes a copy of one message (its properties parsed as p)
// through exchange on view, in an arena of its own as a dead letter gets
// (see shard.deadLetter), and waits until every queue it was routed to
// has taken it (rs is told). It returns how many queues it was routed to
// (0: unroutable, nothing published) and the code they answered.
func (b *Broker) publishCopy(ctx context.Context, view *RouteView, rs *replaySink, exchange, rk string, props []byte, p *wire.Properties,
	body []byte, flags wire.MessageFlags, priority uint8) (int, wire.Code, error) {
	refs, _ := view.Table.Route(nil, exchange, []byte(rk), p.Headers)
	var tqs []*Queue
	for _, ref := range refs {
		if tq := view.Queue(ref); tq != nil {
			tqs = append(tqs, tq)
		}
	}
	if len(tqs) == 0 {
		return 0, wire.OK, nil
	}
	// Stored as the vhost's clients name it, as the fronts store what
	// they publish (routed above by its internal name).
	m := NewStoredMsg([]byte(LocalName(exchange)), []byte(rk), props, body, flags, priority)
	m.Arena.Cost = int64(cap(m.Arena.Buf)) + StoredMsgOverhead + int64(len(tqs))*PlacementOverhead
	m.Arena.Refs.Store(int64(len(tqs)))
	b.AddStoredBytes(m.Arena.Cost)
	meta := queue.Message{Size: uint32(len(m.Body())), Priority: priority, DedupKey: DedupKey(p.MessageID)}
	if p.Has(wire.PropExpiration) {
		meta.ExpirationMs, meta.HasExpiration = p.ExpirationMs, true
	}
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
		return 0, wire.OK, ctx.Err()
	}
	return len(tqs), wire.Code(batch.Codes[0]), nil
}

// replaySink is the Sink of a replay's consumer and publishes.
type replaySink struct {
	mu         sync.Mutex
	ds         []Delivery
	wake       chan struct{}
	confirmed  chan *PublishBatch
	subscribed chan Result
}

func (r *replaySink) Deliver(ds []Delivery) {
	r.mu.Lock()
	r.ds = append(r.ds, ds...)
	r.mu.Unlock()
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

// next is the next delivery, or ok false when none came for replayIdle.
func (r *replaySink) next(ctx context.Context) (d Delivery, ok bool, err error) {
	idle := time.NewTimer(replayIdle)
	defer idle.Stop()
	for {
		r.mu.Lock()
		if len(r.ds) > 0 {
			d = r.ds[0]
			r.ds = r.ds[1:]
			r.mu.Unlock()
			return d, true, nil
		}
		r.mu.Unlock()
		select {
		case <-r.wake:
		case <-idle.C:
			return d, false, nil
		case <-ctx.Done():
			return d, false, ctx.Err()
		}
	}
}

func (r *replaySink) Confirm(b *PublishBatch) { r.confirmed <- b }
func (r *replaySink) Subscribed(_ queue.ConsumerID, _ uint32, code wire.Code, reason string) {
	r.subscribed <- Result{Code: code, Reason: reason}
}
func (r *replaySink) Cancelled(queue.ConsumerID, wire.Code, string) {}
func (r *replaySink) LeaseExpired(queue.ConsumerID, uint64)         {}
func (r *replaySink) ConsumerGone(queue.ConsumerID)                 {}
func (r *replaySink) Answer(uint64, Result)                         {}
