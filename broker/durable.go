package broker

import (
	"context"
	"errors"
	"slices"
	"time"

	"github.com/warren-mq/warren/queue"
	"github.com/warren-mq/warren/replication"
	"github.com/warren-mq/warren/segment"
	"github.com/warren-mq/warren/wire"
	"go.etcd.io/raft/v3/raftpb"
)

// DurableConfig says where durable queues keep their logs (design
// replication.md, phase D4, one node). With it, a queue declared durable
// and not exclusive is a raft group (replication.Group) on its shard's
// Worker: its commands are entries of its log, applied from the committed
// entries, and its message bodies live in the log only. Without it every
// queue is in memory, as before.
type DurableConfig struct {
	Log       *segment.Log           // the node's log (the one the metadata group uses)
	Snapshots *replication.SnapStore // the node's snapshot store over Log
	// Fatal hears a failed log write: the node must stop and recover from
	// the log (warrend exits non-zero).
	Fatal func(error)
	// In a cluster of several nodes: NodeID is this node's id and Send
	// carries the queue groups' raft messages to the peers (the cluster
	// transport); durable queues are then replicated groups over their
	// placed replicas (replicated.go). NodeID 0: one node.
	NodeID uint64
	Send   func(gid uint64, msgs []raftpb.Message)
	// SendSnapshot (optional) carries a snapshot to install to a peer
	// that fell behind a leader's log (cluster.Transport.SendSnapshot);
	// done hears whether it was sent. Without it such a peer stays behind.
	SendSnapshot func(gid uint64, s *replication.SnapshotMessage, done func(ok bool))
	// Forward (optional) sends a payload to node to (the transport's
	// SendForward): publishes to a replicated queue led elsewhere go to its
	// leader (forward.go); without it they are nacked.
	Forward func(to uint64, p []byte) bool
	// ForwardTimeout bounds the wait for a forwarded publish's confirm
	// (0: 10 s), after which it is nacked.
	ForwardTimeout time.Duration
}

// QueueGroupBase is the segment group of the durable queue whose Meta id
// is 0: a queue's group is QueueGroupBase + its id, clear of the node's
// fixed groups (1: the snapshot store, 2: the metadata group).
const QueueGroupBase = 1 << 32

func queueGroup(id queue.QueueRef) uint64 { return QueueGroupBase + uint64(id) }

// durableLogged reports whether q is a raft-backed queue on this shard.
func (s *shard) durableLogged(q *Queue) bool {
	return s.rw != nil && q.decl.Durable && q.exclusive == 0
}

// pendingPart is one Enqueue command a durable queue added in this
// incarnation, in the order added (and so applied): its confirm, when the
// confirm waits for the apply.
type pendingPart struct {
	w     *partWait // nil: confirmed at propose, or a dead letter
	idx   []int     // batch index of each message (reject-publish and replicated queues only)
	dl    bool      // a dead letter (no publisher)
	dlw   *dlWait   // a held dead letter's source, told once it is applied
	bytes int64     // its messages' bytes, counted in the stored-bytes gauge until applied
	seq   uint64    // the proposal seq of the entry it is in (Group.Add)
}

// partWait is a shard part of a publish batch whose confirm waits for
// entries to be applied (persistent messages in durable queues, or a
// reject-publish durable queue): n references, one per durable queue
// entry and one for the enqueue call itself.
type partWait struct {
	batch *PublishBatch
	n     int
	full  *Queue // a queue over its soft limit: the confirm is held there
}

type pendingReq struct {
	sink Sink
	req  uint64
}

func (s *shard) newPartWait(b *PublishBatch) *partWait {
	if n := len(s.waitFree); n > 0 {
		w := s.waitFree[n-1]
		s.waitFree = s.waitFree[:n-1]
		*w = partWait{batch: b, n: 1}
		return w
	}
	return &partWait{batch: b, n: 1}
}

// partRelease drops one reference to w; the last confirms the part (or
// holds it at a full queue).
func (s *shard) partRelease(w *partWait) {
	if w.n--; w.n > 0 {
		return
	}
	if q := w.full; q != nil && !q.gone {
		s.hold(q, w.batch)
		s.releaseHeld(q)
	} else {
		w.batch.PartDone()
	}
	*w = partWait{}
	s.waitFree = append(s.waitFree, w)
}

// openDurable makes q a raft group on the shard's worker: recovered from
// its snapshot and log if it has them (a restart), new otherwise. The
// connections that owned its consumers before the restart are gone: a
// Down for each is its first command, so what they held is ready again
// (redelivered) before anything else is applied.
func (s *shard) openDurable(q *Queue) {
	if s.openReplicated(q) {
		return
	}
	dc := s.b.cfg.Durable
	gid := queueGroup(q.id)
	if s.openedGrps == nil {
		s.openedGrps = map[uint64]struct{}{}
	}
	s.openedGrps[gid] = struct{}{}
	if d, bad := dc.Log.Quarantined(gid); bad {
		// Its data here is damaged (segment quarantine): the queue is
		// refused (q.m stays nil), never opened short of what it held.
		msg := damagedQueueMsg(q, d) + "; it refuses publishes and consumers (the other queues are served): restore this node's data or delete and declare the queue again"
		s.b.log.Error("durable queue refused: its data is damaged", queueLog(q.name),
			"group", gid, "file", d.File, "offset", d.Offset, "damage", d.Why)
		q.replicaErr.Store(&msg)
		return
	}
	cfg := queue.ConfigFromArgs(q.args, q.autoDelete)
	cfg.HoldDeadLetters = true // at-least-once dead-lettering (deadletter.go)
	now := s.now
	replayTo := dc.Log.LastIndex(gid)
	sink := func(a *replication.Applied) { s.applied(q, a) }
	g, err := s.rw.Recover(gid, dc.Snapshots, raftpb.ConfState{Voters: []uint64{1}}, func() *queue.Machine { return queue.New(cfg, now) }, sink)
	if err != nil {
		// The queue refuses work (q.m stays nil) rather than start empty.
		s.b.log.Error("durable queue not recovered: it refuses publishes and consumers until a restart recovers it", queueLog(q.name), "group", gid, "err", err)
		return
	}
	q.grp, q.m, q.replayTo = g, g.FSM().Machine(), replayTo
	q.applSeq = g.LastSeq() // the seq base: nothing of this incarnation is waited for yet (barriers)
	q.cons = map[queue.ConsumerID]consumer{}
	q.subs = map[queue.ConsumerID]pendingReq{}
	var owners []queue.OwnerID
	g.FSM().Machine().EachOwner(func(o queue.OwnerID) { owners = append(owners, o) })
	if from := g.FSM().AppliedIndex() + 1; replayTo >= from {
		owners = s.logOwners(gid, from, replayTo, owners)
	}
	slices.Sort(owners)
	for _, o := range slices.Compact(owners) {
		if _, err := g.Add(&queue.Down{NowMs: now, Owner: o}); err != nil {
			s.b.log.Error("durable queue: cannot return what a connection before the restart held", queueLog(q.name), "err", err)
		}
	}
	// Arms the queue's expiry timer, if any (a Tick before anything is due
	// changes nothing).
	seq, err := g.Add(&queue.Tick{NowMs: now})
	if err != nil {
		q.opened = true // nothing to wait for: the group has stopped
	}
	q.openSeq = seq
}

// logOwners adds to owners the owner of every Subscribe in entries
// [lo, hi] of group gid (the log after the snapshot: the consumers a
// replay will bring back).
func (s *shard) logOwners(gid, lo, hi uint64, owners []queue.OwnerID) []queue.OwnerID {
	es, release, err := s.b.cfg.Durable.Log.EntriesView(gid, lo, hi+1)
	if err != nil {
		return owners
	}
	defer release()
	var dec replication.EntryDecoder
	for _, e := range es {
		if len(e.Data) < 2 {
			continue // raft's empty entries, conf-change markers
		}
		_ = dec.Each(e.Data, func(_ int, c queue.Command) error {
			if sub, ok := c.(*queue.Subscribe); ok {
				owners = append(owners, sub.Spec.Owner)
			}
			return nil
		})
	}
	return owners
}

// enqueueDurable adds a run of items bound for durable queue q to its
// next entry: the message (exchange, routing key, properties, body) is
// encoded into the entry and the heap copy released at once. The part's
// confirm waits for the apply when a message is persistent or the queue
// may refuse it (reject-publish); w collects those waits (nil: none yet).
//
// from (not nil) is the origin of a part another node forwarded: it is
// added as a publish-from (replication/enqueuers.go) and always waits for
// the apply, which says what of it the queue takes.
func (s *shard) enqueueDurable(q *Queue, items []EnqItem, batch *PublishBatch, w *partWait, dl *dlWait, from *replication.Origin) *partWait {
	rejecting := q.args.Overflow == wire.RejectPublish || q.args.Overflow == wire.RejectPublishDLX
	wait := batch != nil && (rejecting || from != nil)
	msgs := s.dmsgScratch[:0]
	size := int64(0)
	for _, it := range items {
		if batch != nil && it.Msg.Flags&wire.Persistent != 0 {
			wait = true
		}
		size += int64(logMsgLen(it.Msg))
		msgs = append(msgs, it.Meta)
	}
	// Each message's log form is written once, from its arena straight
	// into the entry (logBodies).
	s.logSrc.items = items
	var seq uint64
	var err error
	if from != nil {
		seq, err = q.grp.AddEnqueueFrom(*from, s.now, msgs, &s.logSrc)
	} else {
		seq, err = q.grp.AddEnqueue(s.now, msgs, &s.logSrc)
	}
	s.logSrc.items = nil
	s.dmsgScratch = msgs[:0]
	if errors.Is(err, replication.ErrCommandTooLarge) && len(items) > 1 && from == nil && dl == nil {
		// More messages or bytes than one entry holds (a part past 32
		// MiB, possible with max_frame raised): halves, each an Enqueue
		// of its own, in order. (A forwarded part is not split: its
		// origin's frames are far smaller, and one origin's part is one
		// publish-from.)
		h := len(items) / 2
		w = s.enqueueDurable(q, items[:h], batch, w, dl, from)
		return s.enqueueDurable(q, items[h:], batch, w, dl, from)
	}
	for _, it := range items {
		s.release(it.Msg)
		if err != nil {
			if batch != nil {
				batch.Nack(it.Idx, wire.InternalNack)
			} else {
				s.dropDeadLetter(nil, q.name, dlTargetRefused)
			}
		}
	}
	if err != nil {
		if k, ok := batchSink(batch).(*fwdSink); ok {
			k.refused = true // not in the log: its origin starts its stream over
		}
		if dl != nil {
			dl.done()
		}
		return w
	}
	// Until applied, the entry (in raft's log and the storage's tail
	// cache) holds the messages on the heap: they count in the gauge the
	// memory watermark reads, as the arena they came in did.
	p := pendingPart{dl: batch == nil, dlw: dl, bytes: size, seq: seq}
	s.bytesDelta += p.bytes
	if wait {
		if w == nil {
			w = s.newPartWait(batch)
		}
		w.n++
		p.w = w
		if rejecting || q.replicated {
			// Which messages to nack: those a reject-publish queue
			// refuses, or every one when a replicated queue's entry is
			// lost with its leadership (stepDown, failPart).
			p.idx = make([]int, len(items))
			for i, it := range items {
				p.idx[i] = it.Idx
			}
		}
	}
	q.pend = append(q.pend, p)
	return w
}

// batchSink is b's sink (nil for a dead letter's nil batch).
func batchSink(b *PublishBatch) Sink {
	if b == nil {
		return nil
	}
	return b.Sink
}

// round runs the worker's round for the shard's durable queues: it
// proposes what they added and applies what committed.
func (s *shard) round() {
	if s.rw == nil {
		return
	}
	if s.now-s.snapCheckAt >= 5000 {
		// The snapshot policy's idle rule (some log reclaimable and the
		// last snapshot 5 s old), checked at most every 5 s of activity.
		s.snapCheckAt = s.now
		s.rw.MaybeSnapshot(s.now)
	}
	s.roundMore = s.rw.Round(s.now)
	s.answerBarriers()
	s.checkRecovered()
	if st := s.rw.Stats(); s.roundMore && st.Appends == st.Persisted {
		// Nothing in flight will wake the shard: wake it.
		select {
		case s.wake <- struct{}{}:
		default:
		}
	}
}

// quiesce runs rounds until every write the worker submitted is done and
// nothing is left to propose (a clean stop), for at most 10 s.
func (s *shard) quiesce() {
	if s.rw == nil {
		return
	}
	deadline := time.NewTimer(10 * time.Second)
	defer deadline.Stop()
	for {
		s.now = s.b.NowMs()
		s.finishBatch()
		if st := s.rw.Stats(); st.Appends == st.Persisted && !s.roundMore {
			if s.b.dlInflight.Load() == 0 || s.b.writeFailed.Load() || s.b.shardsStopped.Load() > 0 {
				return
			}
			// Held dead letters on their way (from any shard): every
			// shard goes on until their sources have settled them, so
			// the next start does not send them twice (deadletter.go).
			// Once a shard has stopped (the count was 0, or its wait
			// ended) what is sent to it is not taken: no more waiting.
			if f := quiesceDLWait; f != nil {
				f()
			}
		}
		select {
		case <-s.wake:
			s.drain()
		case <-deadline.C:
			s.b.log.Error("durable queues: writes still in flight at stop")
			return
		}
	}
}

// failDurable completes what a deleted durable queue still owed.
func (s *shard) failDurable(q *Queue) {
	for i := q.pendHead; i < len(q.pend); i++ {
		s.bytesDelta -= q.pend[i].bytes
		if w := q.pend[i].w; w != nil {
			s.partRelease(w)
		}
		if d := q.pend[i].dlw; d != nil {
			d.done()
		}
	}
	q.pend, q.pendHead = nil, 0
	for id, p := range q.subs {
		p.sink.Subscribed(id, uint32(p.req), wire.NotFound, "no queue "+q.name)
	}
	q.subs = nil
	for _, p := range q.purges {
		p.sink.Answer(p.req, noQueue(q))
	}
	q.purges = nil
	s.flushEffects()
	for _, p := range q.barriers {
		p.sink.Answer(p.req, Result{}) // nothing more of the queue will come
	}
	q.barriers = nil
}

// pendingBarrier is a CmdBarrier on a durable queue waiting for the
// entry of proposal seq seq to be applied.
type pendingBarrier struct {
	seq  uint64
	sink Sink
	req  uint64
}

// answerBarriers answers, after a round, the barriers whose queues have
// applied every entry proposed before them (all of an entry's commands
// are applied within the round, so none is answered halfway through one).
func (s *shard) answerBarriers() {
	if len(s.barrierQs) == 0 {
		return
	}
	kept := s.barrierQs[:0]
	flushed := false
	for _, q := range s.barrierQs {
		i := 0
		for ; i < len(q.barriers) && q.barriers[i].seq <= q.applSeq; i++ {
			if !flushed {
				s.flushEffects() // the effects of what they waited for go first
				flushed = true
			}
			q.barriers[i].sink.Answer(q.barriers[i].req, Result{})
			q.barriers[i] = pendingBarrier{}
		}
		q.barriers = q.barriers[i:]
		if len(q.barriers) > 0 {
			kept = append(kept, q)
		} else {
			q.barriers = nil
		}
	}
	clear(s.barrierQs[len(kept):])
	s.barrierQs = kept
}

// WaitRecovered waits until every durable queue has applied what its log
// held when it was opened (its messages and counts are back): a node
// opens its listeners after it. At once without Config.Durable.
func (b *Broker) WaitRecovered(ctx context.Context) error {
	if b.cfg.Durable == nil {
		return nil
	}
	for _, sh := range b.shards {
		done := make(chan struct{})
		sh.submit(Command{Kind: cmdPost, post: func() {
			sh.recovered = append(sh.recovered, done)
			sh.checkRecovered()
		}})
		select {
		case <-done:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	b.sweepOnce.Do(func() { b.sweepErr = b.removeDeletedGroups(ctx) })
	return b.sweepErr
}

// checkRecovered releases the WaitRecovered callers once every durable
// queue of the shard has caught up with its log (checked each round while
// someone waits).
func (s *shard) checkRecovered() {
	if len(s.recovered) == 0 {
		return
	}
	for q := range s.queues {
		if !q.opened && q.replicated && q.grp != nil && q.grp.FSM().AppliedIndex() >= q.openCommit {
			// What it knew committed at open is applied, though its last
			// entries held no command (a leader's empty entry, a change of
			// the group's voters: moves end that way) and so never reached
			// applied (a restarted node waited for them for good).
			q.opened = true
		}
		if q.grp != nil && !q.gone && q.grp.Err() == nil && !q.opened {
			return
		}
	}
	for _, c := range s.recovered {
		close(c)
	}
	s.recovered = nil
}
