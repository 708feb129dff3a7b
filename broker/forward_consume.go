package broker

import (
	"encoding/binary"
	"slices"

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
//	  'W' id u64 | queue | if u8 (1 if-unused, 2 if-empty)                      delete (answered as a purge, once applied)
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

// This file has the protocol, the shard's state and its clock
// (tickForwarded); the origin side is in forward_origin.go (a client's
// consumers and gets: their links, settles, cancels and leader
// changes), forward_purge.go (purges and deletes) and
// forward_fromleader.go (what leaders send back); the leader side is in
// forward_serve.go.

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
