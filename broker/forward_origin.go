package broker

import (
	"cmp"
	"encoding/binary"
	"slices"
	"strconv"
	"time"

	"github.com/warren-mq/warren/queue"
	"github.com/warren-mq/warren/wire"
)

// ---- origin side ----

// knownLeader is the node to forward q's requests to: its leader as
// this node knows it, 0 if none is known (nor this node, named by raft
// but not leading yet, or no longer).
func (s *shard) knownLeader(q *Queue) uint64 {
	lead := q.lead.Load()
	if lead == s.nodeID() && !q.leads() {
		return 0
	}
	return lead
}

// mayWait reports whether a request of q may wait for its leader to be
// known; if not it returns the refusal.
func (s *shard) mayWait(q *Queue) (wire.Code, string, bool) {
	code, reason := q.notHere()
	if s.b.cfg.Durable.Forward == nil {
		return code, reason, false
	}
	if n := s.fc.waiting[q]; n >= maxLeaderWaits {
		return code, reason + " (" + strconv.Itoa(n) + " requests of this queue already wait for one)", false
	}
	return 0, "", true
}

// noLeaderRefusal is the refusal of a request that waited ForwardTimeout
// for q's leader to be known.
func (s *shard) noLeaderRefusal(q *Queue) (wire.Code, string) {
	code, reason := q.notHere()
	return code, reason + " (none was known within " + (time.Duration(s.forwardTimeoutMs()) * time.Millisecond).String() + ")"
}

// waitForLeader marks ol as waiting for q's leader to be known (counted
// and timed while the client has no answer).
func (s *shard) waitForLeader(ol *fwdConsumer) {
	if ol.told || ol.waitAt != 0 {
		return
	}
	ol.waitAt = s.now
	s.countWait(ol.q, 1)
}

// stopWaiting ends ol's wait for a leader, if it waits.
func (s *shard) stopWaiting(ol *fwdConsumer) {
	if ol.waitAt != 0 {
		ol.waitAt = 0
		s.countWait(ol.q, -1)
	}
}

func (s *shard) countWait(q *Queue, d int) {
	fc := &s.fc
	if fc.waiting == nil {
		fc.waiting = map[*Queue]int{}
	}
	if fc.waiting[q] += d; fc.waiting[q] <= 0 {
		delete(fc.waiting, q)
	}
}

// fwdSubscribe subscribes the client's consumer on q's leader; with none
// known it waits for one.
func (s *shard) fwdSubscribe(q *Queue, k Sink, spec queue.ConsumerSpec, req uint32) {
	if q.home != 0 && q.exclusive != 0 {
		code, reason := homeRefusal(q)
		k.Subscribed(spec.ID, req, code, reason)
		return
	}
	lead := s.knownLeader(q)
	if lead == 0 {
		if code, reason, ok := s.mayWait(q); !ok {
			k.Subscribed(spec.ID, req, code, reason)
			return
		}
	}
	fc := &s.fc
	if fc.byID == nil {
		fc.byID = map[queue.ConsumerID]*fwdConsumer{}
		fc.byLink = map[uint64]*fwdConsumer{}
		fc.byOwner = map[uint64]map[*fwdConsumer]struct{}{}
	}
	if fc.byID[spec.ID] != nil {
		k.Subscribed(spec.ID, req, wire.InternalError, "a consumer with this id exists")
		return
	}
	ol := &fwdConsumer{q: q, sink: k, spec: spec, req: req}
	fc.byID[spec.ID] = ol
	own := fc.byOwner[uint64(spec.Owner)]
	if own == nil {
		own = map[*fwdConsumer]struct{}{}
		fc.byOwner[uint64(spec.Owner)] = own
	}
	own[ol] = struct{}{}
	s.relink(ol, lead)
}

// newLink draws a link id: unique in the cluster. The counter starts
// from this incarnation's start time (ms, 24 bits, << 16), so a node
// that restarted does not reuse the ids of links its leaders may still
// hold from before.
func (s *shard) newLink() uint64 {
	if s.fc.seq == 0 {
		s.fc.seq = (s.b.seqBase >> 20 & 0xffffff) << 16
	}
	s.fc.seq++
	return (s.nodeID()&0xffff)<<48 | uint64(s.idx)<<40 | s.fc.seq&(1<<40-1)
}

// relink replaces ol's link (if any) with a new one on node to (0: none
// known: the tick tries again).
func (s *shard) relink(ol *fwdConsumer, to uint64) {
	s.unlink(ol, linkDown)
	if ol.cancelled || ol.dead || (ol.spec.Get && ol.told) {
		// A cancelled consumer's unacked messages come back with the
		// link's Down; a get that had its answer gets nothing more.
		s.linkEnded(ol)
		return
	}
	if to == 0 {
		s.waitForLeader(ol) // the tick, or the leader's change, links it
		return
	}
	s.stopWaiting(ol)
	ol.link, ol.to, ol.sent, ol.recv, ol.heard = s.newLink(), to, 0, 0, s.now
	ol.drained = false
	s.fc.byLink[ol.link] = ol
	sp := &ol.spec
	p := append(make([]byte, 0, 48), 'c', 'S')
	p = binary.LittleEndian.AppendUint64(p, ol.link)
	p = binary.LittleEndian.AppendUint64(p, uint64(ol.q.id))
	p = binary.LittleEndian.AppendUint32(p, sp.Prefetch)
	p = binary.LittleEndian.AppendUint32(p, sp.PrefetchBytes)
	p = binary.LittleEndian.AppendUint16(p, uint16(sp.Priority))
	var f byte
	if sp.Exclusive {
		f |= specExclusive
	}
	if sp.Get {
		f |= specGet
	}
	if sp.AutoAck {
		f |= specAutoAck
	}
	p = append(p, f)
	p = binary.LittleEndian.AppendUint64(p, uint64(sp.TimeoutMs))
	p = binary.LittleEndian.AppendUint64(p, s.b.seqBase)
	s.b.sendFwd(to, p) // lost: no answer, and the tick replaces the link
}

// unlink drops ol's link: it is Downed (or cancelled) on its node.
func (s *shard) unlink(ol *fwdConsumer, mode byte) {
	if ol.link == 0 {
		return
	}
	s.sendLinkOp(ol, mode)
	delete(s.fc.byLink, ol.link)
	ol.link, ol.batch = 0, nil
}

func (s *shard) sendLinkOp(ol *fwdConsumer, mode byte) {
	p := append(make([]byte, 0, 19), 'c', 'X')
	p = binary.LittleEndian.AppendUint64(p, ol.link)
	p = binary.LittleEndian.AppendUint64(p, uint64(ol.q.id))
	p = append(p, mode)
	ol.sent++
	s.b.sendFwd(ol.to, p)
}

// linkEnded ends a consumer whose link is gone for good: a get's
// barriers are answered, and a cancelled consumer is forgotten (the
// client hears ConsumerGone); a get not cancelled yet waits for it.
func (s *shard) linkEnded(ol *fwdConsumer) {
	s.releaseGetBarriers(ol)
	if ol.cancelled {
		s.forgetForwarded(ol)
		ol.sink.ConsumerGone(ol.spec.ID)
		return
	}
	ol.dead = true
}

// forgetForwarded drops ol from the shard's maps.
func (s *shard) forgetForwarded(ol *fwdConsumer) {
	fc := &s.fc
	s.stopWaiting(ol)
	if ol.link != 0 {
		delete(fc.byLink, ol.link)
		ol.link = 0
	}
	if fc.byID[ol.spec.ID] == ol {
		delete(fc.byID, ol.spec.ID)
	}
	if own := fc.byOwner[uint64(ol.spec.Owner)]; own != nil {
		delete(own, ol)
		if len(own) == 0 {
			delete(fc.byOwner, uint64(ol.spec.Owner))
		}
	}
	s.releaseGetBarriers(ol)
}

func (s *shard) releaseGetBarriers(ol *fwdConsumer) {
	flushed := false
	for _, w := range ol.waits {
		if w.n--; w.n > 0 {
			continue
		}
		if !flushed {
			s.flushEffects() // what the links delivered goes first
			flushed = true
		}
		w.sink.Answer(w.req, Result{})
	}
	ol.waits = nil
}

// getWait is a barrier held until the gets forwarded for its queue when
// it came have their leaders' drains (n: those still to come).
type getWait struct {
	sink Sink
	req  uint64
	n    int
}

// fwdBarrier holds a barrier on q while a get forwarded for q waits for
// its leader's drain (netio answers a get once the barrier is: what it
// was handed by then is its message). It reports whether it held it.
func (s *shard) fwdBarrier(c *Command) bool {
	q := c.Queue
	if q == nil || len(s.fc.byID) == 0 {
		return false
	}
	if _, leader := c.Sink.(getDrained); leader {
		return false // a leader's own drain for a get (this node is also the origin)
	}
	var w *getWait
	for _, ol := range s.fc.byID {
		if ol.q == q && ol.spec.Get && !ol.drained && !ol.dead && !ol.cancelled {
			// Which get the barrier is for is not known here: it waits
			// for every one in progress.
			if w == nil {
				w = &getWait{sink: c.Sink, req: c.Req}
			}
			w.n++
			ol.waits = append(ol.waits, w)
		}
	}
	return w != nil
}

// fwdCancel cancels a forwarded consumer (CmdCancel at the origin). It
// reports whether id is one.
func (s *shard) fwdCancel(id queue.ConsumerID, requeue bool) bool {
	ol := s.fc.byID[id]
	if ol == nil {
		return false
	}
	if ol.cancelled && !requeue {
		return true
	}
	ol.cancelled = true
	if ol.link == 0 {
		s.linkEnded(ol)
		return true
	}
	mode := byte(linkCancel)
	if requeue {
		mode = linkRequeue
	}
	s.sendLinkOp(ol, mode) // 'g' follows once the leader forgets it
	return true
}

// fwdDown drops the forwarded consumers of a closed connection: Downed on
// their leaders.
func (s *shard) fwdDown(conn uint64) {
	own := s.fc.byOwner[conn]
	if own == nil {
		return
	}
	for _, ol := range sortedConsumers(own) {
		s.unlink(ol, linkDown)
		s.forgetForwarded(ol)
	}
}

func sortedConsumers(m map[*fwdConsumer]struct{}) []*fwdConsumer {
	out := make([]*fwdConsumer, 0, len(m))
	for ol := range m {
		out = append(out, ol)
	}
	slices.SortFunc(out, func(a, b *fwdConsumer) int { return cmp.Compare(a.spec.ID, b.spec.ID) })
	return out
}

// fwdSettle sends the settles of forwarded consumers to their leaders,
// each run (and runs of consecutive tags) as one range, and returns the
// others.
func (s *shard) fwdSettle(items []SettleItem) []SettleItem {
	i := slices.IndexFunc(items, func(it SettleItem) bool { return s.fc.byID[it.Consumer] != nil })
	if i < 0 {
		return items
	}
	rest := append(make([]SettleItem, 0, len(items)), items[:i]...)
	var p []byte
	var cur *fwdConsumer
	var n, at int
	flush := func() {
		if cur != nil && n > 0 {
			binary.LittleEndian.PutUint32(p[at:], uint32(n))
			cur.sent++
			s.b.sendFwd(cur.to, p)
		}
		cur, p, n = nil, nil, 0
	}
	for _, it := range items[i:] {
		ol := s.fc.byID[it.Consumer]
		if ol == nil || ol.q != it.Q {
			rest = append(rest, it)
			continue
		}
		if ol.link == 0 {
			continue // its deliveries come back with the old link's Down
		}
		if ol != cur {
			flush()
			cur = ol
			p = append(make([]byte, 0, 24+21*4), 'c', 'A')
			p = binary.LittleEndian.AppendUint64(p, ol.link)
			p = binary.LittleEndian.AppendUint64(p, uint64(ol.q.id))
			at = len(p)
			p = binary.LittleEndian.AppendUint32(p, 0)
		}
		if e := p[len(p)-21:]; n > 0 && e[0] == byte(it.Op) && binary.LittleEndian.Uint32(e[17:]) == it.Arg &&
			binary.LittleEndian.Uint64(e[9:]) == it.QTag-1 {
			binary.LittleEndian.PutUint64(e[9:], it.last())
			continue
		}
		p = append(p, byte(it.Op))
		p = binary.LittleEndian.AppendUint64(p, it.QTag)
		p = binary.LittleEndian.AppendUint64(p, it.last())
		p = binary.LittleEndian.AppendUint32(p, it.Arg)
		n++
	}
	flush()
	return rest
}

// fwdLeaderChanged re-subscribes q's forwarded consumers on its new
// leader (the origin is a replica and heard it from raft).
func (s *shard) fwdLeaderChanged(q *Queue, lead uint64) {
	if lead == 0 {
		return
	}
	s.sendWaitingPurges(q, lead) // asked before the consumers that wait, or as early
	if len(s.fc.byID) == 0 {
		return
	}
	for _, ol := range s.sortedOf(q) {
		if ol.link == 0 || ol.to != lead {
			s.relink(ol, lead)
		}
	}
}

// sortedOf is q's forwarded consumers in id order (nil q: all).
func (s *shard) sortedOf(q *Queue) []*fwdConsumer {
	var out []*fwdConsumer
	for _, ol := range s.fc.byID {
		if q == nil || ol.q == q {
			out = append(out, ol)
		}
	}
	slices.SortFunc(out, func(a, b *fwdConsumer) int { return cmp.Compare(a.spec.ID, b.spec.ID) })
	return out
}

// fwdQueueGone tells q's forwarded consumers their queue was deleted.
func (s *shard) fwdQueueGone(q *Queue, reason string) {
	s.statusTick(q)
	for _, id := range sortedPurges(s.fc.purges) {
		if p := s.fc.purges[id]; p.q == q && p.to == 0 {
			s.endPurge(id, Result{Code: wire.NotFound, Reason: "no queue " + q.name})
		}
	}
	if len(s.fc.byID) == 0 {
		return
	}
	for _, ol := range s.sortedOf(q) {
		s.forgetForwarded(ol)
		if !ol.told {
			ol.sink.Subscribed(ol.spec.ID, ol.req, wire.NotFound, "no queue "+ol.q.name)
			continue
		}
		ol.sink.Cancelled(ol.spec.ID, wire.NotFound, reason)
		ol.sink.ConsumerGone(ol.spec.ID)
	}
}

// nextLeader is where a link of q that its node stopped answering goes
// next: the leader this node knows if another, else (no replica here)
// the next replica, which names the leader if it is not it.
func (s *shard) nextLeader(q *Queue, from uint64) uint64 {
	lead := q.lead.Load()
	if lead != from || !q.remote || len(q.replicas) < 2 {
		return lead
	}
	i := slices.Index(q.replicas, from)
	next := q.replicas[(i+1)%len(q.replicas)]
	q.lead.Store(next)
	return next
}
