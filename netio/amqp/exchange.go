package amqp

// The exchange class: exchange.declare, delete, bind and unbind (with
// bindArgs, a binding's arguments in key order).

import (
	"slices"
	"strconv"
	"strings"

	"github.com/warren-mq/warren/netio"
	"github.com/warren-mq/warren/wire"
)

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
			return c.bindNotFound(err, src, dst, false)
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

// bindNotFound words a bind's 404 as RabbitMQ does: the source exchange
// named first if it is missing, then the destination, "no exchange 'x' in
// vhost '/'" (the broker's own reason names neither vhost nor the quotes
// RabbitMQ uses). Any other error is returned as it is.
func (c *conn) bindNotFound(err error, src, dst string, toQueue bool) error {
	if !isCode(err, wire.NotFound) {
		return err
	}
	t := c.srv.View().Table
	switch {
	case !t.HasExchange(c.qn(src)):
		return chErr(notFound, "NOT_FOUND - no exchange '"+src+"' in vhost '"+c.vh()+"'")
	case toQueue && c.srv.LookupQueue(c.qn(dst)) == nil:
		return chErr(notFound, "NOT_FOUND - no queue '"+dst+"' in vhost '"+c.vh()+"'")
	case !toQueue && !t.HasExchange(c.qn(dst)):
		return chErr(notFound, "NOT_FOUND - no exchange '"+dst+"' in vhost '"+c.vh()+"'")
	}
	return err
}

// bindArgs puts a binding's arguments in key order: a binding is the same
// one whatever order a client's table came in (amqp091-go writes Go's map
// order), for a bind (no second binding) and an unbind (it is found).
func bindArgs(t wire.Table) wire.Table {
	slices.SortStableFunc(t, func(a, b wire.Field) int { return strings.Compare(a.Key, b.Key) })
	return t
}
