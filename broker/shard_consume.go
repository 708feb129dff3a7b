package broker

import (
	"github.com/warren-mq/warren/queue"
	"github.com/warren-mq/warren/wire"
)

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
