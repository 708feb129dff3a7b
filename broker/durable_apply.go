package broker

// What a durable queue's applied entries do (applied, appliedEnqueue):
// the commands carried out at the entry's time, and the confirms, nacks,
// subscribe answers and purge counts of those this incarnation proposed
// (ours).

import (
	"github.com/warren-mq/warren/queue"
	"github.com/warren-mq/warren/replication"
	"github.com/warren-mq/warren/wire"
)

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
