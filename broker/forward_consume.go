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

// Consumer, get and purge forwarding (design replication.md §6.3, the
// consume half; §6.4's resume and owner-gone rules, in a simpler form):
// a client may consume from a replicated queue on any node (and from a
// non-durable or exclusive queue, whose home serves it as a leader does:
// homed.go). The node the
// client is on (the origin) keeps a fwdConsumer for the client's
// consumer and subscribes, on the queue's leader, a consumer of its own
// for it: a link. The leader runs the link as any consumer, with the
// client's prefetch (so it never has more out than the client allows),
// and its deliveries go back to the origin batched per round (one
// message per origin shard per flush), where they reach the client's
// channel with the leader's queue tags: the channel maps its own
// delivery tags to them, as for a local consumer, and its settles go
// back to the leader on the link. A get is a one-shot consumer (AMQP
// basic.get), its drain answered by the leader. A purge is a request
// and its answer.
//
// A link's consumer id is also its owner id, unique in the cluster:
// node << 48 | origin shard << 40 | a counter (a local consumer or
// connection id is a counter from 1). The leader knows nothing of the
// client's connection: the origin cancels the link when the client
// cancels, and Downs it when the client's connection closes.
//
// Resume: when the queue's leader changes (the origin hears it from raft
// as a replica, from the leader that stepped down, or no longer hears
// from the leader) the origin subscribes a new link on the new leader
// and drops the old one. It does not ask the new leader to resume the
// old link's deliveries (§6.4's Resume{consumer, lastTag}): every new
// leader already proposes a Down for every owner the queue's state holds
// before it serves anyone (replicated.go), old links included, so what
// the old link had unacked is back in the queue, redelivered, before the
// new link subscribes, and the new link gets it as any other message.
// Tags are the queue's and never reused, so the client's acks of the old
// link's tags, which go to the new link, match nothing and are ignored
// (queue.Machine.Settle skips tags it does not hold): at-least-once, as
// for a client connected to a leader that failed over, and nothing is
// lost or settled twice. A link dropped while its leader still leads
// (the origin stopped hearing from it) is Downed there first, on the
// same connection ahead of the new subscribe.
//
// No leader known: right after a queue is declared a replica that is
// not its preferred leader knows no leader until the election's messages
// reach it, and during a failover no replica knows one. A subscribe, get
// or purge that comes then waits on the origin (a fwdConsumer with no
// link, a fwdPurge not sent) and goes out as soon as a leader is known:
// raft names it to a replica (fwdLeaderChanged), a forward answer to a
// node with no replica, and the tick sends what waits to whatever leader
// the node knows by then. What waits is bounded: maxLeaderWaits per
// queue (past it a request is refused at once), and ForwardTimeout each
// (then refused, saying no leader was known). A consumer that was
// answered OK and lost its leader waits for the next one with no limit:
// it is the client's consumer, not a request.
//
// Liveness: every ForwardTimeout/4 the origin sends each leader a
// keepalive naming its links and how many messages it sent on each; the
// leader answers for each whether it still has it and how many
// deliveries it sent on it. The transport keeps a direction's messages
// in order but may lose some when a connection breaks: a count that
// differs means a lost message, and the link is replaced (a lost
// delivery would hold a prefetch slot for good, a lost ack too). A link
// the origin has not heard about for ForwardTimeout is replaced; a link
// the leader has not heard about for ForwardTimeout is Downed there (the
// origin node is gone or cut off: its clients' unacked messages are
// redelivered to others). Every node also says hello to every other one
// as often, naming its incarnation (the start time its proposal seqs
// count from), which each link's subscribe carries too: a node that
// restarted has none of its old clients, and a leader that hears its
// new incarnation Downs the links of the old one at once rather than
// after the timeout.
//
// Messages (after the 'c' that marks them; little-endian, internal to
// one Warren version, but for the hello, which nodes of two versions
// exchange during an upgrade: a field is only ever added at its end, and
// a reader ignores what follows the fields it knows):
//
//	origin → leader
//	  'S' link u64 | queue u64 | prefetch u32 | prefetch bytes u32 | priority u16 | flags u8 | timeout ms u64 | incarnation u64
//	  'A' link | queue | n u32 | n × (op u8 | first u64 | last u64 | arg u32)   settles
//	  'X' link | queue | mode u8                                                cancel, cancel+requeue, down
//	  'K' n u32 | n × (link | queue | sent u64)                                 keepalive
//	  'U' id u64 | queue                                                        purge
//	  'W' id u64 | queue | if u8 (1 if-unused, 2 if-empty)                      delete (answered as a purge)
//	  'I' incarnation u64 | features u64                                        hello, to every node (features: helloFeatures; absent from builds before it)
//	leader → origin
//	  's' link | code u32 | leader u64 | moved u8 | reason                      subscribed
//	  'd' n u32 | n × (link | qtag u64 | msg id u64 | dc u32 | fc u32 | len u32 | log form)
//	  'x' link | code u32 | reason                                              cancelled (queue deleted)
//	  'm' link | leader u64                                                     moved: resubscribe
//	  'g' link                                                                  gone (drained after a cancel)
//	  'l' link | qtag                                                           lease expired
//	  'k' link | alive u8 | sent u64                                            keepalive answer
//	  'e' link                                                                  a get's drain done
//	  'u' id | code u32 | n u64 | reason                                        purge answer
//	  'v' id | leader u64                                                       purge: not the leader (0: none known)

const (
	linkCancel  = 0
	linkRequeue = 1
	linkDown    = 2

	specExclusive = 1
	specGet       = 2
	specAutoAck   = 4

	// maxRedirects bounds how often a subscribe follows "not the leader,
	// try node N" before the client is told.
	maxRedirects = 3
	// fwdDeliverChunk: a flush's deliveries to one origin shard go in
	// messages of about this size.
	fwdDeliverChunk = 1 << 20
	// maxLeaderWaits bounds the subscribes, gets and purges of one queue
	// that wait on a node for its leader to be known (each holds a
	// client's request and a little memory until then).
	maxLeaderWaits = 1024
)

// fwdConsume is a shard's forwarded consumers: those of its clients on
// queues led elsewhere (origin side), and the links it serves for other
// nodes' clients (leader side). Shard-owned.
type fwdConsume struct {
	byID    map[queue.ConsumerID]*fwdConsumer
	byLink  map[uint64]*fwdConsumer
	byOwner map[uint64]map[*fwdConsumer]struct{}
	seq     uint64
	kaAt    int64 // when keepalives last went out

	links map[uint64]*servedLink
	sinks map[uint64]*linkSink // by origin node << 8 | origin shard

	purges   map[uint64]*fwdPurge
	purgeSeq uint64

	waiting map[*Queue]int // requests waiting for a leader to be known, per queue

	status    map[uint64]*fwdStatus // barriers waiting for their queue's counts (forward_status.go)
	statusSeq uint64
}

// fwdConsumer is a client's consumer of a queue led elsewhere.
type fwdConsumer struct {
	q         *Queue
	sink      Sink
	spec      queue.ConsumerSpec // the client's
	req       uint32
	link      uint64 // the leader's consumer for it (0: none now: the tick subscribes one)
	to        uint64 // the node link is on
	told      bool   // the client heard Subscribed OK
	cancelled bool   // the client cancelled it: not resubscribed
	dead      bool   // a get whose link went: nothing more comes
	redirects int
	waitAt    int64  // ms: since when it waits for a leader to be known, not yet answered (0: it does not)
	sent      uint64 // messages sent on link after its subscribe
	recv      uint64 // deliveries received on link
	heard     int64  // ms: the last word about link from its node (or when it was made)
	batch     *sinkBatch
	drained   bool       // a get: its leader's drain is done
	waits     []*getWait // barriers waiting for this get's drain
}

// servedLink is a link this node serves as a queue's leader.
type servedLink struct {
	q       *Queue
	from    uint64 // the origin node
	inc     uint64 // its incarnation
	recv    uint64 // messages received after its subscribe
	sent    uint64 // deliveries sent
	heard   int64
	said    bool // told the origin it is gone ('x', 'm'): nothing more
	pending bool // its subscribe is not applied yet
	drop    bool // drop it once its subscribe is applied
}

// fwdPurge is a purge forwarded to a queue's leader.
type fwdPurge struct {
	q    *Queue
	sink Sink
	req  uint64
	at   int64  // ms: when it came, then when it was sent
	to   uint64 // the node it was sent to (0: none yet: it waits for a leader)

	waits     bool // counted in fwdConsume.waiting
	redirects int  // "not the leader" answers followed
	// del: a delete with if-unused (delIfUnused) or if-empty
	// (delIfEmpty), forwarded as a purge is (0: a purge)
	del byte
}

func (w *fwdPurge) what() string {
	if w.del != 0 {
		return "delete"
	}
	return "purge"
}

// A forwarded delete's conditions ('W'), and delPlain, set on every one
// (a home of an earlier version reads a delete with neither condition
// alike).
const (
	delIfUnused = 1
	delIfEmpty  = 2
	delPlain    = 4
)

// forwardTimeoutMs is DurableConfig.ForwardTimeout or its default, in ms.
func (s *shard) forwardTimeoutMs() int64 {
	if d := s.b.cfg.Durable.ForwardTimeout; d > 0 {
		return d.Milliseconds()
	}
	return defaultForwardTimeout.Milliseconds()
}

// sendFwd sends p to node to over the cluster transport; to this node
// itself it is handed to StepForward (a link whose leader is this node
// again).
func (b *Broker) sendFwd(to uint64, p []byte) bool {
	if to == b.cfg.Durable.NodeID {
		b.StepForward(to, p)
		return true
	}
	if send := b.cfg.Durable.Forward; send != nil && to != 0 {
		return send(to, p)
	}
	return false
}

// ledElsewhere reports whether q is a replicated queue this node does
// not lead: its consumers, gets and purges are forwarded.
func (q *Queue) ledElsewhere() bool {
	return !q.gone && (q.remote || (q.replicated && q.grp != nil && !q.grp.Leader()))
}

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

// tickForwarded is the forwarded consumers' clock: keepalives, links
// not heard about, purges not answered.
func (s *shard) tickForwarded() {
	fc := &s.fc
	limit := s.forwardTimeoutMs()
	s.statusTick(nil)
	for _, id := range sortedPurges(fc.purges) {
		p := fc.purges[id]
		switch {
		case p.to != 0:
			if s.now-p.at >= limit && !s.deleteHere(id) {
				s.endPurge(id, Result{Code: wire.InternalError, Reason: "the queue's leader did not answer the forwarded " + p.what() + " in time: it may or may not have happened"})
			}
		case p.q.gone:
			s.endPurge(id, Result{Code: wire.NotFound, Reason: "no queue " + p.q.name})
		case s.knownLeader(p.q) != 0:
			s.sendPurge(id, s.knownLeader(p.q))
		case s.now-p.at >= limit && !s.deleteHere(id):
			code, reason := s.noLeaderRefusal(p.q)
			s.endPurge(id, Result{Code: code, Reason: reason})
		}
	}
	for _, l := range sortedLinks(fc.links) {
		rl := fc.links[l]
		if s.now-rl.heard >= limit {
			s.dropLink(l) // the origin is gone or cut off
		}
	}
	if len(fc.byID) == 0 {
		return
	}
	for _, ol := range s.sortedOf(nil) {
		switch {
		case ol.link == 0 && !ol.cancelled && !ol.dead:
			if lead := s.knownLeader(ol.q); lead != 0 {
				s.relink(ol, lead)
			} else if ol.waitAt != 0 && s.now-ol.waitAt >= limit {
				s.forgetForwarded(ol)
				code, reason := s.noLeaderRefusal(ol.q)
				ol.sink.Subscribed(ol.spec.ID, ol.req, code, reason)
			}
		case ol.link != 0 && s.now-ol.heard >= limit:
			if ol.redirects++; !ol.told && ol.redirects > maxRedirects {
				s.forgetForwarded(ol)
				code, reason := ol.q.notHere()
				ol.sink.Subscribed(ol.spec.ID, ol.req, code, reason+"; it did not answer")
				continue
			}
			s.relink(ol, s.nextLeader(ol.q, ol.to))
		}
	}
	if s.now-fc.kaAt < limit/4 {
		return
	}
	fc.kaAt = s.now
	by := map[uint64][]byte{}
	var nodes []uint64
	for _, ol := range s.sortedOf(nil) {
		if ol.link == 0 {
			continue
		}
		p := by[ol.to]
		if p == nil {
			p = append(make([]byte, 0, 64), 'c', 'K', 0, 0, 0, 0)
			nodes = append(nodes, ol.to)
		}
		p = binary.LittleEndian.AppendUint64(p, ol.link)
		p = binary.LittleEndian.AppendUint64(p, uint64(ol.q.id))
		p = binary.LittleEndian.AppendUint64(p, ol.sent)
		binary.LittleEndian.PutUint32(p[2:], binary.LittleEndian.Uint32(p[2:])+1)
		by[ol.to] = p
	}
	for _, to := range nodes {
		s.b.sendFwd(to, by[to])
	}
}

func sortedLinks(m map[uint64]*servedLink) []uint64 {
	out := make([]uint64, 0, len(m))
	for l := range m {
		out = append(out, l)
	}
	slices.Sort(out)
	return out
}

// fwdPurge forwards a purge of q to its leader; with none known it
// waits for one.
func (s *shard) fwdPurge(q *Queue, k Sink, req uint64) {
	if q.home != 0 && q.exclusive != 0 {
		code, reason := homeRefusal(q)
		k.Answer(req, Result{Code: code, Reason: reason})
		return
	}
	s.fwdPurgeOrDelete(q, k, req, 0)
}

// fwdDelete forwards a delete of q to its leader or home, which checks
// if-unused and if-empty and answers the count of messages deleted (this
// node holds no copy of q): as a purge is forwarded, answered the same
// way. One without conditions that no leader answers (none known, or
// none answering within ForwardTimeout: a dead home) is done here
// instead, its count unknown (0).
func (s *shard) fwdDelete(q *Queue, k Sink, req uint64, ifUnused, ifEmpty bool) {
	del := byte(delPlain)
	if ifUnused {
		del |= delIfUnused
	}
	if ifEmpty {
		del |= delIfEmpty
	}
	s.fwdPurgeOrDelete(q, k, req, del)
}

// deleteHere ends forwarded delete id that no leader answered: done
// here when it has no conditions (true), else left to the caller.
func (s *shard) deleteHere(id uint64) bool {
	w := s.fc.purges[id]
	if w.del != delPlain {
		return false
	}
	s.endPurge(id, s.deleteIf(w.q, false, false, "queue deleted"))
	return true
}

func (s *shard) fwdPurgeOrDelete(q *Queue, k Sink, req uint64, del byte) {
	lead := s.knownLeader(q)
	if lead == 0 && del == delPlain {
		k.Answer(req, s.deleteIf(q, false, false, "queue deleted"))
		return
	}
	if lead == 0 {
		if code, reason, ok := s.mayWait(q); !ok {
			k.Answer(req, Result{Code: code, Reason: reason})
			return
		}
	}
	fc := &s.fc
	fc.purgeSeq++
	id := uint64(s.idx)<<56 | fc.purgeSeq&(1<<56-1)
	if fc.purges == nil {
		fc.purges = map[uint64]*fwdPurge{}
	}
	fc.purges[id] = &fwdPurge{q: q, sink: k, req: req, at: s.now, del: del}
	if lead == 0 {
		s.purgeWaits(fc.purges[id], true)
		return
	}
	s.sendPurge(id, lead)
}

// purgeWaits marks w as waiting for a leader to be known, or not.
func (s *shard) purgeWaits(w *fwdPurge, waits bool) {
	switch {
	case waits && !w.waits:
		s.countWait(w.q, 1)
	case !waits && w.waits:
		s.countWait(w.q, -1)
	}
	w.waits = waits
}

// sendPurge sends waiting purge id to node lead.
func (s *shard) sendPurge(id, lead uint64) {
	w := s.fc.purges[id]
	s.purgeWaits(w, false)
	p := append(make([]byte, 0, 19), 'c', 'U')
	if w.del != 0 {
		p[1] = 'W'
	}
	p = binary.LittleEndian.AppendUint64(p, id)
	p = binary.LittleEndian.AppendUint64(p, uint64(w.q.id))
	if w.del != 0 {
		p = append(p, w.del)
	}
	if !s.b.sendFwd(lead, p) {
		s.endPurge(id, Result{Code: wire.InternalError, Reason: "the " + w.what() + " could not be sent to the queue's leader (node " + strconv.FormatUint(lead, 10) + "): retry it"})
		return
	}
	w.to, w.at = lead, s.now
}

// sendWaitingPurges sends q's purges that wait for a leader to lead.
func (s *shard) sendWaitingPurges(q *Queue, lead uint64) {
	for _, id := range sortedPurges(s.fc.purges) {
		if p := s.fc.purges[id]; p.q == q && p.to == 0 {
			s.sendPurge(id, lead)
		}
	}
}

// purgeMoved follows a "not the leader" answer to purge id from node
// from: sent to the leader it names, or, with none named, held until one
// is known (as a purge that came with none known); after maxRedirects the
// client is told.
func (s *shard) purgeMoved(from, id, lead uint64) {
	w := s.fc.purges[id]
	if w == nil || w.to != from {
		return // answered, timed out, or sent elsewhere since
	}
	if w.redirects++; w.redirects > maxRedirects {
		code, reason := w.q.notHere()
		s.endPurge(id, Result{Code: code, Reason: reason + "; the nodes asked did not lead it"})
		return
	}
	w.q.learnLeader(lead)
	if lead != 0 && lead != from {
		s.sendPurge(id, lead)
		return
	}
	w.to, w.at = 0, s.now
	s.purgeWaits(w, true)
}

// endPurge answers purge id and forgets it.
func (s *shard) endPurge(id uint64, r Result) {
	w := s.fc.purges[id]
	delete(s.fc.purges, id)
	s.purgeWaits(w, false)
	w.sink.Answer(w.req, r)
}

func sortedPurges(m map[uint64]*fwdPurge) []uint64 {
	out := make([]uint64, 0, len(m))
	for id := range m {
		out = append(out, id)
	}
	slices.Sort(out)
	return out
}

// ---- origin side: what leaders send ----

// fromLeader takes a leader's message about the links of this shard.
func (s *shard) fromLeader(from uint64, p []byte) {
	op := p[1]
	p = p[2:]
	if op == 'd' {
		s.linkDeliveries(p)
		return
	}
	if op == 'u' {
		if len(p) < 20 {
			return
		}
		id := binary.LittleEndian.Uint64(p)
		w := s.fc.purges[id]
		if w == nil {
			return // timed out already
		}
		delete(s.fc.purges, id)
		w.sink.Answer(w.req, Result{Code: wire.Code(binary.LittleEndian.Uint32(p[8:])), N: int64(binary.LittleEndian.Uint64(p[12:])), Reason: string(p[20:])})
		return
	}
	if op == 't' {
		s.statusAnswered(p)
		return
	}
	if op == 'v' {
		if len(p) >= 16 {
			s.purgeMoved(from, binary.LittleEndian.Uint64(p), binary.LittleEndian.Uint64(p[8:]))
		}
		return
	}
	if len(p) < 8 {
		return
	}
	ol := s.fc.byLink[binary.LittleEndian.Uint64(p)]
	if ol == nil {
		return // a link replaced or dropped
	}
	p = p[8:]
	ol.heard = s.now
	switch op {
	case 's':
		if len(p) < 13 {
			return
		}
		code := wire.Code(binary.LittleEndian.Uint32(p))
		lead := binary.LittleEndian.Uint64(p[4:])
		moved := p[12] != 0
		ol.q.learnLeader(lead)
		if code == wire.OK {
			ol.redirects = 0
			if !ol.told {
				ol.told = true
				ol.sink.Subscribed(ol.spec.ID, ol.req, wire.OK, "")
			}
			return
		}
		delete(s.fc.byLink, ol.link) // refused: nothing to drop there
		ol.link, ol.batch = 0, nil
		if moved {
			if ol.redirects++; ol.redirects <= maxRedirects && lead != from {
				s.relink(ol, lead) // 0: the tick retries
				return
			}
			if ol.told {
				return // the tick retries
			}
		}
		s.forgetForwarded(ol)
		reason := string(p[13:])
		if !ol.told {
			ol.sink.Subscribed(ol.spec.ID, ol.req, code, reason)
			return
		}
		ol.sink.Cancelled(ol.spec.ID, code, reason)
		ol.sink.ConsumerGone(ol.spec.ID)
	case 'x':
		if len(p) < 4 {
			return
		}
		s.forgetForwarded(ol)
		ol.sink.Cancelled(ol.spec.ID, wire.Code(binary.LittleEndian.Uint32(p)), string(p[4:]))
		ol.sink.ConsumerGone(ol.spec.ID)
	case 'm':
		lead := uint64(0)
		if len(p) >= 8 {
			lead = binary.LittleEndian.Uint64(p)
		}
		ol.q.learnLeader(lead)
		if lead == from {
			lead = 0
		}
		delete(s.fc.byLink, ol.link) // gone there
		ol.link, ol.batch = 0, nil
		s.relink(ol, lead)
	case 'g':
		delete(s.fc.byLink, ol.link)
		ol.link, ol.batch = 0, nil
		if ol.cancelled {
			s.linkEnded(ol)
		} else {
			s.relink(ol, ol.q.lead.Load())
		}
	case 'l':
		if len(p) >= 8 {
			ol.sink.LeaseExpired(ol.spec.ID, binary.LittleEndian.Uint64(p))
		}
	case 'e':
		ol.drained = true
		s.releaseGetBarriers(ol)
	case 'k':
		if len(p) < 9 {
			return
		}
		if p[0] == 0 || binary.LittleEndian.Uint64(p[1:]) != ol.recv {
			// Gone there, or a delivery lost on the way: the link
			// holds prefetch that will never be freed.
			s.relink(ol, ol.q.lead.Load())
		}
	}
}

// linkDeliveries hands the deliveries a leader sent to their clients.
// p is this shard's (a copy): the messages are views of it, valid while
// the batch's effects are flushed.
func (s *shard) linkDeliveries(p []byte) {
	if len(p) < 4 {
		return
	}
	n := int(binary.LittleEndian.Uint32(p))
	p = p[4:]
	if n > len(p)/36 {
		return // not a message of ours: no allocation on its word
	}
	msgs := make([]StoredMsg, n)
	ar := &Arena{Buf: p}
	for i := range n {
		if len(p) < 36 {
			return
		}
		link := binary.LittleEndian.Uint64(p)
		d := Delivery{QTag: binary.LittleEndian.Uint64(p[8:]), MsgID: binary.LittleEndian.Uint64(p[16:]),
			DeliveryCount: binary.LittleEndian.Uint32(p[24:]), FailedCount: binary.LittleEndian.Uint32(p[28:])}
		l := int(binary.LittleEndian.Uint32(p[32:]))
		p = p[36:]
		if l > len(p) || !parseLogMsg(ar, p[:l], &msgs[i]) {
			return
		}
		p = p[l:]
		ol := s.fc.byLink[link]
		if ol == nil || ol.cancelled && ol.link == 0 {
			continue // a link replaced: its leader requeues it
		}
		ol.recv++
		ol.heard = s.now
		d.Consumer, d.Msg = ol.spec.ID, &msgs[i]
		pb := ol.batch
		if pb == nil {
			pb = s.batchFor(ol.sink)
			ol.batch = pb
		}
		if len(pb.ds) == 0 {
			s.touched = append(s.touched, pb)
		}
		pb.ds = append(pb.ds, d)
	}
}
