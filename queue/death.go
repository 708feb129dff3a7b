package queue

import (
	"slices"

	"github.com/warren-mq/warren/wire"
)

// RecordDeath returns a message's dead-letter history (wire.Death, newest
// first) after it died in queue for reason: the (queue, reason) entry's
// count grows and its last time moves on, and it goes to the front; a
// first death there adds a new entry at the front. ds is modified in place
// where possible.
func RecordDeath(ds []wire.Death, queue string, reason wire.DeathReason, nowMs int64, exchange string, routingKeys []string) []wire.Death {
	for i := range ds {
		if ds[i].Queue == queue && ds[i].Reason == reason {
			d := ds[i]
			d.Count++
			d.LastMs = nowMs
			d.Exchange, d.RoutingKeys = exchange, routingKeys
			copy(ds[1:i+1], ds[:i])
			ds[0] = d
			return ds
		}
	}
	d := wire.Death{Queue: queue, Reason: reason, Count: 1, FirstMs: nowMs, LastMs: nowMs, Exchange: exchange, RoutingKeys: routingKeys}
	return slices.Insert(ds, 0, d)
}

// DeadLetterCycle reports whether dead-lettering a message with history ds
// into queue target would close a loop with no client in it: the message
// already died in target, and every death since then (newest first, up to
// and including that one) was automatic (expired, maxlen, delivery_limit).
// Such a message is dropped instead of dead-lettered, as RabbitMQ does; a
// rejection anywhere in the loop means a consumer is deciding, so it goes on.
func DeadLetterCycle(ds []wire.Death, target string) bool {
	for _, d := range ds {
		if d.Reason == wire.ReasonRejected {
			return false
		}
		if d.Queue == target {
			return true
		}
	}
	return false
}
