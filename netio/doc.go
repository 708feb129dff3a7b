// Package netio is Warren's connection layer: gnet event loops that speak
// the wire protocol, sessions and channels, handshake and auth, flow
// control and outboxes. It turns frames into commands for the broker core
// (package broker: the topology and the queue shards) and implements the
// broker's Sink, turning its effects into frames. broker never imports
// netio.
//
// # Threads and ownership
//
//   - Event loops (gnet, one per core) own their connections: handshake,
//     channels, frame decoding, routing of publishes and the translation of
//     channel delivery tags into queue-local tags. A publish batch is routed
//     against the current routing view (an atomic pointer; no lock), its
//     bodies are copied once into one arena, and it is handed to the shards
//     that own its destination queues as one command per shard.
//
//   - Shards (a fixed number of goroutines) own queues: each queue's
//     queue.Machine, its message bodies and its consumers. A shard drains
//     its inbox in batches, applies commands to machines, and turns the
//     effects into frames (deliveries, confirms, cancels) in connection
//     outboxes. Time comes from the shard's clock and is passed into the
//     machines, which never read one.
//
//   - Outboxes: each connection has one, guarded by a mutex taken once per
//     batch of frames. When it goes from empty to non-empty one AsyncWrite
//     is scheduled on the connection's loop; bytes appended while a write is
//     in flight go out with the next one. A connection whose outbox grows
//     past the configured cap is closed (resource_limit).
//
//   - Control goroutines: a connection's control-plane requests (declares,
//     deletes, purges, binds, subscribes, cancels) are handled off its
//     loop, a run of up to 256 at a time, while the loop reads nothing more
//     of that connection (its frames keep their order, and past 1 MiB
//     buffered behind the run its socket is paused); a storm of them costs
//     its own connection time, not the loop's other connections
//     (control.go).
//
// Commands cross threads in batches: a lock and a wake-up per batch, never
// per message. The boundary between loops and shards is where raft will sit
// for durable queues (commands in, effects out). DESIGN.md asks for MPSC
// rings between them; a mutex-guarded batch inbox is used instead, since it
// is taken once per batch and is simpler to reason about; revisit with a
// profile.
//
// # TLS
//
// gnet has no TLS. Config.TLSAddr opens a crypto/tls listener whose
// connections are handed to the same loops through a Unix socket pair,
// one end enrolled in the engine (gnet.Engine.Register) at accept, before
// the TLS handshake: the broker serves the plaintext with the code that
// serves a plain connection, and every bound on a connection (handshake
// deadline, unauthenticated cap, per-source and total caps, flow-control
// blocking, outbox cap) holds for it unchanged. The client's address is the
// TCP peer's, carried in the enrolled connection's context; no socket
// listens for the broker's end, so no local process can pose as a TLS
// client. Chosen over an event loop with TLS of its own (another codebase to
// trust with the hot path) and over a second, goroutine-per-connection
// session (the connection code written twice); the price is a copy through
// the pair and two goroutines per TLS connection (BENCHMARKS.md). See
// tls.go.
//
// # Flow control
//
//   - Consumers: prefetch bounds the unacked deliveries a consumer holds
//     (an unlimited prefetch is capped by Config.MaxPrefetch). Auto-ack
//     consumers get a window of MaxPrefetch deliveries that is settled when
//     the bytes have been written to the socket: while gnet holds more than
//     autoAckBufferedMax bytes the socket did not take, the deliveries
//     written stay unsettled (ConnInfo.AutoAcksHeld), so a slow or stalled
//     reader holds at most its window and the queue keeps the rest; if it
//     dies, what was not settled is delivered again (what was settled was
//     in the kernel's buffers: auto-ack is at-most-once for those).
//   - Publishers, per queue: past Config.QueueSoftLimit ready messages a
//     queue still takes what is published but holds back the confirms
//     until it has drained below half the limit, so publishers' confirm
//     windows fill and they slow to the consumers' pace. A channel's end
//     sends its held confirms (CmdReleaseEnded): the close, which waits
//     for its confirms, never waits for consumers.
//   - Publishers, broker-wide: when the stored messages' memory passes the
//     high-watermark (their bytes plus a measured per-message overhead,
//     each publish batch's arena counted whole while any of its messages
//     is held: see Arena) the broker sends FLOW(active=false) on channel 0 to
//     every connection, and FLOW(active=true) once it is below 80% of it.
//   - Publishers that do not stop: a connection that sends a PUBLISH while
//     the alarm is on (or the stored bytes are over the watermark) is
//     blocked, as RabbitMQ blocks publishing connections: the loop leaves
//     that frame unread and takes the socket out of its epoll read interest
//     (pause.go), so the kernel's receive buffer fills and TCP stops the
//     client, whatever it does. Everything it sends after that frame waits,
//     acks included (publish and consume on separate connections, as with
//     RabbitMQ). The tick wakes it once the alarm is off and it is read
//     again from where it stopped. While blocked its heartbeats are not
//     read, so it is not closed for missing them; the heartbeat clock
//     restarts when it is unblocked (a peer that dies meanwhile is noticed
//     by a reset, or two intervals after the alarm clears). ConnInfo.Blocked
//     and warren_connections_blocked show it. See block.go.
package netio
