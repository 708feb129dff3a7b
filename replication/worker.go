package replication

import (
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"

	"github.com/warren-mq/warren/segment"
	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
)

// Worker drives the raft groups of one shard (design/replication.md §3.2):
// the shard goroutine calls Round once per drain of its inbox, and the
// round turns every group's buffered commands into one proposal, collects
// every group's Ready, applies committed entries (effects go to each
// group's sink), and hands the whole shard's writes to the appender as one
// segment.Log.Append: about one fdatasync per round for all the shard's
// queues, and with two shards the group commit merges their appends.
//
// Sync Ready/Advance with at most one Ready in flight per group: a group
// whose write is in flight waits for its completion (persisted, posted back
// to the shard) before it produces another Ready. The shard never blocks
// on the disk; the appender goroutine does the waiting. Except on a single
// node (no Send), where a group is its only voter: there its rounds are
// pipelined (pipelined: each round's entries are submitted while earlier
// rounds' writes are still in flight, and raft is told at once that they
// are stable) and nothing is applied before segment made it durable; the
// appender merges the rounds that queued during a write into its next
// Append (group commit), so the disk never waits for the shard.
//
// Everything but the appender runs on the shard goroutine: Worker and
// Group are not safe for concurrent use. Post is how the appender hands
// its completion back: it must run the function on the shard goroutine,
// after the current drain (the shard's inbox).
//
// Single voter by default; a group with peers needs a Transport (Send,
// and Step for what arrives) and RaftTick (transport.go).
type Worker struct {
	log   *segment.Log
	cfg   WorkerConfig
	ids   map[uint64]*Group
	dirty []*Group // FIFO, each group at most once (Group.queued)
	spare []*Group
	sub   *submission // being built this round
	free  []*submission
	now   int64  // the time of the current (or last) round
	ticks uint64 // RaftTick calls

	mu      sync.Mutex
	queue   []*submission // waiting for the appenders
	work    *sync.Cond    // on mu: queue or closing changed
	closing bool
	// tickets: the order the appenders took their work in, which their
	// Appends enter segment in (entered: how many did) and their
	// completions are posted in (turn: the next to post). turns: on mu,
	// entered or turn changed.
	tickets, entered, turn uint64
	turns                  *sync.Cond
	running                int // appenders not yet stopped
	done                   chan struct{}
	failed                 error // an Append failed: the worker is stopped for good
	ownPool                bool

	stats WorkerStats
}

// WorkerConfig configures a Worker.
type WorkerConfig struct {
	NodeID uint64 // raft node id of this node (1 on a single node)
	Shard  uint64
	// Post runs fn on the shard goroutine (the shard's inbox). Required.
	Post func(fn func())
	// Send carries raft messages to peers (cluster step; nil on a single
	// node, where a group has no peers to talk to).
	Send func(gid uint64, msgs []raftpb.Message)
	// SendSnapshot streams a snapshot (raft's MsgSnap, the data, the live
	// entries the follower lacks) to a peer (install.go, design §6.7);
	// nil: raft hears that every snapshot failed. It needs Snapshots (the
	// store the data is read from).
	SendSnapshot func(gid uint64, s *SnapshotMessage)
	// Installed (optional) hears, on the shard, that a group installed a
	// leader's snapshot: its FSM jumped to meta.Index, and the commands
	// up to it were never applied here.
	Installed func(g *Group, meta raftpb.SnapshotMetadata)
	// Fatal is told, on the shard goroutine, that an Append failed: the
	// engine has stopped (segment.ErrStopped) and the node must exit and
	// recover (design §3.2, the fsyncgate rule).
	Fatal func(err error)
	// Snapshots, when set, turns the snapshot policy on (design §2.4):
	// after applying, a group is snapshotted into this store when that
	// frees more log than it costs (Group.SnapshotDue), and MaybeSnapshot
	// applies the idle rule. SnapshotDone (optional) hears each outcome.
	Snapshots    *SnapStore
	SnapshotDone func(g *Group, meta raftpb.SnapshotMetadata, err error)
	// Pool runs snapshot writes and compactions (shared among the node's
	// workers); nil: the worker makes its own of 4, closed by Close.
	Pool *Pool
	// SeqBase is where this worker's groups count their proposal seqs
	// from. A node that restarts must count from above any seq it used
	// before (the broker uses its start time in ms << 20): an entry it
	// proposed before the restart, committed by the others and applied
	// here after it leads again, must not be taken for one of this
	// incarnation's (its confirms would go to the wrong waiters). 0 for
	// tests and simulations.
	SeqBase uint64
	// LeaderChanged (optional) hears, on the shard during a round, that
	// the group's raft state or the leader it knows changed: lead is the
	// leader (0: none known), leader whether it is this node. Commands
	// added from it go into the group's next proposal.
	LeaderChanged func(g *Group, lead uint64, leader bool)
	// PeerLost (optional) hears, on the shard, that this node leads the
	// group and peer lost entries it had acknowledged (its copy deleted
	// and opened empty while this leader still counted it: lost.go). The
	// leader takes it out of the group (ProposeConf) and adds it back as
	// a new learner, whose progress starts from nothing.
	PeerLost func(g *Group, peer uint64)
	// MaxUncommittedBytes is raft's limit on a group's uncommitted entry
	// bytes (0: 64 MiB, design §3.7); the worker paces proposals below
	// half of it.
	MaxUncommittedBytes int
	Logger              *slog.Logger
}

// WorkerStats count rounds and writes.
type WorkerStats struct {
	Rounds    uint64 // Round calls
	Appends   uint64 // segment Appends submitted (at most one per round)
	Persisted uint64 // Appends whose completion the shard has run
	Proposals uint64 // entries proposed
	Dropped   uint64 // proposals raft refused (no leader, transfer, size)
	Applied   uint64 // entries applied
	Recycled  uint64 // proposal buffers given back to segment's pool for later entries (spend)
	// Pipelined: writes submitted while an earlier one of the same group
	// was in flight (pipelined); Merged: rounds the appender added to
	// an Append of an earlier round's (group commit). Read on the shard.
	Pipelined, Merged uint64
	// SnapshotsSent: snapshots handed to SendSnapshot; SnapshotsInstalled:
	// leaders' snapshots installed here.
	SnapshotsSent, SnapshotsInstalled uint64
}

// Group is one raft group (a durable queue) on a Worker.
type Group struct {
	w   *Worker
	id  uint64
	rn  *raft.RawNode
	st  *raftStorage
	fsm *QueueFSM
	enc EntryEncoder
	// encHint: the size of the last entry finished, which the next
	// entry's buffer is allocated at (the proposal takes the buffer).
	encHint int
	full    [][]byte // entries finished early (encoder caps), proposed next round
	seq     uint64
	leader  bool
	lead    uint64            // the leader raft last reported (0: none known)
	heard   map[uint64]uint64 // peer → the worker's tick it was last heard from (Step)
	ledAt   uint64            // the worker's tick a leader's append, heartbeat or snapshot last came (Step; move.go)
	// lost: as leader, the peers that lost entries they acknowledged
	// (lost.go); lostTerm, lostCommit: as follower, the term of the last
	// heartbeat whose commit was past this copy's log, and that commit.
	lost                 map[uint64]bool
	lostTerm, lostCommit uint64
	// commitIdx and appliedIdx mirror raft's commit index and the FSM's
	// applied index for readers on other goroutines (Indexes).
	commitIdx, appliedIdx atomic.Uint64
	queued                bool
	// inflight: a Ready whose write is with the appender.
	inflight bool
	// installing: a snapshot install is off the shard (install to
	// installed): the log is compacted to the snapshot before the FSM is
	// restored from it (Installing).
	installing bool
	// flights: pipelined writes with the appender (pipelined), and
	// waiting: entries raft committed whose write is not durable yet, or
	// that wait behind such entries, applied once it is, in order.
	flights int
	waiting []raftpb.Entry
	// pendingHS: a commit-only hard state not yet written (written with
	// the group's next batch: commit needs no fsync, design §3.2).
	pendingHS raftpb.HardState
	// held: messages that may go out only once the write is durable
	// (MsgAppResp, MsgVoteResp, MsgPreVoteResp).
	held []raftpb.Message
	// unapplied: bytes proposed here and not yet applied (pacing).
	unapplied int
	conf      raftpb.ConfState // the voters, as of the last conf change applied
	// shownVoters: conf's voters, for readers off the worker (Voters)
	shownVoters atomic.Pointer[[]uint64]
	// snapping: a snapshot is being written and compacted (Snapshot);
	// compactAfter: stored, waiting for commit ≥ its index on disk.
	snapping     bool
	compactAfter *pendingCompact
	// deferred: a leader's snapshot raft took while this node's own
	// snapshot was being stored or compacted (install): installed once
	// that one ends (snapshotEnded). Its compaction, run after the
	// install's, would drop the installed snapshot's live entries.
	deferred *deferredInstall
	// The policy's memory of the last snapshot: its size, when, and the
	// FSM's dead and applied byte counts then.
	lastSnapSize    int
	lastSnapAt      int64
	deadAt, bytesAt uint64
	bodies          bodyCache // Body's views for the current round
	lastTick        int64     // when Tick last added a Tick (0: never)
	ticked          bool
	// forceHS: write the pending commit-only hard state at the next round
	// even without entries (a snapshot needs commit ≥ its index on disk).
	forceHS bool
	err     error
	// removed: Remove closed the group; removing runs the removal once
	// nothing of the group is in flight (a write, a snapshot).
	removed  bool
	removing func()
	// staged: a leader's snapshot stepped and not yet installed or
	// refused (StepSnapshot); resume: the rest of a Ready whose snapshot
	// was installed, handled in the next round.
	staged *SnapshotMessage
	resume *raft.Ready
	// handed: this group's large proposals (the encoder's buffer itself,
	// finish) not yet applied, oldest first, kept while it has one voter
	// and no learners; spent: those applied, whose bytes Body's views of
	// the tail may still show until ReleaseBodies. See spend.
	handed, spent [][]byte
}

// ErrNotLeader: a group with peers takes commands only on its leader
// (design §1.3: the leader stamps them); a follower's would never be
// proposed.
var ErrNotLeader = errors.New("replication: this node does not lead the group")

// ErrWorkerStopped: an Append failed earlier; the worker takes no more
// work (the node must restart and recover).
var ErrWorkerStopped = errors.New("replication: worker stopped after a log write failed; restart to recover")

// NewWorker starts a worker and its appender goroutine; Close stops it.
func NewWorker(log *segment.Log, cfg WorkerConfig) *Worker {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.NodeID == 0 {
		cfg.NodeID = 1
	}
	if cfg.MaxUncommittedBytes <= 0 {
		cfg.MaxUncommittedBytes = 64 << 20
	}
	w := &Worker{log: log, cfg: cfg, ids: map[uint64]*Group{}, done: make(chan struct{})}
	w.work, w.turns = sync.NewCond(&w.mu), sync.NewCond(&w.mu)
	if w.cfg.Pool == nil {
		w.cfg.Pool, w.ownPool = NewPool(4), true
	}
	w.running = appenders
	for range appenders {
		go w.appender()
	}
	return w
}

// Stats returns the counters.
func (w *Worker) Stats() WorkerStats { return w.stats }

// Groups is how many groups are open on the worker.
func (w *Worker) Groups() int { return len(w.ids) }

// ID is the group's id (its segment group).
func (g *Group) ID() uint64 { return g.id }

// FSM is the group's state machine. Its live entries are in the log,
// but while a snapshot install is under way (Installing): the install
// compacts the log to the snapshot, off the shard, before the FSM is
// restored from it.
func (g *Group) FSM() *QueueFSM { return g.fsm }

// Installing reports whether a snapshot install is under way: the FSM is
// still the one from before it, and the log may already hold only the
// snapshot's live entries.
func (g *Group) Installing() bool { return g.installing }

// Leader reports whether this node leads the group (and so may propose).
func (g *Group) Leader() bool { return g.leader }

// Err is the error that stopped the group (a bad entry, a storage
// contract breach), or nil.
func (g *Group) Err() error { return g.err }

func (g *Group) fail(err error) {
	if g.err == nil {
		g.err = err
		g.w.cfg.Logger.Error("replication: group stopped", "group", g.id, "err", err)
	}
}

// Close stops the appender once the submitted writes are done (their
// completions are still posted), and the worker's own pool once its
// queued snapshot jobs ran (a shared Pool is its owner's to close). It
// does not close the log.
func (w *Worker) Close() {
	if w.ownPool {
		defer w.cfg.Pool.Close()
	}
	w.mu.Lock()
	w.closing = true
	w.work.Broadcast()
	w.mu.Unlock()
	<-w.done
}
