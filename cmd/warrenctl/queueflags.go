package main

import (
	"errors"
	"flag"
	"strconv"
	"strings"

	"github.com/warren-mq/warren/wire"
)

// queueArgFlags defines on fs one flag per queue argument of wire's
// descriptor table (--max-length N, --ttl MS, --single-active, …); each
// flag given appends its argument to *set. Values are only parsed here
// (an integer, a number, a bool); the broker checks their ranges and
// answers invalid_argument naming the argument and its range.
func queueArgFlags(fs *flag.FlagSet, set *wire.Table) {
	for _, d := range wire.QueueArgDescs() {
		add := func(v wire.Value) { *set = append(*set, wire.Field{Key: d.Key, Value: v}) }
		switch d.Kind {
		case wire.ArgInt, wire.ArgMillis:
			fs.Func(d.Flag, d.Doc, func(s string) error {
				n, err := strconv.ParseInt(s, 10, 64)
				if err != nil {
					return errors.New("want an integer")
				}
				add(wire.Int(n))
				return nil
			})
		case wire.ArgNumber:
			fs.Func(d.Flag, d.Doc, func(s string) error {
				x, err := strconv.ParseFloat(s, 64)
				if err != nil {
					return errors.New("want a number")
				}
				add(wire.Float(x))
				return nil
			})
		case wire.ArgBool:
			fs.Var(boolArg(func(b bool) { add(wire.Bool(b)) }), d.Flag, d.Doc)
		case wire.ArgString, wire.ArgEnum:
			fs.Func(d.Flag, d.Doc, func(s string) error { add(wire.String(s)); return nil })
		default:
			panic("warrenctl: BUG: queue argument " + d.Key + " of unknown kind")
		}
	}
}

// boolArg is a flag that may be given alone (--single-active) or with a
// value (--single-active=false).
type boolArg func(bool)

func (f boolArg) String() string   { return "" }
func (f boolArg) IsBoolFlag() bool { return true }
func (f boolArg) Set(s string) error {
	b, err := strconv.ParseBool(s)
	if err != nil {
		return errors.New("want true or false")
	}
	f(b)
	return nil
}

// flagMeta is the placeholder usage shows after a queue argument's flag.
func flagMeta(d *wire.QueueArgDesc) string {
	switch d.Kind {
	case wire.ArgInt:
		if len(d.Enum) > 0 {
			return " " + strings.Join(d.Enum, "|")
		}
		return " N"
	case wire.ArgMillis:
		return " MS"
	case wire.ArgNumber:
		return " X"
	case wire.ArgEnum:
		return " " + strings.Join(d.Enum, "|")
	case wire.ArgString:
		// The last word of the key: --dlx EXCHANGE, --dlrk KEY.
		return " " + strings.ToUpper(d.Key[strings.LastIndexByte(d.Key, '-')+1:])
	}
	return ""
}

// queueSettingsUsage writes the usage lines of queue declare's settings
// flags, wrapped.
func queueSettingsUsage() string {
	const first, indent, width = "      settings: ", "                ", 112
	words := []string{"--durable", "--auto-delete"}
	descs := wire.QueueArgDescs()
	for i := range descs {
		words = append(words, "--"+descs[i].Flag+flagMeta(&descs[i]))
	}
	var b strings.Builder
	line := first
	for i, w := range words {
		if i > 0 && len(line)+1+len(w) > width {
			b.WriteString(line + "\n")
			line = indent
		} else if i > 0 {
			line += " "
		}
		line += w
	}
	b.WriteString(line + "\n")
	return b.String()
}
