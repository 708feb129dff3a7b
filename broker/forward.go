package broker

import (
	"cmp"
	"encoding/binary"
	"slices"
	"strconv"
	"time"

	"github.com/warren-mq/warren/queue"
	"github.com/warren-mq/warren/replication"
	"github.com/warren-mq/warren/wire"
)

// Publish forwarding (design replication.md §6.3, the publish half): a
// node that does not lead a replicated queue forwards the messages a
// client published to it to the queue's leader over the cluster
// transport (DurableConfig.Forward), which enqueues them as its own
// clients' and sends their confirm back once applied. The client's
// confirm waits for that answer, so it still means committed on a
// majority.
//
// Forwarding is exactly-once while the origin node lives (enqueuer
// deduplication, design §6.4, replication/enqueuers.go): each shard is an
// enqueuer of every queue it forwards to (id node<<48 | shard; its
// incarnation from the node's start time, <<16, counting up for each
// stream the shard starts or starts over) and numbers its messages to the queue from 1 (qseq). A
// part stays in the shard's resend buffer (fwdStream) until the leader
// confirms it; the leader applies of a part only what its queue has not
// had from that enqueuer, so the origin may send a part again whenever it
// cannot tell whether it arrived:
//
//   - the queue's leader changed (a replica hears it from raft), or the
//     node asked answers that it does not lead, or holds no copy of the
//     queue (its replica moved away, or the queue lives on another node:
//     homed.go), naming the leader: every unconfirmed part goes to the
//     node named;
//   - the leader found a part missing before one it got (a gap: lost with
//     a connection, or with a log entry a leader change dropped): it
//     answers resend, and every unconfirmed part goes again;
//   - no answer for a quarter of DurableConfig.ForwardTimeout: sent again
//     (to the next replica, for a queue with no replica here).
//
// Parts already applied are confirmed (ack) again, not enqueued twice
// (on a reject-publish queue nacked instead: the leader does not know
// which of them the full queue refused), so no forwarded message is
// nacked that is in the queue, but for that and one more case: a
// part with no answer for ForwardTimeout (10 s by default: no leader
// reachable that long) is nacked with every unconfirmed part after it, and
// the stream starts over under a new incarnation; those may be in the
// queue (at-least-once, as any publish whose connection is lost). A part
// the leader refused whole (the queue gone, its enqueuer table full, the
// log refusing the entry) is nacked too, and the stream starts over: the
// parts after it cannot apply without it. The resend buffer is bounded
// (maxForwardHeld bytes per shard): a publish that would pass it is
// nacked at once, unsent. Consumers, gets and purges are forwarded too
// (forward_consume.go).
//
// The messages (little-endian, internal to one Warren version; the
// cluster protocol's version guards mixed versions):
//
//	publish: 'P' | enqueuer u64 | inc u64 | queue id u64 | qseq u64 | try u32 | n u32 |
//	         n × (size u32 | priority u8 | hasExp u8 | expMs u32 | dedup u64 | len u32 | the message's log form)
//	confirm: 'C' | enqueuer u64 | inc u64 | queue id u64 | qseq u64 | leader u64 | refused u8 | n u32 | n × code u32 | try u32
//	resend:  'R' | enqueuer u64 | inc u64 | queue id u64 | qseq u64 | try u32 | from u64 | leader u64
//	busy:    'B' | enqueuer u64 | inc u64 | queue id u64 | qseq u64
//	down:    'D' | enqueuer u64 | inc u64 | queue id u64
//
// A confirm with refused 1 applied nothing; try is the send it answers
// (absent from an earlier version's: read as 0, any), and a refusal of a
// send before the last is ignored (the last send's answer counts). A
// part forwarded to a queue that is not replicated goes to its home
// (homed.go), which enqueues it and confirms it at once, with the same
// per-enqueuer rules kept in memory. A resend answers the part
// (qseq, try): from 0, "not the leader: send to leader"; else "missing
// from qseq from: send again". try counts a part's sends, so that the
// answers to sends made before the last resend are told apart and
// ignored. Busy: the leader holds its own publishers back (its memory or
// disk alarm, Config.PublishBlocked) and took nothing of the part (a
// part whose messages the queue holds already is confirmed all the same:
// it takes nothing); the origin holds it and sends it again after the resend interval, until
// the alarm clears or ForwardTimeout passes (then nacked, as above). A
// stream with nothing unconfirmed that has been idle for a
// minute ends: 'D' tells the leader, which logs an enqueuer-down, so the
// queue's table keeps only the enqueuers in use.
//
// This file has the protocol and the origin side (a shard's streams, the
// parts' sends, resends and answers, dead letters forwarded); the leader
// side is in forward_enqueue.go.

// defaultForwardTimeout bounds how long a forwarded publish waits for its
// leader's confirm before it is nacked (DurableConfig.ForwardTimeout).
const defaultForwardTimeout = 10 * time.Second

// maxForwardHeld bounds the bytes of a shard's forwarded parts waiting
// for their confirm (the resend buffer); past it a publish to a queue led
// elsewhere is nacked at once.
const maxForwardHeld = 64 << 20

// maxForwardPart bounds one forwarded part's messages in bytes: half of
// what one log entry holds (replication.MaxCommandBytes), so that the
// leader's Enqueue of it, a little larger per message, fits one entry.
const maxForwardPart = replication.MaxCommandBytes / 2

const (
	fwdPublishHeader = 1 + 8 + 8 + 8 + 8 + 4 + 4
	fwdConfirmHeader = 1 + 8 + 8 + 8 + 8 + 8 + 1 + 4
	fwdResendLen     = 1 + 8 + 8 + 8 + 8 + 4 + 8 + 8
	fwdDownLen       = 1 + 8 + 8 + 8
	fwdBusyLen       = 1 + 8 + 8 + 8 + 8
)

// fwdStream is a shard's stream of parts to one queue led elsewhere: the
// enqueuer's qseqs and its unconfirmed parts, in qseq order.
type fwdStream struct {
	q     *Queue
	inc   uint64
	next  uint64 // the qseq of the next message
	parts []*fwdPart
	used  int64 // when a part was last added (ms): an idle stream ends
}

// streamIdle: a stream with nothing unconfirmed and no part added for
// this long ends (its enqueuer leaves the queue's table: 'D').
const streamIdle = time.Minute

// fwdPart is a forwarded part of a publish batch waiting for the leader's
// confirm.
type fwdPart struct {
	inc    uint64 // the stream's incarnation when it was made
	qseq   uint64
	n      int
	p      []byte // the publish message, kept for resends (its try field is rewritten)
	w      *partWait
	idx    []int // batch index of each message forwarded
	to     uint64
	try    uint32
	at     int64 // when first sent (ms): the give-up
	sentAt int64 // when last sent (ms): the resend
}

func (p *fwdPart) last() uint64 { return p.qseq + uint64(p.n) - 1 }

// enqueuerID is this shard's enqueuer id.
func (s *shard) enqueuerID() uint64 { return s.nodeID()<<48 | uint64(s.idx) }

// stream returns the shard's stream to q, made on first use.
func (s *shard) stream(q *Queue) *fwdStream {
	st := s.streams[q.id]
	if st == nil || st.q != q {
		if s.streams == nil {
			s.streams = map[queue.QueueRef]*fwdStream{}
		}
		st = &fwdStream{q: q, inc: s.newInc(), next: 1}
		s.streams[q.id] = st
	}
	return st
}

// newInc is a new enqueuer incarnation for a stream of this shard: above
// every one this shard used, in this life of the node or an earlier (the
// node's start time in ms << 16, then counting).
func (s *shard) newInc() uint64 {
	if s.fwdInc == 0 {
		s.fwdInc = s.b.seqBase >> 20 << 16
	}
	s.fwdInc++
	return s.fwdInc
}

// forward sends items (bound for replicated queue q, led elsewhere) to
// q's leader, holding them until it confirms; what cannot be held is
// nacked at once. It returns the batch's partWait, as enqueueDurable does.
func (s *shard) forward(q *Queue, items []EnqItem, batch *PublishBatch, w *partWait) *partWait {
	size := fwdPublishHeader
	for _, it := range items {
		size += 22 + logMsgHeader + len(it.Msg.Exchange()) + len(it.Msg.RoutingKey()) + len(it.Msg.Props()) + len(it.Msg.Body())
	}
	if len(items) > 1 && (size > maxForwardPart || len(items) > replication.MaxEntryMessages) {
		// More than the leader's log takes in one entry (it refuses such
		// a part whole): halves, parts of their own, in order.
		h := len(items) / 2
		w = s.forward(q, items[:h], batch, w)
		return s.forward(q, items[h:], batch, w)
	}
	if len(items) == 1 && replication.PublishFromBytes(1, logMsgLen(items[0].Msg)) > replication.MaxCommandBytes {
		// Alone larger than the leader's log takes in one entry: nacked
		// here, as the leader nacks its own publishers' (enqueueDurable).
		// Sent, it was refused whole, and with it the stream's parts
		// after it (refusedFrom): other publishers' messages.
		s.release(items[0].Msg)
		batch.Nack(items[0].Idx, wire.InternalNack)
		return w
	}
	if s.b.cfg.Durable.Forward == nil || s.fwdHeld+size > maxForwardHeld {
		for _, it := range items {
			s.release(it.Msg)
			batch.Nack(it.Idx, wire.InternalNack)
		}
		return w
	}
	st := s.stream(q)
	b := make([]byte, 0, size)
	b = append(b, 'P')
	b = binary.LittleEndian.AppendUint64(b, s.enqueuerID())
	b = binary.LittleEndian.AppendUint64(b, st.inc)
	b = binary.LittleEndian.AppendUint64(b, uint64(q.id))
	b = binary.LittleEndian.AppendUint64(b, st.next)
	b = binary.LittleEndian.AppendUint32(b, 0)
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
		s.release(it.Msg)
	}
	if w == nil {
		w = s.newPartWait(batch)
	}
	w.n++
	st.used = s.now
	p := &fwdPart{inc: st.inc, qseq: st.next, n: len(items), p: b, w: w, idx: idx, at: s.now}
	st.next += uint64(len(items))
	st.parts = append(st.parts, p)
	s.fwdHeld += len(b)
	s.bytesDelta += int64(len(b))
	s.sendPart(st, p, q.lead.Load())
	return w
}

// sendPart sends part p of st to node to (again, if sent before). Sent
// to this node (it leads the queue now), it is taken as a peer's would
// be. Not sent (no leader known, the peer's queue full), it waits for
// the next resend.
func (s *shard) sendPart(st *fwdStream, p *fwdPart, to uint64) {
	p.sentAt, p.to = s.now, to
	if to == 0 {
		return
	}
	p.try++
	if p.try > 1 {
		s.b.fwdResent.Add(1)
	}
	// The first send hands the part's own bytes (try 1 written in them
	// once; nobody changes them after); a resend a copy with its try.
	b := p.p
	if p.try == 1 {
		binary.LittleEndian.PutUint32(b[33:], 1)
	} else {
		b = slices.Clone(p.p)
		binary.LittleEndian.PutUint32(b[33:], p.try)
	}
	if to == s.nodeID() {
		s.b.forwardedPublish(to, b)
		return
	}
	s.b.cfg.Durable.Forward(to, b)
}

// resendAll sends every unconfirmed part of st again, to node to.
func (s *shard) resendAll(st *fwdStream, to uint64) {
	for _, p := range st.parts {
		s.sendPart(st, p, to)
	}
}

// partAnswered completes part i of st with the leader's codes (nil: nack
// every message) and removes it.
func (s *shard) partAnswered(st *fwdStream, i int, codes []uint32) {
	p := st.parts[i]
	st.parts = slices.Delete(st.parts, i, i+1)
	s.fwdHeld -= len(p.p)
	s.bytesDelta -= int64(len(p.p))
	for k, bi := range p.idx {
		code := uint32(wire.InternalNack)
		if codes != nil && k < len(codes) {
			code = codes[k]
		}
		if code != 0 {
			p.w.batch.Nack(bi, wire.Code(code))
		}
	}
	s.partRelease(p.w)
}

// refusedFrom nacks part i of st, which its leader refused whole, and
// every later part of its incarnation (they cannot apply without it); when
// that is the stream's current incarnation the stream starts over under a
// new one (qseqs from 1). Parts of an earlier incarnation before them stay
// until answered.
func (s *shard) refusedFrom(st *fwdStream, i int) {
	inc := st.parts[i].inc
	for j := len(st.parts) - 1; j >= i; j-- {
		if st.parts[j].inc == inc {
			s.partAnswered(st, j, nil)
		}
	}
	if inc == st.inc {
		st.inc, st.next = s.newInc(), 1
	}
}

// firstOf is the position of st's first part of incarnation inc (one
// is there).
func (st *fwdStream) firstOf(inc uint64) int {
	return slices.IndexFunc(st.parts, func(p *fwdPart) bool { return p.inc == inc })
}

// findPart is the position of st's part (inc, qseq), or -1.
func (st *fwdStream) findPart(inc, qseq uint64) int {
	i, ok := slices.BinarySearchFunc(st.parts, [2]uint64{inc, qseq}, func(p *fwdPart, k [2]uint64) int {
		if c := cmp.Compare(p.inc, k[0]); c != 0 {
			return c
		}
		return cmp.Compare(p.qseq, k[1])
	})
	if !ok {
		return -1
	}
	return i
}

// fwdAnswer is a leader's answer to a forwarded part.
type fwdAnswer struct {
	resend     bool
	busy       bool
	inc, qseq  uint64
	lead, from uint64
	try        uint32
	refused    bool
	codes      []uint32
}

// answered takes a leader's answer to a part of the stream to queue qid.
func (s *shard) answered(qid queue.QueueRef, a fwdAnswer) {
	st := s.streams[qid]
	if st == nil {
		return
	}
	q := st.q
	i := st.findPart(a.inc, a.qseq)
	if i < 0 {
		return // answered already
	}
	p := st.parts[i]
	q.learnLeader(a.lead) // a node with no replica learns the leader only this way
	switch {
	case a.busy:
		// Held here: the resend interval sends it again (checkForwards).
		s.b.fwdBusy.Add(1)
	case !a.resend && a.refused && a.try != 0 && a.try != p.try:
		// A refusal of a send made before the last (to a node that no
		// longer had the queue, say): the last send's answer counts.
	case !a.resend && a.refused:
		s.refusedFrom(st, i)
	case !a.resend:
		s.partAnswered(st, i, a.codes)
	case a.try != p.try:
		// The answer to a send made before the last: the last send's
		// answer is the one that counts.
	case a.from == 0 && a.lead == s.nodeID() && q.replicated && !q.leads():
		// Named leader by a node that heard it before this one did: the
		// change of leader will resend.
	case a.from != 0 && a.from < st.parts[st.firstOf(p.inc)].qseq:
		// It misses what it confirmed before: it forgot the stream (a
		// queue living on a node that restarted: homed.go). Those
		// cannot be sent again: the rest is nacked and the stream
		// starts over.
		s.refusedFrom(st, st.firstOf(p.inc))
	default:
		to := a.lead
		if to == 0 {
			to = q.lead.Load()
		}
		s.resendAll(st, to)
	}
	s.flushEffects()
}

// learnLeader notes the leader a peer named for q, on a node with no
// copy of it (it learns the leader no other way). A queue that lives on
// one node (homed.go) keeps its home.
func (q *Queue) learnLeader(lead uint64) {
	if lead != 0 && q.remote && q.home == 0 {
		q.lead.Store(lead)
	}
}

// leaderMoved resends the unconfirmed parts to q when its raft group
// names a new leader (the old one may be dead: not waiting for the
// timeout).
func (s *shard) leaderMoved(q *Queue, lead uint64) {
	st := s.streams[q.id]
	if st == nil || st.q != q || lead == 0 {
		return
	}
	for _, p := range st.parts {
		if p.to != lead {
			s.sendPart(st, p, lead)
		}
	}
}

// checkForwards resends the parts with no answer for a quarter of the
// forward timeout and gives up on those with none for the whole of it.
func (s *shard) checkForwards() {
	limit := s.b.cfg.Durable.ForwardTimeout
	if limit <= 0 {
		limit = defaultForwardTimeout
	}
	resendMs := max(limit.Milliseconds()/4, 1)
	for id, st := range s.streams {
		q := st.q
		if q.gone {
			for len(st.parts) > 0 {
				s.partAnswered(st, len(st.parts)-1, nil)
			}
			delete(s.streams, id)
			continue
		}
		if len(st.parts) == 0 {
			if s.now-st.used >= streamIdle.Milliseconds() {
				s.endStream(st)
			}
			continue
		}
		if s.now-st.parts[0].at >= limit.Milliseconds() {
			// No leader answered for that long: nacked, every part (the
			// later ones could only apply after it), and the stream starts
			// over.
			if ok, n := s.b.fwdNackLog.Allow(time.Now()); ok {
				s.b.log.Warn(forwardNackReason(q, st.parts[0].to, limit), "suppressed_since_last", n)
			}
			for len(st.parts) > 0 {
				s.partAnswered(st, len(st.parts)-1, nil)
			}
			st.inc, st.next = s.newInc(), 1
			continue
		}
		if s.now-st.parts[0].sentAt < resendMs {
			continue
		}
		to := q.lead.Load()
		if q.remote && len(q.replicas) > 1 && to == st.parts[0].to {
			// No answer: that node may be down and the leader another
			// replica, which will name the leader if it is not it.
			i := slices.Index(q.replicas, to)
			to = q.replicas[(i+1)%len(q.replicas)]
			q.lead.Store(to)
		}
		s.resendAll(st, to)
	}
	s.flushEffects()
}

// endStream ends an idle stream: its enqueuer leaves the queue's table
// (best effort: a lost 'D' leaves an entry, which the shard's next stream
// to the queue replaces, with a higher incarnation).
func (s *shard) endStream(st *fwdStream) {
	delete(s.streams, st.q.id)
	to := st.q.lead.Load()
	if to == 0 || s.b.cfg.Durable.Forward == nil {
		return
	}
	p := make([]byte, 0, fwdDownLen)
	p = append(p, 'D')
	p = binary.LittleEndian.AppendUint64(p, s.enqueuerID())
	p = binary.LittleEndian.AppendUint64(p, st.inc)
	p = binary.LittleEndian.AppendUint64(p, uint64(st.q.id))
	if to == s.nodeID() {
		s.b.enqueuerDown(to, p)
		return
	}
	s.b.cfg.Durable.Forward(to, p)
}

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
	case 'C', 'R', 'B':
		b.forwardAnswer(p)
	case 'D':
		b.enqueuerDown(from, p)
	}
}

// forwardAnswer hands a leader's answer to a forwarded part to the shard
// that sent it.
func (b *Broker) forwardAnswer(p []byte) {
	var a fwdAnswer
	if len(p) < 33 {
		return
	}
	enq := binary.LittleEndian.Uint64(p[1:])
	a.inc = binary.LittleEndian.Uint64(p[9:])
	qid := queue.QueueRef(binary.LittleEndian.Uint64(p[17:]))
	a.qseq = binary.LittleEndian.Uint64(p[25:])
	if enq>>48 != b.cfg.Durable.NodeID || enq&(1<<48-1) >= uint64(len(b.shards)) {
		return
	}
	switch p[0] {
	case 'C':
		if len(p) < fwdConfirmHeader {
			return
		}
		a.lead = binary.LittleEndian.Uint64(p[33:])
		a.refused = p[41] != 0
		n := int(binary.LittleEndian.Uint32(p[42:]))
		if n > (len(p)-fwdConfirmHeader)/4 {
			return
		}
		a.codes = make([]uint32, n)
		for i := range a.codes {
			a.codes[i] = binary.LittleEndian.Uint32(p[fwdConfirmHeader+4*i:])
		}
		if end := fwdConfirmHeader + 4*n; len(p) >= end+4 {
			a.try = binary.LittleEndian.Uint32(p[end:]) // the send it answers (0 from a node that does not say)
		}
	case 'B':
		if len(p) != fwdBusyLen {
			return
		}
		a.busy = true
	case 'R':
		if len(p) != fwdResendLen {
			return
		}
		a.resend = true
		a.try = binary.LittleEndian.Uint32(p[33:])
		a.from = binary.LittleEndian.Uint64(p[37:])
		a.lead = binary.LittleEndian.Uint64(p[45:])
	}
	s := b.shards[enq&(1<<48-1)]
	s.submit(Command{Kind: cmdPost, post: func() { s.answered(qid, a) }})
}

// forwardNackReason says why publishes forwarded for q to node to were
// nacked (the client's nack carries only internal_nack): no answer within
// limit, naming the node and what it is to q.
func forwardNackReason(q *Queue, to uint64, limit time.Duration) string {
	what := "its leader"
	if q.home != 0 {
		what = "its home (a non-durable or exclusive queue lives on one node)"
	}
	node := "no node"
	if to != 0 {
		node = "node " + strconv.FormatUint(to, 10)
	}
	return "publishes forwarded to " + QueueText(q.name) + " nacked (internal_nack): " + what + ", " + node +
		", did not answer within " + limit.String() + " (down or unreachable?)"
}

// forwardDeadLetter forwards dead letters (items, one for a held dead
// letter) to the leader of replicated queue q as a publish of its own: dl
// (nil: not held) is told once the leader confirmed it, so its source
// settles it only then (deadletter.go); a nack (the queue gone or full,
// no leader within ForwardTimeout) drops it, counted as target_refused,
// as a local target's refusal does.
func (s *shard) forwardDeadLetter(q *Queue, items []EnqItem, dl *dlWait) {
	batch := &PublishBatch{Sink: &dlFwdSink{s: s, target: q.name, dl: dl}, Codes: make([]uint32, len(items))}
	batch.Pending.Store(1)
	for i := range items {
		items[i].Idx = i
	}
	if w := s.forward(q, items, batch, nil); w != nil {
		s.partRelease(w)
	} else {
		batch.PartDone()
	}
}

// dlFwdSink hears the answer to forwarded dead letters, on the shard that
// forwarded them.
type dlFwdSink struct {
	s      *shard
	target string
	dl     *dlWait
}

func (k *dlFwdSink) Confirm(batch *PublishBatch) {
	for i := range batch.Codes {
		if batch.Codes[i] != 0 {
			k.s.dropDeadLetter(nil, k.target, dlTargetRefused)
		}
	}
	if k.dl != nil {
		k.dl.done()
	}
}

func (*dlFwdSink) Deliver([]Delivery)                                     {}
func (*dlFwdSink) Subscribed(queue.ConsumerID, uint32, wire.Code, string) {}
func (*dlFwdSink) Cancelled(queue.ConsumerID, wire.Code, string)          {}
func (*dlFwdSink) LeaseExpired(queue.ConsumerID, uint64)                  {}
func (*dlFwdSink) ConsumerGone(queue.ConsumerID)                          {}
func (*dlFwdSink) Answer(uint64, Result)                                  {}
