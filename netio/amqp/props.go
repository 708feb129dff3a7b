package amqp

import (
	"encoding/binary"
	"slices"
	"strconv"
	"strings"

	"github.com/warren-mq/warren/broker"
	"github.com/warren-mq/warren/wire"
)

// Basic property flags, in the order the values follow.
const (
	flContentType     = 1 << 15
	flContentEncoding = 1 << 14
	flHeaders         = 1 << 13
	flDeliveryMode    = 1 << 12
	flPriority        = 1 << 11
	flCorrelationID   = 1 << 10
	flReplyTo         = 1 << 9
	flExpiration      = 1 << 8
	flMessageID       = 1 << 7
	flTimestamp       = 1 << 6
	flType            = 1 << 5
	flUserID          = 1 << 4
	flAppID           = 1 << 3
	flClusterID       = 1 << 2
)

// inbound is a content header translated to Warren's message model.
type inbound struct {
	props    []byte // Warren's property block (without its u16 length)
	flags    wire.MessageFlags
	priority uint8
	expires  bool
	expMs    uint32
	msgID    []byte // a view into props
	userID   []byte // a view into props
	headers  []byte // raw Warren table entries, a view into props
}

// parseHeader reads a content header frame's payload after class, weight
// and body size: the property flags and values, into Warren's properties.
//
// replyName is the channel's direct reply-to name ("": none), which
// stands for a reply-to of amq.rabbitmq.reply-to.
func parseHeader(r *reader, in *inbound, sc *pubScratch, replyName string) *amqpError {
	fl := r.u16()
	if fl&1 != 0 {
		return connErr(frameError, "FRAME_ERROR - property flag continuation is not supported")
	}
	var p wire.Properties
	str := func(id wire.PropID, dst *[]byte) {
		v := r.take(int(r.u8()))
		if len(v) > 0 {
			*dst = v
			p.Set(id)
		}
	}
	if fl&flContentType != 0 {
		str(wire.PropContentType, &p.ContentType)
	}
	if fl&flContentEncoding != 0 {
		str(wire.PropContentEncoding, &p.ContentEncoding)
	}
	sc.sig = sc.sig[:0]
	if fl&flHeaders != 0 {
		raw := r.longstr()
		if r.err == nil {
			var err error
			sc.hdr, err = appendWarrenEntries(sc.hdr[:0], raw, 0, &sc.sig)
			if err != nil {
				return connErr(syntaxError, "SYNTAX_ERROR - malformed headers table")
			}
			if len(sc.hdr) > 0 {
				p.Headers = sc.hdr
				p.Set(wire.PropHeaders)
			}
		}
	}
	if fl&flDeliveryMode != 0 && r.u8() == 2 {
		in.flags |= wire.Persistent
	}
	if fl&flPriority != 0 {
		in.priority = r.u8()
	}
	if fl&flCorrelationID != 0 {
		str(wire.PropCorrelationID, &p.CorrelationID)
	}
	if fl&flReplyTo != 0 {
		str(wire.PropReplyTo, &p.ReplyTo)
		if string(p.ReplyTo) == replyQueue {
			if replyName == "" {
				return chErr(preconditionFailed, "PRECONDITION_FAILED - fast reply consumer does not exist")
			}
			p.ReplyTo = []byte(replyName)
		}
	}
	if fl&flExpiration != 0 {
		s := r.shortstr()
		ms, err := strconv.ParseUint(s, 10, 32)
		if err != nil && r.err == nil {
			return chErr(preconditionFailed, "PRECONDITION_FAILED - invalid expiration '"+s+"': want milliseconds as a decimal integer")
		}
		p.ExpirationMs = uint32(ms)
		p.Set(wire.PropExpiration)
		in.expires, in.expMs = true, uint32(ms)
	}
	if fl&flMessageID != 0 {
		str(wire.PropMessageID, &p.MessageID)
	}
	if fl&flTimestamp != 0 {
		p.TimestampMs = timestampMs(r.u64())
		p.Set(wire.PropTimestamp)
	}
	if fl&flType != 0 {
		str(wire.PropType, &p.Type)
	}
	if fl&flUserID != 0 {
		str(wire.PropUserID, &p.UserID)
	}
	if fl&flAppID != 0 {
		str(wire.PropAppID, &p.AppID)
	}
	if fl&flClusterID != 0 {
		r.shortstr() // deprecated in 0-9-1; RabbitMQ drops it too
	}
	if r.err != nil {
		return connErr(frameError, "FRAME_ERROR - malformed content header")
	}
	for _, tag := range sc.sig {
		if sig := sc.sig; !canonicalTag(tag) && len(sig) <= 0xffff {
			// Widths to keep (types.go): an unknown property to Warren.
			sc.unk = append(append(sc.unk[:0], propAMQPTypes, byte(len(sig)), byte(len(sig)>>8)), sig...)
			p.Unknown = sc.unk
			break
		}
	}
	block := wire.AppendProperties(sc.props[:0], &p)
	sc.props = block
	if len(block)-2 > wire.MaxPropertiesLen {
		return chErr(preconditionFailed, "PRECONDITION_FAILED - message properties over 65535 bytes")
	}
	in.props = block[2:]
	var view wire.Properties
	if err := wire.ParseProperties(in.props, &view); err != nil {
		return chErr(preconditionFailed, "PRECONDITION_FAILED - message properties: "+err.Error())
	}
	in.msgID, in.headers = view.MessageID, view.Headers
	return nil
}

// appendHeader appends the content header frame of a stored message;
// deliveryCount > 1 (a redelivery) adds x-delivery-count, the deliveries
// before this one.
func appendHeader(b []byte, ch uint16, m *broker.StoredMsg, deliveryCount uint32) []byte {
	var p wire.Properties
	_ = wire.ParseProperties(m.Props(), &p) // validated when it was published
	b, start := beginFrame(b, frameHeader, ch)
	b = binary.BigEndian.AppendUint16(b, classBasic)
	b = binary.BigEndian.AppendUint16(b, 0)
	b = binary.BigEndian.AppendUint64(b, uint64(len(m.Body())))
	flagsAt := len(b)
	b = append(b, 0, 0)
	var fl uint16
	str := func(f uint16, v []byte, present bool) {
		if present {
			fl |= f
			b = putShortstr(b, string(v))
		}
	}
	str(flContentType, p.ContentType, p.Has(wire.PropContentType))
	str(flContentEncoding, p.ContentEncoding, p.Has(wire.PropContentEncoding))
	if p.Has(wire.PropHeaders) || p.Has(wire.PropDeaths) || deliveryCount > 1 {
		var extra wire.Table
		var drop func([]byte) bool
		if p.Has(wire.PropDeaths) {
			extra = xDeath(p.Deaths) // allocates, for dead letters only
			if extra != nil {
				drop = isDeathHeader
			}
		}
		if deliveryCount > 1 {
			if drop == nil {
				drop = isDeliveryCount
			} else {
				drop = isDeathOrCount
			}
		}
		var sig typeSig
		var sigp *typeSig
		if raw := typesProp(p.Unknown); raw != nil {
			sig = typeSig{b: raw, ok: true}
			sigp = &sig
		}
		fl |= flHeaders
		b = putHeaders(b, p.Headers, sigp, drop, extra, deliveryCount)
	}
	if m.Flags&wire.Persistent != 0 {
		fl |= flDeliveryMode
		b = append(b, 2)
	} else {
		fl |= flDeliveryMode
		b = append(b, 1)
	}
	if m.Priority != 0 {
		fl |= flPriority
		b = append(b, m.Priority)
	}
	str(flCorrelationID, p.CorrelationID, p.Has(wire.PropCorrelationID))
	str(flReplyTo, p.ReplyTo, p.Has(wire.PropReplyTo))
	if p.Has(wire.PropExpiration) {
		fl |= flExpiration
		at := len(b)
		b = strconv.AppendUint(append(b, 0), uint64(p.ExpirationMs), 10)
		b[at] = byte(len(b) - at - 1)
	}
	str(flMessageID, p.MessageID, p.Has(wire.PropMessageID))
	if p.Has(wire.PropTimestamp) {
		fl |= flTimestamp
		b = binary.BigEndian.AppendUint64(b, uint64(p.TimestampMs/1000))
	}
	str(flType, p.Type, p.Has(wire.PropType))
	str(flUserID, p.UserID, p.Has(wire.PropUserID))
	str(flAppID, p.AppID, p.Has(wire.PropAppID))
	binary.BigEndian.PutUint16(b[flagsAt:], fl)
	return endFrame(b, start)
}

func isDeathHeader(k []byte) bool {
	switch string(k) {
	case "x-death", "x-first-death-queue", "x-first-death-reason", "x-first-death-exchange":
		return true
	}
	return false
}

func isDeliveryCount(k []byte) bool { return string(k) == "x-delivery-count" }
func isDeathOrCount(k []byte) bool  { return isDeathHeader(k) || isDeliveryCount(k) }

// xDeath is the x-death header (and the x-first-death-* ones), replacing
// the message's own, from Warren's death history, in RabbitMQ's format: an
// array of tables, most recent first, each with queue, reason, count,
// time, exchange and routing-keys. nil: no history.
func xDeath(raw []byte) wire.Table {
	ds, err := wire.DecodeDeaths(raw)
	if err != nil || len(ds) == 0 {
		return nil
	}
	var out wire.Table
	arr := make([]wire.Value, len(ds))
	for i, d := range ds {
		keys := make([]wire.Value, len(d.RoutingKeys))
		for j, k := range d.RoutingKeys {
			keys[j] = wire.String(k)
		}
		arr[i] = wire.TableValue(wire.Table{
			{Key: "count", Value: wire.Int(int64(d.Count))},
			{Key: "reason", Value: wire.String(d.Reason.String())},
			{Key: "queue", Value: wire.String(d.Queue)},
			{Key: "time", Value: wire.Timestamp(d.FirstMs)},
			{Key: "exchange", Value: wire.String(d.Exchange)},
			{Key: "routing-keys", Value: wire.ArrayValue(keys)},
		})
	}
	first := ds[len(ds)-1]
	return append(out,
		wire.Field{Key: "x-death", Value: wire.ArrayValue(arr)},
		wire.Field{Key: "x-first-death-queue", Value: wire.String(first.Queue)},
		wire.Field{Key: "x-first-death-reason", Value: wire.String(first.Reason.String())},
		wire.Field{Key: "x-first-death-exchange", Value: wire.String(first.Exchange)})
}

// queueArgMap pairs RabbitMQ's queue arguments with Warren's, in the
// order RabbitMQ 3.10 compares a redeclare's (a classic queue's list;
// x-delivery-limit, which RabbitMQ applies to quorum queues only, is
// last). x-queue-type quorum is Warren's replicas (below).
var queueArgMap = [...]struct{ amqp, warren string }{
	{"x-expires", "expires"},
	{"x-message-ttl", "message-ttl"},
	{"x-dead-letter-exchange", "dead-letter-exchange"},
	{"x-dead-letter-routing-key", "dead-letter-routing-key"},
	{"x-max-length", "max-length"},
	{"x-max-length-bytes", "max-length-bytes"},
	{"x-max-priority", "max-priority"},
	{"x-overflow", "overflow"},
	{"x-single-active-consumer", "single-active-consumer"},
	{"x-queue-type", "replicas"},
	{"x-delivery-limit", "delivery-limit"},
}

// strictPriority is the argument a queue declared with x-max-priority
// gets: dispatch strictly by priority, as RabbitMQ's priority queues do.
const strictPriority = "strict-priority"

// quorumReplicas is the replicas a quorum queue is declared with: copies
// on three nodes, RabbitMQ's usual quorum group.
const quorumReplicas = 3

// queueArgs maps RabbitMQ's queue x-arguments onto Warren's queue
// arguments, in Warren's order (wire.QueueArgDescs: a redeclare compares
// them as declared, and a client's table may come in any order). One it
// does not map is refused, never ignored. x-queue-type classic is the
// same as none; quorum is a durable queue with replicas 3 (quorum is
// set), which is how a redeclare tells the two apart. rs names the queue
// in refusals as RabbitMQ does ("queue 'q' in vhost '/'").
func queueArgs(t wire.Table, rs string) (_ wire.Table, quorum bool, _ *amqpError) {
	var out wire.Table
	invalid := func(key, why string) *amqpError {
		return chErr(preconditionFailed, "PRECONDITION_FAILED - invalid arg '"+key+"' for "+rs+": "+why)
	}
	for _, f := range t {
		key := ""
		for _, m := range queueArgMap {
			if m.amqp == f.Key {
				key = m.warren
			}
		}
		switch {
		case key == "":
			return nil, false, chErr(preconditionFailed, "PRECONDITION_FAILED - unsupported queue argument '"+f.Key+"' for "+rs+": Warren does not map it (see README, AMQP 0-9-1)")
		case f.Key == "x-overflow":
			if s := string(f.Value.Bytes); f.Value.Kind == wire.KindString && s != "drop-head" && s != "reject-publish" && s != "reject-publish-dlx" {
				return nil, false, invalid(f.Key, strconv.Quote("unsupported overflow '"+s+"' (drop-head, reject-publish and reject-publish-dlx are)"))
			}
		case f.Key == "x-dead-letter-exchange" && f.Value.Kind != wire.KindString && f.Value.Kind != wire.KindBytes:
			// RabbitMQ's own words for this one (its other type errors
			// are "invalid arg ...", as below).
			return nil, false, chErr(preconditionFailed, "PRECONDITION_FAILED - invalid type '"+amqpTypeName(f.Value)+"' for arg '"+f.Key+"' in "+rs)
		case f.Key == "x-queue-type":
			// Warren has one kind of queue: classic and quorum are both
			// it (quorum ones durable, as RabbitMQ requires, with
			// replicas 3: copies in a cluster).
			switch s := string(f.Value.Bytes); {
			case f.Value.Kind != wire.KindString:
				return nil, false, invalid(f.Key, strconv.Quote("expected string, got "+amqpTypeName(f.Value)))
			case s == "classic":
				continue
			case s == "quorum":
				quorum = true
				continue
			default:
				return nil, false, invalid(f.Key, strconv.Quote("unsupported queue type '"+s+"'"))
			}
		}
		out = append(out, wire.Field{Key: key, Value: f.Value})
	}
	if quorum {
		out = append(out, wire.Field{Key: "replicas", Value: wire.Int(quorumReplicas)})
	}
	// RabbitMQ dispatches a priority queue strictly by priority; Warren's
	// default lets a waiting lower level through after 8 from the top.
	if _, ok := t.Get("x-max-priority"); ok {
		out = append(out, wire.Field{Key: strictPriority, Value: wire.Bool(true)})
	}
	// A dead-letter routing key without a dead-letter exchange would be
	// kept and never used: refused, as RabbitMQ refuses it.
	_, dlrk := t.Get("x-dead-letter-routing-key")
	if _, dlx := t.Get("x-dead-letter-exchange"); dlrk && !dlx {
		return nil, false, invalid("x-dead-letter-routing-key", strconv.Quote("x-dead-letter-exchange is not set"))
	}
	if _, err := wire.ParseQueueArgs(out); err != nil {
		reason := reasonText(err)
		for _, m := range queueArgMap { // "queue argument max-priority: want …"
			if rest, ok := strings.CutPrefix(reason, "queue argument "+m.warren+": "); ok {
				return nil, false, invalid(m.amqp, strconv.Quote(rest))
			}
		}
		return nil, false, chErr(preconditionFailed, "PRECONDITION_FAILED - "+reason)
	}
	order := func(k string) int {
		for i, d := range wire.QueueArgDescs() {
			if d.Key == k {
				return i
			}
		}
		return -1
	}
	slices.SortStableFunc(out, func(a, b wire.Field) int { return order(a.Key) - order(b.Key) })
	return out, quorum, nil
}

func reasonText(err error) string {
	if we, ok := err.(*wire.Error); ok {
		return we.Reason
	}
	return err.Error()
}
