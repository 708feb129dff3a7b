package replication

import (
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/warren-mq/warren/queue"
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

// submission is one round's writes: one Append.
type submission struct {
	batches []segment.Batch
	groups  []*Group
	readies []raft.Ready
	hss     []raftpb.HardState // what each batch wrote as hard state (empty: none)
	hsOnly  []bool             // a hard state written for a snapshot, no Ready
	piped   []bool             // a pipelined group's write: Advanced already
	convs   [][]segment.Entry  // each batch's entries (reused; cleared once written)
	bytes   int                // the entries' data
	err     error
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

// maxHanded bounds handed and spent (past it, buffers are left to the
// GC). A busy queue's entries are about entryBufMax each, and 20,000
// messages of 1 KiB in flight (durable.sh's confirm windows) are 20 of
// them: with 16, the rest were built in fresh buffers.
const maxHanded = 64

// ErrGroupRemoved: the group was removed (its queue deleted); it takes no
// more commands.
var ErrGroupRemoved = errors.New("replication: the group was removed (its queue was deleted)")

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

// Remove closes group g for good and then removes its snapshot from store
// (if store is not nil) and its log from segment (Log.RemoveGroup), for a
// deleted queue, after before (if not nil) returned nil: the caller's way
// to wait until the deletion itself is durable (the metadata entry), so a
// crash never leaves a queue whose log is gone. From the call on the group has no more rounds, ticks or
// snapshots, Add refuses with ErrGroupRemoved, what it buffered and did
// not propose is dropped (the caller answers those commands' requests:
// they will never be applied), a snapshot waiting to be compacted is
// abandoned (its done hears ErrGroupRemoved), and nothing it had
// proposed is applied any more. The removal waits until nothing of the
// group is in flight (a write with the appender, a snapshot being
// written or compacted), so nothing writes to the group after it, and
// runs on the pool (it syncs); done (optional) is then posted to the
// shard with its outcome. The group id may be opened again once done ran.
func (w *Worker) Remove(g *Group, store *SnapStore, before func() error, done func(error)) {
	if g.removed {
		return
	}
	g.removed = true
	if g.err == nil {
		g.err = ErrGroupRemoved
	}
	if w.ids[g.id] == g {
		delete(w.ids, g.id)
	}
	clear(g.full)
	g.full, g.enc, g.held = nil, EntryEncoder{}, nil
	g.handed, g.spent = nil, nil
	g.dropStaged()
	g.pendingHS, g.forceHS = raftpb.HardState{}, false
	if p := g.compactAfter; p != nil {
		g.compactAfter, g.snapping = nil, false
		p.done(p.meta, ErrGroupRemoved)
	}
	gid := g.id
	g.removing = func() {
		w.cfg.Pool.Go(func() {
			var err error
			if before != nil {
				err = before()
			}
			if err == nil && store != nil {
				err = store.Forget(gid)
			}
			if err == nil {
				err = w.log.RemoveGroup(gid)
			}
			if err != nil {
				err = fmt.Errorf("replication: removing group %d: %w", gid, err)
			}
			if done != nil {
				w.cfg.Post(func() { done(err) })
			}
		})
	}
	g.maybeRemove()
}

// maybeRemove starts a removed group's removal once nothing of it is in
// flight.
func (g *Group) maybeRemove() {
	if !g.removed || g.removing == nil || g.inflight || g.flights > 0 || g.snapping {
		return
	}
	f := g.removing
	g.removing = nil
	f()
}

// Open opens group gid over the log: its storage from what segment holds
// and snap (the latest snapshot's metadata, ConfState included; for a new
// group index 0 and the voters), its FSM (fsm, restored to snap.Index by
// the caller, or new), and its RawNode, which campaigns at once when this
// node is the only voter. Entries after snap.Index are replayed through
// the FSM by the rounds that follow, with the sink the FSM has (set it to
// nil to drop replayed effects, then SetSink once caught up).
func (w *Worker) Open(gid uint64, snap raftpb.SnapshotMetadata, fsm *QueueFSM) (*Group, error) {
	if w.ids[gid] != nil {
		return nil, fmt.Errorf("replication: group %d is already open", gid)
	}
	if fsm.AppliedIndex() != snap.Index {
		return nil, fmt.Errorf("replication: group %d: the FSM is at entry %d, the snapshot at %d", gid, fsm.AppliedIndex(), snap.Index)
	}
	st, err := openRaftStorage(w.log, gid, snap)
	if err != nil {
		return nil, err
	}
	rc := groupConfig(w.cfg.NodeID, st, snap.Index, w.cfg.Logger)
	rc.MaxUncommittedEntriesSize = uint64(w.cfg.MaxUncommittedBytes)
	rn, err := raft.NewRawNode(rc)
	if err != nil {
		return nil, fmt.Errorf("replication: group %d: %w", gid, err)
	}
	// ledAt starts at the open: LedWithin's quiet window is counted from
	// then, not taken as long past (a copy just opened has not heard from
	// its leader yet, and must not be dropped for that: reconcile.go).
	g := &Group{w: w, id: gid, rn: rn, st: st, fsm: fsm, seq: w.cfg.SeqBase, ledAt: w.ticks}
	g.setConf(snap.ConfState)
	g.appliedIdx.Store(snap.Index)
	g.commitIdx.Store(rn.BasicStatus().Commit)
	if v := snap.ConfState.Voters; len(v) == 1 && v[0] == w.cfg.NodeID && len(snap.ConfState.Learners) == 0 {
		if err := rn.Campaign(); err != nil {
			return nil, fmt.Errorf("replication: group %d: %w", gid, err)
		}
	}
	w.ids[gid] = g
	w.mark(g)
	return g, nil
}

// ID is the group's id (its segment group).
func (g *Group) ID() uint64 { return g.id }

// FSM is the group's state machine.
func (g *Group) FSM() *QueueFSM { return g.fsm }

// Leader reports whether this node leads the group (and so may propose).
func (g *Group) Leader() bool { return g.leader }

// Err is the error that stopped the group (a bad entry, a storage
// contract breach), or nil.
func (g *Group) Err() error { return g.err }

// LastSeq is the proposal seq of the last command added: that of the
// entry being built if it holds any, else that of the last one proposed
// (0 before any). Everything added so far is applied once an entry with
// this seq or a later one of this incarnation has been.
func (g *Group) LastSeq() uint64 {
	if g.enc.Commands() > 0 {
		return g.seq + 1
	}
	return g.seq
}

// Add buffers cmd for the group's next proposal (one entry per group per
// round, design §1.3) and returns the proposal seq of the entry it goes
// into: the entry is applied under that seq (Applied.Header.Seq, with
// Proposer node<<48 | shard), which is how a leader matches the confirms
// it holds to what was applied (§3.4). The command is encoded now: cmd
// may be reused when Add returns. Its time and message ids are set at
// apply.
func (g *Group) Add(cmd queue.Command) (seq uint64, err error) {
	if err := g.canAdd(); err != nil {
		return 0, err
	}
	err = g.enc.Add(cmd)
	if errors.Is(err, ErrEntryFull) {
		g.endEntry()
		err = g.enc.Add(cmd)
	}
	return g.added(err)
}

// AddEnqueue adds an Enqueue of msgs whose bodies src writes straight
// into the entry (EntryEncoder.AddEnqueue: one copy of each body, where
// building an Enqueue's Bodies for Add costs two); as Add.
func (g *Group) AddEnqueue(nowMs int64, msgs []queue.Message, src queue.BodySource) (seq uint64, err error) {
	if err := g.canAdd(); err != nil {
		return 0, err
	}
	err = g.enc.AddEnqueue(nowMs, msgs, src)
	if errors.Is(err, ErrEntryFull) {
		g.endEntry()
		err = g.enc.AddEnqueue(nowMs, msgs, src)
	}
	return g.added(err)
}

// canAdd says whether the group takes commands (and readies the
// encoder: presize).
func (g *Group) canAdd() error {
	if g.err != nil {
		return g.err
	}
	if !g.leader && (len(g.conf.Voters) > 1 || len(g.conf.Learners) > 0) {
		return ErrNotLeader
	}
	if g.w.failed != nil {
		return ErrWorkerStopped
	}
	g.presize()
	return nil
}

// Sizes of a busy group's entries: once an entry holds splitMin bytes
// (half of entryBufMax),
// it ends where its buffer is full, and a new one starts, rather than
// being copied into a buffer twice the size (a round of a busy queue
// brings megabytes, in amounts that vary from round to round); and a
// new entry's buffer is at most entryBufMax. So a busy queue's entries
// are about entryBufMax each, their buffers all of one size, which the
// pool of proposal buffers has at hand (growing by copies, from
// buffers of every size, the pool mostly missed: a fresh buffer, zeroed
// and faulted in, and a copy of every body, per entry).
const (
	splitMin    = entryBufMax / 2
	entryBufMax = 1 << 20
)

// presize gives an encoder with no buffer one of about the size of the
// group's last entry, and sets it to split.
func (g *Group) presize() {
	g.enc.split = splitMin
	if g.enc.buf == nil && g.encHint > handMin {
		g.enc.buf = propBuf(min(g.encHint+g.encHint/4, entryBufMax))
	}
}

// endEntry ends the entry being built (its encoder is full): proposed in
// the next round, before the next entry.
func (g *Group) endEntry() {
	g.full = append(g.full, g.finish(g.w.now))
	g.presize()
}

// added ends an Add: the seq of the entry the command went into.
func (g *Group) added(err error) (uint64, error) {
	if err != nil {
		return 0, err
	}
	g.w.mark(g)
	return g.seq + 1, nil
}

// finish takes the encoder's entry as a proposal of its own (raft keeps
// the bytes until applied) and resets the encoder.
func (g *Group) finish(now int64) []byte {
	g.seq++
	h := EntryHeader{NowMs: now, Proposer: g.w.cfg.NodeID<<48 | g.w.cfg.Shard, Seq: g.seq}
	// A large entry (a round of a busy queue): the proposal takes the
	// encoder's buffer (no copy: at 1 KiB a message, copies and the page
	// faults of fresh buffers were most of a durable queue's CPU) and the
	// next entry's buffer is allocated at its first Add at about this
	// size, so it does not grow by copies. A small one is copied out
	// exactly and the buffer kept (raft holds a proposal until it is
	// applied: not in a buffer sized for a burst), except a burst's
	// buffer, which not every group keeps. The hint decays: a burst's
	// size is not kept for good.
	//
	// A solo group's entries over handMin bytes that fill at least a
	// quarter of their buffer are handed over too, and their buffers come
	// back once applied (spend): copying a round's entry out for each of
	// many queues was a copy of every body. (A small entry in a buffer
	// sized for a burst is still copied out.)
	data := g.enc.Finish(h)
	g.encHint -= g.encHint / 8
	solo := g.solo()
	if len(data) > 256<<10 || solo && len(data) > handMin && len(data) >= cap(data)/4 {
		g.enc = EntryEncoder{}
		g.encHint = max(g.encHint, len(data))
		if solo && len(g.handed) < maxHanded {
			g.handed = append(g.handed, data)
		}
		return data
	}
	data = append([]byte(nil), data...)
	g.enc.Reset()
	if cap(g.enc.buf) > 256<<10 {
		putPropBuf(g.enc.buf) // copied out: nothing refers to it
		g.enc = EntryEncoder{}
	}
	return data
}

func (w *Worker) mark(g *Group) {
	if !g.queued {
		g.queued = true
		w.dirty = append(w.dirty, g)
	}
}

// Round runs one round at time now (ms, the shard's clock): it proposes
// what every dirty group buffered, collects and handles their Readys
// (up to 4 passes, so a group that became leader or advanced in this
// round proposes or applies at once), and submits the round's writes as
// one Append. It reports whether groups are still dirty (the shard should
// run another round soon).
func (w *Worker) Round(now int64) (more bool) {
	w.stats.Rounds++
	w.now = now
	if w.failed != nil {
		return false
	}
	for pass := 0; pass < 4 && len(w.dirty) > 0; pass++ {
		groups := w.dirty
		w.dirty, w.spare = w.spare[:0], groups
		for _, g := range groups {
			g.queued = false
			if g.err == nil {
				w.process(g, now)
			}
		}
		clear(groups)
	}
	if w.sub != nil {
		w.mu.Lock()
		w.queue = append(w.queue, w.sub)
		w.work.Signal()
		w.mu.Unlock()
		w.sub = nil
		w.stats.Appends++
	}
	return len(w.dirty) > 0
}

// process proposes g's buffered entries and handles its Ready.
func (w *Worker) process(g *Group, now int64) {
	// raft drops every proposal while a leadership transfer is pending:
	// what is buffered waits. An abandoned transfer (the target did not
	// take over within an election timeout) leaves this node leading, and
	// its next Ready (a heartbeat round) proposes it; a transfer that
	// succeeds drops it with the leadership (below), its waiters answered
	// at the step-down.
	if g.leader && g.rn.BasicStatus().LeadTransferee == raft.None {
		// Pace each entry below raft's uncommitted limit: what is left
		// waits for a later round (once applies brought unapplied down),
		// since raft would drop it, commands and all. One entry always
		// goes when nothing is unapplied (raft takes one of any size then).
		limit := w.cfg.MaxUncommittedBytes / 2
		k := 0
		for k < len(g.full) && (g.unapplied == 0 || g.unapplied+len(g.full[k]) <= limit) {
			g.propose(g.full[k])
			k++
		}
		if k > 0 {
			n := copy(g.full, g.full[k:])
			clear(g.full[n:])
			g.full = g.full[:n]
		}
		if len(g.full) == 0 && g.enc.Commands() > 0 && (g.unapplied == 0 || g.unapplied+g.enc.Len() <= limit) {
			g.propose(g.finish(now))
		}
		if len(g.full) > 0 || g.enc.Commands() > 0 {
			defer w.mark(g) // left for the next round
		}
	}
	if g.inflight {
		return
	}
	if g.resume != nil {
		rd := *g.resume
		g.resume = nil
		w.handle(g, rd, now)
		return
	}
	if !g.rn.HasReady() {
		if g.forceHS && !raft.IsEmptyHardState(g.pendingHS) {
			g.forceHS = false
			if err := w.submit(g, raft.Ready{}, g.pendingHS, true, false); err != nil {
				g.fail(err)
				return
			}
			g.pendingHS = raftpb.HardState{}
		}
		return
	}
	rd := g.rn.Ready()
	if rd.SoftState != nil {
		was := g.leader
		g.leader = rd.SoftState.RaftState == raft.StateLeader
		if g.leader != was {
			g.dropHanded()
			g.lost = nil // a new leader's progress starts from nothing
		}
		if g.leader && !was {
			// A new term: nothing is proposed in it yet. What this node
			// proposed as an earlier leader may have been overwritten and
			// is never applied; raft forgets its size here too.
			g.unapplied = 0
		}
		if was && !g.leader {
			// Commands buffered for a proposal this node may no longer
			// make: dropped (their waiters hear LeaderChanged).
			clear(g.full)
			g.full = g.full[:0]
			g.enc.Reset()
		}
		if f := w.cfg.LeaderChanged; f != nil && (g.lead != rd.SoftState.Lead || was != g.leader) {
			g.lead = rd.SoftState.Lead
			f(g, g.lead, g.leader)
		}
		g.lead = rd.SoftState.Lead
	}
	if !raft.IsEmptyHardState(rd.HardState) {
		g.commitIdx.Store(rd.HardState.Commit)
	}
	if !raft.IsEmptySnap(rd.Snapshot) {
		g.install(rd) // then the rest of rd (resume)
		return
	}
	g.dropStaged() // raft did not take it (or there was none)
	w.handle(g, rd, now)
}

// handle applies, sends and writes what a Ready holds (its snapshot, if
// any, installed already).
func (w *Worker) handle(g *Group, rd raft.Ready, now int64) {
	// raft's order: a Ready's entries are stored before its committed
	// entries are applied. Those stored already apply now; the rest (a
	// follower handed entries the others committed) once this Ready's
	// write is durable, in persisted.
	applied := g.fsm.AppliedIndex()
	if err := g.applyDurable(rd.CommittedEntries); err != nil {
		g.fail(err)
		return
	}
	g.maybeAutoSnapshot(applied, now)
	write := len(rd.Entries) > 0 || rd.MustSync
	if len(rd.Messages) > 0 {
		if hs := rd.HardState; write && !raft.IsEmptyHardState(hs) && (hs.Term != g.st.hs.Term || hs.Vote != g.st.hs.Vote) {
			// A new term or vote: nothing goes before it is on disk (a
			// candidate's vote request, a new term's first append).
			g.held = append(g.held, rd.Messages...)
		} else if write {
			g.sendEarly(rd.Messages)
		} else {
			// Nothing to write and nothing in flight: whatever these
			// acknowledge is durable already (a pre-vote answer, a
			// retransmitted append this node holds), so none waits.
			g.send(rd.Messages)
		}
	}
	hs := rd.HardState
	if raft.IsEmptyHardState(hs) {
		hs = g.pendingHS
	}
	if write && w.pipelined(g, rd) {
		// Raft hears now that the entries are stable (a single voter
		// commits them at once); applyDurable holds them back until
		// persisted says they are.
		if err := w.submit(g, rd, hs, false, true); err != nil {
			g.fail(err)
			return
		}
		g.pendingHS = raftpb.HardState{}
		if err := g.st.stage(rd.Entries); err != nil {
			g.fail(err)
			return
		}
		if g.flights > 0 {
			w.stats.Pipelined++
		}
		g.flights++
		g.rn.Advance(rd)
		w.mark(g)
		return
	}
	if write {
		if err := w.submit(g, rd, hs, false, false); err != nil {
			g.fail(err)
			return
		}
		g.pendingHS = raftpb.HardState{}
		return
	}
	// Nothing to write (a commit-only hard state is written lazily, with
	// the group's next entries): advance now.
	if !raft.IsEmptyHardState(rd.HardState) {
		g.pendingHS = rd.HardState
	}
	g.rn.Advance(rd)
	w.mark(g)
}

// pipelined reports whether g's Ready rd may be written pipelined
// (handle): on a single node (no transport: no other replica ever sees
// an entry before this node made it durable), a group that is its own
// only voter and leads, and rd changes neither term nor vote (those are
// made durable before anything follows, as usual). Its entries are then
// committed in raft's view before they are durable; nothing acts on
// that but applyDurable, which waits for the write.
func (w *Worker) pipelined(g *Group, rd raft.Ready) bool {
	if w.cfg.Send != nil || !g.leader || !g.solo() || len(rd.Messages) > 0 || g.inflight {
		return false
	}
	hs := rd.HardState
	return raft.IsEmptyHardState(hs) || hs.Term == g.st.hs.Term && hs.Vote == g.st.hs.Vote
}

// submit adds a group's batch (rd's entries and hs) to the round's
// Append; a pipelined one does not hold the group's next Ready.
func (w *Worker) submit(g *Group, rd raft.Ready, hs raftpb.HardState, hsOnly, piped bool) error {
	if w.sub == nil {
		if n := len(w.free); n > 0 {
			w.sub, w.free = w.free[n-1], w.free[:n-1]
		} else {
			w.sub = &submission{}
		}
	}
	sub := w.sub
	k := len(sub.batches)
	if k == len(sub.convs) {
		sub.convs = append(sub.convs, nil)
	}
	b, conv, err := g.st.batchTo(sub.convs[k][:0], rd.Entries, hs)
	sub.convs[k] = conv
	if err != nil {
		return err
	}
	for _, e := range b.Entries {
		sub.bytes += len(e.Data)
	}
	sub.batches = append(sub.batches, b)
	sub.groups = append(sub.groups, g)
	sub.readies = append(sub.readies, rd)
	sub.hss = append(sub.hss, hs)
	sub.hsOnly = append(sub.hsOnly, hsOnly)
	sub.piped = append(sub.piped, piped)
	if !piped {
		g.inflight = true
	}
	return nil
}

func (g *Group) propose(data []byte) {
	if err := g.rn.Propose(data); err != nil {
		// No leader, a transfer, or raft's size limit: the entry's commands
		// are not in the log (design §3.4: their confirms are nacked).
		g.w.stats.Dropped++
		g.w.cfg.Logger.Warn("replication: proposal dropped", "group", g.id, "err", err)
		return
	}
	g.unapplied += len(data)
	g.w.stats.Proposals++
}

// apply applies committed entries to the FSM and lets the storage drop
// them from its tail cache.
func (g *Group) apply(ents []raftpb.Entry) error {
	for i := range ents {
		e := &ents[i]
		var data []byte
		switch e.Type {
		case raftpb.EntryNormal:
			data = e.Data
		case raftpb.EntryConfChange:
			var cc raftpb.ConfChange
			if err := cc.Unmarshal(e.Data); err != nil {
				return fmt.Errorf("replication: group %d: conf change %d: %w", g.id, e.Index, err)
			}
			g.setConf(*g.rn.ApplyConfChange(cc))
			g.forgetLost()
		case raftpb.EntryConfChangeV2:
			var cc raftpb.ConfChangeV2
			if err := cc.Unmarshal(e.Data); err != nil {
				return fmt.Errorf("replication: group %d: conf change %d: %w", g.id, e.Index, err)
			}
			g.setConf(*g.rn.ApplyConfChange(cc))
			g.forgetLost()
		}
		if _, err := g.fsm.Apply(e.Index, data); err != nil {
			return fmt.Errorf("replication: group %d: %w", g.id, err)
		}
		g.unapplied = max(0, g.unapplied-len(data))
		g.w.stats.Applied++
		if len(g.handed) > 0 && len(e.Data) > handMin {
			g.spend(e.Data)
		}
	}
	if n := len(ents); n > 0 {
		g.st.applied(ents[n-1].Index)
		g.appliedIdx.Store(ents[n-1].Index)
	}
	if len(g.spent) > 0 && len(g.bodies.entries) == 0 {
		g.recycle() // no view of the tail is out
	}
	return nil
}

// applyDurable applies committed entries ents in order as far as they
// are durable here (stored: a Ready's committed entries may include ones
// its own write, or a pipelined write in flight, is still storing) and
// keeps the rest, and any behind entries already waiting, in waiting for
// applyWaiting. Raft may count them applied: it hands them out once.
func (g *Group) applyDurable(ents []raftpb.Entry) error {
	if len(g.waiting) == 0 {
		k := 0
		for k < len(ents) && ents[k].Index <= g.st.durable {
			k++
		}
		if err := g.apply(ents[:k]); err != nil {
			return err
		}
		ents = ents[k:]
	}
	g.waiting = append(g.waiting, ents...)
	return g.applyWaiting()
}

// applyWaiting applies the waiting entries that are durable now.
func (g *Group) applyWaiting() error {
	k := 0
	for k < len(g.waiting) && g.waiting[k].Index <= g.st.durable {
		k++
	}
	if k == 0 {
		return nil
	}
	err := g.apply(g.waiting[:k])
	n := copy(g.waiting, g.waiting[k:])
	clear(g.waiting[n:]) // their data: the bodies
	g.waiting = g.waiting[:n]
	return err
}

// solo: the group has one voter and no learners (and is not changing
// that): nothing but this node's raft, storage and Body's views refers
// to its proposals' bytes.
func (g *Group) solo() bool {
	c := &g.conf
	return len(c.Voters) == 1 && len(c.VotersOutgoing) == 0 && len(c.Learners) == 0 && len(c.LearnersNext) == 0
}

// spend is the apply of a large entry, data: if it is the oldest of the
// group's own large proposals (the same bytes, not a copy read back from
// segment) and the group still has one voter, the buffer is spent. Then
// nothing will read it again: raft let go of it when the write was
// persisted (a single voter commits its entries only then, and the
// unstable log drops them), segment wrote it before that, the tail
// cache dropped it with this apply (g.st.applied), and no follower's
// append carries it. What remains is the views Body handed out of the
// tail (and the apply callbacks', over by now): recycle gives the buffer
// back once they are released. An earlier entry of this group's own
// proposer (by its header's seq) that is not the buffer handed is one
// finish copied out: passed over. Anything else (a proposal raft
// dropped, an entry read from segment, a change of voters or of leader)
// forgets every buffer handed: the GC takes them.
func (g *Group) spend(data []byte) {
	h := g.handed[0]
	if g.solo() && unsafe.SliceData(data) != unsafe.SliceData(h) && len(data) >= entryHeaderLen &&
		le.Uint64(data[16:]) == le.Uint64(h[16:]) && le.Uint64(data[24:]) < le.Uint64(h[24:]) {
		return
	}
	if !g.solo() || unsafe.SliceData(data) != unsafe.SliceData(h) || len(g.spent) >= maxHanded {
		g.dropHanded()
		return
	}
	g.spent = append(g.spent, g.handed[0])
	n := copy(g.handed, g.handed[1:])
	g.handed[n] = nil
	g.handed = g.handed[:n]
}

func (g *Group) dropHanded() {
	clear(g.handed)
	g.handed = g.handed[:0]
}

// recycle gives the spent proposal buffers back to segment's pool of
// large buffers (the next large entry of any group is built in one): no
// view of them is out.
func (g *Group) recycle() {
	for i, b := range g.spent {
		if putPropBuf(b) {
			g.w.stats.Recycled++
		}
		g.spent[i] = nil
	}
	g.spent = g.spent[:0]
}

// sendEarly sends what may go before the write is durable and holds the
// rest (the thesis's §10.2.1 rule: a leader's appends and heartbeats go
// at once; acknowledgements of durability wait).
func (g *Group) sendEarly(msgs []raftpb.Message) {
	var now []raftpb.Message
	for _, m := range msgs {
		switch m.Type {
		case raftpb.MsgAppResp, raftpb.MsgVoteResp, raftpb.MsgPreVoteResp:
			g.held = append(g.held, m)
		default:
			now = append(now, m)
		}
	}
	g.send(now)
}

func (g *Group) send(msgs []raftpb.Message) {
	n := 0
	for _, m := range msgs {
		if m.Type == raftpb.MsgSnap {
			g.sendSnapshot(m) // with its data and live entries (install.go)
			continue
		}
		if m.Type == raftpb.MsgAppResp && m.Reject && m.Term == g.lostTerm && g.st.last < g.lostCommit {
			m.Commit = g.lostCommit // (lost.go)
		}
		msgs[n] = m
		n++
	}
	msgs = msgs[:n]
	if len(msgs) == 0 {
		return
	}
	if g.w.cfg.Send == nil {
		g.fail(fmt.Errorf("replication: group %d has messages for peers and there is no transport (cluster step)", g.id))
		return
	}
	g.w.cfg.Send(g.id, msgs)
}

func (g *Group) fail(err error) {
	if g.err == nil {
		g.err = err
		g.w.cfg.Logger.Error("replication: group stopped", "group", g.id, "err", err)
	}
}

// persisted runs on the shard once the appender's Append of sub returned.
func (w *Worker) persisted(sub *submission) {
	w.stats.Persisted++
	if sub.err != nil {
		w.stop(sub.err)
		return
	}
	for i, g := range sub.groups {
		piped := sub.piped[i]
		if piped {
			g.flights--
		} else {
			g.inflight = false
		}
		if g.removed {
			g.maybeRemove()
			continue
		}
		rd := sub.readies[i]
		if piped {
			last := g.st.durable
			if n := len(rd.Entries); n > 0 {
				last = rd.Entries[n-1].Index
			}
			g.st.persisted(last, sub.hss[i])
		} else if err := g.st.appended(rd.Entries, sub.hss[i]); err != nil {
			g.fail(err)
			continue
		}
		w.mark(g)
		g.maybeCompact()
		// Committed entries that were not durable when their Ready came.
		applied := g.fsm.AppliedIndex()
		if err := g.applyWaiting(); err != nil {
			g.fail(err)
			continue
		}
		g.maybeAutoSnapshot(applied, w.now)
		if sub.hsOnly[i] || piped {
			continue // no Ready behind it, or Advanced already
		}
		held := g.held
		g.held = nil
		g.send(held)
		g.rn.Advance(rd)
	}
	clear(sub.batches)
	clear(sub.groups)
	clear(sub.readies)
	for _, c := range sub.convs {
		clear(c[:cap(c)]) // the entries' data: the bodies
	}
	*sub = submission{batches: sub.batches[:0], groups: sub.groups[:0], readies: sub.readies[:0], hss: sub.hss[:0],
		hsOnly: sub.hsOnly[:0], piped: sub.piped[:0], convs: sub.convs}
	w.free = append(w.free, sub)
}

// stop stops the worker for good after a failed write and tells Fatal.
func (w *Worker) stop(err error) {
	if w.failed == nil {
		w.failed = err
		if w.cfg.Fatal != nil {
			w.cfg.Fatal(err)
		}
	}
}

// appenders is how many appender goroutines a worker runs: two, so one
// writes while the other's fdatasync runs (segment keeps two writes in
// flight), and the disk does not wait for a write() of the next rounds.
const appenders = 2

// appender makes the rounds' writes durable and posts their completions
// back to the shard, in the order the rounds were submitted: every round
// queued since an appender's last Append goes into its next one (group
// commit: one write and one fdatasync for all of them, pipelined rounds
// of one group included). segment makes Appends durable in the order
// they took their place (a later one returns after an earlier one), and
// the tickets keep the completions in that order too.
func (w *Worker) appender() {
	defer func() {
		w.mu.Lock()
		w.running--
		last := w.running == 0
		w.mu.Unlock()
		if last {
			close(w.done)
		}
	}()
	var subs []*submission
	var batches []segment.Batch
	for {
		w.mu.Lock()
		for len(w.queue) == 0 && !w.closing {
			w.work.Wait()
		}
		if len(w.queue) == 0 {
			w.mu.Unlock()
			return
		}
		n, size := 0, 0
		for n < len(w.queue) && (n == 0 || size+w.queue[n].bytes <= maxMerged) {
			size += w.queue[n].bytes
			n++
		}
		subs = append(subs[:0], w.queue[:n]...)
		k := copy(w.queue, w.queue[n:])
		clear(w.queue[k:])
		w.queue = w.queue[:k]
		if k > 0 {
			w.work.Signal() // the other appender may take the rest
		}
		ticket := w.tickets
		w.tickets++
		// The Appends take their places in the log in ticket order too:
		// a group's later entries must not be written before its earlier
		// ones. An Append has its place once segment queued its batches
		// (enter), or once it returned.
		for w.entered != ticket {
			w.turns.Wait()
		}
		w.mu.Unlock()
		batches = batches[:0]
		for _, sub := range subs {
			batches = append(batches, sub.batches...)
		}
		in := false
		enter := func() {
			if !in {
				in = true
				w.mu.Lock()
				w.entered++
				w.turns.Broadcast()
				w.mu.Unlock()
			}
		}
		err := w.log.AppendThen(enter, batches...)
		enter()
		clear(batches)
		done := append([]*submission(nil), subs...)
		clear(subs)
		w.mu.Lock()
		for w.turn != ticket {
			w.turns.Wait()
		}
		w.mu.Unlock()
		w.cfg.Post(func() {
			w.stats.Merged += uint64(len(done) - 1)
			for _, sub := range done {
				sub.err = err
				w.persisted(sub)
			}
		})
		w.mu.Lock()
		w.turn++
		w.turns.Broadcast()
		w.mu.Unlock()
	}
}

// maxMerged bounds the entry bytes of the rounds the appender merges
// into one Append (segment takes at most 256 MiB in one).
const maxMerged = 64 << 20

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

// ErrSnapshotLater: a snapshot of the group is still in progress; try
// again after it finished.
var ErrSnapshotLater = errors.New("replication: a snapshot is in progress; retry once it is done")

type pendingCompact struct {
	meta raftpb.SnapshotMetadata
	live []uint64
	done func(raftpb.SnapshotMetadata, error)
}

// Snapshot snapshots the group at its applied index S into store and then
// compacts its log to S, keeping the entries that still hold messages
// (design §2.4). The snapshot is taken now, on the shard (O(held
// messages)); the store's write runs on a goroutine of its own, and once
// it is durable and the group's commit index ≥ S is on disk too (segment
// and raft require it before a compaction: the next round writes a
// pending commit-only hard state for it), the compaction runs on another.
// done is posted back to the shard with the outcome, after the storage
// knows the log starts at S+1. It returns ErrSnapshotLater while a
// snapshot is in progress, and nil without calling done when nothing was
// applied since the last one.
func (g *Group) Snapshot(store *SnapStore, done func(meta raftpb.SnapshotMetadata, err error)) error {
	if g.err != nil {
		return g.err
	}
	if g.w.failed != nil {
		return ErrWorkerStopped
	}
	if g.snapping {
		return ErrSnapshotLater
	}
	at := g.fsm.AppliedIndex()
	if at <= g.st.snap.Index {
		return nil
	}
	term, err := g.st.Term(at)
	if err != nil {
		return fmt.Errorf("replication: group %d: term of applied entry %d: %w", g.id, at, err)
	}
	meta := raftpb.SnapshotMetadata{Index: at, Term: term, ConfState: g.conf}
	data, err := g.fsm.Snapshot()
	if err != nil {
		return err
	}
	p := &pendingCompact{meta: meta, live: g.fsm.LiveEntries(nil, at), done: done}
	g.snapping = true
	g.lastSnapSize, g.lastSnapAt = len(data), g.w.now
	g.deadAt, g.bytesAt = g.fsm.DeadBytes(), g.fsm.AppliedBytes()
	w := g.w
	w.cfg.Pool.Go(func() {
		err := store.Put(g.id, meta, data)
		w.cfg.Post(func() {
			if err == nil && g.removed {
				err = ErrGroupRemoved
			}
			if err != nil {
				g.snapping = false
				done(meta, err)
				g.maybeRemove()
				return
			}
			g.compactAfter = p
			g.maybeCompact()
		})
	})
	return nil
}

// Tick adds a queue Tick command (design §1.4: time-driven work is a log
// decision) to every group this node leads whose queue's latest Timer
// (QueueFSM.WakeAt) is due at now, at most one per group per 10 ms; the
// next Round proposes it, alongside the group's other commands if any.
// It returns how many groups got one. Call it from the shard's timer,
// armed at NextWake. O(groups).
func (w *Worker) Tick(now int64) int {
	n := 0
	for _, g := range w.ids {
		if !g.leader || g.err != nil || w.failed != nil {
			continue
		}
		at, ok := g.fsm.WakeAt()
		if !ok || at > now || g.ticked && now-g.lastTick < 10 {
			continue
		}
		if _, err := g.Add(&queue.Tick{NowMs: now}); err != nil {
			continue
		}
		g.lastTick, g.ticked = now, true
		n++
	}
	return n
}

// NextWake is the earliest time a group this node leads needs a Tick, and
// whether any does. O(groups).
func (w *Worker) NextWake() (int64, bool) {
	at, any := int64(0), false
	for _, g := range w.ids {
		if !g.leader || g.err != nil {
			continue
		}
		if t, ok := g.fsm.WakeAt(); ok && (!any || t < at) {
			at, any = t, true
		}
	}
	return at, any
}

// SnapshotDue applies the snapshot policy of design §2.4 at time now (ms):
// a snapshot is due when it frees much more log than it writes (the log
// bytes that died since the last one reach max(1 MiB, snapReclaimFactor
// times its size)), when
// enough log was applied since to bound a replay (max(64 MiB, four times
// its size)), or when some log is reclaimable and the last snapshot is 5 s
// old (idle clean-up).
func (g *Group) SnapshotDue(now int64) bool {
	if g.lastSnapAt == 0 {
		g.lastSnapAt = now // the idle clock starts at the first check
	}
	reclaim := g.fsm.DeadBytes() - g.deadAt
	since := g.fsm.AppliedBytes() - g.bytesAt
	last := uint64(g.lastSnapSize)
	return reclaim >= max(1<<20, snapReclaimFactor*last) ||
		since >= max(64<<20, 4*last) ||
		(reclaim > 0 && now-g.lastSnapAt >= 5000)
}

// snapReclaimFactor: a snapshot is taken once the log it frees is this
// many times its size. Every snapshot is written in full (48 B per held
// message), so the factor bounds what snapshots add to the log's writes:
// with 2, a queue holding 20,000 messages in flight wrote a 1 MB snapshot
// per 2 MB of bodies consumed, a quarter more than the bodies themselves
// (BENCHMARKS.md, durable queues). The dead log waits longer for its
// snapshot; it is still freed before its WAL file is moved into segment
// files (segment.Options.MoveLag: 256 MiB of appends later) unless the
// snapshot is over 32 MiB (some 700,000 held messages).
const snapReclaimFactor = 8

// maybeAutoSnapshot takes a snapshot if entries were applied since
// the FSM was at entry before and the policy asks for one.
func (g *Group) maybeAutoSnapshot(before uint64, now int64) {
	if g.fsm.AppliedIndex() > before && g.w.cfg.Snapshots != nil && !g.snapping && g.err == nil && g.SnapshotDue(now) {
		g.autoSnapshot()
	}
}

// autoSnapshot takes a snapshot the policy asked for.
func (g *Group) autoSnapshot() {
	w := g.w
	err := g.Snapshot(w.cfg.Snapshots, func(meta raftpb.SnapshotMetadata, err error) {
		if err != nil && !errors.Is(err, ErrGroupRemoved) { // a queue deleted meanwhile: nothing failed
			w.cfg.Logger.Error("replication: snapshot failed", "group", g.id, "index", meta.Index, "err", err)
		}
		if w.cfg.SnapshotDone != nil {
			w.cfg.SnapshotDone(g, meta, err)
		}
	})
	if err != nil && !errors.Is(err, ErrSnapshotLater) {
		w.cfg.Logger.Error("replication: snapshot not started", "group", g.id, "err", err)
	}
}

// MaybeSnapshot applies the snapshot policy to every group (the idle
// rule needs a clock: call it from a periodic timer, every few seconds).
// O(groups).
func (w *Worker) MaybeSnapshot(now int64) {
	if w.cfg.Snapshots == nil || w.failed != nil {
		return
	}
	w.now = max(w.now, now)
	for _, g := range w.ids {
		if g.err == nil && !g.snapping && g.SnapshotDue(now) {
			g.autoSnapshot()
		}
	}
}

// maybeCompact starts the compaction of a stored snapshot once the
// group's commit index on disk covers it, or asks the next round to write
// the commit.
func (g *Group) maybeCompact() {
	p := g.compactAfter
	if p == nil {
		return
	}
	if g.st.hs.Commit < p.meta.Index {
		g.forceHS = true
		g.w.mark(g)
		return
	}
	g.compactAfter = nil
	w := g.w
	// The storage starts after the snapshot from now on, before segment
	// drops anything: raft must never ask segment for an entry the
	// compaction may have dropped (a leader sending to a follower;
	// ErrUnavailable there panics raft). The snapshot is durable in the
	// store already, and raft sends it instead.
	if err := g.st.compacted(p.meta); err != nil {
		g.snapping = false
		p.done(p.meta, err)
		g.maybeRemove()
		return
	}
	w.cfg.Pool.Go(func() {
		err := w.log.Compact(g.id, p.meta.Index, p.live)
		w.cfg.Post(func() {
			g.snapping = false
			if err == nil && g.removed {
				err = ErrGroupRemoved
			}
			p.done(p.meta, err)
			g.maybeRemove()
		})
	})
}

// Recover opens group gid after a restart: its FSM restored from its
// latest snapshot in store (or, without one, a new FSM over newMachine()
// with the voters given), its storage and RawNode over the log, and then
// the one Compact segment requires after a restart, which also checks
// that every entry still holding a message is stored (segment.ErrCorrupt
// names the group otherwise). The entries after the snapshot are replayed
// by the following rounds, through sink (nil while replaying is usual;
// SetSink when caught up).
func (w *Worker) Recover(gid uint64, store *SnapStore, voters raftpb.ConfState, newMachine func() *queue.Machine, sink Sink) (*Group, error) {
	meta, data, ok, err := store.Load(gid)
	if err != nil {
		return nil, fmt.Errorf("replication: group %d: loading its snapshot: %w", gid, err)
	}
	var fsm *QueueFSM
	var install []segment.Entry
	if ok {
		if data, install, err = splitInstall(data); err != nil {
			return nil, fmt.Errorf("replication: group %d: %w", gid, err)
		}
		if fsm, err = RestoreQueueFSM(meta.Index, data, sink); err != nil {
			return nil, fmt.Errorf("replication: group %d: %w", gid, err)
		}
	} else {
		meta = raftpb.SnapshotMetadata{ConfState: voters}
		fsm = NewQueueFSM(newMachine(), 0, sink)
	}
	g, err := w.Open(gid, meta, fsm)
	if err != nil {
		return nil, err
	}
	if meta.Index > 0 {
		live := fsm.LiveEntries(nil, meta.Index)
		if install != nil {
			// A leader's snapshot: redo what a crash may have left undone
			// of its install (install.go), then the same check.
			err = completeInstall(w.log, gid, meta, live, install)
		} else {
			err = w.log.Compact(gid, meta.Index, live)
		}
		if err != nil {
			g.fail(err)
			delete(w.ids, gid)
			return nil, fmt.Errorf("replication: group %d: %w", gid, err)
		}
	}
	return g, nil
}
