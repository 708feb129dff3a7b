package broker

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/warren-mq/warren/queue"
	"github.com/warren-mq/warren/replication"
)

// This file is the shard's loop: commands in, batches run, effects
// handed out (handle) and flushed, timers. A queue's life on the shard
// is in shard_queue.go (created, its bodies freed, deleted), publishing
// into it in shard_enqueue.go (and confirms held back), consumers and
// settles in shard_consume.go, dead-lettering in shard_deadletter.go
// (the at-least-once part for durable queues: deadletter.go).

// shard owns a set of queues and runs their commands one batch at a time.
// Loops submit commands (values, one per batch of work); the shard drains
// them in batches and hands the effects to their sinks. Its own goroutine
// runs the batches, or, while that goroutine is idle and the shard holds
// only in-memory queues, the loop that submits runs its batch itself
// (submitInline): one goroutine hand-off fewer each way, which at low
// rates is most of a message's latency tail.
type shard struct {
	b     *Broker
	idx   int // in Broker.shards
	mu    sync.Mutex
	inbox []Command
	spare []Command
	wake  chan struct{}
	// own is held by whoever runs the shard's work (everything below
	// "shard-owned"): its goroutine, or a loop in submitInline.
	own sync.Mutex
	// inline says whether a loop may run the shard's work (setInline;
	// written with own held).
	inline atomic.Bool
	// barrierQs are the durable queues with barriers waiting for an apply
	// (answerBarriers).
	barrierQs []*Queue
	stop      chan struct{}
	done      chan struct{}

	// shard-owned
	queues  map[*Queue]struct{}
	holding map[*Queue]struct{} // queues holding confirms back (Queue.held not empty)
	byGroup map[uint64]*Queue   // replicated queues by group id (replicated.go)
	moves   shardMoves          // replicated queues with a move pending (reconcile.go)
	// Publishes forwarded to other nodes, waiting for their confirm
	// (forward.go): the stream to each queue, and the bytes they hold.
	streams map[queue.QueueRef]*fwdStream
	fwdHeld int
	fwdInc  uint64     // the last enqueuer incarnation a stream took (newInc)
	fc      fwdConsume // forwarded consumers and the links served (forward_consume.go)
	now     int64      // ms, stamped once per drained batch
	// timers orders the queues waiting for a Tick by wake time; the timer
	// is armed for armedAt (0: not armed), the earliest of them.
	timers     timerHeap
	armedAt    int64
	due        []*Queue // scratch: the queues a timer firing or a Down looks at
	conns      connIndex
	tickCmd    Command            // the CmdTick being applied for the timer
	leased     []queue.ConsumerID // scratch: consumers handle told of a lease expiry
	timer      *time.Timer
	msgScratch []queue.Message
	// bytesDelta accumulates stored-byte changes, folded into the server's
	// counter once per batch rather than once per message.
	bytesDelta int64

	tagScratch []uint64 // liveRun's

	// deliveries gathered during a batch, handed per sink at its end; a
	// consumer record keeps its sink's batch, so a delivery costs no
	// lookup here (pending is looked in once per consumer)
	pending map[Sink]*sinkBatch
	touched []*sinkBatch
	// flushes counts flushEffects calls; every pendingSweepEvery of them,
	// sinks not flushed in the last pendingSweepEvery leave pending (a
	// connection that consumed and went would stay in it for good).
	flushes uint64

	// Durable queues (durable.go): the raft worker of the shard's durable
	// queues (nil without Config.Durable), whether its last round left
	// work, and the scratch of the durable paths.
	rw          *replication.Worker
	roundMore   bool
	snapCheckAt int64               // when the snapshot policy's idle rule last ran
	recovered   []chan struct{}     // WaitRecovered callers, released once the durable queues caught up
	openedGrps  map[uint64]struct{} // the durable queue groups opened on this shard's worker in this incarnation (until removed)
	removing    int                 // groups of deleted durable queues whose removal has not finished
	removeWait  []chan struct{}     // waitGroupRemovals callers, released when removing is 0
	waitFree    []*partWait
	dmsgScratch []queue.Message
	logSrc      logBodies // the bodies of the Enqueue a durable queue adds (AddEnqueue encodes them at once)
	settleCmd   queue.Settle
	tickScratch queue.Tick
	downCmd     queue.Down
	sdlCmd      queue.SettleDeadLetter
	views       []*logView // messages read from logs in this batch
	viewUsed    int
	viewers     []*Queue // queues whose log views are held until the batch ends

	// visited counts the queues a timer or a Down looked at (tests check
	// that the work per event is the queues it concerns, not all of them).
	visited atomic.Int64

	stopping bool // the shard's goroutine is stopping: nothing runs inline
}

func newShard(b *Broker, idx int) *shard {
	s := &shard{
		b: b, idx: idx, wake: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{}),
		queues: map[*Queue]struct{}{}, pending: map[Sink]*sinkBatch{},
		timer: time.NewTimer(time.Hour),
	}
	s.timer.Stop()
	if b.cfg.Durable != nil {
		s.startWorker()
	}
	return s
}

// startWorker starts the raft worker of the shard's durable queues.
func (s *shard) startWorker() {
	dc := s.b.cfg.Durable
	s.rw = replication.NewWorker(dc.Log, replication.WorkerConfig{
		NodeID: s.nodeID(), Shard: uint64(s.idx), Logger: s.b.log, Fatal: s.b.logFailed, Snapshots: dc.Snapshots, Pool: s.b.pool,
		SeqBase:       s.b.seqBase,
		Post:          func(fn func()) { s.submit(Command{Kind: cmdPost, post: fn}) },
		Send:          dc.Send,
		LeaderChanged: s.leaderChanged,
		PeerLost:      s.peerLost,
		Installed:     s.installed,
		SendSnapshot:  s.sendSnapshot(dc.SendSnapshot),
	})
}

// submit queues a command for the shard. Safe from any goroutine.
func (s *shard) submit(c Command) {
	s.mu.Lock()
	s.inbox = append(s.inbox, c)
	s.mu.Unlock()
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// submitInline queues a command and, if the shard is idle and may run
// inline, runs what is queued on the caller's goroutine before it
// returns (one batch: what is queued after it is left to the shard's
// goroutine); otherwise it wakes the shard as submit does. A busy
// shard's holder, or its goroutine (which waits for own), drains the
// command.
// The caller must hold no lock the shard's work may take: a connection's
// mutex (sinks take it), the topology's.
func (s *shard) submitInline(c Command) {
	s.mu.Lock()
	s.inbox = append(s.inbox, c)
	s.mu.Unlock()
	if s.inline.Load() && s.own.TryLock() {
		if s.inline.Load() { // read again with own held: setInline writes it so
			// One batch only: work the batch makes for the shard itself
			// (a delivery its sink hands back, say) goes to the shard's
			// goroutine, never keeping a loop from its connections.
			s.drainOnce(true)
			s.setInline()
			s.own.Unlock()
			s.mu.Lock()
			more := len(s.inbox) > 0
			s.mu.Unlock()
			if !more {
				return
			}
		} else {
			s.own.Unlock()
		}
	}
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// setInline decides whether loops may run the shard's work (own held):
// only while it holds no durable queue, no forwarding state and no raft
// work in flight, whose paths wait on the worker or the cluster and stay
// on the shard's goroutine; and never once it is stopping, or when the
// test hooks that expect the goroutine (ManualTicks, OnApply) are set.
func (s *shard) setInline() {
	ok := !s.b.cfg.NoInlineShards && !s.b.cfg.ManualTicks && s.b.cfg.OnApply == nil &&
		s.b.topo.cl.Load() == nil && len(s.streams) == 0 && len(s.byGroup) == 0 &&
		len(s.openedGrps) == 0 && s.removing == 0 && !s.roundMore && !s.stopping
	if s.inline.Load() != ok {
		s.inline.Store(ok)
	}
}

func (s *shard) run() {
	defer close(s.done)
	for {
		select {
		case <-s.stop:
			s.own.Lock() // kept: the shard runs nothing more after quiesce
			s.stopping = true
			s.setInline()
			s.drain()
			s.quiesce()
			s.b.shardsStopped.Add(1)
			s.b.wakeShards()
			return
		case <-s.wake:
			s.own.Lock()
			s.drain()
			s.setInline()
			s.own.Unlock()
		case <-s.timer.C:
			s.own.Lock()
			s.armedAt = 0
			s.now = s.b.NowMs()
			s.tick()
			s.finishBatch()
			s.setInline()
			s.own.Unlock()
		}
	}
}

func (s *shard) drain() {
	for s.drainOnce(false) {
	}
}

// drainOnce runs the commands queued now as one batch and reports whether
// there were any (more may have come meanwhile). inline: only if they are
// all publishes and settlements (what SubmitInline sends); a control
// command (a create that may open a durable queue, a delete that takes the
// topology's lock) leaves the batch to the shard's goroutine, and
// drainOnce reports false.
func (s *shard) drainOnce(inline bool) bool {
	// inbox and spare are two distinct arrays that trade places.
	s.mu.Lock()
	if inline {
		for i := range s.inbox {
			if k := s.inbox[i].Kind; k != CmdPublish && k != CmdSettle {
				s.mu.Unlock()
				return false
			}
		}
	}
	batch := s.inbox
	s.inbox, s.spare = s.spare[:0], nil
	s.mu.Unlock()
	if len(batch) == 0 {
		s.spare = batch
		if s.roundMore {
			// The last round left work for another.
			s.now = s.b.NowMs()
			s.finishBatch()
		}
		return false
	}
	s.now = s.b.NowMs()
	for i := range batch {
		s.exec(&batch[i])
		batch[i] = Command{}
	}
	s.spare = batch[:0]
	s.finishBatch()
	return true
}

// exec applies one command at the shard's time, shown first to the
// recorder (Config.OnApply) if there is one.
func (s *shard) exec(c *Command) {
	if f := s.b.cfg.OnApply; f != nil && c.Kind != cmdFire && c.Kind != cmdPost && c.Kind != cmdDLDone {
		f(s.idx, s.now, c)
	}
	s.apply(c)
}

// finishBatch hands the deliveries gathered in this batch to their sinks,
// one call per sink, and re-arms the timer.
func (s *shard) finishBatch() {
	s.round()
	s.flushEffects()
	s.releaseViews()
	// Re-armed only when a queue wants an earlier wake than the timer is
	// set for; a firing with nothing due (the earliest queue was ticked or
	// deleted meanwhile) just re-arms it.
	if next := s.timers.next(); next > 0 && !s.b.cfg.ManualTicks && (s.armedAt == 0 || next < s.armedAt) {
		d := time.Duration(next-s.now) * time.Millisecond
		if d < time.Millisecond {
			d = time.Millisecond
		}
		s.armedAt = next
		s.timer.Reset(d)
	}
}

// flushEffects hands the deliveries gathered so far to their sinks, one
// call per sink, and folds the stored-byte changes into the gauge.
func (s *shard) flushEffects() {
	if s.bytesDelta != 0 {
		s.b.storedBytes.Add(s.bytesDelta)
		s.bytesDelta = 0
	}
	s.flushes++
	for i, pb := range s.touched {
		pb.sink.Deliver(pb.ds)
		clear(pb.ds) // its messages (and their arenas) are not kept alive by the batch
		pb.ds = pb.ds[:0]
		pb.used = s.flushes
		s.touched[i] = nil
	}
	s.touched = s.touched[:0]
	if s.flushes%pendingSweepEvery == 0 {
		s.sweepPending()
	}
}

// pendingSweepEvery: how many flushes apart pending is swept, and how
// long a sink may go unflushed before it leaves it.
const pendingSweepEvery = 4096

// sweepPending drops the batches of sinks not flushed lately. A consumer
// record may still hold one (an idle consumer): it goes on using it, and
// a new consumer of that sink makes another (the sink then gets two
// Deliver calls in a flush, each consumer's deliveries in order in one).
// O(sinks) every pendingSweepEvery flushes.
func (s *shard) sweepPending() {
	for k, pb := range s.pending {
		if s.flushes-pb.used >= pendingSweepEvery && len(pb.ds) == 0 {
			delete(s.pending, k)
		}
	}
}

// tick is the timer firing: a CmdTick for each queue whose timer is due,
// earliest first, through the command path; the other queues are not
// looked at.
func (s *shard) tick() {
	s.due = s.timers.popDue(s.now, s.due[:0])
	for i, q := range s.due {
		s.due[i] = nil
		s.visited.Add(1)
		s.tickCmd = Command{Kind: CmdTick, Queue: q}
		s.exec(&s.tickCmd)
		s.tickCmd = Command{}
	}
}

// tickQueue applies a Tick to q at the shard's time. A Tick before the
// queue's timer is due is harmless (queue.Tick).
func (s *shard) tickQueue(q *Queue) {
	if q.gone || q.m == nil {
		return
	}
	s.timers.remove(q)
	if !q.leads() {
		return // its leader ticks it
	}
	if q.grp != nil {
		s.tickScratch = queue.Tick{NowMs: s.now}
		_, _ = q.grp.Add(&s.tickScratch) // applied from the log
		return
	}
	effs, _ := q.m.Apply(&queue.Tick{NowMs: s.now})
	s.handle(q, effs)
}

// handle carries out a machine's effects.
func (s *shard) handle(q *Queue, effs []queue.Effect) {
	for _, e := range effs {
		switch e.Kind {
		case queue.Deliver:
			c, ok := q.cons[e.Consumer]
			if !ok && q.grp != nil {
				continue // a consumer of an earlier incarnation, or its connection closed: its Down returns it
			}
			msg := s.msgOf(q, e.Msg)
			if !ok || msg == nil {
				panic("netio: BUG: delivery to an unknown consumer or of an unknown message")
			}
			pb := c.batch
			if pb == nil {
				pb = s.batchFor(c.sink)
				c.batch = pb
				q.cons[e.Consumer] = c
			}
			if len(pb.ds) == 0 {
				s.touched = append(s.touched, pb)
			}
			pb.ds = append(pb.ds, Delivery{Consumer: e.Consumer, QTag: e.Tag, MsgID: e.Msg, Msg: msg, DeliveryCount: e.DeliveryCount, FailedCount: e.FailedCount})
		case queue.Remove, queue.Drop, queue.Duplicate, queue.RejectPublish:
			s.free(q, e.Msg)
		case queue.DeadLetter:
			if q.grp != nil && q.m.IsHeldDeadLetter(e.Msg) {
				// At-least-once: held by the machine until its targets have
				// it (deadletter.go); a replayed one, or one while the
				// recovered topology is not in the view yet, is sent once
				// both are done (resendHeld).
				if !q.replaying && q.leads() && !s.b.topo.restoring.Load() {
					s.sendHeld(q, e.Msg, e.Reason, s.now)
				}
				continue
			}
			if !q.leads() {
				// Its leader dead-letters it.
			} else if msg := s.msgOf(q, e.Msg); msg != nil {
				s.deadLetter(q, msg, e.Reason)
			}
			s.free(q, e.Msg)
		case queue.LeaseExpired:
			if c, ok := q.cons[e.Consumer]; ok {
				c.sink.LeaseExpired(e.Consumer, e.Tag)
				s.leased = append(s.leased, e.Consumer)
			}
		case queue.Timer:
			s.timers.set(q, e.At)
		case queue.DeleteQueue:
			if !q.leads() {
				continue // the leader deletes it (a follower may lag behind)
			}
			q.storeStats() // final counts, for the broker-wide totals
			if s.b.topo.removeQueue(q, 0) {
				s.deleteQueue(q, "queue deleted (auto-delete or expiry)")
			}
		}
	}
	// A cancelled consumer whose last delivery a lease took back is
	// drained: forgotten once every notice of this batch has gone out.
	for i, id := range s.leased {
		if !q.gone {
			s.forgetIfGone(q, id)
		}
		s.leased[i] = 0
	}
	s.leased = s.leased[:0]
	s.releaseHeld(q)
	q.storeStats()
}

// sinkBatch is the deliveries to one sink gathered during a batch.
type sinkBatch struct {
	sink Sink
	ds   []Delivery
	used uint64 // s.flushes when it was last flushed (sweepPending)
}

// batchFor is sink k's batch, made on first use.
func (s *shard) batchFor(k Sink) *sinkBatch {
	pb := s.pending[k]
	if pb == nil {
		pb = &sinkBatch{sink: k, used: s.flushes}
		s.pending[k] = pb
	}
	return pb
}
