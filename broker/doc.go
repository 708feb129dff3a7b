// Package broker is Warren's core at run time: the metadata state machine
// (exchanges, queues, bindings; meta.go and meta_*.go) and the runtime
// around it (topology.go), the shards that own the queues' state
// machines, message bodies and dead-lettering (shard.go and shard_*.go),
// a durable queue's raft group over the log (durable.go and durable_*.go),
// and the operator API the admin API uses (ops.go).
//
// Metadata. Meta is pure and deterministic: Apply(MetaCommand) returns a
// MetaResult and MetaEffects, values. A command carries everything the
// rules read: its time, the requester's user, whether it may act on what
// others declared (Requester: the administrator tag, or the operator
// API; netio decides it, Meta applies it) and its connection, and any
// name the runtime drew (a generated queue name is chosen before the
// command, so a log replays it). Queue ids come from a counter in Meta's
// snapshot. MetaCommand has one binary encoding (meta_codec.go, versioned)
// and MetaMachine applies encoded commands as replication.StateMachine.
// Meta indexes bindings by key, by source and by destination, so a
// declare, bind or delete costs what it touches.
//
// The runtime (topology) turns each request into a MetaCommand, applies it
// under its mutex and then its effects: a queue is created on the shard its
// name hashes to, the routing (queue.Routes) is changed, and a new
// RouteView (the Routes' Table, whose publication costs what changed) is
// swapped in atomically, once per request or, in a connection's control
// run, once per run. Routing reads the view without a lock: Route returns
// queue refs (Meta's ids) and RouteView.Queue resolves one through a
// lock-free slot table, allocating nothing. A queue's deletion is
// decided by its shard (if-unused, if-empty, auto-delete, an exclusive
// owner gone), which then applies the metadata command that removes it.
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
// A shard's work per event is what the event concerns (timers.go,
// down.go). Time-driven work is commands too: a shard keeps its queues in
// a heap by the time of their latest Timer effect, and when its timer
// fires it applies a CmdTick to each due queue, and looks at no other,
// through the same path as submitted work, so a recorder (Config.OnApply)
// sees the ticks and a replay of the recorded commands at their times
// reproduces what the timers did (Config.ManualTicks leaves the firing to
// the caller: FireTimers, or the recorded CmdTicks). A Down (a connection
// closed) looks only at the queues the shard's index names for that
// connection: those where it has consumers, and the exclusive queues it
// owns.
//
// Still pointers, not yet ids (for the durable-queue work to turn into log
// data): a command's Queue, its publish items' message bodies (StoredMsg in
// a batch's Arena) and its PublishBatch.
package broker
