package admin

import (
	"context"

	"github.com/warren-mq/warren/admin/api"
	"github.com/warren-mq/warren/broker"
)

// ReplayResult says what a replay did.
type ReplayResult = api.ReplayResult

// ErrUnroutable stops a replay whose target no longer routes anywhere.
var ErrUnroutable = broker.ErrUnroutable

// Replay moves up to count messages (all ready ones if count is 0) from a
// dead-letter queue back to the exchange and routing key they died from
// (their newest death record), at most rate per second if rate > 0.
//
// It runs in process, through the broker (broker.Broker.Replay): no
// client, no loopback connection, no hidden user. It is at-least-once: each
// message leaves the dead-letter queue only once every queue its republish
// was routed to has taken it; a message that routes nowhere or is refused
// stops the replay, leaving it (and the rest) where they were.
func Replay(ctx context.Context, b *broker.Broker, queue string, count int, rate float64) (ReplayResult, error) {
	r, err := b.Replay(ctx, queue, count, rate)
	return ReplayResult{Moved: r.Moved, Skipped: r.Skipped}, err
}

// MaxReplayIDs is the most messages one ReplaySelected names.
const MaxReplayIDs = broker.MaxReplayIDs

// ReplaySelected is Replay of the messages with the given ids (as POST
// /api/queues/{name}/get shows them), wherever they are among the first
// MaxReplayIDs of the queue (broker.Broker.ReplaySelected). Ids the queue
// no longer holds are counted as missing.
func ReplaySelected(ctx context.Context, b *broker.Broker, queue string, ids []uint64, rate float64) (ReplayResult, error) {
	r, err := b.ReplaySelected(ctx, queue, ids, rate)
	return ReplayResult{Moved: r.Moved, Skipped: r.Skipped, Missing: r.Missing}, err
}
