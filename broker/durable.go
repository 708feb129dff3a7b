package broker

import (
	"context"
	"encoding/binary"
	"fmt"
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

// ours reports whether an applied entry was proposed in this incarnation
// (after what the log held when the queue was opened): only those have
// pending confirms and requests here; of a replicated queue, only those
// this node proposed (another leader's are not).
func (q *Queue) ours(a *replication.Applied) bool {
	return a.Index > q.replayTo && (!q.replicated || a.Header.Proposer == q.proposer)
}

// applied carries out one applied command of a durable queue's log, at
// the time the entry stamps.
func (s *shard) applied(q *Queue, a *replication.Applied) {
	if q.gone {
		return
	}
	if !q.opened && q.ours(a) && a.Header.Seq >= q.openSeq {
		q.opened = true // the Downs and Tick added at open are applied
	}
	if !q.opened && q.replicated && a.Index >= q.openCommit {
		q.opened = true // what it knew committed at open is applied
	}
	if q.ours(a) && a.Header.Seq > q.applSeq {
		q.applSeq = a.Header.Seq
	}
	saved := s.now
	s.now = a.NowMs
	q.replaying = !q.ours(a)
	if !q.replaying && !q.caughtUp {
		q.caughtUp = true
		s.resendHeld(q)
	}
	switch c := a.Command.(type) {
	case *queue.Enqueue:
		s.appliedEnqueue(q, a, c)
	case *queue.Subscribe:
		p, ok := q.subs[c.Spec.ID]
		if ok && q.ours(a) {
			delete(q.subs, c.Spec.ID)
		} else {
			ok = false
		}
		switch {
		case a.Err != nil:
			if ok {
				p.sink.Subscribed(c.Spec.ID, uint32(p.req), wire.CodeOf(a.Err), reasonOf(a.Err))
			}
		case ok:
			q.cons[c.Spec.ID] = consumer{sink: p.sink, owner: uint64(c.Spec.Owner)}
			s.conns.addConsumer(uint64(c.Spec.Owner), q)
			p.sink.Subscribed(c.Spec.ID, uint32(p.req), wire.OK, "")
			s.handle(q, a.Effects)
		default:
			s.handle(q, a.Effects) // a consumer of an earlier incarnation (replay)
			s.orphanLink(q, c.Spec.ID)
		}
	case *queue.Cancel:
		s.handle(q, a.Effects)
		s.forgetIfGone(q, c.Consumer)
	case *queue.Settle:
		s.handle(q, a.Effects)
		s.forgetIfGone(q, c.Consumer)
	case *queue.Purge:
		n := int64(0)
		for _, e := range a.Effects {
			if e.Kind == queue.Remove {
				n++
			}
		}
		s.handle(q, a.Effects)
		if q.ours(a) && len(q.purges) > 0 {
			p := q.purges[0]
			q.purges = q.purges[1:]
			p.sink.Answer(p.req, Result{N: n})
		}
	default: // Down, Tick
		s.handle(q, a.Effects)
	}
	s.now = saved
}

func (s *shard) appliedEnqueue(q *Queue, a *replication.Applied, c *queue.Enqueue) {
	var p pendingPart
	have := false
	if q.ours(a) && q.replicated {
		// A replicated queue's leader may apply, after it led again, an
		// entry it proposed in an earlier term (committed by another
		// leader meanwhile): its waiters were answered when it stepped
		// down, so only an entry of the seq at the head is the head's.
		// Heads of earlier seqs were lost with a change of leader.
		for q.pendHead < len(q.pend) && q.pend[q.pendHead].seq < a.Header.Seq {
			s.failPart(q, q.pendHead)
		}
	}
	if q.ours(a) && q.pendHead < len(q.pend) && (!q.replicated || q.pend[q.pendHead].seq == a.Header.Seq) {
		p, have = q.pend[q.pendHead], true
		q.pend[q.pendHead] = pendingPart{}
		if q.pendHead++; q.pendHead == len(q.pend) {
			q.pend, q.pendHead = q.pend[:0], 0
		}
	}
	if have {
		s.bytesDelta -= p.bytes
	}
	switch a.From.Outcome {
	case replication.FromDuplicate:
		s.b.fwdDuplicates.Add(uint64(a.From.N))
	case replication.FromApplied:
		s.b.fwdDuplicates.Add(uint64(a.From.Skipped))
	}
	if have && p.w != nil && (q.args.Overflow == wire.RejectPublish || q.args.Overflow == wire.RejectPublishDLX) {
		// Messages an earlier send of this part got applied (its answer
		// was lost): the queue may have refused some of them when full,
		// and what it refused is not remembered. So they are nacked (each
		// may be in the queue: at-least-once), never confirmed while the
		// queue may not hold them.
		n := 0
		switch a.From.Outcome {
		case replication.FromDuplicate:
			n = a.From.N
		case replication.FromApplied:
			n = a.From.Skipped
		}
		for i := 0; i < n && i < len(p.idx); i++ {
			p.w.batch.Nack(p.idx[i], wire.InternalNack)
		}
	}
	if have && p.w != nil && a.From.Outcome != replication.FromNone {
		if k, ok := p.w.batch.Sink.(*fwdSink); ok {
			switch a.From.Outcome {
			case replication.FromGap:
				k.from = a.From.ResendFrom
			case replication.FromFull, replication.FromStale:
				k.refused = true
			}
		}
	}
	for _, e := range a.Effects {
		if e.Kind != queue.RejectPublish || len(c.Msgs) == 0 {
			continue
		}
		i := a.From.Skipped + int(e.Msg-c.Msgs[0].ID)
		switch {
		case have && p.w != nil && i < len(p.idx):
			p.w.batch.Nack(p.idx[i], wire.QueueFull)
		case have && p.dl:
			s.dropDeadLetter(nil, q.name, dlTargetRefused)
		}
	}
	s.handle(q, a.Effects)
	if have && p.dlw != nil {
		p.dlw.done() // on disk here (or refused): the source may settle it
	}
	if have && p.w != nil {
		// A forwarded part's confirm is not held at a full queue: its
		// origin would take the wait for a lost answer, send it again and
		// nack it at its timeout though it is in the queue.
		_, fwd := p.w.batch.Sink.(*fwdSink)
		if lim := s.b.cfg.QueueSoftLimit; lim > 0 && q.m.Ready() > lim && p.w.full == nil && !fwd {
			p.w.full = q
		}
		s.partRelease(p.w)
	}
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

// The log form of a message: flags, priority, the lengths of exchange,
// routing key and properties, then the four byte strings.
const logMsgHeader = 10

// logMsgLen is the length of m's log form.
func logMsgLen(m *StoredMsg) int {
	return logMsgHeader + int(m.exchange.n) + int(m.key.n) + int(m.props.n) + int(m.bd.n)
}

// logBodies is the queue.BodySource of a durable queue's Enqueue: the
// log forms of items' messages, written from their arenas into the entry.
type logBodies struct{ items []EnqItem }

func (l *logBodies) BodyLen(i int) int { return logMsgLen(l.items[i].Msg) }

func (l *logBodies) AppendBody(dst []byte, i int) []byte { return appendLogMsg(dst, l.items[i].Msg) }

func appendLogMsg(b []byte, m *StoredMsg) []byte {
	b = append(b, byte(m.Flags), m.Priority)
	b = binary.LittleEndian.AppendUint16(b, uint16(len(m.Exchange())))
	b = binary.LittleEndian.AppendUint16(b, uint16(len(m.RoutingKey())))
	b = binary.LittleEndian.AppendUint32(b, uint32(len(m.Props())))
	b = append(b, m.Exchange()...)
	b = append(b, m.RoutingKey()...)
	b = append(b, m.Props()...)
	return append(b, m.Body()...)
}

// parseLogMsg fills m with views of b (a message in its log form), which
// lies in ar.Buf.
func parseLogMsg(ar *Arena, b []byte, m *StoredMsg) bool {
	if len(b) < logMsgHeader {
		return false
	}
	ex := int(binary.LittleEndian.Uint16(b[2:]))
	rk := int(binary.LittleEndian.Uint16(b[4:]))
	pr := int(binary.LittleEndian.Uint32(b[6:]))
	rest := b[logMsgHeader:]
	if ex+rk+pr > len(rest) {
		return false
	}
	*m = ar.Msg(rest[:ex], rest[ex:ex+rk], rest[ex+rk:ex+rk+pr], rest[ex+rk+pr:], wire.MessageFlags(b[0]), b[1])
	return true
}

// msgOf is message id of q: its StoredMsg (memory queues), or a view of
// it read from the log (durable queues), valid until the end of the
// shard's batch (releaseViews).
func (s *shard) msgOf(q *Queue, id uint64) *StoredMsg {
	if q.grp == nil {
		return q.bodies.get(id)
	}
	b, err := q.grp.Body(id)
	if !q.viewing {
		q.viewing = true
		s.viewers = append(s.viewers, q)
	}
	if err != nil {
		s.b.log.Error("durable queue: a message's body is not in the log", queueLog(q.name), "id", id, "err", err)
		return nil
	}
	if s.viewUsed == len(s.views) {
		s.views = append(s.views, &logView{})
	}
	v := s.views[s.viewUsed]
	v.ar.Buf = b
	m := &v.m
	if !parseLogMsg(&v.ar, b, m) {
		s.b.log.Error("durable queue: a message in the log does not parse", queueLog(q.name), "id", id)
		return nil
	}
	s.viewUsed++
	return m
}

// logView is a message read from a durable queue's log: a view of the
// log's bytes, its arena only their holder (no references are counted).
type logView struct {
	m  StoredMsg
	ar Arena
}

// releaseViews ends the log views handed out in this batch (after the
// deliveries were handed to their sinks, which copy them).
func (s *shard) releaseViews() {
	for i, q := range s.viewers {
		q.viewing = false
		q.grp.ReleaseBodies()
		s.viewers[i] = nil
	}
	s.viewers = s.viewers[:0]
	for _, v := range s.views[:s.viewUsed] {
		v.m, v.ar.Buf = StoredMsg{}, nil
	}
	s.viewUsed = 0
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

// removeGroup closes a deleted durable queue's group on the shard's
// worker and removes its snapshot and log (segment.RemoveGroup) once
// nothing of it is in flight and the deletion is in the metadata log, on
// the pool, so deleting queues holds
// neither memory nor disk for them. Until that is done the group stays in
// openedGrps (the start-up sweep leaves it alone). Should the removal
// fail (the engine stopped: the node is going down), the next start
// removes the group (removeDeletedGroups).
func (s *shard) removeGroup(q *Queue) {
	gid := q.grp.ID()
	s.removing++
	// Only once the metadata log holds the deletion (removeQueue added
	// it before deleteQueue ran): a crash before that brings the queue
	// back, and it must find its log.
	metaSynced := func() error {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		return s.b.topo.sync(ctx, syncFor{queue: uint64(q.id)})
	}
	s.rw.Remove(q.grp, s.b.cfg.Durable.Snapshots, metaSynced, func(err error) {
		s.removing--
		delete(s.openedGrps, gid)
		if err != nil {
			s.b.log.Error("durable queue deleted: its log was not removed now; the next start removes it", queueLog(q.name), "group", gid, "err", err)
		}
		s.checkRemovals()
	})
}

// checkRemovals releases the waitGroupRemovals callers once no removal is
// in flight.
func (s *shard) checkRemovals() {
	if s.removing > 0 || len(s.removeWait) == 0 {
		return
	}
	for _, c := range s.removeWait {
		close(c)
	}
	s.removeWait = nil
}

// waitGroupRemovals waits until every shard has finished removing the
// groups of the durable queues deleted before the call.
func (b *Broker) waitGroupRemovals(ctx context.Context) error {
	for _, sh := range b.shards {
		done := make(chan struct{})
		sh.submit(Command{Kind: cmdPost, post: func() {
			sh.removeWait = append(sh.removeWait, done)
			sh.checkRemovals()
		}})
		select {
		case <-done:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

// removeDeletedGroups removes from the log (segment.RemoveGroup) and the
// snapshot store (SnapStore.Forget) every queue group that no queue of
// the metadata owns and that no shard opened in this incarnation: the
// groups of durable queues deleted (by a client, auto-delete or expiry)
// in an earlier incarnation, or in this one when the removal at run time
// (removeGroup) did not finish before a crash or failed. Their files are
// reclaimed, and a queue that later gets the same group id (a Meta id
// reused) starts empty. It runs once, when recovery is done and before
// the listeners open, so no group it removes has a worker writing to it.
func (b *Broker) removeDeletedGroups(ctx context.Context) error {
	dc := b.cfg.Durable
	keep := map[uint64]struct{}{}
	for _, sh := range b.shards {
		done := make(chan struct{})
		sh.submit(Command{Kind: cmdPost, post: func() {
			for gid := range sh.openedGrps {
				keep[gid] = struct{}{}
			}
			close(done)
		}})
		select {
		case <-done:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	b.topo.mu.Lock()
	for id := range b.topo.queues {
		keep[queueGroup(queue.QueueRef(id))] = struct{}{}
	}
	b.topo.mu.Unlock()
	gids := dc.Log.Groups()
	for _, d := range dc.Log.Damaged() {
		gids = append(gids, d.Group) // a deleted queue's damaged copy goes too
	}
	for _, gid := range gids {
		if gid < QueueGroupBase {
			continue
		}
		if _, ok := keep[gid]; ok {
			continue
		}
		// The snapshot first: a crash between the two leaves the log, and
		// the next start removes the group again.
		if err := dc.Snapshots.Forget(gid); err != nil {
			return fmt.Errorf("broker: removing deleted queue group %d: %w", gid, err)
		}
		if err := dc.Log.RemoveGroup(gid); err != nil {
			return fmt.Errorf("broker: removing deleted queue group %d: %w", gid, err)
		}
		b.log.Info("removed the log of a deleted durable queue", "group", gid)
	}
	return nil
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
