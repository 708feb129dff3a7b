// Package queue is Warren's queue state machine and its routing table:
// pure, deterministic code with no I/O, no goroutines, no clock and no
// randomness. Time and commands come in; effects go out as values. Every
// replica of a queue that applies the same commands, with the same times,
// from the same snapshot, computes the same state, the same effects and
// the same snapshot bytes. The broker (netio today; broker/ and
// replication/ soon) drives it; nothing here calls back into the caller.
//
// # The machine
//
// A Machine is one queue: its ready messages (one FIFO ring of fixed-size
// 32-byte entries per priority level, a bitmap of non-empty levels, and
// weighted anti-starvation between levels, see Machine), its consumers and
// the deliveries each holds (in tag order, per consumer), parked
// retries and message expiries (timer heaps keyed by time), the dedup
// window, and its counters. It never holds a message body: a message is
// its Message record (ID, size, priority, expiration, dedup key), and the
// caller keeps the bytes under the ID.
//
// Commands are the Machine's mutating methods, or the same as values
// through Machine.Apply (command.go has the command types and their one
// binary encoding, for a log):
//
//	Enqueue    publish a batch (length limits, overflow, TTL, dedup)
//	Subscribe  add a consumer          Cancel  stop one (requeue or drain)
//	Settle     ack, requeue, reject, extend a range of delivery tags
//	Down       an owner (connection, channel) went away: take back its deliveries
//	Tick       time passed: expiries, retries whose wait is over, ack timeouts, queue expiry
//	Purge      drop every ready message
//	SettleDeadLetter  a held dead letter's targets have it: free it
//
// After each command the machine dispatches what it can (highest
// consumer priority first, round-robin among equals, within prefetch) and
// returns the effects of the command and of the dispatch, in order.
// Ready, ReadyBytes, Parked, Unacked, Consumers (all O(1)), HasConsumer,
// Peek, Snapshot and Stats read the state and change nothing.
//
// # The caller's duties
//
//  1. Give each queue one owner. A Machine is not safe for concurrent use:
//     one goroutine (a shard) applies its commands, one at a time.
//  2. Stamp every command with the time, in milliseconds, from the one
//     place that reads a clock (the shard; a raft leader when it proposes),
//     and pass that same time wherever the command is applied: a replica
//     or a replay uses the time in the command, never its own clock. Times
//     must not decrease from one command to the next; the machine does not
//     check.
//  3. Give messages IDs that are unique and increasing per queue (a
//     counter, or a log index) and keep each body under its ID until an
//     effect frees it (Remove, DeadLetter, Drop, Duplicate; RejectPublish
//     for a message that was never taken).
//  4. Carry out every effect, in order (see Effects). A Deliver names the
//     consumer, its queue-local delivery tag and the message; the caller
//     maps tags to whatever its protocol numbers.
//  5. Call Tick once the time reaches the At of the latest Timer effect
//     (it supersedes the earlier ones; a Tick before then is harmless and
//     returns a new Timer). Nothing time-driven happens without it:
//     a message whose TTL passes stays counted as ready until a Tick (it is
//     never delivered: dispatch dead-letters an expired entry instead), a parked retry
//     stays parked, a lease outlives its deadline.
//  6. Finish with a command's effects, or copy them, before the next
//     command on the same machine: the slice is reused. In particular an
//     effect whose handling makes a command for the same machine (a dead
//     letter routed back to its own queue) must be queued and applied
//     after the loop over the effects, not inside it.
//  7. Snapshot only between commands, and restore with Restore; apply
//     after the restore exactly the commands that followed the snapshot.
//
// # Time
//
// Time is an input: every command takes now (ms), New takes the declare
// time (the start of the expiry clock), and the machine stores deadlines
// as absolute times in the same unit (message expiry, retry ready time,
// lease deadlines, the dedup window, the last use for queue expiry). It
// reads no clock, sets no timer and never sleeps: the Timer effect tells
// the caller when the next Tick has work. Tests drive it with whatever
// times they like (testdata/traces: "tick at=1000").
//
// # Effects
//
// An Effect is a value; the machine performs none of them. The slice a
// command returns is owned by the machine and valid until its next
// command; it holds no pointer into the machine's state. The caller must:
//
//	Deliver        send message Msg to Consumer under Tag (DeliveryCount, FailedCount: spec §9.2)
//	Remove         free Msg: it is settled for good (acked, auto-acked, purged)
//	DeadLetter     publish Msg to the queue's dead-letter exchange with a death record
//	               for Reason (RecordDeath, DeadLetterCycle; time: the command's), then free it
//	               (with Config.HoldDeadLetters: keep it until SettleDeadLetter; held.go)
//	Drop           free Msg: it died for Reason with no dead-letter exchange
//	RejectPublish  nack Msg's publisher (queue_full); the queue never took it
//	Duplicate      confirm Msg to its publisher and free it: within the dedup window
//	LeaseExpired   tell Consumer its delivery Tag was taken back (ack timeout)
//	DeleteQueue    delete the queue (auto-delete, or expired); at most once
//	Timer          call Tick at At or earlier; at most one, always last
//
// Confirms are the caller's: a message Enqueue took (no RejectPublish or
// Duplicate for it) may be confirmed once the caller has made it as
// durable as the queue promises. Dead-lettering is at least once only if
// the caller keeps the body until the dead-letter target has taken it:
// Config.HoldDeadLetters keeps such dead letters in the machine's state
// (snapshot included) until a SettleDeadLetter command (held.go).
//
// Errors: a command a client got wrong (an unknown consumer or delivery
// tag, an exclusive conflict) returns a *wire.Error carrying the protocol
// code to answer with, and changes nothing; its effects are nil.
//
// # Determinism
//
// Nothing a replica could compute differently may reach the state, the
// effects or the snapshot:
//
//   - no clock: time comes in with the command (above);
//   - no randomness: round-robin cursors, the anti-starvation run and the
//     consumer arrival order are state, and the consistent-hash exchange
//     hashes with xxhash (fixed, seedless);
//   - no floating point in state: the retry multiplier is kept in
//     thousandths (Config.RetryMultiplierMilli; MultiplierMilli converts
//     the declared number once, at declare time) and the retry wait is
//     computed in integers by the rule of spec §7.2 (Machine.backoff);
//   - no order from Go maps: maps serve lookups only; whatever is
//     iterated is a slice, a ring or a heap in an order the commands
//     decide, and Snapshot writes map keys sorted.
//
// Deliveries are not commands: they are a function of the commands, so a
// durable queue logs the commands and every replica derives the same
// deliveries (only the leader sends them).
//
// # Snapshots
//
// Snapshot returns an exact image of the machine, a new byte slice the
// caller owns: its configuration, every ready entry in ring order, every
// consumer with its outstanding deliveries, the timer heaps, the dedup
// window, the valve and cursor state, and the counters (Stats). Restore
// rebuilds a machine from it, checks its invariants, and refuses
// malformed input with ErrBadSnapshot (never a panic). The contract:
//
//   - Restore(Snapshot()) then any commands gives the same effects and the
//     same snapshots as the original given the same commands
//     (TestSnapshotRoundTrip checks this over random workloads);
//   - machines in the same state give equal bytes (map keys are sorted,
//     derived fields are not written);
//   - the first byte is the format version (snapshotVersion), and Restore
//     reads only its own: a change to the layout is a new version. No
//     snapshot has been persisted yet, so older versions are refused with
//     an error naming them rather than read; once snapshots live on disk,
//     a new version must read the one before it.
//
// # Routing
//
// Routes holds exchanges, queues (by the caller's QueueRef) and bindings,
// changed by one writer (the caller serialises its methods); Table returns
// an immutable snapshot that any number of goroutines may route against
// without a lock (direct, topic, fanout, headers, consistent-hash,
// exchange-to-exchange, alternate exchanges). Route appends the
// destination queues' refs to the caller's slice and allocates nothing;
// their order differs between processes (names are hashed with a seed
// chosen per process, so that clients cannot flood one hash), the set
// does not.
// Publishing a snapshot (an atomic pointer) is the caller's. Routes is
// built of persistent maps (pmap.go): a change costs O(log n) whatever the
// size of the topology, Table is O(1), and changes between two snapshots
// are made in place. The reference model it is tested against, a table
// compiled whole from a Topology, lives in route_model_test.go.
//
// # Not built yet
//
// Routing is not split into a sub-package.
package queue
