// Package replication puts a raft log between the broker's commands and
// their application: one group per durable queue, one metadata group, over
// segment/ (design: ../shared/design/replication.md). It never imports the
// broker: what it applies, it applies through the StateMachine interface
// (statemachine.go).
//
// # What is built
//
// Phase D1 of the design, the pure parts, all deterministic and without
// I/O:
//
//   - entry.go: the versioned log entry (§1.2): a 32-byte header (the
//     leader's now_ms, proposer, proposal seq) and the queue's own commands
//     (queue.Command in queue.AppendCommand's encoding: one encoding per
//     command), each framed and 8-byte aligned. EntryEncoder builds one in
//     a reused buffer; EntryDecoder checks a whole entry, then hands out its
//     commands as views, allocating nothing. Damage is an error naming it
//     (FuzzDecodeEntry). raft's conf-change entries carry a one-byte marker
//     in segment; empty entries are stored empty.
//   - fsm.go: QueueFSM applies committed entries to a queue.Machine (§2.1)
//     at the leader-stamped time made monotonic (max(now_ms, lastNow)),
//     numbers messages index<<16 | slot, ignores a settle of a tag no
//     longer outstanding, tracks the latest Timer, keeps the live entry
//     set, and hands each command's effects to a Sink. It implements
//     StateMachine; its snapshot is a 32-byte header and the machine's
//     exact image (no bodies: they stay in the log's live entries).
//     TestFSMEquivalence checks that applying through the log equals
//     applying the commands directly, and that snapshot and restore change
//     nothing.
//   - live.go: the set of entries that still hold a message (§2.3), O(1)
//     amortised per release, rebuilt from queue.Machine.EachMessage on
//     restore; what segment.Log.Compact will be given after a snapshot.
//
// And the first piece of phase D2:
//
//   - storage.go: raft.Storage for one group over the node's segment.Log
//     (§2.5): a mirror of what segment made durable (changed only between
//     the Append and Advance), terms from in-memory runs, entries from the
//     tail cache raft handed out or copied out of segment. Tested against
//     raft's MemoryStorage query by query, and with a single-voter RawNode
//     that proposes, commits, applies, and recovers the same queue from the
//     log after a clean close or a crash at a random sync
//     (TestSingleVoterRecovers; a test driver, not the worker).
//   - raftconfig.go: a group's raft.Config (§3.7) and raft's logger on slog.
//   - worker.go and the files of its concerns: the round (§3.2). worker.go
//     holds the Worker, its config and the Group; round.go the round;
//     propose.go the commands added and the proposals made of them;
//     appender.go the appenders and the writes' completions; groups.go a
//     group's Open, Recover and Remove; snapshot.go snapshots and their
//     policy. A Worker, owned by a shard goroutine, drives many groups'
//     RawNodes: Group.Add buffers commands, Round makes one proposal per
//     group, handles each group's Ready (at most
//     one in flight per group; commit-only hard states written lazily),
//     applies committed entries, and hands the round's writes to its
//     appender goroutine as one segment Append, whose completion is posted
//     back to the shard (Advance then). On a single node (no transport) a
//     group that is its own only voter is pipelined instead: its rounds'
//     writes are submitted while earlier ones are in flight, Advanced at
//     once (raft commits them), and their entries applied only once
//     persisted says they are durable (applyDurable); the appender merges
//     the rounds that queued during a write into its next Append, so one
//     hot queue keeps the disk busy. Two appender goroutines, so one
//     writes while the other's fdatasync runs (segment.AppendThen keeps
//     their places in the log, tickets their completions, in submission
//     order). An Append failure stops the worker
//     and is reported (Fatal). TestWorkerRounds checks one Append per
//     round across groups, exactly-once apply, and recovery of every group
//     after a clean close or a crash at a random sync.
//   - snapstore.go and Group.Snapshot (snapshot.go) / Worker.Recover
//     (groups.go): snapshots (§2.4).
//     SnapStore keeps each group's latest snapshot in segment group 1
//     (chunks of at most 4 MiB, no files of their own); Group.Snapshot
//     takes the FSM's snapshot on the shard, stores it on a goroutine, and
//     once the commit index covering it is on disk compacts the group's
//     log to it keeping the entries that still hold messages;
//     Worker.Recover restores a group from its latest snapshot, replays
//     the log after it, and makes the Compact segment requires after a
//     restart (which reports a lost live entry). TestSnapshotsCompactAndRecover.
//     With WorkerConfig.Snapshots set, the worker applies §2.4's policy
//     after each apply (Group.SnapshotDue), and MaybeSnapshot its idle
//     rule (TestSnapshotPolicy). Snapshot writes and compactions run on a
//     bounded Pool (pool.go; 4 goroutines by default, shared by a node's
//     workers).
//   - Worker.Tick and NextWake: a queue's time-driven work (TTL, retries,
//     leases, expiry) is a Tick the leader proposes once the queue's
//     latest Timer is due (§1.4), at most one per group per 10 ms
//     (TestWorkerTicks).
//   - bodies.go: Group.Body reads a message's body back from the log by
//     its id (§2.2): from the storage's tail cache while the entry is in
//     memory, else through one segment view per entry, held until
//     ReleaseBodies (TestBodiesFromTheLog).
//
// And phase D3 on one node:
//
//   - meta.go (and meta_*.go): MetaGroup, the metadata group (§4): a
//     single voter over segment group 2 whose entries carry the broker's
//     encoded metadata commands, one entry per round (every command added
//     since the last round: a run of declarations shares one entry and one
//     fdatasync); snapshots of the metadata state into the SnapStore every
//     10,000 entries or 8 MiB, the log compacted to each; OpenMeta recovers
//     (snapshot, then replay). On one voter the caller applies a command
//     as it adds it (the proposal order is the log order, and a failed
//     write stops the node) and answers only once Wait says it is
//     committed. With several voters (MetaConfig.Peers, Step, Tick) the
//     group applies at commit on every node instead (the broker does not
//     run it so yet).
//     What survives a restart now: durable exchanges, durable queues'
//     declarations and the bindings between durable ends (the broker
//     logs a NodeUp at each start that drops the rest). Messages do not
//     yet: every queue's messages are in memory.
//
// # Several voters (the simulation; the cluster step builds on it)
//
// A group may have several voters: its raft messages go out through
// WorkerConfig.Send (a Transport) and come in through Worker.Step, and
// Group.RaftTick drives its elections and heartbeats (a single voter is
// never ticked). A Ready's messages that announce a new term or vote wait
// until it is on disk, and so do acknowledgements of entries; committed
// entries are applied only once stored. replication/sim runs three voters
// per group in one goroutine over a seeded fake network, with crashes,
// torn writes, partitions and snapshots (TestSim; make soak-sim).
//
// Snapshot install (install.go, design §6.7): a follower that needs
// entries its leader compacted away gets the leader's latest snapshot
// and only the live entries above its Match (WorkerConfig.SendSnapshot,
// a SnapshotTransport; Worker.StepSnapshot on the other side, and
// Worker.ReportSnapshot back to the sender). It cuts its divergent
// suffix, stores the snapshot with the entries it lacks (an install
// record), compacts its log to the snapshot (segment.Log.CompactAt) and
// writes those entries below it (segment.Log.AppendLive), off the shard;
// then restores its FSM (WorkerConfig.Installed hears it) and answers the
// leader. Worker.Recover finishes an install a crash interrupted
// (TestInstallSurvivesACrashAtEverySync). A group compacting its log
// switches its storage to the snapshot before segment drops anything, so
// raft never asks segment for a dropped entry.
//
// # How the broker uses it (design phase D4, one node)
//
// broker/durable.go: a queue declared durable and not exclusive is a
// Group (segment group broker.QueueGroupBase + its Meta id) on its shard's
// Worker, over the node's one log (warrend --data DIR: DIR/log, shared with
// the metadata group and the snapshot store). The shard adds its
// commands each drain and runs Round at the end of the drain; effects come
// back through the FSM's sink. What survives a restart (clean or a crash):
// every command whose entry reached the disk. A persistent message is
// confirmed once its entry is applied (after the fsync), a transient one
// when added (in a reject-publish queue, at apply too); the leader's
// pending confirms are a FIFO of the Enqueue commands added since the
// queue was opened, matched to applied Enqueues past the log's last index
// at open. Bodies are in the entries only (the heap copy is dropped when
// added) and read back with Body at delivery. On open after a restart the
// queue's first command is a Down for every consumer owner the snapshot
// and the log after it name (the broker, not a Recover log command), so
// what was out with a consumer is ready again, redelivered.
//
// # Not built yet
//
//   - a proposal raft drops is only counted and logged, and the broker's
//     confirm FIFO would then be out of step (with the pacing that happens
//     only without a leader, which a single voter never is);
//   - the Recover log command (§2.4 restart step 5; the broker Downs the
//     earlier owners itself) and DeleteIf, EnqueuerDown (frame kinds 8–10
//     are reserved and refused);
//   - a group that stops snapshotting pins the snapshot store from its
//     snapshot on (SnapStore's doc; Forget covers deleted queues);
//   - the node-wide crash simulation with confirms (§7; the broker has
//     restart and MemFS-crash tests of one queue, and warrend a kill -9
//     test), a free-disk limit, restart time and RSS with a deep backlog;
//   - most of the cluster step (§6): the TCP transport is built
//     (replication/cluster) and the broker runs the metadata group with
//     every node a voter over it (MetaConfig.Peers: proposals forwarded to
//     the leader, applied at commit on every node, each entry naming its
//     origin so the proposer's Wait and Done see its own commands), with
//     membership changes and snapshot install (members.go); queue
//     groups with several voters, placement, forwarding, enqueuer dedup
//     and consumer resume are not (the queue side of resume is:
//     queue.Machine.Outstanding), and the transport does not carry
//     snapshots yet (SnapshotTransport). An install record keeps the
//     entries it wrote a second time in the snapshot store until the
//     group's next snapshot; a cluster leader compacts to its own applied
//     index whatever its followers' Match (a laggard then needs a
//     snapshot).
package replication
