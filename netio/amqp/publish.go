package amqp

// A basic.publish's content read (onHeader, onBody), routed and handed to
// its queues' shards (publish, enqueue), and a message's content frames
// written (sendReturn, appendContent).

import (
	"encoding/binary"
	"strconv"
	"time"
	"unsafe"

	"github.com/warren-mq/warren/broker"
	"github.com/warren-mq/warren/queue"
	"github.com/warren-mq/warren/wire"
)

// onHeader reads a publish's content header.
func (c *conn) onHeader(ch *channel, p []byte) error {
	r := &reader{b: p}
	class := r.u16()
	r.u16() // weight
	size := r.u64()
	if r.err != nil || class != classBasic {
		return connErr(frameError, "FRAME_ERROR - malformed content header")
	}
	pub := ch.pub
	if size > uint64(c.l.cfg.MaxMessageSize) {
		ch.pub = nil
		return chErr(preconditionFailed, "PRECONDITION_FAILED - message size "+strconv.FormatUint(size, 10)+" is larger than the configured max size "+strconv.Itoa(c.l.cfg.MaxMessageSize))
	}
	if max := c.maxPartial(); size > 0 && c.partial.Load()+int64(size) > max {
		ch.pub = nil
		return chErr(preconditionFailed, "PRECONDITION_FAILED - message size "+strconv.FormatUint(size, 10)+" announced while this connection's channels await "+
			strconv.FormatInt(c.partial.Load(), 10)+" bytes of bodies of other messages; at most "+strconv.FormatInt(max, 10)+
			" (4 times the max message size) at once: send a message's body before the next message's header")
	}
	replyName := ""
	if ch.reply != nil {
		replyName = ch.reply.name
	}
	if ae := parseHeader(r, &pub.in, &c.sc, replyName); ae != nil {
		ch.pub = nil
		return ae
	}
	pub.header, pub.size = true, size
	n := len(pub.exchange) + len(pub.key) + len(pub.in.props) + int(size)
	pub.arena = make([]byte, 0, n)
	pub.arena = append(pub.arena, pub.exchange...)
	pub.arena = append(pub.arena, pub.key...)
	pub.arena = append(pub.arena, pub.in.props...)
	pub.bodyAt = len(pub.arena)
	// The properties were built in the connection's scratch: point the
	// views publish reads at the arena's copy.
	pub.in.props = pub.arena[len(pub.exchange)+len(pub.key) : pub.bodyAt]
	var view wire.Properties
	_ = wire.ParseProperties(pub.in.props, &view) // parseHeader validated it
	pub.in.msgID, pub.in.userID, pub.in.headers = view.MessageID, view.UserID, view.Headers
	if size == 0 {
		return c.publish(ch)
	}
	pub.held = int64(size)
	c.partial.Add(pub.held)
	return nil
}

// maxPartial bounds conn.partial: the arenas of a connection's publishes
// whose bodies have not all come (each made its announced size at the
// header), so a client announcing the max message size on every channel
// and sending no body (2,047 × 16 MiB) makes the broker allocate at most
// 4 messages' worth.
func (c *conn) maxPartial() int64 { return 4 * int64(c.l.cfg.MaxMessageSize) }

// dropPending lets go of pub's share of conn.partial (its body complete,
// or its channel closing).
func (c *conn) dropPending(pub *pending) {
	if pub.held != 0 {
		c.partial.Add(-pub.held)
		pub.held = 0
	}
}

func (c *conn) onBody(ch *channel, p []byte) error {
	pub := ch.pub
	if uint64(len(pub.arena)-pub.bodyAt+len(p)) > pub.size {
		return connErr(frameError, "FRAME_ERROR - body frames longer than the content header's body size")
	}
	pub.arena = append(pub.arena, p...)
	if uint64(len(pub.arena)-pub.bodyAt) == pub.size {
		return c.publish(ch)
	}
	return nil
}

// publish routes a complete message and hands each shard its part, as
// netio's PUBLISH does for a batch of one.
func (c *conn) publish(ch *channel) error {
	pub := ch.pub
	ch.pub = nil
	c.dropPending(pub)
	// Once routed (or refused), the channel's pending keeps no view of
	// the message: an idle channel kept its last one (up to the max
	// message size) alive after its queues let it go, unseen by the
	// stored-bytes count the memory alarm reads.
	defer func() { *pub = pending{} }()
	// The bounds on what this connection makes the broker hold (its
	// publishes in flight, the memory alarm) were checked before the
	// basic.publish was read (conn.mustWait).
	if len(pub.in.userID) > 0 && string(pub.in.userID) != c.user { // consumers may trust it, as in RabbitMQ
		return chErr(preconditionFailed, "PRECONDITION_FAILED - user_id property set to '"+string(pub.in.userID)+"' but authenticated user was '"+c.user+"'")
	}
	view := c.srv.View()
	exName := c.pubExchange(pub.exchange)
	if !view.Table.HasExchange(exName) {
		return chErr(notFound, "NOT_FOUND - no exchange '"+pub.exchange+"' in vhost '"+c.vh()+"'")
	}
	if view.Table.IsInternal(exName) {
		return chErr(accessRefused, "ACCESS_REFUSED - cannot publish to internal exchange '"+pub.exchange+"' in vhost '"+c.vh()+"'")
	}
	if !c.pubPerm.AllowedIn(c.srv, c.vh(), c.user, pub.exchange) { // permissions (issue 15), decided once per exchange
		return c.srv.PublishRefusalIn(c.vh(), c.user, pub.exchange)
	}
	if ch.tx {
		return c.hold(ch, pub)
	}
	if isReplyKey(pub.exchange, pub.key) {
		c.replyPublish(ch, pub)
		return nil
	}
	var seq uint64
	if ch.confirm {
		ch.pubSeq++
		seq = ch.pubSeq
	}
	c.enqueue(ch, pub, view, exName, seq)
	return nil
}

// enqueue routes a publish and hands each shard its part; seq is its
// confirm's number (0: none), or in tx mode its commit's.
func (c *conn) enqueue(ch *channel, pub *pending, view *broker.RouteView, exName string, seq uint64) {
	a := pub.arena
	ne, nk, np := len(pub.exchange), len(pub.key), len(pub.in.props)
	blk := new(pubBlock)
	ar := &blk.ar
	sm := &blk.sm
	ar.Buf = a
	*sm = ar.Msg(a[:ne], a[ne:ne+nk], a[ne+nk:ne+nk+np], a[pub.bodyAt:], pub.in.flags, pub.in.priority)
	meta := queue.Message{Size: uint32(len(sm.Body())), Priority: pub.in.priority, DedupKey: broker.DedupKey(pub.in.msgID)}
	if pub.in.expires {
		meta.ExpirationMs, meta.HasExpiration = pub.in.expMs, true
	}
	c.routeBuf, _ = view.Table.Route(c.routeBuf[:0], exName, sm.RoutingKey(), pub.in.headers)
	placed := 0
	for _, ref := range c.routeBuf {
		q := view.Queue(ref)
		if q == nil {
			continue
		}
		si := q.ShardIndex()
		c.parts[si] = append(c.parts[si], broker.EnqItem{Q: q, Msg: sm, Meta: meta})
		placed++
	}
	if placed == 0 && pub.mandatory {
		c.sendReturn(ch.id, sm)
	}
	batch := &blk.batch
	batch.Sink, batch.Ch, batch.FirstSeq, batch.Codes, batch.Start = c, ch.id, (ch.gen&(1<<24-1))<<40|seq, blk.code[:], time.Now()
	// A backlog holds its confirm until the connection ends (its Down
	// releases it, rather than keep the connection in memory until the
	// queue drains). A channel.close does not wait for confirms: the
	// channel's generation drops those that come after it.
	batch.Ended = &c.stopped
	parts := 1
	if placed > 0 {
		ar.Cost = int64(cap(a)) + pubBlockSize + int64(placed)*broker.PlacementOverhead
		ar.Refs.Store(int64(placed))
		c.srv.AddStoredBytes(ar.Cost)
		for _, p := range c.parts {
			if len(p) > 0 {
				parts++
			}
		}
	}
	batch.Pending.Store(int32(parts))
	c.unconfirmed.Add(1)
	c.published.Add(1)
	own := true
	for si, p := range c.parts {
		if len(p) == 0 {
			continue
		}
		var items []broker.EnqItem
		if len(p) == 1 && own { // the common case: one queue
			blk.item[0], items, own = p[0], blk.item[:], false
		} else {
			items = append([]broker.EnqItem(nil), p...)
		}
		clear(p)
		c.parts[si] = p[:0]
		c.srv.Submit(broker.Command{Kind: broker.CmdPublish, Items: items, Batch: batch})
	}
	batch.PartDone()
}

// pubBlock is what one publish allocates beside its bytes, in one
// allocation: the stored message and its arena (kept while a queue holds
// the message), the batch (until its confirm) and the shard part's item.
type pubBlock struct {
	sm    broker.StoredMsg
	ar    broker.Arena
	batch broker.PublishBatch
	code  [1]uint32
	item  [1]broker.EnqItem
}

// pubBlockSize is a pubBlock's size, counted in the stored bytes.
const pubBlockSize = int64(unsafe.Sizeof(pubBlock{}))

// sendReturn sends basic.return for an unroutable mandatory message.
func (c *conn) sendReturn(ch uint16, m *broker.StoredMsg) {
	c.mu.Lock()
	if cur := c.channels[ch]; cur == nil || cur.closing { // a shard's close overtook the publish (as reply)
		c.mu.Unlock()
		return
	}
	b, st := method(c.out, ch, classBasic, 50)
	b = binary.BigEndian.AppendUint16(b, noRoute)
	b = putShortstr(b, "NO_ROUTE")
	b = putShortstr(b, string(m.Exchange()))
	b = putShortstr(b, string(m.RoutingKey()))
	b = endFrame(b, st)
	c.out = c.appendContent(b, ch, m, 0)
	c.flushLocked()
	c.mu.Unlock()
}

// appendContent appends a message's content header and body frames.
func (c *conn) appendContent(b []byte, ch uint16, m *broker.StoredMsg, deliveryCount uint32) []byte {
	b = appendHeader(b, ch, m, deliveryCount)
	max := int(c.frameMax) - 8
	for body := m.Body(); len(body) > 0; {
		n := min(len(body), max)
		var st int
		b, st = beginFrame(b, frameBody, ch)
		b = append(b, body[:n]...)
		b = endFrame(b, st)
		body = body[n:]
	}
	return b
}
