package amqp

import (
	"strconv"

	"github.com/warren-mq/warren/broker"
	"github.com/warren-mq/warren/wire"
)

// A redeclare that differs from the existing queue or exchange is refused
// by the broker; the refusal is told in RabbitMQ's words, which name the
// first setting that differs in RabbitMQ's order and both values:
//
//	PRECONDITION_FAILED - inequivalent arg 'durable' for queue 'q' in
//	vhost '/': received 'true' but current is 'false'
//
// These run only when the broker has refused (the broker's check is the
// one that counts); nil means none was found (the declaration changed
// meanwhile), and the broker's own words are sent.

// rs names a queue or exchange as RabbitMQ does: "queue 'q' in vhost '/'".
func (c *conn) rs(kind, name string) string {
	return kind + " '" + name + "' in vhost '" + c.vh() + "'"
}

// errExclusive is RabbitMQ's refusal of a declare of another connection's
// exclusive queue, or of one whose exclusive flag differs.
func (c *conn) errExclusive(name string) *amqpError {
	return chErr(resourceLocked, "RESOURCE_LOCKED - cannot obtain exclusive access to locked "+c.rs("queue", name)+
		". It could be originally declared on another connection or the exclusive property value does not match that of the original declaration.")
}

// queueInequivalent explains a refused queue redeclare; raw is the
// declare's own argument table.
func (c *conn) queueInequivalent(name string, durable, autoDelete, exclusive bool, raw wire.Table) *amqpError {
	info, ok := c.srv.Queue(c.qn(name))
	if !ok {
		return nil
	}
	if info.Exclusive != exclusive {
		return c.errExclusive(name)
	}
	rs := c.rs("queue", name)
	if info.Durable != durable {
		return inequivalent("durable", rs, boolVal(durable), boolVal(info.Durable))
	}
	if info.AutoDelete != autoDelete {
		return inequivalent("auto_delete", rs, boolVal(autoDelete), boolVal(info.AutoDelete))
	}
	for _, m := range queueArgMap {
		nv, nok := raw.Get(m.amqp)
		ov, ook := info.Declared.Get(m.warren)
		same := nok == ook && (!nok || sameValue(nv, ov))
		if m.amqp == "x-queue-type" { // classic is none; quorum is replicas
			if ook {
				ov = wire.String("quorum")
			}
			isQuorum := nok && nv.Kind == wire.KindString && string(nv.Bytes) == "quorum"
			same = isQuorum == ook
		}
		if !same {
			return inequivalent(m.amqp, rs, optVal{nv, nok}, optVal{ov, ook})
		}
	}
	return nil
}

// exchangeInequivalent explains a refused exchange redeclare.
func (c *conn) exchangeInequivalent(name, kind string, d *wire.ExchangeDeclare) *amqpError {
	var info *broker.ExchangeInfo
	for _, e := range c.srv.Exchanges() { // the refusal's path only
		if e.Name == d.Name {
			info = &e
			break
		}
	}
	if info == nil {
		return nil
	}
	rs := c.rs("exchange", name)
	if k, _ := wire.ParseExchangeKind(info.Type); k != d.Kind {
		cur := info.Type
		if cur == "consistent-hash" {
			cur = "x-consistent-hash"
		}
		return inequivalent("type", rs, optVal{wire.String(kind), true}, optVal{wire.String(cur), true})
	}
	for _, b := range [...]struct {
		key      string
		cur, got bool
	}{{"durable", info.Durable, d.Durable}, {"auto_delete", info.AutoDelete, d.AutoDelete}, {"internal", info.Internal, d.Internal}} {
		if b.cur != b.got {
			return inequivalent(b.key, rs, boolVal(b.got), boolVal(b.cur))
		}
	}
	if info.Alternate != d.Alternate {
		nv := optVal{wire.String(broker.LocalName(d.Alternate)), d.Alternate != ""}
		ov := optVal{wire.String(broker.LocalName(info.Alternate)), info.Alternate != ""}
		return inequivalent("alternate-exchange", rs, nv, ov)
	}
	return nil
}

// optVal is an argument's value, or none.
type optVal struct {
	v  wire.Value
	ok bool
}

func boolVal(b bool) optVal { return optVal{wire.Bool(b), true} }

// inequivalent is RabbitMQ's refusal (rabbit_misc:equivalence_fail): two
// values of one kind are shown as values, anything else with its type.
func inequivalent(key, rs string, got, cur optVal) *amqpError {
	show := func(o optVal) string {
		if !o.ok {
			return "none"
		}
		if got.ok && cur.ok && typeClass(got.v) == typeClass(cur.v) {
			return "'" + valueString(o.v) + "'"
		}
		return "the value '" + valueString(o.v) + "' of type '" + amqpTypeName(o.v) + "'"
	}
	return chErr(preconditionFailed, "PRECONDITION_FAILED - inequivalent arg '"+key+"' for "+rs+": received "+show(got)+" but current is "+show(cur))
}

// sameValue compares two argument values as RabbitMQ does: ints of any
// width are equal when their values are.
func sameValue(a, b wire.Value) bool {
	if typeClass(a) != typeClass(b) {
		return false
	}
	switch a.Kind {
	case wire.KindString, wire.KindBytes:
		return string(a.Bytes) == string(b.Bytes)
	case wire.KindFloat:
		return a.Float == b.Float
	}
	return a.Int == b.Int && a.Kind == b.Kind
}

func typeClass(v wire.Value) wire.Kind { return v.Kind }

func valueString(v wire.Value) string {
	switch v.Kind {
	case wire.KindInt, wire.KindTimestamp:
		return strconv.FormatInt(v.Int, 10)
	case wire.KindBool:
		return strconv.FormatBool(v.Int != 0)
	case wire.KindFloat:
		return strconv.FormatFloat(v.Float, 'g', -1, 64)
	case wire.KindString, wire.KindBytes:
		return string(v.Bytes)
	}
	return v.Kind.String()
}

// amqpTypeName is RabbitMQ's name of the field type a value was most
// likely sent as: an int is a signedint when it fits in 32 bits, as
// amqp091-go (int32), pika and most clients send it, else a long.
func amqpTypeName(v wire.Value) string {
	switch v.Kind {
	case wire.KindInt:
		if v.Int >= -1<<31 && v.Int < 1<<31 {
			return "signedint"
		}
		return "long"
	case wire.KindBool:
		return "bool"
	case wire.KindFloat:
		return "double"
	case wire.KindString:
		return "longstr"
	case wire.KindBytes:
		return "binary"
	case wire.KindTimestamp:
		return "timestamp"
	case wire.KindTable:
		return "table"
	case wire.KindArray:
		return "array"
	}
	return "void"
}
