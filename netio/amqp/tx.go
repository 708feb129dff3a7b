package amqp

import (
	"strconv"

	"github.com/warren-mq/warren/broker"
	"github.com/warren-mq/warren/wire"
)

// AMQP transactions, as RabbitMQ has them: after tx.select a channel's
// publishes and its acks, nacks and rejects are held until tx.commit,
// which hands them all to the broker and answers commit-ok once every
// held publish has been taken by its queues (as a confirm would say:
// durable queues' copies written); tx.rollback drops them. As in RabbitMQ
// a commit is not atomic across queues, and a channel is in tx mode or in
// confirm mode, never both. One difference: the messages whose acks a
// rollback drops are returned to their queues (redelivered), where
// RabbitMQ keeps them unacked on the channel under their old tags.

// maxTxBytes bounds the publish bytes a connection's transactions hold
// before their commits (with Config.MaxUnconfirmed publishes).
const maxTxBytes = 64 << 20

// txCommit is a commit whose publishes are not all taken yet.
type txCommit struct {
	seq  uint64
	left int
}

func (c *conn) onTx(ch *channel, id uint16) error {
	switch id {
	case 10: // select
		if ch.confirm {
			return chErr(preconditionFailed, "PRECONDITION_FAILED - cannot switch from confirm to tx mode")
		}
		c.mu.Lock() // Confirm reads it (a commit's confirms)
		ch.tx = true
		c.mu.Unlock()
		c.reply(ch.id, classTx, 11, nil)
		return nil
	case 20, 30: // commit, rollback
		if !ch.tx {
			return chErr(preconditionFailed, "PRECONDITION_FAILED - channel is not transactional")
		}
		if id == 20 {
			c.commit(ch)
			return nil
		}
		c.mu.Lock()
		settles := ch.txSettles
		c.dropTxLocked(ch)
		c.mu.Unlock()
		for i := range settles {
			settles[i].Op = wire.SettleRequeue
		}
		if len(settles) > 0 {
			c.srv.Submit(broker.Command{Kind: broker.CmdSettle, Settles: settles})
		}
		c.reply(ch.id, classTx, 31, nil)
		return nil
	}
	return connErr(commandInvalid, "COMMAND_INVALID - unknown tx method "+strconv.Itoa(int(id)))
}

// hold keeps a complete publish for the channel's commit. pub is the
// channel's scratch: the held copy takes its routing key from its arena.
func (c *conn) hold(ch *channel, pub *pending) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if ch.closing {
		// A shard closed the channel since handle looked: its
		// transaction is dropped (releaseLocked), and this publish with it.
		return nil
	}
	if c.txHeld >= c.l.cfg.MaxUnconfirmed || c.txHeldBytes+cap(pub.arena) > maxTxBytes {
		return chErr(preconditionFailed, "PRECONDITION_FAILED - a connection's transactions hold at most "+
			strconv.Itoa(c.l.cfg.MaxUnconfirmed)+" publishes and "+strconv.Itoa(maxTxBytes>>20)+" MiB before tx.commit: commit more often")
	}
	p := new(pending)
	*p = *pub
	ne := len(p.exchange)
	p.key = p.arena[ne : ne+len(pub.key) : ne+len(pub.key)]
	ch.txPubs = append(ch.txPubs, p)
	c.txHeld++
	c.txHeldBytes += cap(p.arena)
	return nil
}

// commit hands the held settles and publishes to the broker; commit-ok
// follows once the publishes are taken (txConfirmedLocked).
func (c *conn) commit(ch *channel) {
	c.mu.Lock()
	pubs, settles := ch.txPubs, ch.txSettles
	ch.txPubs, ch.txSettles, ch.txGets = nil, nil, nil
	for _, p := range pubs {
		c.txHeld--
		c.txHeldBytes -= cap(p.arena)
	}
	ch.txSeq++
	stored := 0 // direct replies are not stored: nothing confirms them
	for _, p := range pubs {
		if !isReplyKey(p.exchange, p.key) {
			stored++
		}
	}
	ch.txOpen = append(ch.txOpen, txCommit{seq: ch.txSeq, left: stored})
	c.mu.Unlock()
	if len(settles) > 0 {
		c.srv.Submit(broker.Command{Kind: broker.CmdSettle, Settles: settles})
	}
	view := c.srv.View()
	for _, p := range pubs {
		if isReplyKey(p.exchange, p.key) {
			c.replyPublish(ch, p) // not in confirm mode: it only delivers
			continue
		}
		c.enqueue(ch, p, view, c.pubExchange(p.exchange), ch.txSeq)
	}
	c.mu.Lock()
	c.txAdvanceLocked(ch)
	c.mu.Unlock()
}

// txConfirmedLocked counts a committed publish as taken. c.mu held.
func (c *conn) txConfirmedLocked(ch *channel, seq uint64) {
	for i := range ch.txOpen {
		if ch.txOpen[i].seq == seq {
			ch.txOpen[i].left--
			break
		}
	}
	c.txAdvanceLocked(ch)
}

// txAdvanceLocked sends commit-ok for the oldest commits whose publishes
// are all taken. c.mu held.
func (c *conn) txAdvanceLocked(ch *channel) {
	n := 0
	for n < len(ch.txOpen) && ch.txOpen[n].left <= 0 {
		n++
	}
	if n == 0 {
		return
	}
	ch.txOpen = append(ch.txOpen[:0], ch.txOpen[n:]...)
	if c.dead || ch.closing {
		return
	}
	for ; n > 0; n-- {
		b, st := method(c.out, ch.id, classTx, 21)
		c.out = endFrame(b, st)
	}
	c.flushLocked()
}

// dropTxLocked forgets the channel's held publishes and settles (its
// rollback, or its close). c.mu held.
func (c *conn) dropTxLocked(ch *channel) {
	for _, p := range ch.txPubs {
		c.txHeld--
		c.txHeldBytes -= cap(p.arena)
	}
	ch.txPubs, ch.txSettles, ch.txGets = nil, nil, nil
}
