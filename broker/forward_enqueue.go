package broker

// The leader side of forwarded publishes (forward.go has the protocol and
// the origin side): a part taken from a peer (forwardedPublish,
// parseForwarded) and enqueued, refused, redirected or held back busy;
// its answer sent back (fwdSink); and the queues' enqueuer tables kept
// to the streams in use (enqueuerDown, nodesRemoved, sweepEnqueuers).

import (
	"encoding/binary"
	"errors"
	"math"
	"slices"

	"github.com/warren-mq/warren/queue"
	"github.com/warren-mq/warren/replication"
	"github.com/warren-mq/warren/wire"
)

// forwardedPublish enqueues a publish another node forwarded to this
// node (p is its own), which it believes leads the queue, as a
// publish-from of the origin's enqueuer; the answer goes back once
// applied (fwdSink).
func (b *Broker) forwardedPublish(from uint64, p []byte) {
	if len(p) < fwdPublishHeader {
		return
	}
	k := &fwdSink{b: b, to: from}
	k.origin.Enqueuer = binary.LittleEndian.Uint64(p[1:])
	k.origin.Incarnation = binary.LittleEndian.Uint64(p[9:])
	qid := binary.LittleEndian.Uint64(p[17:])
	k.origin.QSeq = binary.LittleEndian.Uint64(p[25:])
	k.try = binary.LittleEndian.Uint32(p[33:])
	k.qid = qid
	n := int(binary.LittleEndian.Uint32(p[37:]))
	if n == 0 || n > (len(p)-fwdPublishHeader)/22 || qid == 0 || qid > 1<<32 || k.origin.Enqueuer>>48 != from || k.origin.QSeq == 0 {
		return // not what a Warren node sends: no answer (its origin gives up)
	}
	batch := &PublishBatch{Sink: k, Codes: make([]uint32, n)}
	batch.Pending.Store(1)
	q := b.topo.slots.get(queue.QueueRef(qid))
	items, ar, err := parseForwarded(p[fwdPublishHeader:], n, q)
	if q == nil || err != nil {
		k.refused = true
		batch.PartDone()
		return
	}
	b.AddStoredBytes(ar.Cost)
	s := q.shard
	s.submit(Command{Kind: cmdPost, post: func() {
		k.lead = q.lead.Load()
		refuse := func() {
			for _, it := range items {
				s.release(it.Msg)
			}
			batch.PartDone()
		}
		switch {
		case q.gone:
			k.refused = true
			refuse()
			return
		case q.remote:
			// No copy here (its replica moved away, or it lives on
			// another node): the origin sends it to the node this one
			// names, which it may not have known.
			k.redirect, k.lead = true, s.redirectTo(q)
			refuse()
			return
		case q.m == nil || !q.replicated && q.home == 0:
			k.refused = true
			refuse()
			return
		case !q.leads():
			k.redirect = true // to the leader it names
			refuse()
			return
		case q.forwardedBefore(k.origin, len(items)):
			// A resend of a part the queue holds (its answer lost):
			// confirmed now, before any check that holds new
			// publishes back (busy), which would have its origin send
			// it again until its forward timeout and nack it.
			s.forwardedDuplicate(q, items, batch)
			return
		case b.cfg.PublishBlocked != nil && b.cfg.PublishBlocked():
			k.busy = true // held back as this node's own publishers are
			refuse()
			return
		case q.grp == nil && s.b.cfg.QueueSoftLimit > 0 && q.m.Ready() > s.b.cfg.QueueSoftLimit:
			// It lives here, over its backlog's soft limit: held back as
			// this node's own publishers' confirms are (shard.enqueue),
			// the origin sending it again later.
			k.busy = true
			refuse()
			return
		case q.grp == nil:
			s.enqueueForwarded(q, items, batch, k) // it lives here (homed.go)
			return
		}
		q.published.Add(uint64(len(items)))
		w := s.enqueueDurable(q, items, batch, nil, nil, &k.origin)
		if w != nil {
			s.partRelease(w)
		} else {
			batch.PartDone()
		}
	}})
}

var errForward = errors.New("broker: a forwarded message that does not parse")

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

// redirectTo is where this node, which holds no copy of q, sends the
// parts forwarded to it: the leader it knows, else a replica (which names
// the leader if it is not it); never itself.
func (s *shard) redirectTo(q *Queue) uint64 {
	if l := q.lead.Load(); l != 0 && l != s.nodeID() {
		return l
	}
	for _, n := range q.replicas {
		if n != s.nodeID() {
			return n
		}
	}
	return 0
}

// fwdSink answers a forwarded part: its confirm, refusal or resend goes
// back to the origin node (through appliedEnqueue and answerLost, which
// set what the answer is). Nothing else of a Sink is used.
type fwdSink struct {
	b        *Broker
	to       uint64
	qid      uint64
	origin   replication.Origin
	try      uint32
	lead     uint64
	refused  bool   // nothing of the part was applied, nor will be
	redirect bool   // this node does not lead the queue: resend to lead
	busy     bool   // this node's alarm is on: nothing taken, send again later
	from     uint64 // the queue misses the enqueuer's qseqs from here on: resend
}

func (k *fwdSink) Confirm(batch *PublishBatch) {
	var p []byte
	if k.busy {
		p = make([]byte, 0, fwdBusyLen)
		p = append(p, 'B')
	} else if k.redirect || k.from != 0 {
		p = make([]byte, 0, fwdResendLen)
		p = append(p, 'R')
	} else {
		p = make([]byte, 0, fwdConfirmHeader+4*len(batch.Codes)+4) // and its try
		p = append(p, 'C')
	}
	p = binary.LittleEndian.AppendUint64(p, k.origin.Enqueuer)
	p = binary.LittleEndian.AppendUint64(p, k.origin.Incarnation)
	p = binary.LittleEndian.AppendUint64(p, k.qid)
	p = binary.LittleEndian.AppendUint64(p, k.origin.QSeq)
	if p[0] == 'B' {
		// nothing more
	} else if p[0] == 'R' {
		p = binary.LittleEndian.AppendUint32(p, k.try)
		p = binary.LittleEndian.AppendUint64(p, k.from)
		p = binary.LittleEndian.AppendUint64(p, k.lead)
	} else {
		p = binary.LittleEndian.AppendUint64(p, k.lead)
		p = append(p, flagByte(k.refused))
		p = binary.LittleEndian.AppendUint32(p, uint32(len(batch.Codes)))
		for i := range batch.Codes {
			code := batch.Codes[i]
			if k.refused {
				code = uint32(wire.InternalNack)
			}
			p = binary.LittleEndian.AppendUint32(p, code)
		}
		p = binary.LittleEndian.AppendUint32(p, k.try)
	}
	if k.to == k.b.cfg.Durable.NodeID {
		k.b.forwardAnswer(p) // this node's own part (it leads the queue now)
		return
	}
	if send := k.b.cfg.Durable.Forward; send != nil {
		send(k.to, p) // lost: the origin sends the part again
	}
}

func (*fwdSink) Deliver([]Delivery)                                     {}
func (*fwdSink) Subscribed(queue.ConsumerID, uint32, wire.Code, string) {}
func (*fwdSink) Cancelled(queue.ConsumerID, wire.Code, string)          {}
func (*fwdSink) LeaseExpired(queue.ConsumerID, uint64)                  {}
func (*fwdSink) ConsumerGone(queue.ConsumerID)                          {}
func (*fwdSink) Answer(uint64, Result)                                  {}

// forwarded reports whether batch is a part another node forwarded here.
func forwarded(batch *PublishBatch) bool {
	_, ok := batch.Sink.(*fwdSink)
	return ok
}

// enqueuerDown takes an origin's end of its stream to a queue this node
// leads: the enqueuer leaves the queue's table (EnqueuerDown in its log).
func (b *Broker) enqueuerDown(from uint64, p []byte) {
	if len(p) != fwdDownLen {
		return
	}
	enq := binary.LittleEndian.Uint64(p[1:])
	inc := binary.LittleEndian.Uint64(p[9:])
	qid := binary.LittleEndian.Uint64(p[17:])
	q := b.topo.slots.get(queue.QueueRef(qid))
	if enq>>48 != from || enq&replication.EveryEnqueuer == replication.EveryEnqueuer || q == nil {
		return
	}
	q.shard.submit(Command{Kind: cmdPost, post: func() {
		switch {
		case !q.gone && q.replicated && q.leads():
			_, _ = q.grp.AddEnqueuerDown(enq, inc)
		case !q.gone && q.home != 0:
			q.homeEnqueuerDown(enq, inc)
		}
	}})
}

// nodesRemoved hears the nodes removed from the cluster (at every
// membership change): the queues led here drop their enqueuers (the node
// sweep, design §6.4), and so does a queue whose leadership this node
// takes later (leaderChanged).
func (b *Broker) nodesRemoved(removed []uint64) {
	if len(removed) == 0 || b.cfg.Durable == nil {
		return
	}
	r := slices.Clone(removed)
	b.removedNodes.Store(&r)
	for _, s := range b.shards {
		s.submit(Command{Kind: cmdPost, post: func() {
			for _, q := range s.byGroup {
				s.sweepEnqueuers(q)
			}
		}})
	}
}

// sweepEnqueuers proposes, in a queue this node leads, an enqueuer-down
// for every node removed from the cluster that still has enqueuers in
// its table (their streams ended with their node: none will say so).
func (s *shard) sweepEnqueuers(q *Queue) {
	rm := s.b.removedNodes.Load()
	if rm == nil || !q.leading || q.gone || q.grp == nil {
		return
	}
	for _, n := range *rm {
		if q.grp.FSM().HasEnqueuersOf(n) {
			_, _ = q.grp.AddEnqueuerDown(n<<48|replication.EveryEnqueuer, math.MaxUint64)
		}
	}
}
