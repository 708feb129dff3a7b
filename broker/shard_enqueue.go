package broker

import (
	"github.com/warren-mq/warren/queue"
	"github.com/warren-mq/warren/wire"
)

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
