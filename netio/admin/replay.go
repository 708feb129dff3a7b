package admin

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/warren-mq/warren/client"
	"github.com/warren-mq/warren/netio"
	"github.com/warren-mq/warren/netio/admin/api"
	"github.com/warren-mq/warren/wire"
)

// ReplayResult says what a replay did.
type ReplayResult = api.ReplayResult

// ErrUnroutable stops a replay whose target no longer routes anywhere.
var ErrUnroutable = errors.New("admin: replayed message was unroutable; left in the dead-letter queue")

// Replay moves up to count messages (all ready ones if count is 0) from a
// dead-letter queue back to the exchange and routing key they died from
// (their newest death record), at most rate per second if rate > 0.
//
// It is at-least-once: each message is republished as mandatory and
// acknowledged in the dead-letter queue only after the broker confirmed the
// republish and did not return it as unroutable. A failure stops the
// replay, leaving the failed message (and the rest) where they were.
func Replay(ctx context.Context, srv *netio.Server, queue string, count int, rate float64) (ReplayResult, error) {
	var res ReplayResult
	info, ok := srv.Queue(queue)
	if !ok {
		return res, &wire.Error{Code: wire.NotFound, Reason: "no queue " + queue}
	}
	target := int(info.Ready)
	if count > 0 && count < target {
		target = count
	}
	if target == 0 {
		return res, nil
	}
	conn, err := client.Dial(ctx, srv.InternalURL(), client.Options{Name: "warren-replay", Heartbeat: -1})
	if err != nil {
		return res, err
	}
	defer conn.Close()
	ch, err := conn.Channel(ctx)
	if err != nil {
		return res, err
	}
	var mu sync.Mutex
	returned := map[uint64]bool{}
	ch.NotifyReturn(func(r client.Return) {
		mu.Lock()
		returned[r.Seq] = true
		mu.Unlock()
	})
	cs, err := ch.Consume(ctx, queue, client.ConsumeOptions{Prefetch: uint32(min(target, 256)), Tag: "warren-replay"})
	if err != nil {
		return res, err
	}
	var skipped []*client.Delivery
	defer func() {
		for _, d := range skipped {
			_ = d.Nack(true)
		}
		_ = cs.Cancel(context.Background())
	}()
	start := time.Now()
	seq := uint64(0)
	for res.Moved+res.Skipped < target {
		var d *client.Delivery
		select {
		case d = <-cs.Deliveries():
		case <-ctx.Done():
			return res, ctx.Err()
		case <-time.After(2 * time.Second):
			return res, nil // fewer messages than counted (consumed by others meanwhile)
		}
		if d == nil {
			return res, errors.New("admin: replay consumer stopped")
		}
		props, _ := d.Props()
		if props == nil || len(props.Deaths) == 0 || len(props.Deaths[0].RoutingKeys) == 0 {
			skipped = append(skipped, d)
			res.Skipped++
			continue
		}
		death := props.Deaths[0]
		if rate > 0 {
			if wait := time.Until(start.Add(time.Duration(float64(res.Moved) / rate * float64(time.Second)))); wait > 0 {
				select {
				case <-time.After(wait):
				case <-ctx.Done():
					_ = d.Nack(true)
					return res, ctx.Err()
				}
			}
		}
		seq++
		err := ch.Publish(ctx, death.Exchange, client.Message{RoutingKey: death.RoutingKeys[0], Body: d.Body, Mandatory: true,
			Persistent: d.Persistent, Priority: d.Priority, Props: props})
		mu.Lock()
		unroutable := returned[seq]
		mu.Unlock()
		if err == nil && unroutable {
			err = ErrUnroutable
		}
		if err != nil {
			_ = d.Nack(true)
			return res, err
		}
		if err := d.Ack(); err != nil {
			return res, err
		}
		res.Moved++
	}
	return res, nil
}
