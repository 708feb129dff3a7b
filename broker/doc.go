// Package broker is Warren's core at run time: the topology (exchanges,
// queues, bindings; topology.go), the shards that own the queues' state
// machines, message bodies and dead-lettering (shard.go), and the operator
// API the admin API uses (ops.go).
//
// The seam with the connection layer (netio) is made of values. Work comes
// in as Command values through one entry point, Broker.Submit, one per batch
// per shard (a publish part, a run of settlements, a subscribe…); each queue
// command is applied as the queue package's typed command of the same name
// through queue.Machine.Apply, stamped with the time the shard read from
// the broker's one clock source (Config.Clock). Effects go out as values to
// the Sink each command names (deliveries batched: one Deliver per sink per
// drained batch); the broker never calls into a connection. Consumers are
// named by their queue.ConsumerID.
//
// Still pointers, not yet ids (for the durable-queue work to turn into log
// data): a command's Queue, its publish items' message bodies (StoredMsg in
// a batch's Arena) and its PublishBatch.
package broker
