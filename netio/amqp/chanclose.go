package amqp

// Channel close: a channel error becomes channel.close (from the loop, or
// from a shard), and what the channel held — its consumers, the messages
// its basic.gets took and it did not ack, its reply-to consumer — goes
// back to its queues.

import (
	"errors"
	"slices"

	"github.com/warren-mq/warren/broker"
	"github.com/warren-mq/warren/queue"
	"github.com/warren-mq/warren/wire"
)

// chanResult turns a channel error into channel.close; a connection error
// goes up.
func (c *conn) chanResult(ch *channel, err error) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, errClientClosed) {
		return err
	}
	ae := errOf(err)
	if ae.class == 0 {
		cp := *ae // it may be a shared one (errSyntax)
		ae = &cp
		ae.class, ae.method = c.curClass, c.curMethod
	}
	if ae.conn || ae.code == notImplemented || ae.code >= 500 {
		ae.conn = true
		return ae
	}
	c.closeChannel(ch, ae)
	return nil
}

// closeChannel sends channel.close and returns what the channel's
// consumers held; nothing if the channel is closing already (the client's
// channel.close or another channel.close of the broker's came first).
// Safe from any goroutine but a shard's (it submits).
func (c *conn) closeChannel(ch *channel, ae *amqpError) {
	if r, ok := c.claimClose(ch, ae); ok {
		c.submitRelease(r)
	}
}

// claimClose marks ch closing and sends channel.close, if ch is open and
// still the channel of its id: the client's channel.close and the
// broker's both claim the channel under c.mu, and the loser sends nothing.
// Without it, a close a shard decided on (a consume refused) could go out
// after the client's own close was answered, on a freed or reused id, and
// the client's close-ok to it ended the connection (504, expected
// 'channel.open'). The pointer comparison tells a channel from a later
// one on the same id. It submits nothing: safe from a shard.
func (c *conn) claimClose(ch *channel, ae *amqpError) (release, bool) {
	c.mu.Lock()
	r, ok := c.releaseLocked(ch)
	if !ok {
		c.mu.Unlock()
		return r, false
	}
	c.out = appendClose(c.out, ch.id, classChannel, 40, ae)
	c.flushLocked()
	c.mu.Unlock()
	c.dropReply(r.reply)
	return r, true
}

// dropPub lets go of the publish a closing channel was reading the content
// of. Only the loop (handle, and what it calls) touches ch.pub: a channel
// a shard closes mid-content keeps it until the channel's next frame,
// which the client sends (the rest of the body, or close-ok).
func (c *conn) dropPub(ch *channel) {
	if ch.pub != nil {
		c.dropPending(ch.pub)
		*ch.pub = pending{} // its arena with it (publish)
		ch.pub = nil
	}
}

// release is what a closed channel hands back: its consumers to cancel
// (with requeue) and the basic.gets' messages it did not ack.
type release struct {
	cons  []*consumer
	back  []broker.SettleItem
	reply *replyConsumer
}

// submitRelease returns what a closed channel held to its queues.
func (c *conn) submitRelease(r release) {
	if len(r.back) > 0 {
		c.srv.Submit(broker.Command{Kind: broker.CmdSettle, Settles: r.back})
	}
	for _, cr := range r.cons {
		c.srv.Submit(broker.Command{Kind: broker.CmdCancel, Queue: cr.q, Consumer: cr.id, Requeue: true})
	}
}

// releaseLocked marks a channel closing and takes what it holds: its
// consumers and what its basic.gets took and it did not ack (no
// consumer's cancel returns those). false: the channel was closing
// already, or is no longer the channel of its id. c.mu held.
func (c *conn) releaseLocked(ch *channel) (release, bool) {
	if ch.closing || c.channels[ch.id] != ch {
		return release{}, false
	}
	ch.closing = true
	// ch.pub is left to the loop (dropPub, at the channel's next frame):
	// a shard clearing it raced the loop between handle's look at it and
	// onBody's use (a nil dereference on the event loop).
	cons := make([]*consumer, 0, len(ch.consumers))
	for _, cr := range ch.consumers {
		cons = append(cons, cr)
	}
	// What no consumer's cancel returns: the basic.gets' unacked messages
	// and those of the consumers the client cancelled (a basic.cancel
	// leaves its deliveries unacked on the channel, as in RabbitMQ),
	// returned in the order they were delivered.
	// The channel's consumers as a set: a scan of them per delivery tag
	// was O(tags × consumers) on the event loop (136 ms for 20,000 tags
	// and 1,000 consumers, BenchmarkReleaseChannel).
	var live map[queue.ConsumerID]struct{}
	if len(ch.tags) > 0 && len(cons) > 0 {
		live = make(map[queue.ConsumerID]struct{}, len(cons))
		for _, cr := range cons {
			live[cr.id] = struct{}{}
		}
	}
	var back []broker.SettleItem
	for _, e := range ch.tags {
		if !e.live || e.q == nil {
			continue
		}
		if _, held := live[e.cid]; e.get || !held { // held: the consumer's cancel returns it
			back = append(back, broker.SettleItem{Q: e.q, Consumer: e.cid, Op: wire.SettleRequeue, QTag: e.qtag})
		}
	}
	requeueOrder(back)
	for _, i := range ch.txGets { // acked in a transaction not committed
		it := ch.txSettles[i]
		it.Op = wire.SettleRequeue
		back = append(back, it)
	}
	ch.consumers = nil
	ch.tags = nil
	c.resetStashLocked(ch)
	c.dropTxLocked(ch) // the other held settles: the consumers' cancels return those messages
	// ch.reply is left set, for the reader's eyes (onHeader reads it
	// without the lock; the shard clearing it raced that read): the
	// channel closing, sendReply delivers nothing to it, and dropReply,
	// given it here, forgets it (once: OnClose may give it again).
	return release{cons: cons, back: back, reply: ch.reply}, true
}

// requeueOrder orders requeue settlements so that their messages go back
// in the order they were delivered, before the queue's other messages, as
// RabbitMQ returns them: the queue puts each run of one consumer's it
// takes back at the head of its level, so the runs go last first (each
// still in ascending tags, which the shard joins into one command). Before,
// two basic.gets' messages requeued together came back in reverse. items
// of other ops are left as they are.
func requeueOrder(items []broker.SettleItem) {
	for i := range items {
		if items[i].Op != wire.SettleRequeue {
			return
		}
	}
	slices.Reverse(items)
	for i := 0; i < len(items); {
		j := i + 1
		for j < len(items) && items[j].Q == items[i].Q && items[j].Consumer == items[i].Consumer {
			j++
		}
		slices.Reverse(items[i:j])
		i = j
	}
}
