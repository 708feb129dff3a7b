package broker

import (
	"encoding/binary"
	"errors"
	"slices"
	"time"

	"github.com/warren-mq/warren/queue"
	"github.com/warren-mq/warren/wire"
)

// Publish forwarding (design replication.md §6.3, the publish half): a
// node that does not lead a replicated queue forwards the messages a
// client published to it to the queue's leader over the cluster
// transport (DurableConfig.Forward), which enqueues them as its own
// clients' and sends their confirm back. The client's confirm waits for
// that answer, so it still means committed on a majority; an answer that
// does not come in time (the leader died, the link broke)
// (DurableConfig.ForwardTimeout, 10 s by default) is a nack, as is a refusal (the node asked no longer leads: the next
// publish goes to the leader it named). Forwarding is at-least-once: a
// message nacked this way may be in the queue; there is no per-enqueuer
// deduplication across leader changes yet (§6.4). Consumers, gets and
// purges are forwarded too (forward_consume.go).
//
// The messages (little-endian, internal to one Warren version; the
// cluster protocol's version guards mixed versions):
//
//	publish: 'P' | fwd u64 | queue id u64 | n u32 |
//	         n × (size u32 | priority u8 | hasExp u8 | expMs u32 | dedup u64 | len u32 | the message's log form)
//	confirm: 'C' | fwd u64 | leader u64 | n u32 | n × code u32
//
// fwd is the origin shard's id for the forward: shard index << 56 | a
// counter, so the confirm finds its shard.

// defaultForwardTimeout bounds how long a forwarded publish waits for its
// leader's confirm before it is nacked (DurableConfig.ForwardTimeout).
const defaultForwardTimeout = 10 * time.Second

// pendingFwd is a forwarded part of a publish batch waiting for the
// leader's confirm.
type pendingFwd struct {
	q   *Queue
	to  uint64 // the node it went to
	w   *partWait
	idx []int // batch index of each message forwarded
	at  int64 // when it was sent (ms)
}

// forward sends items (bound for replicated queue q, led elsewhere) to
// q's leader; what cannot be sent is nacked at once. It returns the
// batch's partWait, as enqueueDurable does.
func (s *shard) forward(q *Queue, items []EnqItem, batch *PublishBatch, w *partWait) *partWait {
	lead := q.lead.Load()
	send := s.b.cfg.Durable.Forward
	nack := func() *partWait {
		for _, it := range items {
			s.release(it.Msg)
			batch.Nack(it.Idx, wire.InternalNack)
		}
		return w
	}
	if lead == 0 || lead == s.nodeID() || send == nil {
		return nack()
	}
	s.fwdSeq++
	id := uint64(s.idx)<<56 | s.fwdSeq&(1<<56-1)
	b := append(make([]byte, 0, 64+len(items)*64), 'P')
	b = binary.LittleEndian.AppendUint64(b, id)
	b = binary.LittleEndian.AppendUint64(b, uint64(q.id))
	b = binary.LittleEndian.AppendUint32(b, uint32(len(items)))
	idx := make([]int, len(items))
	for i, it := range items {
		m := &it.Meta
		b = binary.LittleEndian.AppendUint32(b, m.Size)
		b = append(b, m.Priority, flagByte(m.HasExpiration))
		b = binary.LittleEndian.AppendUint32(b, m.ExpirationMs)
		b = binary.LittleEndian.AppendUint64(b, m.DedupKey)
		off := len(b)
		b = binary.LittleEndian.AppendUint32(b, 0)
		b = appendLogMsg(b, it.Msg)
		binary.LittleEndian.PutUint32(b[off:], uint32(len(b)-off-4))
		idx[i] = it.Idx
	}
	if !send(lead, b) {
		return nack()
	}
	for _, it := range items {
		s.release(it.Msg)
	}
	if w == nil {
		w = s.newPartWait(batch)
	}
	w.n++
	if s.fwd == nil {
		s.fwd = map[uint64]*pendingFwd{}
	}
	s.fwd[id] = &pendingFwd{q: q, to: lead, w: w, idx: idx, at: s.now}
	s.fwdOrder = append(s.fwdOrder, id)
	return w
}

// forwardConfirmed completes forward id with the leader's codes (nil:
// nack every message, the leader did not answer). lead is the leader the
// node asked knows: a node with no replica of the queue learns the
// leader only this way (a replica hears it from raft).
func (s *shard) forwardConfirmed(id uint64, codes []uint32, lead uint64) {
	p := s.fwd[id]
	if p == nil {
		return // timed out already
	}
	delete(s.fwd, id)
	switch q := p.q; {
	case lead != 0 && q.remote:
		q.lead.Store(lead)
	case codes == nil && q.remote && len(q.replicas) > 1:
		// No answer: that node may be down and the leader another
		// replica, which will name the leader if it is not it.
		cur := q.lead.Load()
		i := slices.Index(q.replicas, cur)
		q.lead.Store(q.replicas[(i+1)%len(q.replicas)])
	}
	for i, k := range p.idx {
		code := uint32(wire.InternalNack)
		if codes != nil && i < len(codes) {
			code = codes[i]
		}
		if code != 0 {
			p.w.batch.Nack(k, wire.Code(code))
		}
	}
	s.partRelease(p.w)
}

// forwardsLost nacks at once the forwards to q's old leader when its
// raft group names another (the old one may be dead: not waiting for the
// timeout). A forward it did apply is then nacked and confirmed never:
// at-least-once, as any nack during a failover.
func (s *shard) forwardsLost(q *Queue, lead uint64) {
	n := 0
	for id, p := range s.fwd {
		if p.q == q && p.to != lead {
			s.forwardConfirmed(id, nil, 0)
			n++
		}
	}
	if n > 0 {
		s.flushEffects()
	}
}

// expireForwards nacks the forwards that have waited their timeout.
func (s *shard) expireForwards() {
	limit := s.b.cfg.Durable.ForwardTimeout
	if limit <= 0 {
		limit = defaultForwardTimeout
	}
	i := 0
	for ; i < len(s.fwdOrder); i++ {
		id := s.fwdOrder[i]
		p := s.fwd[id]
		if p == nil {
			continue // answered
		}
		if s.now-p.at < limit.Milliseconds() {
			break
		}
		s.forwardConfirmed(id, nil, 0)
	}
	s.fwdOrder = s.fwdOrder[:copy(s.fwdOrder, s.fwdOrder[i:])]
	if len(s.fwdOrder) > 0 {
		s.flushEffects()
	}
}

var errForward = errors.New("broker: a forwarded message that does not parse")

// StepForward takes a message a peer forwarded (the cluster transport's
// DeliverForward); p is only valid during the call.
func (b *Broker) StepForward(from uint64, p []byte) {
	if len(p) < 1 || b.cfg.Durable == nil {
		return
	}
	switch p[0] {
	case 'P':
		b.forwardedPublish(from, append([]byte(nil), p...))
	case 'c':
		b.forwardedConsume(from, p) // forward_consume.go
	case 'C':
		if len(p) < 21 {
			return
		}
		id := binary.LittleEndian.Uint64(p[1:])
		lead := binary.LittleEndian.Uint64(p[9:])
		n := int(binary.LittleEndian.Uint32(p[17:]))
		if n > (len(p)-21)/4 || int(id>>56) >= len(b.shards) {
			return
		}
		codes := make([]uint32, n)
		for i := range codes {
			codes[i] = binary.LittleEndian.Uint32(p[21+4*i:])
		}
		s := b.shards[id>>56]
		s.submit(Command{Kind: cmdPost, post: func() { s.forwardConfirmed(id, codes, lead) }})
	}
}

// forwardedPublish enqueues a publish another node forwarded to this
// node, which it believes leads the queue, and answers with the confirm.
func (b *Broker) forwardedPublish(from uint64, p []byte) {
	if len(p) < 21 {
		return
	}
	id := binary.LittleEndian.Uint64(p[1:])
	qid := binary.LittleEndian.Uint64(p[9:])
	n := int(binary.LittleEndian.Uint32(p[17:]))
	if n > (len(p)-21)/22 || qid == 0 || qid > 1<<32 {
		return
	}
	k := &fwdSink{b: b, to: from, id: id}
	batch := &PublishBatch{Sink: k, Codes: make([]uint32, n)}
	batch.Pending.Store(1)
	q := b.topo.slots.get(queue.QueueRef(qid))
	items, ar, err := parseForwarded(p[21:], n, q)
	if q == nil || err != nil {
		for i := range batch.Codes {
			batch.Codes[i] = uint32(wire.InternalNack)
		}
		batch.PartDone()
		return
	}
	b.AddStoredBytes(ar.Cost)
	s := q.shard
	s.submit(Command{Kind: cmdPost, post: func() {
		k.lead = q.lead.Load()
		if q.gone || !q.leads() || !q.replicated {
			for _, it := range items {
				s.release(it.Msg)
				batch.Nack(it.Idx, wire.InternalNack)
			}
			batch.PartDone()
			return
		}
		q.published.Add(uint64(len(items)))
		s.enqueue(items, batch, nil)
	}})
}

// parseForwarded reads n forwarded messages for queue q (views of p).
func parseForwarded(p []byte, n int, q *Queue) ([]EnqItem, *Arena, error) {
	ar := &Arena{Buf: p}
	ar.Refs.Store(int64(n))
	ar.Cost = int64(len(p))
	items := make([]EnqItem, n)
	msgs := make([]StoredMsg, n)
	for i := range n {
		if len(p) < 22 {
			return nil, nil, errForward
		}
		m := queue.Message{Size: binary.LittleEndian.Uint32(p), Priority: p[4], HasExpiration: p[5] != 0,
			ExpirationMs: binary.LittleEndian.Uint32(p[6:]), DedupKey: binary.LittleEndian.Uint64(p[10:])}
		l := int(binary.LittleEndian.Uint32(p[18:]))
		p = p[22:]
		if l > len(p) || !parseLogMsg(ar, p[:l], &msgs[i]) {
			return nil, nil, errForward
		}
		p = p[l:]
		ar.Cost += StoredMsgOverhead
		items[i] = EnqItem{Q: q, Msg: &msgs[i], Meta: m, Idx: i}
	}
	if len(p) != 0 {
		return nil, nil, errForward
	}
	return items, ar, nil
}

// fwdSink answers a forwarded publish: its confirm goes back to the
// origin node. Nothing else of a Sink is used.
type fwdSink struct {
	b    *Broker
	to   uint64
	id   uint64
	lead uint64
}

func (k *fwdSink) Confirm(batch *PublishBatch) {
	p := append(make([]byte, 0, 21+4*len(batch.Codes)), 'C')
	p = binary.LittleEndian.AppendUint64(p, k.id)
	p = binary.LittleEndian.AppendUint64(p, k.lead)
	p = binary.LittleEndian.AppendUint32(p, uint32(len(batch.Codes)))
	for i := range batch.Codes {
		p = binary.LittleEndian.AppendUint32(p, batch.Codes[i])
	}
	if send := k.b.cfg.Durable.Forward; send != nil {
		send(k.to, p) // lost: the origin's timeout nacks it
	}
}

func (*fwdSink) Deliver([]Delivery)                                     {}
func (*fwdSink) Subscribed(queue.ConsumerID, uint32, wire.Code, string) {}
func (*fwdSink) Cancelled(queue.ConsumerID, wire.Code, string)          {}
func (*fwdSink) LeaseExpired(queue.ConsumerID, uint64)                  {}
func (*fwdSink) ConsumerGone(queue.ConsumerID)                          {}
func (*fwdSink) Answer(uint64, Result)                                  {}
