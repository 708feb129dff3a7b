package amqp

// The queue class: queue.declare (passiveDeclare answers a passive one from
// the queue's shard), bind, unbind, purge and delete, and the answers to a
// purge or delete (conn.Answer, deleteAnswer, heldAnswer).

import (
	"encoding/binary"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/warren-mq/warren/broker"
	"github.com/warren-mq/warren/netio"
	"github.com/warren-mq/warren/wire"
)

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
		if _, strict := wargs.Get(strictPriority); strict && !passive {
			// A priority queue that exists without strict-priority, or
			// with it false (declared natively, or over AMQP before
			// x-max-priority meant strict), keeps its dispatch: its
			// redeclare is not refused for an argument the client did not
			// send.
			if info, ok := c.srv.Queue(c.qn(name)); ok {
				switch v, had := info.Declared.Get(strictPriority); {
				case !had:
					wargs = slices.DeleteFunc(slices.Clone(wargs), func(f wire.Field) bool { return f.Key == strictPriority })
				case v.Kind != wire.KindBool || v.Int == 0:
					wargs = slices.Clone(wargs)
					for i := range wargs {
						if wargs[i].Key == strictPriority {
							wargs[i].Value = v // as declared
						}
					}
				}
			}
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
			// The methods behind it wait for the answer (awaitAnswer).
			k := waitedAnswer{Sink: passiveDeclare{c, q}, done: make(chan struct{})}
			c.srv.Submit(broker.Command{Kind: broker.CmdBarrier, Queue: q, Sink: k, Req: (ch.gen&(1<<32-1))<<32 | uint64(ch.id)<<8})
			return c.awaitAnswer(k.done)
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
			return c.bindNotFound(err, ex, ch.queueName(qn), true)
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
			if ref&ansNoWait != 0 {
				c.srv.Submit(broker.Command{Kind: broker.CmdPurge, Queue: q, Sink: c, Req: ref | ansPurge})
				return nil
			}
			k := waitedAnswer{Sink: c, done: make(chan struct{})}
			c.srv.Submit(broker.Command{Kind: broker.CmdPurge, Queue: q, Sink: k, Req: ref | ansPurge})
			return c.awaitAnswer(k.done)
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

// waitedAnswer is a Sink for one shard answer (a purge's, a passive
// declare's) that the channel's next methods wait for, so that their
// replies follow it as the methods followed each other (RabbitMQ answers
// a channel's methods in order; a basic.qos pipelined behind a purge got
// its qos-ok first). done is closed once the answer is written.
type waitedAnswer struct {
	broker.Sink
	done chan struct{}
}

func (k waitedAnswer) Answer(ref uint64, r broker.Result) {
	defer close(k.done)
	k.Sink.Answer(ref, r)
}

// awaitAnswer waits (off the loop: queue methods are slow frames) until
// done is closed, or the connection stops.
func (c *conn) awaitAnswer(done chan struct{}) error {
	for {
		select {
		case <-done:
			return nil
		case <-time.After(100 * time.Millisecond):
			if c.stopped.Load() {
				return errClientClosed
			}
		}
	}
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
	open := ch != nil && ch.gen&(1<<32-1) == gen && !ch.closing // the reference keeps the generation's low 32 bits
	c.mu.Unlock()
	if !open {
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
	c.replyTo(ch, classQueue, id, func(b []byte) []byte { return binary.BigEndian.AppendUint32(b, uint32(r.N)) })
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
	open := ch != nil && ch.gen&(1<<32-1) == gen && !ch.closing
	p.mu.Unlock()
	if !open {
		return
	}
	if p.q.Gone() {
		ae := chErr(notFound, "NOT_FOUND - no queue '"+broker.LocalName(p.q.Name())+"' in vhost '"+p.vh()+"'")
		ae.class, ae.method = classQueue, 10
		p.closeChannelFromShard(ch, ae)
		return
	}
	p.replyTo(ch, classQueue, 11, func(b []byte) []byte {
		b = putShortstr(b, broker.LocalName(p.q.Name()))
		b = binary.BigEndian.AppendUint32(b, uint32(p.q.ReadyCount()))
		return binary.BigEndian.AppendUint32(b, uint32(p.q.ConsumerCount()))
	})
}
