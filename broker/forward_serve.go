package broker

import (
	"context"
	"encoding/binary"
	"errors"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/warren-mq/warren/queue"
	"github.com/warren-mq/warren/wire"
)

// The leader side of forwarded consumers (forward_consume.go has the
// protocol and the origin side): links served for other nodes' consumers,
// their keepalives, and the sinks that send a queue's effects back.

// forwardedConsume takes a message about forwarded consumers (after its
// 'c'); p is valid only during the call.
func (b *Broker) forwardedConsume(from uint64, p []byte) {
	if len(p) < 2 {
		return
	}
	op := p[1]
	switch op {
	case 'S', 'A', 'X', 'U', 'T', 'W':
		if len(p) < 18 {
			return
		}
		qid := binary.LittleEndian.Uint64(p[10:])
		q := b.topo.slots.get(queue.QueueRef(qid))
		if qid == 0 || qid > 1<<32 || q == nil {
			b.refuseLink(from, p)
			return
		}
		p = append([]byte(nil), p...)
		s := q.shard
		s.submit(Command{Kind: cmdPost, post: func() { s.forLeader(from, q, p) }})
	case 'I':
		if len(p) >= 10 {
			var features uint64
			if len(p) >= 18 { // builds before the features field: none
				features = binary.LittleEndian.Uint64(p[10:])
			}
			b.heardOrigin(from, binary.LittleEndian.Uint64(p[2:]), features)
		}
	case 'K':
		if len(p) < 6 {
			return
		}
		n := int(binary.LittleEndian.Uint32(p[2:]))
		if n > (len(p)-6)/24 {
			return
		}
		for i := range n {
			e := p[6+24*i:]
			link, qid, sent := binary.LittleEndian.Uint64(e), binary.LittleEndian.Uint64(e[8:]), binary.LittleEndian.Uint64(e[16:])
			q := b.topo.slots.get(queue.QueueRef(qid))
			if q == nil || qid == 0 || qid > 1<<32 {
				b.sendFwd(from, keepaliveAnswer(link, false, 0))
				continue
			}
			s := q.shard
			s.submit(Command{Kind: cmdPost, post: func() { s.keepalive(from, q, link, sent) }})
		}
	case 'd', 's', 'x', 'm', 'g', 'l', 'k', 'e', 'u', 'v', 't':
		if len(p) < 10 {
			return
		}
		// A link's id, or a purge's, names the origin shard.
		id := binary.LittleEndian.Uint64(p[2:])
		i := int(id >> 40 & 0xff)
		if op == 'u' || op == 'v' || op == 't' {
			i = int(id >> 56)
		} else if op == 'd' {
			if len(p) < 14 {
				return
			}
			i = int(binary.LittleEndian.Uint64(p[6:]) >> 40 & 0xff)
		}
		if i >= len(b.shards) {
			return
		}
		p = append([]byte(nil), p...)
		s := b.shards[i]
		s.submit(Command{Kind: cmdPost, post: func() { s.fromLeader(from, p) }})
	}
}

// refuseLink answers a subscribe for a queue this node does not have.
func (b *Broker) refuseLink(from uint64, p []byte) {
	id := binary.LittleEndian.Uint64(p[2:])
	switch p[1] {
	case 'S':
		b.sendFwd(from, subscribedAnswer(id, wire.NotFound, 0, false, "no such queue on the node asked"))
	case 'U', 'W':
		b.sendFwd(from, purgeAnswer(id, Result{Code: wire.NotFound, Reason: "no such queue on the node asked"}))
	case 'T':
		b.sendFwd(from, statusAnswer(id, nil, false))
	}
}

func subscribedAnswer(link uint64, code wire.Code, lead uint64, moved bool, reason string) []byte {
	p := append(make([]byte, 0, 23+len(reason)), 'c', 's')
	p = binary.LittleEndian.AppendUint64(p, link)
	p = binary.LittleEndian.AppendUint32(p, uint32(code))
	p = binary.LittleEndian.AppendUint64(p, lead)
	p = append(p, flagByte(moved))
	return append(p, reason...)
}

func purgeAnswer(id uint64, r Result) []byte {
	p := append(make([]byte, 0, 22+len(r.Reason)), 'c', 'u')
	p = binary.LittleEndian.AppendUint64(p, id)
	p = binary.LittleEndian.AppendUint32(p, uint32(r.Code))
	p = binary.LittleEndian.AppendUint64(p, uint64(r.N))
	return append(p, r.Reason...)
}

func keepaliveAnswer(link uint64, alive bool, sent uint64) []byte {
	p := append(make([]byte, 0, 19), 'c', 'k')
	p = binary.LittleEndian.AppendUint64(p, link)
	p = append(p, flagByte(alive))
	return binary.LittleEndian.AppendUint64(p, sent)
}

func linkNote(op byte, link uint64, tail ...byte) []byte {
	p := append(make([]byte, 0, 10+len(tail)), 'c', op)
	p = binary.LittleEndian.AppendUint64(p, link)
	return append(p, tail...)
}

// forLeader runs an origin's request on q's shard (p is this call's).
func (s *shard) forLeader(from uint64, q *Queue, p []byte) {
	op := p[1]
	id := binary.LittleEndian.Uint64(p[2:])
	p = p[18:]
	// A replicated queue this node leads, or one that lives here
	// (homed.go).
	here := !q.gone && !q.remote && q.m != nil && q.leads() && (q.replicated || q.home != 0)
	if op == 'T' {
		s.b.sendFwd(from, statusAnswer(id, q, here))
		return
	}
	if op == 'U' || op == 'W' {
		if !here && !q.gone {
			// The origin follows it (it knew an earlier leader).
			s.b.sendFwd(from, binary.LittleEndian.AppendUint64(linkNote('v', id), q.lead.Load()))
			return
		}
		k := &purgeSink{b: s.b, to: from, id: id}
		if op == 'W' {
			if len(p) < 1 {
				return
			}
			k.queue = uint64(q.id)
			s.apply(&Command{Kind: CmdDelete, Queue: q, Sink: k, IfUnused: p[0]&delIfUnused != 0, IfEmpty: p[0]&delIfEmpty != 0, Reason: "queue deleted"})
			return
		}
		s.apply(&Command{Kind: CmdPurge, Queue: q, Sink: k})
		return
	}
	if op == 'S' {
		if len(p) < 27 {
			return
		}
		inc := binary.LittleEndian.Uint64(p[19:])
		if !here {
			code, reason := wire.NotFound, "no queue "+strconv.Quote(LocalName(q.name))
			if !q.gone {
				code, reason = q.notHere()
			}
			s.b.sendFwd(from, subscribedAnswer(id, code, q.lead.Load(), !q.gone, reason))
			return
		}
		fc := &s.fc
		if fc.links == nil {
			fc.links = map[uint64]*servedLink{}
			fc.sinks = map[uint64]*linkSink{}
		}
		if fc.links[id] != nil {
			return // a duplicate
		}
		f := p[10]
		spec := queue.ConsumerSpec{ID: queue.ConsumerID(id), Owner: queue.OwnerID(id),
			Prefetch: binary.LittleEndian.Uint32(p), PrefetchBytes: binary.LittleEndian.Uint32(p[4:]),
			Priority: int16(binary.LittleEndian.Uint16(p[8:])), Exclusive: f&specExclusive != 0, Get: f&specGet != 0,
			AutoAck: f&specAutoAck != 0, TimeoutMs: int64(binary.LittleEndian.Uint64(p[11:]))}
		if spec.Prefetch == 0 {
			spec.Prefetch = maxLinkPrefetch // an origin's clients always have one: bounded all the same
		}
		if inc < s.b.origins.known(from) {
			return // an earlier incarnation's: that node has no such client now
		}
		rl := &servedLink{q: q, from: from, inc: inc, heard: s.now, pending: true}
		fc.links[id] = rl
		k := s.linkSinkFor(from, id)
		s.subscribe(q, k, spec, 0)
		if spec.Get {
			// Its drain: answered once the subscribe is applied and
			// what it delivered has gone out (CmdBarrier).
			s.apply(&Command{Kind: CmdBarrier, Queue: q, Sink: getDrained{b: s.b, to: from, link: id}})
		}
		return
	}
	rl := s.fc.links[id]
	if rl == nil || rl.q != q {
		if op == 'X' {
			s.orphanLink(q, queue.ConsumerID(id)) // its origin dropped it: so does the queue
		}
		return // dropped here: the keepalive tells the origin
	}
	rl.recv++
	rl.heard = s.now
	switch op {
	case 'A':
		if len(p) < 4 {
			return
		}
		n := int(binary.LittleEndian.Uint32(p))
		if n > (len(p)-4)/21 || q.gone || q.m == nil {
			return
		}
		for i := range n {
			e := p[4+21*i:]
			s.settleCmd = queue.Settle{NowMs: s.now, Consumer: queue.ConsumerID(id), Op: wire.SettleOp(e[0]),
				First: max(1, binary.LittleEndian.Uint64(e[1:])), Last: binary.LittleEndian.Uint64(e[9:]), ArgMs: binary.LittleEndian.Uint32(e[17:])}
			if q.grp != nil {
				_, _ = q.grp.Add(&s.settleCmd) // encoded at once; an unknown tag is ignored at apply
				continue
			}
			// A queue that lives here (homed.go): applied now.
			if effs, err := q.m.Apply(&s.settleCmd); err == nil {
				s.handle(q, effs)
				s.forgetIfGone(q, queue.ConsumerID(id))
			}
			if q.gone || q.m == nil {
				return // settled into an auto-delete
			}
		}
	case 'X':
		if len(p) < 1 {
			return
		}
		switch p[0] {
		case linkDown:
			s.dropLink(id)
		default:
			s.cancel(q, queue.ConsumerID(id), p[0] == linkRequeue)
		}
	}
}

// maxLinkPrefetch bounds a link asked with no prefetch.
const maxLinkPrefetch = 1000

// keepalive answers an origin's keepalive for link: dropped when a
// message of the origin's was lost on the way.
func (s *shard) keepalive(from uint64, q *Queue, link, sent uint64) {
	rl := s.fc.links[link]
	if rl == nil || rl.q != q || rl.from != from {
		s.orphanLink(q, queue.ConsumerID(link))
		s.b.sendFwd(from, keepaliveAnswer(link, false, 0))
		return
	}
	if rl.recv != sent {
		s.dropLink(link)
		s.b.sendFwd(from, keepaliveAnswer(link, false, 0))
		return
	}
	rl.heard = s.now
	s.flushEffects() // its deliveries so far go first: the count is theirs
	s.b.sendFwd(from, keepaliveAnswer(link, true, rl.sent))
}

// orphanLink Downs link id in q's state when this node leads q and does
// not serve the link: a subscribe this node proposed in an earlier term,
// or another leader's, applied after this node's first Downs (an entry
// of an earlier term committed by this one), or a link this node
// dropped whose Down was lost with a change of leader. Nothing would
// ever settle what it holds.
func (s *shard) orphanLink(q *Queue, id queue.ConsumerID) {
	if uint64(id) < 1<<48 || !q.leading || q.gone || q.grp == nil || s.fc.links[uint64(id)] != nil || !q.m.HasConsumer(id) {
		return
	}
	if _, pending := q.subs[id]; pending {
		return
	}
	s.downCmd = queue.Down{NowMs: s.now, Owner: queue.OwnerID(id)}
	_, _ = q.grp.Add(&s.downCmd)
}

// dropLink Downs a link: what it holds goes back to the queue,
// redelivered.
func (s *shard) dropLink(link uint64) {
	rl := s.fc.links[link]
	if rl == nil {
		return
	}
	if rl.pending {
		rl.drop = true // once its subscribe is applied (its Down would come first)
		return
	}
	delete(s.fc.links, link)
	s.down(link)
}

// linkSinkFor is the sink of the links from node from's shard that link
// names.
func (s *shard) linkSinkFor(from, link uint64) *linkSink {
	key := from<<8 | link>>40&0xff
	k := s.fc.sinks[key]
	if k == nil {
		k = &linkSink{s: s, to: from}
		s.fc.sinks[key] = k
	}
	return k
}

// linkSink is the Sink of the links of one origin shard on one leader
// shard: it sends what the shard hands it to the origin. Called on its
// shard only.
type linkSink struct {
	s  *shard
	to uint64
}

func (k *linkSink) Deliver(ds []Delivery) {
	s := k.s
	var p []byte
	n := 0
	send := func() {
		if n == 0 {
			return
		}
		binary.LittleEndian.PutUint32(p[2:], uint32(n))
		if !s.b.sendFwd(k.to, p) {
			// Lost: the origin replaces the links that had deliveries
			// in it (their keepalive counts no longer match).
			s.b.log.Debug("forwarded deliveries dropped (the peer's queue is full or it is unreachable)", "node", k.to, "n", n)
		}
		p, n = nil, 0
	}
	for i := range ds {
		d := &ds[i]
		rl := s.fc.links[uint64(d.Consumer)]
		if rl == nil {
			continue // dropped here: the Down returns it
		}
		if p == nil {
			p = append(make([]byte, 0, min(fwdDeliverChunk, 64+len(ds)*256)), 'c', 'd', 0, 0, 0, 0)
		}
		p = binary.LittleEndian.AppendUint64(p, uint64(d.Consumer))
		p = binary.LittleEndian.AppendUint64(p, d.QTag)
		p = binary.LittleEndian.AppendUint64(p, d.MsgID)
		p = binary.LittleEndian.AppendUint32(p, d.DeliveryCount)
		p = binary.LittleEndian.AppendUint32(p, d.FailedCount)
		off := len(p)
		p = binary.LittleEndian.AppendUint32(p, 0)
		p = appendLogMsg(p, d.Msg)
		binary.LittleEndian.PutUint32(p[off:], uint32(len(p)-off-4))
		rl.sent++
		n++
		if len(p) >= fwdDeliverChunk {
			send()
		}
	}
	send()
}

func (k *linkSink) Subscribed(id queue.ConsumerID, _ uint32, code wire.Code, reason string) {
	s := k.s
	rl := s.fc.links[uint64(id)]
	if rl == nil {
		return
	}
	rl.pending = false
	q := rl.q
	moved := code != wire.OK && !q.gone && !q.leads()
	if code != wire.OK {
		delete(s.fc.links, uint64(id))
	}
	s.b.sendFwd(k.to, subscribedAnswer(uint64(id), code, q.lead.Load(), moved, reason))
	if code == wire.OK && rl.drop {
		s.submit(Command{Kind: cmdPost, post: func() { s.dropLink(uint64(id)) }})
	}
}

func (k *linkSink) Cancelled(id queue.ConsumerID, code wire.Code, reason string) {
	s := k.s
	rl := s.fc.links[uint64(id)]
	if rl == nil || rl.said {
		return
	}
	rl.said = true
	if q := rl.q; !q.gone && !q.leads() {
		// This node no longer leads: the origin subscribes on the next
		// leader, whose Down returns what the link held.
		s.b.sendFwd(k.to, linkNote('m', uint64(id), binary.LittleEndian.AppendUint64(nil, q.lead.Load())...))
		return
	}
	s.b.sendFwd(k.to, linkNote('x', uint64(id), append(binary.LittleEndian.AppendUint32(nil, uint32(code)), reason...)...))
}

func (k *linkSink) LeaseExpired(id queue.ConsumerID, qtag uint64) {
	if rl := k.s.fc.links[uint64(id)]; rl != nil {
		k.s.b.sendFwd(k.to, linkNote('l', uint64(id), binary.LittleEndian.AppendUint64(nil, qtag)...))
	}
}

func (k *linkSink) ConsumerGone(id queue.ConsumerID) {
	s := k.s
	rl := s.fc.links[uint64(id)]
	if rl == nil {
		return
	}
	delete(s.fc.links, uint64(id))
	if !rl.said {
		s.b.sendFwd(k.to, linkNote('g', uint64(id)))
	}
}

func (*linkSink) Confirm(*PublishBatch) {}
func (*linkSink) Answer(uint64, Result) {}

// purgeSink answers a forwarded purge.
type purgeSink struct {
	b  *Broker
	to uint64
	id uint64
	// queue: a delete's queue id (0: a purge). A delete that proposed
	// the queue's deletion is answered once it is applied here (or its
	// time ran out: the origin is told it may still be), as a local
	// delete's control run ends: the origin's reply follows the apply.
	queue uint64
}

func (k *purgeSink) Answer(_ uint64, r Result) {
	t := k.b.topo
	cl := t.cl.Load()
	if k.queue == 0 || r.Code != wire.OK || cl == nil {
		k.b.sendFwd(k.to, purgeAnswer(k.id, r))
		return
	}
	// Off the shard's goroutine: the wait is bounded by the cluster
	// timeout, and ends when the metadata group stops.
	go func() {
		if err := t.clusterSync(context.Background(), cl, syncFor{queue: k.queue}); err != nil {
			r = Result{Code: wire.InternalError, Reason: reasonOf(err)}
			var we *wire.Error
			if errors.As(err, &we) {
				r.Code = we.Code
			}
		}
		k.b.sendFwd(k.to, purgeAnswer(k.id, r))
	}()
}

func (*purgeSink) Deliver([]Delivery)                                     {}
func (*purgeSink) Confirm(*PublishBatch)                                  {}
func (*purgeSink) Subscribed(queue.ConsumerID, uint32, wire.Code, string) {}
func (*purgeSink) Cancelled(queue.ConsumerID, wire.Code, string)          {}
func (*purgeSink) LeaseExpired(queue.ConsumerID, uint64)                  {}
func (*purgeSink) ConsumerGone(queue.ConsumerID)                          {}

// getDrained tells a get's origin its leader's drain is done.
type getDrained struct {
	b    *Broker
	to   uint64
	link uint64
}

func (k getDrained) Answer(uint64, Result) { k.b.sendFwd(k.to, linkNote('e', k.link)) }

func (getDrained) Deliver([]Delivery)                                     {}
func (getDrained) Confirm(*PublishBatch)                                  {}
func (getDrained) Subscribed(queue.ConsumerID, uint32, wire.Code, string) {}
func (getDrained) Cancelled(queue.ConsumerID, wire.Code, string)          {}
func (getDrained) LeaseExpired(queue.ConsumerID, uint64)                  {}
func (getDrained) ConsumerGone(queue.ConsumerID)                          {}

// helloFeatures is what this build can do that an earlier one could
// not, as its hello tells the other nodes (a bit each; a build that sends
// no features field has none):
//
//   - featMetaTerms: it reads the metadata group's version 3 entries
//     (replication.MetaGroup; older builds stop at one). A node writes
//     them only once every member said so (metaTagTerms): a cluster is
//     upgraded one node at a time without losing its metadata quorum.
const (
	featMetaTerms = 1 << 0
	helloFeatures = featMetaTerms
)

// fwdOrigins is what a node knows of the others' incarnations.
type fwdOrigins struct {
	mu       sync.Mutex
	features map[uint64]uint64    // node → the features its latest incarnation's hello named
	inc      map[uint64]uint64    // node → the latest incarnation heard
	heardAt  map[uint64]time.Time // node → when its last hello came (monotonic: a step of the wall clock declares no node down)
	helloAt  int64                // ms: when this node last said hello
}

func (o *fwdOrigins) known(node uint64) uint64 {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.inc[node]
}

// metaTagTerms says whether every one of nodes reads version 3 metadata
// entries (featMetaTerms; the metadata group's MetaConfig.TagTerms): this
// build (self) does, another node if its latest hello said so. A node not
// heard from yet does not.
func (b *Broker) metaTagTerms(self uint64, nodes []uint64) bool {
	o := &b.origins
	o.mu.Lock()
	defer o.mu.Unlock()
	if b.features&featMetaTerms == 0 {
		return false // (a test's node playing an older build)
	}
	for _, n := range nodes {
		if n != self && o.features[n]&featMetaTerms == 0 {
			return false
		}
	}
	return true
}

// helloOrigins says hello to every other node, every ForwardTimeout/4
// (from the cluster's ticker), naming its incarnation and features.
func (b *Broker) helloOrigins() {
	if b.cfg.Durable == nil || b.cfg.Durable.Forward == nil {
		return
	}
	limit := b.cfg.Durable.ForwardTimeout
	if limit <= 0 {
		limit = defaultForwardTimeout
	}
	now := b.NowMs()
	o := &b.origins
	o.mu.Lock()
	due := now-o.helloAt >= limit.Milliseconds()/4
	if due {
		o.helloAt = now
	}
	o.mu.Unlock()
	if !due {
		return
	}
	b.topo.mu.Lock()
	nodes := slices.Clone(b.topo.meta.Nodes())
	b.topo.mu.Unlock()
	for _, n := range nodes {
		if n != b.cfg.Durable.NodeID {
			p := binary.LittleEndian.AppendUint64(append(make([]byte, 0, 18), 'c', 'I'), b.seqBase)
			p = binary.LittleEndian.AppendUint64(p, b.features)
			b.cfg.Durable.Forward(n, p)
		}
	}
}

// heardOrigin notes node's incarnation and the features it named; a
// newer incarnation than known Downs the links of the earlier ones on
// every shard.
func (b *Broker) heardOrigin(node, inc, features uint64) {
	o := &b.origins
	now := time.Now()
	o.mu.Lock()
	was := o.inc[node]
	if inc > was {
		if o.inc == nil {
			o.inc = map[uint64]uint64{}
		}
		o.inc[node] = inc
	}
	if inc >= was {
		if o.heardAt == nil {
			o.heardAt, o.features = map[uint64]time.Time{}, map[uint64]uint64{}
		}
		o.heardAt[node] = now
		o.features[node] = features
	}
	o.mu.Unlock()
	if was == 0 || inc <= was {
		return
	}
	for _, s := range b.shards {
		s.submit(Command{Kind: cmdPost, post: func() {
			for _, l := range sortedLinks(s.fc.links) {
				if rl := s.fc.links[l]; rl.from == node && rl.inc < inc {
					s.dropLink(l)
				}
			}
		}})
	}
}
