package netio

// The two hot paths of a connection's frames: a PUBLISH batch decoded,
// copied once, routed and handed to its shards (onPublish), and a SETTLE
// frame's ranges translated into settlements as runs (onSettle, settle).

import (
	"bytes"
	"slices"
	"strconv"
	"time"

	"github.com/warren-mq/warren/broker"
	"github.com/warren-mq/warren/queue"
	"github.com/warren-mq/warren/wire"
)

// onPublish routes a PUBLISH batch: decode and validate it whole, copy it
// once into an arena, route each message, return unroutable mandatory ones,
// and hand each shard its part. The batch is confirmed when every part is
// done.
func (c *conn) onPublish(ch *channel, f wire.Frame) error {
	var b wire.PublishBatch
	ls := c.scratch()
	if err := wire.DecodePublish(f, c.maxFrame, &c.dec, &b); err != nil {
		return err
	}
	if b.FirstSeq != ch.nextSeq {
		return &wire.Error{Code: wire.SequenceError, Reason: "publish first_seq " + strconv.FormatUint(b.FirstSeq, 10) + ", expected " + strconv.FormatUint(ch.nextSeq, 10)}
	}
	ch.nextSeq += uint64(b.Count)
	c.srv.metrics.published.Add(int(b.Count))
	batch := &broker.PublishBatch{Sink: c, Ch: ch.id, FirstSeq: b.FirstSeq, Codes: make([]uint32, b.Count), Start: time.Now(), Ended: &ch.ended}
	ch.owed.Add(1) // paid by Confirm
	view := c.srv.View()
	exLocal, exName := c.pubExchange(b.Exchange)
	if !view.Table.HasExchange(exName) || view.Table.IsInternal(exName) || !c.pubPerm.AllowedIn(c.srv, c.vhostName(), c.user, exLocal) {
		code := wire.ExchangeNotFound
		switch {
		case !view.Table.HasExchange(exName):
		case view.Table.IsInternal(exName):
			code = wire.ExchangeInternal
		default:
			code = wire.AccessRefused // no write permission (Permit)
			c.srv.auditRefusal(c.user, c.vhostName(), "write", "exchange", exchangeResource(exLocal))
		}
		for i := range batch.Codes {
			batch.Codes[i] = uint32(code)
		}
		batch.Pending.Store(1)
		batch.PartDone()
		return nil
	}
	// One arena for every byte the queues keep (the batch's exchange name
	// and messages, copied out of the frame as they were sent: one copy,
	// nothing zeroed), one slice of messages.
	ar := &broker.Arena{Buf: b.Own()}
	msgs := make([]broker.StoredMsg, b.Count)
	rets := returns{max: int(c.maxFrame)}
	var props wire.Properties
	var m wire.Message
	it := b.Messages()
	for i := 0; it.Next(&m); i++ {
		_ = wire.ParseProperties(m.Properties, &props) // validated by DecodePublish
		sent := m                                      // as published, for a return
		if props.Has(wire.PropDeaths) {
			// The broker owns the death history (dlq replay trusts it): a
			// publisher's own is dropped (in place, in the arena). Rare, so
			// the copy and the re-parse are cheap.
			sent.Properties = bytes.Clone(m.Properties)
			m.Properties = stripProperty(m.Properties, wire.PropDeaths)
			_ = wire.ParseProperties(m.Properties, &props)
		}
		sm := &msgs[i]
		*sm = ar.Msg(b.Exchange, m.RoutingKey, m.Properties, m.Body, m.Flags, m.Priority)
		meta := queue.Message{Size: uint32(len(m.Body)), Priority: m.Priority, DedupKey: broker.DedupKey(props.MessageID)}
		if props.Has(wire.PropExpiration) {
			meta.ExpirationMs, meta.HasExpiration = props.ExpirationMs, true
		}
		var refs []queue.QueueRef
		if len(props.Headers) == 0 {
			refs = ls.memo.route(view.Table, exName, m.RoutingKey)
		} else {
			ls.routeBuf, _ = view.Table.Route(ls.routeBuf[:0], exName, m.RoutingKey, props.Headers)
			refs = ls.routeBuf
		}
		if len(refs) == 0 && m.Flags&wire.Mandatory != 0 {
			if !rets.add(ch.id, &wire.Returned{Seq: b.FirstSeq + uint64(i), Code: wire.NoRoute, Exchange: b.Exchange, Message: sent}) {
				batch.Codes[i] = uint32(wire.NoRoute) // its RETURN would pass the publisher's max_frame: nacked instead
			}
		}
		for _, ref := range refs {
			q := view.Queue(ref)
			if q == nil {
				continue
			}
			si := q.ShardIndex()
			if ls.parts[si] == nil {
				// Sized for the whole batch at once (as msgs above), so a
				// big batch does not regrow its scratch by doubling.
				ls.parts[si] = make([]broker.EnqItem, 0, b.Count)
			}
			ls.parts[si] = append(ls.parts[si], broker.EnqItem{Q: q, Msg: sm, Meta: meta, Idx: i})
		}
	}
	ls.memo.forget()
	if rets.total > 0 {
		c.mu.Lock()
		if !c.closed {
			c.out = append(c.out, rets.end()...)
			c.flushLocked()
		}
		c.mu.Unlock()
		c.srv.metrics.returned.Add(rets.total)
	}
	parts, placed := 1, 0
	for _, p := range ls.parts {
		if len(p) > 0 {
			parts++
			placed += len(p)
		}
	}
	if placed > 0 {
		// Counted now, before any shard has it: the loop's next check of
		// the watermark sees this batch.
		ar.Cost = int64(cap(ar.Buf)) + int64(b.Count)*broker.StoredMsgOverhead + int64(placed)*broker.PlacementOverhead
		ar.Refs.Store(int64(placed))
		c.srv.AddStoredBytes(ar.Cost)
	}
	batch.Pending.Store(int32(parts))
	for si, p := range ls.parts {
		if len(p) == 0 {
			continue
		}
		items := groupByQueue(p, &ls.group) // handed to the shard: p itself, or a new slice
		switch {
		case cap(p) > partsKeepMax:
			// A huge batch's scratch is not kept per connection: hand it
			// over whole instead of copying it.
			ls.parts[si] = nil
		case &items[0] == &p[0]:
			items, ls.parts[si] = slices.Clone(p), p[:0]
		default:
			ls.parts[si] = p[:0]
		}
		c.srv.SubmitInline(broker.Command{Kind: broker.CmdPublish, Items: items, Batch: batch})
	}
	batch.PartDone()
	return nil
}

// returns collects a publish frame's RETURN entries in frames of at most
// max bytes (the publisher's max_frame): each entry carries its sequence
// number, code and exchange, more than the message took in the PUBLISH
// frame, so the returns of a frame filled with small messages need more
// than one.
type returns struct {
	buf   []byte
	mark  wire.BatchMark
	start int // the open frame's first byte
	n     int // entries in the open frame
	total int
	max   int
}

// add appends rm, in the open frame or a new one; false (nothing added)
// if it alone would pass max.
func (r *returns) add(ch uint16, rm *wire.Returned) bool {
	if r.n == 0 {
		r.start = len(r.buf)
		r.buf, r.mark = wire.BeginReturn(r.buf, ch)
	}
	at := len(r.buf)
	r.buf = wire.AppendReturned(r.buf, rm)
	if len(r.buf)-r.start <= r.max {
		r.n++
		r.total++
		return true
	}
	r.buf = r.buf[:at]
	if r.n > 0 {
		r.buf = r.mark.End(r.buf, uint32(r.n))
		r.n = 0
		return r.add(ch, rm)
	}
	r.buf = r.buf[:r.start]
	return false
}

// end closes the open frame and returns the frames.
func (r *returns) end() []byte {
	if r.n > 0 {
		r.buf = r.mark.End(r.buf, uint32(r.n))
		r.n = 0
	}
	return r.buf
}

// partsKeepMax: a connection keeps its routing scratch (loopScratch.parts) between
// batches up to this many items per shard.
const partsKeepMax = 4096

// publishCost estimates what a PUBLISH frame will add to the stored-bytes
// gauge once routed to one queue: its payload and the per-message overhead
// of its count (read from the frame; 0 if it is malformed, which decoding
// refuses anyway).
func publishCost(f wire.Frame) int64 {
	if len(f.Payload) < 12 {
		return int64(len(f.Payload))
	}
	count := int64(f.Payload[8]) | int64(f.Payload[9])<<8 | int64(f.Payload[10])<<16 | int64(f.Payload[11])<<24
	return int64(len(f.Payload)) + count*(broker.StoredMsgOverhead+broker.PlacementOverhead)
}

// onSettle translates channel tags into queue tags and hands each shard its
// settlements.
func (c *conn) onSettle(ch *channel, f wire.Frame) error {
	var b wire.SettleBatch
	if err := wire.DecodeSettle(f, &b); err != nil {
		return err
	}
	ls := c.scratch()
	items := ls.settles[:0]
	acked := 0
	c.mu.Lock()
	for i := 0; i < b.Count; i++ {
		var s wire.Settlement
		b.At(i, &s)
		if s.Last > ch.nextTag {
			c.mu.Unlock()
			return &wire.Error{Code: wire.UnknownDeliveryTag, Reason: "tag " + strconv.FormatUint(s.Last, 10) + " was never delivered on this channel"}
		}
		first := max(s.First, ch.tagBase)
		if s.First == 0 {
			first = ch.tagBase
		}
		matched := 0
		runs := len(items) // this settlement's runs start here
		for t := first; t <= s.Last; t++ {
			e := ch.tagAt(t)
			if e == nil {
				break
			}
			switch e.state {
			case tagLive:
				matched++
				items = appendRun(items, runs, e.c, e.qtag, s.Op, s.Arg)
				if s.Op == wire.SettleAck {
					acked++
				}
				if s.Op != wire.SettleExtend {
					e.state = tagSettled
					if e.c.chTags != nil {
						delete(e.c.chTags, e.qtag)
					}
				}
			case tagExpired:
				matched++ // a late settlement of a taken-back delivery is ignored
				if s.Op != wire.SettleExtend {
					e.state = tagSettled
				}
			}
		}
		if matched == 0 && s.First != 0 {
			c.mu.Unlock()
			return &wire.Error{Code: wire.UnknownDeliveryTag, Reason: "no outstanding delivery in tags " + strconv.FormatUint(s.First, 10) + ".." + strconv.FormatUint(s.Last, 10)}
		}
	}
	ch.compact()
	c.mu.Unlock()
	c.srv.settleAcrossInline(items, acked)
	// The scratch is kept for the next frame, its queue pointers cleared
	// (a deleted queue is not kept alive by it); a huge one is let go.
	clear(items)
	if cap(items) <= partsKeepMax {
		ls.settles = items[:0]
	} else {
		ls.settles = nil
	}
	return nil
}

// appendRun adds the consumer's delivery qtag, settled with op and arg, to
// items: to the run of the consumer's that this settlement (items[from:])
// already has, if one of its last few runs is, else as a new run. Within one
// settlement that is sound (broker.SettleItem): the client settles every
// delivery of the consumer in the settlement's tag range, queue tags rise
// with channel tags, and those in between not settled now were settled or
// taken back before. Runs from several settlements are not joined here.
func appendRun(items []broker.SettleItem, from int, cr *consumerRef, qtag uint64, op wire.SettleOp, arg uint32) []broker.SettleItem {
	for i := len(items) - 1; i >= max(from, len(items)-runLookback); i-- {
		if it := &items[i]; it.Consumer == cr.id && it.Q == cr.q {
			if qtag <= max(it.QTag, it.Last) {
				break // not in delivery order: not a run (never expected)
			}
			it.Last = qtag
			return items
		}
	}
	return append(items, broker.SettleItem{Q: cr.q, Consumer: cr.id, Op: op, QTag: qtag, Arg: arg})
}

// runLookback bounds how many of a settlement's runs appendRun looks at: a
// channel's consumers interleave, and a few runs cover the usual handful of
// them; a consumer not found starts a new run, which is never wrong.
const runLookback = 4

// settleAcross counts the acked deliveries and submits the settlements
// (the broker splits them by shard and copies what it keeps).
func (s *Server) settleAcross(items []broker.SettleItem, acked int) {
	s.settle(items, acked, false)
}

// settleAcrossInline is settleAcross from a loop holding no lock: an idle
// shard runs the settlements before it returns (broker.SubmitInline).
func (s *Server) settleAcrossInline(items []broker.SettleItem, acked int) {
	s.settle(items, acked, true)
}

func (s *Server) settle(items []broker.SettleItem, acked int, inline bool) {
	if len(items) == 0 {
		return
	}
	s.metrics.acked.Add(acked)
	if inline {
		s.SubmitInline(broker.Command{Kind: broker.CmdSettle, Settles: items})
	} else {
		s.Submit(broker.Command{Kind: broker.CmdSettle, Settles: items})
	}
}
