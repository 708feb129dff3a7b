package amqp

import (
	"encoding/binary"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/warren-mq/warren/broker"
	"github.com/warren-mq/warren/netio"
	"github.com/warren-mq/warren/queue"
	"github.com/warren-mq/warren/wire"
)

var errSyntax = connErr(syntaxError, "SYNTAX_ERROR - malformed method arguments")

// errDefaultExchange refuses to bind to, from or delete the default
// exchange, in RabbitMQ's words.
var errDefaultExchange = chErr(accessRefused, "ACCESS_REFUSED - operation not permitted on the default exchange")

// onMethod handles a method on an open channel.
func (c *conn) onMethod(ch *channel, class, id uint16, r *reader) error {
	switch class {
	case classChannel:
		switch id {
		case 20: // flow
			active := r.bitAt()
			if r.err != nil {
				return errSyntax
			}
			if !active {
				return connErr(notImplemented, "NOT_IMPLEMENTED - active=false")
			}
			c.reply(ch.id, classChannel, 21, func(b []byte) []byte { return append(b, 1) })
			return nil
		case 40: // close
			cons := c.releaseChannel(ch)
			for _, cr := range cons {
				c.srv.Submit(broker.Command{Kind: broker.CmdCancel, Queue: cr.q, Consumer: cr.id, Requeue: true})
			}
			c.mu.Lock()
			delete(c.channels, ch.id)
			c.mu.Unlock()
			c.reply(ch.id, classChannel, 41, nil)
			return nil
		case 41: // close-ok without a close
			return nil
		}
	case classExchange:
		return c.onExchange(ch, id, r)
	case classQueue:
		return c.onQueue(ch, id, r)
	case classBasic:
		return c.onBasic(ch, id, r)
	case classConfirm:
		if id == 10 {
			noWait := r.bitAt()
			if r.err != nil {
				return errSyntax
			}
			if ch.tx {
				return chErr(preconditionFailed, "PRECONDITION_FAILED - cannot switch from tx to confirm mode")
			}
			ch.confirm = true
			if !noWait {
				c.reply(ch.id, classConfirm, 11, nil)
			}
			return nil
		}
	case classTx:
		return c.onTx(ch, id)
	}
	return connErr(commandInvalid, "COMMAND_INVALID - unknown method "+strconv.Itoa(int(class))+"."+strconv.Itoa(int(id)))
}

func (c *conn) onExchange(ch *channel, id uint16, r *reader) error {
	switch id {
	case 10: // declare
		r.u16()
		name, kind := r.shortstr(), r.shortstr()
		passive, durable, autoDelete, internal, noWait := r.bitAt(), r.bitAt(), r.bitAt(), r.bitAt(), r.bitAt()
		args := r.table()
		if r.err != nil {
			return r.err
		}
		d := &wire.ExchangeDeclare{Name: name, Durable: durable, AutoDelete: autoDelete, Internal: internal, Passive: passive}
		asked := kind
		if kind == "x-consistent-hash" { // the RabbitMQ plugin's name
			kind = "consistent-hash"
		}
		if k, ok := wire.ParseExchangeKind(kind); ok {
			d.Kind = k
		} else if passive {
			d.Kind = wire.ExchangeDirect
		} else {
			return connErr(commandInvalid, "COMMAND_INVALID - unknown exchange type '"+kind+"'")
		}
		for _, f := range args {
			if f.Key == "alternate-exchange" && f.Value.Kind == wire.KindString {
				d.Alternate = string(f.Value.Bytes)
				continue
			}
			return chErr(preconditionFailed, "PRECONDITION_FAILED - unsupported exchange argument '"+f.Key+"' (only alternate-exchange is mapped)")
		}
		if err := c.srv.PermitDeclareIn(c.vh(), c.user, passive, "exchange", name, d.Alternate); err != nil { // permissions (issue 15)
			return err
		}
		d.Name = c.qn(name)
		if d.Alternate != "" {
			d.Alternate = c.qn(d.Alternate)
		}
		if passive {
			if !c.srv.View().Table.HasExchange(d.Name) {
				return chErr(notFound, "NOT_FOUND - no exchange '"+name+"' in vhost '"+c.vh()+"'")
			}
		} else if err := c.control(func() error { return c.srv.DeclareExchangeAs(d, c.user) }); err != nil {
			if isCode(err, wire.AccessRefused) && strings.HasPrefix(name, "amq.") {
				return chErr(accessRefused, "ACCESS_REFUSED - exchange name '"+name+"' contains reserved prefix 'amq.*'")
			}
			if isCode(err, wire.PreconditionFailed) {
				if ae := c.exchangeInequivalent(name, asked, d); ae != nil {
					return ae
				}
			}
			return err
		}
		if !noWait {
			c.reply(ch.id, classExchange, 11, nil)
		}
		return nil
	case 20: // delete
		r.u16()
		name := r.shortstr()
		ifUnused, noWait := r.bitAt(), r.bitAt()
		if r.err != nil {
			return r.err
		}
		if err := c.srv.PermitIn(c.vh(), c.user, netio.PermConfigure, "exchange", name); err != nil { // permissions (issue 15)
			return err
		}
		switch {
		case name == "":
			return errDefaultExchange
		case strings.HasPrefix(name, "amq."):
			if c.srv.View().Table.HasExchange(c.qn(name)) {
				return chErr(accessRefused, "ACCESS_REFUSED - deletion of system exchange '"+name+"' in vhost '"+c.vh()+"' not allowed")
			}
		}
		err := c.control(func() error {
			return c.srv.DeleteExchangeAs(&wire.ExchangeDelete{Name: c.qn(name), IfUnused: ifUnused}, c.requester())
		})
		if ifUnused && isCode(err, wire.PreconditionFailed) {
			return chErr(preconditionFailed, "PRECONDITION_FAILED - "+c.rs("exchange", name)+" in use")
		}
		if err != nil && !isCode(err, wire.NotFound) { // deleting what is not there is ok, as in RabbitMQ
			return err
		}
		if !noWait {
			c.reply(ch.id, classExchange, 21, nil)
		}
		return nil
	case 30, 40: // bind, unbind
		r.u16()
		dst, src, key := r.shortstr(), r.shortstr(), r.shortstr()
		noWait := r.bitAt()
		args := r.table()
		if r.err != nil {
			return r.err
		}
		if err := c.srv.PermitBindIn(c.vh(), c.user, src, dst, true); err != nil { // permissions (issue 15)
			return err
		}
		if src == "" || dst == "" {
			return errDefaultExchange
		}
		b := &wire.Bind{Unbind: id == 40, ToExchange: true, Destination: c.qn(dst), Source: c.qn(src), RoutingKey: key, Args: bindArgs(args)}
		// Unbinding what is not there (binding, exchange or queue) is ok,
		// as RabbitMQ 3.10 answers it.
		if err := c.control(func() error { return c.srv.BindAs(b, c.requester()) }); err != nil && !(b.Unbind && isCode(err, wire.NotFound)) {
			return err
		}
		if !noWait {
			okID := uint16(31)
			if id == 40 {
				okID = 51
			}
			c.reply(ch.id, classExchange, okID, nil)
		}
		return nil
	}
	return connErr(commandInvalid, "COMMAND_INVALID - unknown exchange method "+strconv.Itoa(int(id)))
}

// bindArgs puts a binding's arguments in key order: a binding is the same
// one whatever order a client's table came in (amqp091-go writes Go's map
// order), for a bind (no second binding) and an unbind (it is found).
func bindArgs(t wire.Table) wire.Table {
	slices.SortStableFunc(t, func(a, b wire.Field) int { return strings.Compare(a.Key, b.Key) })
	return t
}

func isCode(err error, code wire.Code) bool {
	we, ok := err.(*wire.Error)
	return ok && we.Code == code
}

// queueName resolves the empty name to the channel's last declared queue.
func (ch *channel) queueName(n string) string {
	if n == "" {
		return ch.lastQueue
	}
	return n
}

// Answer kinds, in a request reference's low bits.
const (
	ansPurge  = 1
	ansDelete = 2
	ansNoWait = 4
)

func (c *conn) onQueue(ch *channel, id uint16, r *reader) error {
	switch id {
	case 10: // declare
		r.u16()
		name := r.shortstr()
		passive, durable, exclusive, autoDelete, noWait := r.bitAt(), r.bitAt(), r.bitAt(), r.bitAt(), r.bitAt()
		args := r.table()
		if r.err != nil {
			return r.err
		}
		if passive && name == replyQueue { // direct reply-to is there (Spring AMQP asks)
			if !noWait {
				c.reply(ch.id, classQueue, 11, func(b []byte) []byte { return binary.BigEndian.AppendUint64(putShortstr(b, name), 0) })
			}
			return nil
		}
		if passive && name == "" { // the channel's last queue, as RabbitMQ reads it
			if name = ch.lastQueue; name == "" {
				return chErr(notFound, "NOT_FOUND - no queue '' in vhost '"+c.vh()+"'")
			}
		}
		wargs, quorum, ae := queueArgs(args, c.rs("queue", name))
		if ae != nil {
			return ae
		}
		if quorum && !passive { // as RabbitMQ checks a quorum queue's properties
			bad := ""
			switch {
			case !durable:
				bad = "non-durable"
			case exclusive:
				bad = "exclusive-owner"
			case autoDelete:
				bad = "auto-delete"
			}
			if bad != "" {
				return chErr(preconditionFailed, "PRECONDITION_FAILED - invalid property '"+bad+"' for "+c.rs("queue", name))
			}
		}
		dlx := ""
		if qa, err := wire.ParseQueueArgs(wargs); err == nil {
			dlx = qa.DeadLetterExchange
		}
		if err := c.srv.PermitDeclareIn(c.vh(), c.user, passive, "queue", name, dlx); err != nil { // permissions (issue 15)
			return err
		}
		d := &wire.QueueDeclare{Name: c.qn(name), Durable: durable, Exclusive: exclusive, AutoDelete: autoDelete, Passive: passive, Args: wargs}
		var q *broker.Queue
		err := c.control(func() (err error) {
			q, err = c.srv.DeclareQueueAs(d, c.id, c.user)
			return err
		})
		if err != nil {
			if passive && isCode(err, wire.NotFound) {
				return chErr(notFound, "NOT_FOUND - no queue '"+name+"' in vhost '"+c.vh()+"'")
			}
			if isCode(err, wire.ResourceLocked) {
				return c.errExclusive(name)
			}
			if isCode(err, wire.AccessRefused) && strings.HasPrefix(name, "amq.") {
				return chErr(accessRefused, "ACCESS_REFUSED - queue name '"+name+"' contains reserved prefix 'amq.*'")
			}
			if !passive && isCode(err, wire.PreconditionFailed) {
				if ae := c.queueInequivalent(name, durable, autoDelete, exclusive, args); ae != nil {
					return ae
				}
			}
			return err
		}
		if x := q.ExclusiveTo(); x != 0 && x != c.id {
			return c.errExclusive(broker.LocalName(q.Name()))
		}
		ch.lastQueue = broker.LocalName(q.Name())
		if passive && !noWait {
			// Answered by the queue's shard after everything submitted
			// before it, as netio does: the counts are exact, and this
			// connection's earlier acks and closes have taken effect.
			c.srv.Submit(broker.Command{Kind: broker.CmdBarrier, Queue: q, Sink: passiveDeclare{c, q}, Req: (ch.gen&(1<<32-1))<<32 | uint64(ch.id)<<8})
			return nil
		}
		if !noWait {
			c.reply(ch.id, classQueue, 11, func(b []byte) []byte {
				b = putShortstr(b, broker.LocalName(q.Name()))
				b = binary.BigEndian.AppendUint32(b, uint32(q.ReadyCount()))
				return binary.BigEndian.AppendUint32(b, uint32(q.ConsumerCount()))
			})
		}
		return nil
	case 20, 50: // bind, unbind
		r.u16()
		qn, ex, key := r.shortstr(), r.shortstr(), r.shortstr()
		noWait := false
		if id == 20 {
			noWait = r.bitAt()
		}
		args := r.table()
		if r.err != nil {
			return r.err
		}
		if err := c.srv.PermitBindIn(c.vh(), c.user, ex, ch.queueName(qn), false); err != nil { // permissions (issue 15)
			return err
		}
		if ex == "" {
			return errDefaultExchange
		}
		if q := c.srv.LookupQueue(c.qn(ch.queueName(qn))); q != nil {
			if x := q.ExclusiveTo(); x != 0 && x != c.id {
				return c.errExclusive(ch.queueName(qn))
			}
		}
		b := &wire.Bind{Unbind: id == 50, Destination: c.qn(ch.queueName(qn)), Source: c.qn(ex), RoutingKey: key, Args: bindArgs(args)}
		// Unbinding what is not there is ok, as above.
		if err := c.control(func() error { return c.srv.BindAs(b, c.requester()) }); err != nil && !(b.Unbind && isCode(err, wire.NotFound)) {
			return err
		}
		if !noWait {
			c.reply(ch.id, classQueue, id+1, nil)
		}
		return nil
	case 30, 40: // purge, delete
		r.u16()
		qn := ch.queueName(r.shortstr())
		var ifUnused, ifEmpty bool
		if id == 40 {
			ifUnused, ifEmpty = r.bitAt(), r.bitAt()
		}
		noWait := r.bitAt()
		if r.err != nil {
			return r.err
		}
		q := c.srv.LookupQueue(c.qn(qn))
		ref := (ch.gen&(1<<32-1))<<32 | uint64(ch.id)<<8
		if noWait {
			ref |= ansNoWait
		}
		if q == nil {
			if id == 40 { // deleting what is not there is ok, as in RabbitMQ
				if !noWait {
					c.reply(ch.id, classQueue, 41, func(b []byte) []byte { return binary.BigEndian.AppendUint32(b, 0) })
				}
				return nil
			}
			return chErr(notFound, "NOT_FOUND - no queue '"+qn+"' in vhost '"+c.vh()+"'")
		}
		if x := q.ExclusiveTo(); x != 0 && x != c.id {
			return c.errExclusive(qn)
		}
		perm := netio.PermConfigure // permissions (issue 15): delete
		if id == 30 {
			perm = netio.PermRead // purge
		}
		if err := c.srv.PermitIn(c.vh(), c.user, perm, "queue", qn); err != nil {
			return err
		}
		if id == 30 {
			if err := c.srv.Authorize(c.user, netio.ActPurge, q.DeclaredBy(), "queue "+strconv.Quote(qn)); err != nil {
				return err
			}
			c.srv.Submit(broker.Command{Kind: broker.CmdPurge, Queue: q, Sink: c, Req: ref | ansPurge})
			return nil
		}
		if err := c.srv.Authorize(c.user, netio.ActDelete, q.DeclaredBy(), "queue "+strconv.Quote(qn)); err != nil {
			return err
		}
		// The shard answers once it has proposed the deletion; the
		// control run's end waits for that answer, then for the deletion
		// to be durable (one node) or applied here (a cluster), and only
		// then does the answer go out.
		k := heldAnswer{deleteAnswer: deleteAnswer{c, qn}}
		if err := c.control(func() error {
			c.srv.Submit(broker.Command{Kind: broker.CmdDelete, Queue: q, Sink: &k, Req: ref | ansDelete, Owner: c.id,
				IfUnused: ifUnused, IfEmpty: ifEmpty, Reason: "queue deleted"})
			return nil
		}); err != nil {
			return err
		}
		if k.answered {
			k.deleteAnswer.Answer(k.ref, k.r)
		}
		return nil
	}
	return connErr(commandInvalid, "COMMAND_INVALID - unknown queue method "+strconv.Itoa(int(id)))
}

func (c *conn) onBasic(ch *channel, id uint16, r *reader) error {
	switch id {
	case 10: // qos
		size, count, global := r.u32(), r.u16(), r.bitAt()
		if r.err != nil {
			return errSyntax
		}
		if global {
			// RabbitMQ 3.x: a prefetch shared by the channel's consumers,
			// beside each consumer's own (global=false).
			if size != 0 {
				return connErr(notImplemented, "NOT_IMPLEMENTED - prefetch_size!=0 with global=true ("+strconv.FormatUint(uint64(size), 10)+")")
			}
			c.mu.Lock()
			ch.globalMax = count
			c.flushStashLocked(ch)
			c.mu.Unlock()
			c.reply(ch.id, classBasic, 11, nil)
			return nil
		}
		ch.prefetch, ch.prefBytes = count, size
		c.reply(ch.id, classBasic, 11, nil)
		return nil
	case 20: // consume
		return c.onConsume(ch, r)
	case 30: // cancel
		tag := r.shortstr()
		noWait := r.bitAt()
		if r.err != nil {
			return errSyntax
		}
		c.mu.Lock()
		if rc := ch.reply; rc != nil && rc.tag == tag {
			ch.reply = nil
			c.mu.Unlock()
			c.dropReply(rc)
			if !noWait {
				c.reply(ch.id, classBasic, 31, func(b []byte) []byte { return putShortstr(b, tag) })
			}
			return nil
		}
		cr := ch.consumers[tag]
		delete(ch.consumers, tag)
		var back []broker.SettleItem
		if cr != nil {
			back = c.unstashLocked(ch, cr, nil)
		}
		c.mu.Unlock()
		if cr != nil {
			if len(back) > 0 { // never sent: back to the queue
				c.srv.Submit(broker.Command{Kind: broker.CmdSettle, Settles: back})
			}
			c.srv.Submit(broker.Command{Kind: broker.CmdCancel, Queue: cr.q, Consumer: cr.id})
		}
		if !noWait {
			c.reply(ch.id, classBasic, 31, func(b []byte) []byte { return putShortstr(b, tag) })
		}
		return nil
	case 40: // publish
		r.u16()
		exB := r.take(int(r.u8()))
		key := r.take(int(r.u8()))
		mandatory, immediate := r.bitAt(), r.bitAt()
		if r.err != nil {
			return errSyntax
		}
		if immediate {
			return connErr(notImplemented, "NOT_IMPLEMENTED - immediate=true")
		}
		// No allocation per publish: the exchange name is the last one's
		// string while it is the same, the key is copied out of the frame
		// buffer into the channel's scratch, and pending is the channel's.
		if string(exB) != ch.lastEx {
			ch.lastEx = string(exB)
		}
		ch.names = append(ch.names[:0], key...)
		ch.pubBuf = pending{exchange: ch.lastEx, key: ch.names, mandatory: mandatory}
		ch.pub = &ch.pubBuf
		return nil
	case 70:
		return c.onGet(ch, r)
	case 100, 110: // recover-async, recover
		requeue := r.bitAt()
		if r.err != nil {
			return errSyntax
		}
		if !requeue { // as RabbitMQ: redelivery to the same consumer is not offered
			return connErr(notImplemented, "NOT_IMPLEMENTED - requeue=false")
		}
		c.recover(ch)
		if id == 110 {
			c.reply(ch.id, classBasic, 111, nil)
		}
		return nil
	case 80, 90, 120: // ack, reject, nack
		tag := r.u64()
		var multiple, requeue bool
		switch id {
		case 80:
			multiple = r.bitAt()
		case 90:
			requeue = r.bitAt()
		case 120:
			multiple, requeue = r.bitAt(), r.bitAt()
		}
		if r.err != nil {
			return errSyntax
		}
		op := wire.SettleAck
		if id != 80 {
			op = wire.SettleReject
			if requeue {
				op = wire.SettleRequeue
			}
		}
		return c.settle(ch, tag, multiple, op)
	}
	return connErr(commandInvalid, "COMMAND_INVALID - unknown basic method "+strconv.Itoa(int(id)))
}

// recover returns every unacked delivery of the channel to its queue (to
// be redelivered, with redelivered set); their tags are forgotten.
func (c *conn) recover(ch *channel) {
	var items []broker.SettleItem
	c.mu.Lock()
	for i := range ch.tags {
		if e := &ch.tags[i]; e.live && e.q != nil {
			items = append(items, broker.SettleItem{Q: e.q, Consumer: e.cid, Op: wire.SettleRequeue, QTag: e.qtag})
		}
	}
	ch.tags = ch.tags[:0]
	ch.tagBase = ch.nextTag + 1
	ch.inflight = 0
	items = c.unstashLocked(ch, nil, items)
	c.mu.Unlock()
	if len(items) > 0 {
		c.srv.Submit(broker.Command{Kind: broker.CmdSettle, Settles: items})
	}
}

// settle translates channel delivery tags into queue tags.
func (c *conn) settle(ch *channel, tag uint64, multiple bool, op wire.SettleOp) error {
	var items []broker.SettleItem
	c.mu.Lock()
	first, last := tag, tag
	if multiple {
		first = ch.tagBase
		if tag == 0 {
			last = ch.nextTag
		}
	}
	if !multiple && (tag < ch.tagBase || tag > ch.nextTag || !ch.tags[tag-ch.tagBase].live) {
		c.mu.Unlock()
		return chErr(preconditionFailed, "PRECONDITION_FAILED - unknown delivery tag "+strconv.FormatUint(tag, 10))
	}
	if last > ch.nextTag {
		c.mu.Unlock()
		return chErr(preconditionFailed, "PRECONDITION_FAILED - unknown delivery tag "+strconv.FormatUint(tag, 10))
	}
	for t := first; t <= last && t >= ch.tagBase; t++ {
		e := &ch.tags[t-ch.tagBase]
		if e.live {
			e.live = false
			if e.gated {
				e.gated = false
				ch.inflight--
			}
			if e.q != nil {
				items = append(items, broker.SettleItem{Q: e.q, Consumer: e.cid, Op: op, QTag: e.qtag})
				if ch.tx && e.get {
					ch.txGets = append(ch.txGets, len(ch.txSettles)+len(items)-1)
				}
			}
		}
	}
	// Drop the settled head.
	n := 0
	for n < len(ch.tags) && !ch.tags[n].live {
		n++
	}
	if n > 0 {
		ch.tags = append(ch.tags[:0], ch.tags[n:]...)
		ch.tagBase += uint64(n)
	}
	if ch.stashHead < len(ch.stashQ) {
		c.flushStashLocked(ch)
	}
	if ch.tx { // until tx.commit
		ch.txSettles = append(ch.txSettles, items...)
		items = nil
	}
	c.mu.Unlock()
	if len(items) > 0 {
		c.srv.Submit(broker.Command{Kind: broker.CmdSettle, Settles: items})
	}
	return nil
}

func (c *conn) onConsume(ch *channel, r *reader) error {
	r.u16()
	qn, tag := ch.queueName(r.shortstr()), r.shortstr()
	_, noAck, exclusive, noWait := r.bitAt(), r.bitAt(), r.bitAt(), r.bitAt()
	args := r.table()
	if r.err != nil {
		return r.err
	}
	if qn == replyQueue {
		return c.onReplyConsume(ch, tag, noAck, noWait)
	}
	if err := c.srv.PermitIn(c.vh(), c.user, netio.PermRead, "queue", qn); err != nil { // permissions (issue 15)
		return err
	}
	var prio int16
	for _, f := range args {
		switch {
		case f.Key != "x-priority":
			return chErr(preconditionFailed, "PRECONDITION_FAILED - unsupported consumer argument '"+f.Key+"' for "+c.rs("queue", qn)+" (only x-priority is mapped)")
		case f.Value.Kind != wire.KindInt:
			return chErr(preconditionFailed, "PRECONDITION_FAILED - invalid arg 'x-priority' for "+c.rs("queue", qn)+": \"expected integer, got "+amqpTypeName(f.Value)+"\"")
		case f.Value.Int < -32768 || f.Value.Int > 32767:
			return chErr(preconditionFailed, "PRECONDITION_FAILED - invalid arg 'x-priority' for "+c.rs("queue", qn)+": \"expected an integer in [-32768, 32767]\"")
		}
		prio = int16(f.Value.Int)
	}
	q := c.srv.LookupQueue(c.qn(qn))
	if q == nil {
		return chErr(notFound, "NOT_FOUND - no queue '"+qn+"' in vhost '"+c.vh()+"'")
	}
	if x := q.ExclusiveTo(); x != 0 && x != c.id {
		return c.errExclusive(qn)
	}
	c.mu.Lock()
	if tag == "" {
		c.ctagSeq++
		tag = "amq.ctag-" + strconv.FormatUint(c.id, 10) + "-" + strconv.Itoa(c.ctagSeq)
	}
	if _, dup := ch.consumers[tag]; dup {
		c.mu.Unlock()
		return connErr(notAllowed, "NOT_ALLOWED - attempt to reuse consumer tag '"+tag+"'")
	}
	cr := &consumer{id: c.srv.NewConsumerID(), tag: tag, ch: ch, q: q, autoAck: noAck, noWait: noWait}
	ch.consumers[tag] = cr
	c.byID[cr.id] = cr
	c.mu.Unlock()
	prefetch := uint32(ch.prefetch)
	if g := uint32(ch.globalMax); g > 0 && !noAck && (prefetch == 0 || g < prefetch) {
		prefetch = g // it can never have more out than the channel
	}
	if max := c.srv.MaxPrefetch(); prefetch == 0 || prefetch > max {
		prefetch = max
	}
	spec := queue.ConsumerSpec{ID: cr.id, Owner: queue.OwnerID(c.id), Prefetch: prefetch, PrefetchBytes: ch.prefBytes, Priority: prio, Exclusive: exclusive}
	c.srv.Submit(broker.Command{Kind: broker.CmdSubscribe, Queue: q, Sink: c, Spec: spec})
	return nil
}

// heldAnswer keeps a shard's answer to a queue.delete (a Sink for one
// CmdDelete) for the control run to give once the deletion is durable
// (EndControlRun waits for the answer first).
type heldAnswer struct {
	deleteAnswer
	answered bool
	ref      uint64
	r        broker.Result
}

func (k *heldAnswer) Answer(ref uint64, r broker.Result) {
	k.ref, k.r, k.answered = ref, r, true
}

// deleteAnswer answers a queue.delete, naming the queue in a refusal as
// RabbitMQ does (a Sink for one CmdDelete).
type deleteAnswer struct {
	*conn
	name string
}

func (d deleteAnswer) Answer(ref uint64, r broker.Result) {
	if r.Code == wire.PreconditionFailed { // if-empty or if-unused
		why := " in use"
		if strings.Contains(r.Reason, "not empty") {
			why = " not empty"
		}
		r.Reason = d.rs("queue", d.name) + why
	}
	d.conn.Answer(ref, r)
}

// Answer answers queue.purge and queue.delete.
func (c *conn) Answer(ref uint64, r broker.Result) {
	gen, chID, kind := ref>>32, uint16(ref>>8), ref&0xff
	c.mu.Lock()
	ch := c.channels[chID]
	c.mu.Unlock()
	if ch == nil || ch.gen&(1<<32-1) != gen || ch.closing { // the reference keeps the generation's low 32 bits
		return
	}
	if r.Code != wire.OK {
		if r.Code == wire.NotFound && kind&ansDelete != 0 {
			r = broker.Result{} // deleted meanwhile: ok, as in RabbitMQ
		} else {
			ae := brokerErr(r.Code, r.Reason)
			ae.class, ae.method = classQueue, 30
			if kind&ansDelete != 0 {
				ae.method = 40
			}
			c.closeChannelFromShard(ch, ae)
			return
		}
	}
	if kind&ansNoWait != 0 {
		return
	}
	id := uint16(31)
	if kind&ansDelete != 0 {
		id = 41
	}
	c.reply(chID, classQueue, id, func(b []byte) []byte { return binary.BigEndian.AppendUint32(b, uint32(r.N)) })
}

// sendBlocked sends connection.blocked or unblocked, to a client that
// takes them.
func (c *conn) sendBlocked(on bool) {
	if !c.blockedCap {
		return
	}
	if on {
		why := "low on memory" // RabbitMQ's words
		if c.srv.DiskAlarm() {
			why = "low on disk"
		}
		c.reply(0, classConnection, 60, func(b []byte) []byte { return putShortstr(b, why) })
		return
	}
	c.reply(0, classConnection, 61, nil)
}

// passiveDeclare answers a passive queue.declare from the queue's shard
// (a Sink for one CmdBarrier).
type passiveDeclare struct {
	*conn
	q *broker.Queue
}

// Answer runs on the queue's shard.
func (p passiveDeclare) Answer(ref uint64, _ broker.Result) {
	gen, chID := ref>>32, uint16(ref>>8)
	p.mu.Lock()
	ch := p.channels[chID]
	p.mu.Unlock()
	if ch == nil || ch.gen&(1<<32-1) != gen || ch.closing {
		return
	}
	if p.q.Gone() {
		ae := chErr(notFound, "NOT_FOUND - no queue '"+broker.LocalName(p.q.Name())+"' in vhost '"+p.vh()+"'")
		ae.class, ae.method = classQueue, 10
		p.closeChannelFromShard(ch, ae)
		return
	}
	p.reply(chID, classQueue, 11, func(b []byte) []byte {
		b = putShortstr(b, broker.LocalName(p.q.Name()))
		b = binary.BigEndian.AppendUint32(b, uint32(p.q.ReadyCount()))
		return binary.BigEndian.AppendUint32(b, uint32(p.q.ConsumerCount()))
	})
}

func boolByte(v bool) byte {
	if v {
		return 1
	}
	return 0
}

// onGet answers basic.get with a consumer of prefetch 1 for one drain of
// the queue's shard: subscribed, then a barrier on that shard; whatever it
// was handed by the barrier is the answer (get-ok), else get-empty. It is
// then cancelled: with its message still held for an ack (a get with
// acks), or with everything returned (no-ack: the message acked first).
func (c *conn) onGet(ch *channel, r *reader) error {
	r.u16()
	qn := ch.queueName(r.shortstr())
	noAck := r.bitAt()
	if r.err != nil {
		return errSyntax
	}
	if err := c.srv.PermitIn(c.vh(), c.user, netio.PermRead, "queue", qn); err != nil { // permissions (issue 15)
		return err
	}
	q := c.srv.LookupQueue(c.qn(qn))
	if q == nil {
		return chErr(notFound, "NOT_FOUND - no queue '"+qn+"' in vhost '"+c.vh()+"'")
	}
	if x := q.ExclusiveTo(); x != 0 && x != c.id {
		return c.errExclusive(qn)
	}
	cr := &consumer{id: c.srv.NewConsumerID(), ch: ch, q: q, autoAck: noAck, noWait: true, get: make(chan struct{})}
	c.mu.Lock()
	c.byID[cr.id] = cr
	c.mu.Unlock()
	c.srv.Submit(broker.Command{Kind: broker.CmdSubscribe, Queue: q, Sink: c, Spec: queue.ConsumerSpec{ID: cr.id, Owner: queue.OwnerID(c.id), Prefetch: 1, Get: true}})
	c.srv.Submit(broker.Command{Kind: broker.CmdBarrier, Queue: q, Sink: getDone{c, cr}})
	for waiting := true; waiting; {
		select {
		case <-cr.get:
			waiting = false
		case <-time.After(100 * time.Millisecond):
			if c.stopped.Load() {
				return errClientClosed
			}
		}
	}
	c.mu.Lock()
	got, qtag := cr.got, cr.getQTag
	c.mu.Unlock()
	// Cancelled first: its prefetch of 1 is full while it holds its
	// message, so nothing more is handed to it (an ack first freed it,
	// the queue handed it the next message and the cancel requeued that
	// one, counted as delivered).
	c.srv.Submit(broker.Command{Kind: broker.CmdCancel, Queue: q, Consumer: cr.id, Requeue: !got})
	if got && noAck {
		c.srv.Submit(broker.Command{Kind: broker.CmdSettle, Settles: []broker.SettleItem{{Q: q, Consumer: cr.id, Op: wire.SettleAck, QTag: qtag}}})
	}
	return nil
}

// getDone answers a basic.get once the queue's shard has handed over
// what it had (a Sink for one CmdBarrier).
type getDone struct {
	*conn
	cr *consumer
}

// Answer runs on the queue's shard.
func (g getDone) Answer(uint64, broker.Result) {
	g.mu.Lock()
	g.cr.answered = true
	if !g.cr.got && !g.cr.ch.closing && !g.dead {
		b, st := method(g.out, g.cr.ch.id, classBasic, 72)
		b = putShortstr(b, "")
		g.out = endFrame(b, st)
		g.flushLocked()
	}
	g.mu.Unlock()
	close(g.cr.get)
}
