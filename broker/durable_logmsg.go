package broker

// A message's log form in a durable queue's entries (logMsgLen,
// appendLogMsg, logBodies: written once, from its arena into the entry),
// and the views of it read back from the log at delivery (parseLogMsg,
// msgOf, releaseViews).

import (
	"encoding/binary"

	"github.com/warren-mq/warren/wire"
)

// The log form of a message: flags, priority, the lengths of exchange,
// routing key and properties, then the four byte strings.
const logMsgHeader = 10

// logMsgLen is the length of m's log form.
func logMsgLen(m *StoredMsg) int {
	return logMsgHeader + int(m.exchange.n) + int(m.key.n) + int(m.props.n) + int(m.bd.n)
}

// logBodies is the queue.BodySource of a durable queue's Enqueue: the
// log forms of items' messages, written from their arenas into the entry.
type logBodies struct{ items []EnqItem }

func (l *logBodies) BodyLen(i int) int { return logMsgLen(l.items[i].Msg) }

func (l *logBodies) AppendBody(dst []byte, i int) []byte { return appendLogMsg(dst, l.items[i].Msg) }

func appendLogMsg(b []byte, m *StoredMsg) []byte {
	b = append(b, byte(m.Flags), m.Priority)
	b = binary.LittleEndian.AppendUint16(b, uint16(len(m.Exchange())))
	b = binary.LittleEndian.AppendUint16(b, uint16(len(m.RoutingKey())))
	b = binary.LittleEndian.AppendUint32(b, uint32(len(m.Props())))
	b = append(b, m.Exchange()...)
	b = append(b, m.RoutingKey()...)
	b = append(b, m.Props()...)
	return append(b, m.Body()...)
}

// parseLogMsg fills m with views of b (a message in its log form), which
// lies in ar.Buf.
func parseLogMsg(ar *Arena, b []byte, m *StoredMsg) bool {
	if len(b) < logMsgHeader {
		return false
	}
	ex := int(binary.LittleEndian.Uint16(b[2:]))
	rk := int(binary.LittleEndian.Uint16(b[4:]))
	pr := int(binary.LittleEndian.Uint32(b[6:]))
	rest := b[logMsgHeader:]
	if ex+rk+pr > len(rest) {
		return false
	}
	*m = ar.Msg(rest[:ex], rest[ex:ex+rk], rest[ex+rk:ex+rk+pr], rest[ex+rk+pr:], wire.MessageFlags(b[0]), b[1])
	return true
}

// msgOf is message id of q: its StoredMsg (memory queues), or a view of
// it read from the log (durable queues), valid until the end of the
// shard's batch (releaseViews).
func (s *shard) msgOf(q *Queue, id uint64) *StoredMsg {
	if q.grp == nil {
		return q.bodies.get(id)
	}
	b, err := q.grp.Body(id)
	if !q.viewing {
		q.viewing = true
		s.viewers = append(s.viewers, q)
	}
	if err != nil {
		s.b.log.Error("durable queue: a message's body is not in the log", queueLog(q.name), "id", id, "err", err)
		return nil
	}
	if s.viewUsed == len(s.views) {
		s.views = append(s.views, &logView{})
	}
	v := s.views[s.viewUsed]
	v.ar.Buf = b
	m := &v.m
	if !parseLogMsg(&v.ar, b, m) {
		s.b.log.Error("durable queue: a message in the log does not parse", queueLog(q.name), "id", id)
		return nil
	}
	s.viewUsed++
	return m
}

// logView is a message read from a durable queue's log: a view of the
// log's bytes, its arena only their holder (no references are counted).
type logView struct {
	m  StoredMsg
	ar Arena
}

// releaseViews ends the log views handed out in this batch (after the
// deliveries were handed to their sinks, which copy them).
func (s *shard) releaseViews() {
	for i, q := range s.viewers {
		q.viewing = false
		q.grp.ReleaseBodies()
		s.viewers[i] = nil
	}
	s.viewers = s.viewers[:0]
	for _, v := range s.views[:s.viewUsed] {
		v.m, v.ar.Buf = StoredMsg{}, nil
	}
	s.viewUsed = 0
}
