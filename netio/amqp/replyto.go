package amqp

import (
	"crypto/rand"
	"encoding/base64"
	"encoding/binary"
	"strconv"

	"github.com/warren-mq/warren/broker"
)

// Direct reply-to, as RabbitMQ has it (its "fast reply"): a channel
// consumes the pseudo-queue amq.rabbitmq.reply-to, without acks; its
// publishes with reply-to amq.rabbitmq.reply-to carry instead a name of
// its own, amq.rabbitmq.reply-to.<token>; a publish to the default
// exchange with such a name as its routing key is delivered straight to
// that consumer, through no queue (nothing is stored: a reply to a channel
// that is gone is unroutable). The listener maps tokens to channels.

const (
	replyQueue  = "amq.rabbitmq.reply-to"
	replyPrefix = replyQueue + "."
)

// replyConsumer is a channel's consumer of amq.rabbitmq.reply-to.
type replyConsumer struct {
	c     *conn
	ch    *channel
	tag   string
	name  string // amq.rabbitmq.reply-to.<token>
	vhost string
}

// onReplyConsume handles basic.consume of amq.rabbitmq.reply-to.
func (c *conn) onReplyConsume(ch *channel, tag string, noAck, noWait bool) error {
	if !noAck {
		return chErr(preconditionFailed, "PRECONDITION_FAILED - reply consumer cannot acknowledge")
	}
	if ch.reply != nil {
		return chErr(preconditionFailed, "PRECONDITION_FAILED - reply consumer already set")
	}
	var tok [18]byte
	_, _ = rand.Read(tok[:])
	c.mu.Lock()
	if ch.closing || c.dead { // a shard closed it since the frame was read, or the socket is gone: dropped
		c.mu.Unlock()
		return nil
	}
	if tag == "" {
		c.ctagSeq++
		tag = "amq.ctag-" + strconv.FormatUint(c.id, 10) + "-" + strconv.Itoa(c.ctagSeq)
	}
	if _, dup := ch.consumers[tag]; dup {
		c.mu.Unlock()
		return connErr(notAllowed, "NOT_ALLOWED - attempt to reuse consumer tag '"+tag+"'")
	}
	rc := &replyConsumer{c: c, ch: ch, tag: tag, name: replyPrefix + base64.RawURLEncoding.EncodeToString(tok[:]), vhost: c.vh()}
	ch.reply = rc
	// Listed under c.mu: a close (the channel's release, OnClose) takes
	// ch.reply under it and then forgets it, so it is forgotten after it
	// is listed (listed after, it stayed, the connection with it).
	c.l.replyMu.Lock()
	c.l.replies[rc.name] = rc
	c.l.replyMu.Unlock()
	c.mu.Unlock()
	if !noWait {
		c.reply(ch.id, classBasic, 21, func(b []byte) []byte { return putShortstr(b, tag) })
	}
	return nil
}

// dropReply forgets the channel's reply consumer (cancelled, or the
// channel or connection closed). Any goroutine; c.mu not held.
func (c *conn) dropReply(rc *replyConsumer) {
	if rc == nil {
		return
	}
	c.l.replyMu.Lock()
	if c.l.replies[rc.name] == rc {
		delete(c.l.replies, rc.name)
	}
	c.l.replyMu.Unlock()
}

// isReplyKey says a default-exchange publish is a direct reply.
func isReplyKey(exchange string, key []byte) bool {
	return exchange == "" && len(key) > len(replyPrefix) && string(key[:len(replyPrefix)]) == replyPrefix
}

// sendReply delivers a publish to the reply consumer its routing key
// names; false: there is none (the publish is unroutable).
func (c *conn) sendReply(pub *pending) bool {
	c.l.replyMu.Lock()
	rc := c.l.replies[string(pub.key)]
	c.l.replyMu.Unlock()
	if rc == nil || rc.vhost != c.vh() {
		return false
	}
	a := pub.arena
	ne, nk, np := len(pub.exchange), len(pub.key), len(pub.in.props)
	ar := &broker.Arena{Buf: a}
	m := ar.Msg(a[:ne], a[ne:ne+nk], a[ne+nk:ne+nk+np], a[pub.bodyAt:], pub.in.flags, pub.in.priority)
	t := rc.c
	t.mu.Lock()
	defer t.mu.Unlock()
	ch := rc.ch
	if t.dead || ch.closing || ch.reply != rc {
		return false
	}
	ch.nextTag++
	if len(ch.tags) == 0 { // as for any no-ack delivery: nothing to settle
		ch.tagBase = ch.nextTag + 1
	} else {
		ch.tags = append(ch.tags, tagEntry{})
	}
	b, st := method(t.out, ch.id, classBasic, 60)
	b = putShortstr(b, rc.tag)
	b = binary.BigEndian.AppendUint64(b, ch.nextTag)
	b = append(b, 0) // not redelivered
	b = putShortstr(b, "")
	b = putShortstr(b, string(m.RoutingKey()))
	b = endFrame(b, st)
	t.out = t.appendContent(b, ch.id, &m, 0)
	t.delivered.Add(1)
	t.flushLocked()
	return true
}

// replyPublish is a publish of a direct reply: delivered, or returned if
// mandatory; confirmed at once in confirm mode (nothing is stored).
func (c *conn) replyPublish(ch *channel, pub *pending) {
	if !c.sendReply(pub) && pub.mandatory {
		a := pub.arena
		ne, nk, np := len(pub.exchange), len(pub.key), len(pub.in.props)
		ar := &broker.Arena{Buf: a}
		m := ar.Msg(a[:ne], a[ne:ne+nk], a[ne+nk:ne+nk+np], a[pub.bodyAt:], pub.in.flags, pub.in.priority)
		c.sendReturn(ch.id, &m)
	}
	c.published.Add(1)
	if !ch.confirm {
		return
	}
	ch.pubSeq++
	seq := ch.pubSeq
	c.mu.Lock()
	if !c.dead && !ch.closing {
		out, st := method(c.out, ch.id, classBasic, 80)
		out = binary.BigEndian.AppendUint64(out, seq)
		out = append(out, 0)
		c.out = endFrame(out, st)
		c.flushLocked()
	}
	c.mu.Unlock()
}
