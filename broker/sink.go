package broker

import (
	"github.com/warren-mq/warren/queue"
	"github.com/warren-mq/warren/wire"
)

// Sink is where a shard hands the effects of its work, as values: the shard
// never calls into a connection. netio's connections implement it. Calls
// come from shard goroutines, in the order the effects happened, and are
// batched: one Deliver per sink per drained batch of commands, never one
// call per message. A Sink must not call back into the shard that calls it.
//
// Consumers are named by their queue.ConsumerID (unique broker-wide), which
// the sink maps to its own state; an id it no longer knows is ignored.
type Sink interface {
	// Deliver hands the deliveries of one batch to this sink's consumers,
	// in the order the queues made them. ds is the shard's: the sink
	// copies what it keeps before returning.
	Deliver(ds []Delivery)
	// Confirm says every part of a publish batch has been taken (or
	// refused, its codes say which) by the queues it was routed to.
	Confirm(b *PublishBatch)
	// Subscribed answers a subscribe: code wire.OK, or why it failed (the
	// consumer is then gone, and no ConsumerGone follows).
	Subscribed(id queue.ConsumerID, req uint32, code wire.Code, reason string)
	// Cancelled says the broker cancelled a consumer (its queue was
	// deleted); ConsumerGone follows.
	Cancelled(id queue.ConsumerID, code wire.Code, reason string)
	// LeaseExpired says a delivery's lease ran out and the queue took it
	// back; qtag is the queue's delivery tag.
	LeaseExpired(id queue.ConsumerID, qtag uint64)
	// ConsumerGone says the shard forgot a consumer (cancelled and drained,
	// its queue deleted): the sink may drop what it keeps for it.
	ConsumerGone(id queue.ConsumerID)
	// Answer answers the request command the sink submitted under req.
	Answer(req uint64, r Result)
}

// Delivery is one message handed to a consumer: a value, copied into the
// sink's outbox by Deliver. Msg and its bytes are valid only during the
// Deliver call: a durable queue's message is a view of its log, released
// once the shard's batch is done.
type Delivery struct {
	Consumer      queue.ConsumerID
	QTag          uint64 // the queue's delivery tag (settle by it)
	MsgID         uint64 // the message's id in its queue (Message.ID, as a peek shows it)
	Msg           *StoredMsg
	DeliveryCount uint32
	FailedCount   uint32
}

// consumer is a shard's record of one subscription.
type consumer struct {
	sink  Sink
	owner uint64     // the owning connection's id (Down)
	batch *sinkBatch // sink's deliveries in this batch; set on first delivery
}
