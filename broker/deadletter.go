package broker

import (
	"sync/atomic"

	"github.com/warren-mq/warren/queue"
	"github.com/warren-mq/warren/wire"
)

// At-least-once dead-lettering from durable queues.
//
// A durable queue's machine holds its dead letters
// (queue.Config.HoldDeadLetters): a dead letter is in its state, and its
// entry stays live in its log, from the command that killed it until a
// logged SettleDeadLetter. The shard sends it on as before (deadLetterTo:
// the same routing, cycle check and death history) with a dlWait that
// each target takes a reference of: a durable target lets go once the
// dead letter's entry is applied from its log (after the fdatasync that
// covers it), a replicated target led by another node once that leader
// confirmed it (forwardDeadLetter), an in-memory target once it has
// enqueued it, and a target
// that refuses it (deleted, reject-publish when full, its log stopped)
// once it has counted the drop. The last reference posts cmdDLDone to the
// source's shard, which adds SettleDeadLetter to the source's log; its
// Remove frees the entry. A dead letter with no target at all (no
// exchange, unroutable, a cycle, too large) is settled at once.
//
// After a crash or a restart the source's recovered machine (snapshot and
// log) still holds what was not settled on disk, and the shard sends
// those again once the log found at open is applied (resendHeld), with
// their original death time and reason, so the x-death history is the one
// the first send had. A dead letter whose targets had it but whose settle
// did not reach the disk is sent twice: at-least-once. Replaying the log
// sends nothing by itself (a replayed DeadLetter effect of a held dead
// letter is skipped), so a settled dead letter is not sent again.
//
// Bound: every send ends with each target's answer within its next log
// round (a refusal is an answer: the dead letter is dropped and counted,
// as before; it is never retried), so a source holds at most the dead
// letters in flight, plus, after a recovery, those it resends once.
// Nothing waits on a target that never confirms. A clean stop waits (at
// most its 10 s) for the dead letters in flight to be settled, so a
// restart sends none twice.
//
// Not at-least-once: an in-memory source (non-durable or exclusive) frees
// a dead letter when it sends it, as before; a copy sent to an in-memory
// target is lost with it in a crash, whatever the source.

// dlWait is a held dead letter in flight: one reference per target it
// was sent to, and one for the send itself.
type dlWait struct {
	src *Queue
	id  uint64
	n   atomic.Int32
}

// done drops one reference; the last tells the source's shard.
func (w *dlWait) done() {
	if w.n.Add(-1) == 0 {
		w.src.shard.submit(Command{Kind: cmdDLDone, dl: w})
	}
}

// sendHeld sends held dead letter id of durable queue q on to its
// targets (at: the death's time), unless it is in flight already.
func (s *shard) sendHeld(q *Queue, id uint64, reason wire.DeathReason, at int64) {
	if _, ok := q.dlFlight[id]; ok {
		return
	}
	if q.dlFlight == nil {
		q.dlFlight = map[uint64]struct{}{}
	}
	q.dlFlight[id] = struct{}{}
	s.b.dlInflight.Add(1)
	w := &dlWait{src: q, id: id}
	w.n.Store(1)
	if msg := s.msgOf(q, id); msg != nil {
		s.deadLetterTo(q, msg, reason, at, w)
	}
	w.done()
}

// resendHeld sends again, once, every dead letter q's machine holds (a
// queue recovered from its log), in id order, once the log found at open
// is applied (q.caughtUp) and the recovered topology is in the routing
// view (else they would find no exchange).
func (s *shard) resendHeld(q *Queue) {
	if q.dlResent || !q.caughtUp || q.gone || s.b.topo.restoring.Load() {
		return
	}
	q.dlResent = true
	if n, _ := q.m.HeldDeadLetters(); n == 0 {
		return
	}
	q.m.EachHeldDeadLetter(func(id uint64, reason wire.DeathReason, at int64) {
		s.sendHeld(q, id, reason, at)
	})
}

// topologyRestored ends OpenMetaLog's restore (its topology is in the
// view, or it failed): the durable queues that caught up with their logs
// meanwhile send their held dead letters.
func (b *Broker) topologyRestored() {
	b.topo.publishIfDirty()
	b.topo.restoring.Store(false)
	for _, sh := range b.shards {
		sh.submit(Command{Kind: cmdPost, post: func() {
			for q := range sh.queues {
				if q.grp != nil {
					sh.resendHeld(q)
				}
			}
		}})
	}
}

// logFailed hears a failed log write of a shard's worker: the node must
// stop (Durable.Fatal). Stopping shards no longer wait for dead letters
// in flight (some never will be settled): they are woken to see it.
func (b *Broker) logFailed(err error) {
	b.writeFailed.Store(true)
	b.wakeShards()
	if f := b.cfg.Durable.Fatal; f != nil {
		f(err)
	}
}

// dlDone settles a held dead letter every target has answered for.
func (s *shard) dlDone(w *dlWait) {
	q := w.src
	delete(q.dlFlight, w.id)
	if !q.gone && q.grp != nil {
		s.sdlCmd = queue.SettleDeadLetter{NowMs: s.now, ID: w.id}
		if _, err := q.grp.Add(&s.sdlCmd); err != nil {
			// The group has stopped: the next start sends it again.
			s.b.log.Error("durable queue: cannot settle a dead letter its targets have; it is sent again at the next start", queueLog(q.name), "err", err)
		}
	}
	if s.b.dlInflight.Add(-1) == 0 {
		s.b.wakeShards() // shards stopping wait for this (quiesce)
	}
}

// wakeShards wakes every shard (a stopping one rechecks what it waits
// for). Not for a hot path.
func (b *Broker) wakeShards() {
	for _, sh := range b.shards {
		select {
		case sh.wake <- struct{}{}:
		default:
		}
	}
}

// quiesceDLWait, if set (tests), is called when a stopping shard waits
// for dead letters in flight.
var quiesceDLWait func()
