package broker

import (
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/warren-mq/warren/queue"
	"github.com/warren-mq/warren/replication"
	"github.com/warren-mq/warren/wire"
)

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

func (s *shard) createQueue(q *Queue) {
	if q.homedElsewhere(s.nodeID()) {
		// It lives on another node: served from there (homed.go).
		q.remote, q.opened = true, true
		q.lead.Store(q.home)
		s.queues[q] = struct{}{}
		return
	}
	if q.home != 0 && q.homeInc != s.b.homeInc() {
		// It lived here in an earlier life of this node, and went with
		// it: its MetaDropHome is on its way (homed.go). Until then it
		// serves nothing: a publish forwarded to it is refused (its origin
		// nacks it), never confirmed into a copy about to go.
		q.opened = true
		s.queues[q] = struct{}{}
		return
	}
	if q.home != 0 {
		q.lead.Store(q.home)
	}
	if s.durableLogged(q) {
		s.queues[q] = struct{}{}
		s.openDurable(q)
		return
	}
	q.m = queue.New(queue.ConfigFromArgs(q.args, q.autoDelete), s.now)
	q.cons = map[queue.ConsumerID]consumer{}
	s.queues[q] = struct{}{}
	if q.exclusive != 0 {
		s.conns.addExclusive(q.exclusive, q)
	}
	effs, _ := q.m.Apply(&queue.Tick{NowMs: s.now}) // arms the expiry timer, if any
	s.handle(q, effs)
}

// EnqItem is one message bound for one queue.
type EnqItem struct {
	Q    *Queue
	Msg  *StoredMsg
	Meta queue.Message // ID filled in by the shard
	Idx  int           // index in the publish batch, for confirms
}

// enqueue applies a group of messages (already grouped by queue, in
// publish order) and reports nacks into batch. dl, for a held dead letter
// (one item), is told once its queue has it (durable: applied from the
// log) or refused it.
func (s *shard) enqueue(items []EnqItem, batch *PublishBatch, dl *dlWait) {
	if dl != nil {
		defer func() {
			if dl != nil {
				dl.done()
			}
		}()
	}
	msgs := s.msgScratch[:0]
	defer func() { s.msgScratch = msgs[:0] }()
	var full *Queue
	var w *partWait // confirms waiting for durable queues' entries
	for start := 0; start < len(items); {
		q := items[start].Q
		end := start + 1
		for end < len(items) && items[end].Q == q {
			end++
		}
		if !q.gone && (q.remote || q.inCluster && !q.leads()) {
			if batch != nil {
				w = s.forward(q, items[start:end], batch, w) // to its leader (forward.go)
			} else {
				s.forwardDeadLetter(q, items[start:end], dl)
				dl = nil // told when its leader confirms it
			}
			start = end
			continue
		}
		if q.gone || q.m == nil || !q.leads() {
			for _, it := range items[start:end] {
				s.release(it.Msg)
				if batch != nil {
					batch.Nack(it.Idx, wire.InternalNack)
				} else {
					s.dropDeadLetter(nil, q.name, dlTargetRefused)
				}
			}
			start = end
			continue
		}
		if q.grp != nil {
			w = s.enqueueDurable(q, items[start:end], batch, w, dl, nil)
			dl = nil // told when applied (or failed)
			start = end
			continue
		}
		firstID := q.nextID + 1
		msgs = msgs[:0]
		for _, it := range items[start:end] {
			q.nextID++
			it.Meta.ID = q.nextID
			q.bodies.put(q.nextID, it.Msg)
			msgs = append(msgs, it.Meta)
		}
		effs, _ := q.m.Apply(&queue.Enqueue{NowMs: s.now, Msgs: msgs})
		for _, e := range effs {
			if e.Kind == queue.RejectPublish {
				if batch != nil {
					batch.Nack(items[start+int(e.Msg-firstID)].Idx, wire.QueueFull)
				} else {
					s.dropDeadLetter(nil, q.name, dlTargetRefused)
				}
			}
		}
		s.handle(q, effs)
		if full == nil && s.b.cfg.QueueSoftLimit > 0 && q.m.Ready() > s.b.cfg.QueueSoftLimit {
			full = q
		}
		start = end
	}
	if batch == nil {
		return
	}
	if w != nil {
		if w.full == nil {
			w.full = full
		}
		s.partRelease(w)
		return
	}
	if full != nil && !forwarded(batch) {
		s.hold(full, batch)
		return
	}
	batch.PartDone()
}

// hold holds back the confirm of batch's part at q, over its soft limit:
// backpressure. The messages are in the queue, but the confirm waits
// until the queue drains below half its soft limit (releaseHeld). The
// publisher's confirm window fills and it slows to the consumers' pace,
// instead of growing the backlog (and its latency) without bound. A batch
// whose channel has ended is confirmed at once: the channel's end waits
// for it (releaseEnded).
func (s *shard) hold(q *Queue, batch *PublishBatch) {
	if batch.ended() {
		batch.PartDone()
		return
	}
	if len(q.held) == 0 {
		if s.holding == nil {
			s.holding = map[*Queue]struct{}{}
		}
		s.holding[q] = struct{}{}
	}
	q.held = append(q.held, batch)
}

// releaseHeld confirms the batches held back by a queue's backlog once it
// has drained (or is gone).
func (s *shard) releaseHeld(q *Queue) {
	if len(q.held) == 0 || (!q.gone && q.m.Ready() > s.b.cfg.QueueSoftLimit/2) {
		return
	}
	held := q.held
	q.held = nil
	delete(s.holding, q)
	for _, b := range held {
		b.PartDone()
	}
}

// releaseEnded confirms the held batches whose channel has ended
// (CmdReleaseEnded, a Down): their messages are in their queues, and the
// channel's end, which waits for its confirms, must not wait for a
// backlog to drain.
func (s *shard) releaseEnded() {
	for q := range s.holding {
		kept := q.held[:0]
		for _, b := range q.held {
			if b.ended() {
				b.PartDone()
			} else {
				kept = append(kept, b)
			}
		}
		clear(q.held[len(kept):])
		q.held = kept
		if len(kept) == 0 {
			q.held = nil
			delete(s.holding, q)
		}
	}
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
			if s.b.topo.removeQueue(q) {
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

// storeStats publishes the machine's counts for replies and metrics.
func (q *Queue) storeStats() {
	st := &q.m.Stats
	q.ready.Store(q.m.Ready())
	q.unacked.Store(int64(q.m.Unacked()))
	q.consumers.Store(int64(q.m.Consumers()))
	q.published.Store(st.Enqueued)
	q.delivered.Store(st.Delivered)
	q.acked.Store(st.Acked)
	q.redelivered.Store(st.Redelivered)
	if q.grp != nil {
		n, _ := q.m.HeldDeadLetters()
		q.dlHeld.Store(int64(n))
	}
}

func (s *shard) free(q *Queue, id uint64) {
	if msg := q.bodies.del(id); msg != nil {
		s.release(msg)
	}
}

// release lets go of one placement of msg; the last one uncounts its
// arena (see Arena).
func (s *shard) release(msg *StoredMsg) {
	if msg.Arena.Refs.Add(-1) == 0 {
		s.bytesDelta -= msg.Arena.Cost
	}
}

// deleteQueue drops a queue's state and tells its consumers.
func (s *shard) deleteQueue(q *Queue, reason string) int64 {
	if q.gone {
		return 0
	}
	q.gone = true
	s.timers.remove(q)
	s.conns.forget(q)
	if q.grp != nil && s.byGroup[q.grp.ID()] == q {
		delete(s.byGroup, q.grp.ID())
	}
	s.fwdQueueGone(q, reason)
	if q.m == nil { // a replicated queue with no replica here
		delete(s.queues, q)
		return 0
	}
	n := int64(q.m.Ready())
	// In consumer id order, not the map's: a replica applying the same
	// commands hands out the same effects in the same order.
	for _, id := range slices.Sorted(maps.Keys(q.cons)) {
		c := q.cons[id]
		c.sink.Cancelled(id, wire.NotFound, reason)
		c.sink.ConsumerGone(id)
	}
	q.bodies.each(func(_ uint64, m *StoredMsg) { s.release(m) })
	if q.grp != nil {
		s.failDurable(q)
		s.removeGroup(q)
	}
	q.bodies = bodyStore{}
	q.cons = nil
	s.releaseHeld(q)
	q.ready.Store(0)
	q.unacked.Store(0)
	q.consumers.Store(0)
	delete(s.queues, q)
	return n
}

// DLDrop says why a dead letter went nowhere.
type DLDrop uint8

const (
	dlNoExchange    DLDrop = iota // the dead-letter exchange does not exist
	dlBadProperties               // its stored properties do not parse (a bug if it happens)
	dlTooLarge                    // its death history would not fit the property block (65,535 bytes, 255 records)
	dlUnroutable                  // the exchange routed it to no queue
	dlCycle                       // every target would close a dead-letter cycle (queue.DeadLetterCycle)
	dlTargetRefused               // the target queue was deleted meanwhile or refused it (reject-publish)
	NumDLDrops
)

var dlDropNames = [NumDLDrops]string{"no_exchange", "bad_properties", "too_large", "unroutable", "cycle", "target_refused"}

func (r DLDrop) String() string { return dlDropNames[r] }

// dropDeadLetter counts a dead letter that went nowhere, per source queue
// (if known) and broker-wide by reason, and logs it (at most one line per
// reason per 10 s, with the count of those left out).
func (s *shard) dropDeadLetter(q *Queue, target string, r DLDrop) {
	// Logged before counted: whoever sees the count finds the line.
	if ok, n := s.b.dlDropLog[r].Allow(time.Now()); ok {
		if q != nil { // target: its dead-letter exchange, in its vhost
			s.b.log.Warn("dead letter dropped", queueLog(q.name), "target", target, "reason", r.String(), "suppressed_since_last", n)
		} else { // target: the queue that refused it
			s.b.log.Warn("dead letter dropped", "vhost", VhostOf(target), "target", LocalName(target), "reason", r.String(), "suppressed_since_last", n)
		}
	}
	if f := s.b.cfg.DeadLetterDropped; f != nil {
		f(r)
	}
	if q != nil {
		q.deadLetterDropped.Add(1)
	}
}

// deadLetter republishes msg to the queue's dead-letter exchange with its
// death history extended. Messages that would loop without a rejection
// in the cycle are dropped (queue.DeadLetterCycle). A dead letter that
// goes nowhere is counted and logged as dropped, never as dead-lettered.
// The death's time is s.now, the time stamped on the work being applied,
// never a clock reading: a replica applying the same commands must record
// the same history.
func (s *shard) deadLetter(q *Queue, msg *StoredMsg, reason wire.DeathReason) {
	s.deadLetterTo(q, msg, reason, s.now, nil)
}

// deadLetterTo is deadLetter with the death's time given (at) and, for a
// held dead letter, its wait: each target it is sent to takes a reference
// and tells it once it has the dead letter.
func (s *shard) deadLetterTo(q *Queue, msg *StoredMsg, reason wire.DeathReason, at int64, dl *dlWait) {
	dlx := q.args.DeadLetterExchange // the client's name, in the queue's vhost
	dlxName := QualifyName(VhostOf(q.name), dlx)
	view := s.b.topo.view.Load()
	if !view.Table.HasExchange(dlxName) {
		s.dropDeadLetter(q, dlx, dlNoExchange)
		return
	}
	var props wire.Properties
	if err := wire.ParseProperties(msg.Props(), &props); err != nil {
		s.dropDeadLetter(q, dlx, dlBadProperties)
		return
	}
	var deaths []wire.Death
	oldDeathsLen := 0
	if props.Has(wire.PropDeaths) {
		deaths, _ = wire.DecodeDeaths(props.Deaths)
		oldDeathsLen = 3 + len(props.Deaths)
	}
	deaths = queue.RecordDeath(deaths, LocalName(q.name), reason, at, string(msg.Exchange()), []string{string(msg.RoutingKey())})
	if len(deaths) > 255 {
		s.dropDeadLetter(q, dlx, dlTooLarge)
		return
	}
	rk := msg.RoutingKey()
	if q.args.DeadLetterRoutingKey != "" {
		rk = []byte(q.args.DeadLetterRoutingKey)
	}
	props.Deaths = wire.AppendDeaths(nil, deaths)
	// The block is canonical (ParseProperties checked it), so its new size
	// is exact: the old deaths and expiration entries out, the new deaths in.
	newLen := len(msg.Props()) - oldDeathsLen + 3 + len(props.Deaths)
	if props.Has(wire.PropExpiration) {
		newLen -= 3 + 4
	}
	if newLen > wire.MaxPropertiesLen {
		s.dropDeadLetter(q, dlx, dlTooLarge)
		return
	}
	props.Set(wire.PropDeaths)
	// A dead letter never expires again by its old per-message TTL.
	props.Present &^= 1 << wire.PropExpiration
	newProps := wire.AppendProperties(nil, &props)[2:]
	// A dead letter gets an arena of its own (dead-letter queues keep
	// messages for long; sharing the body would pin the batch it came in).
	dm := NewStoredMsg([]byte(dlx), rk, newProps, msg.Body(), msg.Flags, msg.Priority)
	targets, _ := view.Table.Route(nil, dlxName, dm.RoutingKey(), props.Headers)
	sent, cycles := 0, 0
	var tqs []*Queue
	for _, ref := range targets {
		tq := view.Queue(ref)
		if tq == nil {
			continue // deleted since the view was published
		}
		// The history includes this death: a rejection just now means a
		// client decided, so the loop is not a cycle.
		if queue.DeadLetterCycle(deaths, LocalName(tq.name)) {
			cycles++
			continue
		}
		tqs = append(tqs, tq)
	}
	if len(tqs) > 0 {
		dm.Arena.Cost = int64(cap(dm.Arena.Buf)) + StoredMsgOverhead + int64(len(tqs))*PlacementOverhead
		dm.Arena.Refs.Store(int64(len(tqs)))
		s.bytesDelta += dm.Arena.Cost
	}
	for _, tq := range tqs {
		sent++
		meta := queue.Message{Size: uint32(len(dm.Body())), Priority: dm.Priority}
		item := []EnqItem{{Q: tq, Msg: dm, Meta: meta}}
		// Always through the inbox, even to this shard: we are inside
		// handle() for q, and q itself may be the target.
		if dl != nil {
			dl.n.Add(1)
		}
		tq.shard.submit(Command{Kind: CmdPublish, Items: item, dl: dl})
	}
	switch {
	case sent > 0:
		q.deadLettered.Add(1)
	case cycles > 0:
		s.dropDeadLetter(q, dlx, dlCycle)
	default:
		s.dropDeadLetter(q, dlx, dlUnroutable)
	}
}

// subscribe adds a consumer and answers through its sink.
func (s *shard) subscribe(q *Queue, k Sink, spec queue.ConsumerSpec, req uint32) {
	if q.ledElsewhere() {
		s.fwdSubscribe(q, k, spec, req)
		return
	}
	if q.gone || q.m == nil {
		r := noQueue(q)
		k.Subscribed(spec.ID, req, r.Code, r.Reason)
		return
	}
	if q.grp != nil { // answered at apply
		q.subs[spec.ID] = pendingReq{sink: k, req: uint64(req)}
		if _, err := q.grp.Add(&queue.Subscribe{NowMs: s.now, Spec: spec}); err != nil {
			delete(q.subs, spec.ID)
			k.Subscribed(spec.ID, req, wire.InternalError, err.Error())
		}
		return
	}
	effs, err := q.m.Apply(&queue.Subscribe{NowMs: s.now, Spec: spec})
	if err != nil {
		k.Subscribed(spec.ID, req, wire.CodeOf(err), reasonOf(err))
		return
	}
	q.cons[spec.ID] = consumer{sink: k, owner: uint64(spec.Owner)}
	s.conns.addConsumer(uint64(spec.Owner), q)
	k.Subscribed(spec.ID, req, wire.OK, "")
	s.handle(q, effs)
}

// cancel stops a consumer. With requeue its unacked deliveries go back.
func (s *shard) cancel(q *Queue, id queue.ConsumerID, requeue bool) {
	if len(s.fc.byID) > 0 && s.fwdCancel(id, requeue) {
		return
	}
	if q.gone || q.m == nil {
		return
	}
	if q.grp != nil {
		_, _ = q.grp.Add(&queue.Cancel{NowMs: s.now, Consumer: id, Requeue: requeue})
		return
	}
	effs, err := q.m.Apply(&queue.Cancel{NowMs: s.now, Consumer: id, Requeue: requeue})
	if err != nil {
		return
	}
	s.handle(q, effs)
	s.forgetIfGone(q, id)
}

// forgetIfGone drops a consumer the machine no longer tracks (cancelled
// and drained).
func (s *shard) forgetIfGone(q *Queue, id queue.ConsumerID) {
	if c, ok := q.cons[id]; ok && !q.m.HasConsumer(id) {
		delete(q.cons, id)
		s.conns.dropConsumer(c.owner, q)
		c.sink.ConsumerGone(id)
	}
}

// SettleItem settles a run of one consumer's deliveries: its outstanding
// deliveries with queue tags QTag..Last (Last 0: QTag alone). A caller
// that makes a run of several tags vouches that every delivery the
// consumer still holds in that range is one its client settled: queue tags
// rise in the order the consumer's deliveries were made, so a run is the
// consumer's deliveries between two of them that the client settled
// together (an AMQP "multiple", netio's onSettle), those in between already
// settled or taken back. Runs keep an ack of n deliveries O(runs) from the
// connection to the queue machine, which settles a run in one pass.
type SettleItem struct {
	Q        *Queue
	Consumer queue.ConsumerID
	QTag     uint64 // the run's first queue tag
	Last     uint64 // the run's last queue tag (≥ QTag); 0: QTag alone
	Arg      uint32
	Op       wire.SettleOp
}

// last is the run's last queue tag.
func (it *SettleItem) last() uint64 { return max(it.QTag, it.Last) }

// sameRun reports whether o may extend a run of it's: the same queue,
// consumer, op and argument.
func (it *SettleItem) sameRun(o *SettleItem) bool {
	return o.Q == it.Q && o.Consumer == it.Consumer && o.Op == it.Op && o.Arg == it.Arg
}

// liveRun is the end of the run of single-tag items from start (same
// queue, consumer, op and argument, ascending tags) that are the
// consumer's consecutive live deliveries (queue.Machine.LiveRun), at least
// start+1 and at most start+liveRunMax: the look-ahead is bounded, so a
// frame of tags that never form runs costs linear work, not quadratic.
func (s *shard) liveRun(items []SettleItem, start int) int {
	it := &items[start]
	tags := append(s.tagScratch[:0], it.QTag)
	for end := start + 1; end < len(items) && len(tags) < liveRunMax; end++ {
		n := &items[end]
		if !it.sameRun(n) || n.last() != n.QTag || n.QTag <= tags[len(tags)-1] {
			break
		}
		tags = append(tags, n.QTag)
	}
	s.tagScratch = tags[:0] // at most liveRunMax
	if len(tags) == 1 {
		return start + 1
	}
	return start + max(1, it.Q.m.LiveRun(it.Consumer, tags))
}

// liveRunMax bounds one liveRun (and so one Settle it makes): 64 tags a
// command already make its fixed cost small.
const liveRunMax = 64

// settle applies settlements, each run in one machine command; adjacent
// runs of one consumer and op (consecutive queue tags) are joined, and so
// are single tags that are the consumer's next live deliveries (liveRun).
func (s *shard) settle(items []SettleItem) {
	if len(s.fc.byID) > 0 {
		items = s.fwdSettle(items)
	}
	for start := 0; start < len(items); {
		it := &items[start]
		last := it.last()
		end := start + 1
		for end < len(items) && it.sameRun(&items[end]) && items[end].QTag == last+1 {
			last = items[end].last()
			end++
		}
		q := it.Q
		if end == start+1 && last == it.QTag && q.grp == nil && !q.gone && q.m != nil {
			// Deliveries round-robined among a queue's consumers do not
			// have consecutive tags; a run of one consumer's next live
			// deliveries is still one range for the machine.
			if end = s.liveRun(items, start); end > start+1 {
				last = items[end-1].QTag
			}
		}
		if !q.gone && q.m != nil && q.grp != nil {
			s.settleCmd = queue.Settle{NowMs: s.now, Consumer: it.Consumer, Op: it.Op, First: it.QTag, Last: last, ArgMs: it.Arg}
			_, _ = q.grp.Add(&s.settleCmd) // encoded at once: the scratch is free again
		} else if !q.gone && q.m != nil {
			effs, err := q.m.Apply(&queue.Settle{NowMs: s.now, Consumer: it.Consumer, Op: it.Op, First: it.QTag, Last: last, ArgMs: it.Arg})
			if err == nil {
				s.handle(q, effs)
				s.forgetIfGone(q, it.Consumer)
			}
		}
		start = end
	}
}
