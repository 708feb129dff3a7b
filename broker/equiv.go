package broker

import (
	"reflect"
	"strconv"
	"strings"

	"github.com/warren-mq/warren/wire"
)

// The equivalence check of a redeclare says which setting differs, so the
// user knows what to change: "type is topic, the declare asked for
// direct".

// exchangeDiff describes how a redeclare n differs from the existing
// declaration o ("" when it does not).
func exchangeDiff(o, n *wire.ExchangeDeclare) string {
	var d []string
	if o.Kind != n.Kind {
		d = append(d, differs("type", o.Kind.String(), n.Kind.String()))
	}
	d = appendBool(d, "durable", o.Durable, n.Durable)
	d = appendBool(d, "auto_delete", o.AutoDelete, n.AutoDelete)
	d = appendBool(d, "internal", o.Internal, n.Internal)
	if o.Alternate != n.Alternate {
		d = append(d, differs("alternate exchange", quoteOrNone(o.Alternate), quoteOrNone(n.Alternate)))
	}
	return strings.Join(argsDiff(d, o.Args, n.Args), "; ")
}

// queueDiff describes how a redeclare n differs from the existing
// declaration o ("" when it does not).
func queueDiff(o, n *wire.QueueDeclare) string {
	var d []string
	d = appendBool(d, "durable", o.Durable, n.Durable)
	d = appendBool(d, "exclusive", o.Exclusive, n.Exclusive)
	d = appendBool(d, "auto_delete", o.AutoDelete, n.AutoDelete)
	return strings.Join(argsDiff(d, o.Args, n.Args), "; ")
}

func differs(what, old, asked string) string {
	return what + " is " + old + ", the declare asked for " + asked
}

func appendBool(d []string, what string, o, n bool) []string {
	if o != n {
		d = append(d, differs(what, strconv.FormatBool(o), strconv.FormatBool(n)))
	}
	return d
}

func quoteOrNone(s string) string {
	if s == "" {
		return "none"
	}
	return strconv.Quote(s)
}

// argsDiff names each argument that is absent on one side or has another
// value.
func argsDiff(d []string, o, n wire.Table) []string {
	find := func(t wire.Table, k string) (wire.Value, bool) {
		for _, f := range t {
			if f.Key == k {
				return f.Value, true
			}
		}
		return wire.Value{}, false
	}
	show := func(v wire.Value, ok bool) string {
		if !ok {
			return "absent"
		}
		return valueText(v)
	}
	before := len(d)
	for _, f := range o {
		nv, ok := find(n, f.Key)
		if !ok || !reflect.DeepEqual(f.Value, nv) {
			d = append(d, differs("argument "+strconv.Quote(f.Key), valueText(f.Value), show(nv, ok)))
		}
	}
	for _, f := range n {
		if _, ok := find(o, f.Key); !ok {
			d = append(d, differs("argument "+strconv.Quote(f.Key), "absent", valueText(f.Value)))
		}
	}
	if len(d) == before && !reflect.DeepEqual(normArgs(o), normArgs(n)) {
		d = append(d, "the arguments differ (in order or repetition)")
	}
	return d
}

func valueText(v wire.Value) string {
	switch v.Kind {
	case wire.KindInt, wire.KindTimestamp:
		return strconv.FormatInt(v.Int, 10)
	case wire.KindBool:
		return strconv.FormatBool(v.Int != 0)
	case wire.KindFloat:
		return strconv.FormatFloat(v.Float, 'g', -1, 64)
	case wire.KindString, wire.KindBytes:
		return strconv.Quote(string(v.Bytes))
	case wire.KindNull:
		return "null"
	}
	return "a " + v.Kind.String()
}
