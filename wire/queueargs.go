package wire

import (
	"math"
	"strconv"
	"strings"
	"time"
)

// ArgKind is the kind of value a queue argument takes.
type ArgKind uint8

const (
	ArgInt    ArgKind = iota + 1 // an int in [Min, Max]; with Enum, one of those ints
	ArgMillis                    // an int in [Min, Max]: milliseconds
	ArgNumber                    // a float or an int in [Min, Max]
	ArgBool                      // a bool
	ArgString                    // a string of at most MaxNameLen bytes
	ArgEnum                      // a string, one of Enum
)

// MaxArgMillis is the largest milliseconds value a queue argument takes:
// the most a time.Duration holds.
const MaxArgMillis = math.MaxInt64 / int64(time.Millisecond)

// QueueArgDesc describes one queue argument. The table of them
// (QueueArgDescs) is the one schema of queue arguments: ParseQueueArgs
// checks against it, the admin API's queue JSON and warrenctl's queue
// declare flags are derived from it, and tests check that spec/PROTOCOL.md
// §7.2 and spec/admin-api.yaml (QueueSettings) say the same.
type QueueArgDesc struct {
	Key  string  // the protocol key in QUEUE_DECLARE args (spec §7.2)
	JSON string  // the admin API's JSON name (admin-api.yaml QueueSettings)
	Flag string  // warrenctl queue declare's flag, without the dashes
	Kind ArgKind // what the value is
	// Min and Max bound ArgInt, ArgMillis and ArgNumber values, inclusive.
	Min, Max int64
	// Enum lists the values an ArgEnum takes (in the order of their
	// constants, as Overflow's), or the only ints an ArgInt takes.
	Enum    []string
	Default string // the value absence means, as a user writes it; "" when absence means unset
	Doc     string // one line: what it does

	// set returns a with this argument set to v. (A value in and out,
	// not a pointer: through a func value a pointer would escape, and every
	// declare would allocate its QueueArgs.)
	set func(a QueueArgs, v argValue) QueueArgs
}

// argValue is a checked argument value: n for ints, milliseconds, bools
// (0, 1) and enums (the index in Enum); f for numbers; s for strings.
type argValue struct {
	n int64
	f float64
	s string
}

var overflowNames = [...]string{"drop-head", "reject-publish", "reject-publish-dlx", "dead-letter"}

func millis(n int64) time.Duration { return time.Duration(n) * time.Millisecond }

// queueArgDescs is in the order the admin API writes the arguments to a
// declare (which re-declares compare), and the order of QueueArgs' fields.
var queueArgDescs = [...]QueueArgDesc{
	{Key: "max-priority", JSON: "max_priority", Flag: "max-priority", Kind: ArgInt, Min: 1, Max: 255,
		Doc: "priority levels 0..n; a priority above n counts as n",
		set: func(a QueueArgs, v argValue) QueueArgs { a.MaxPriority = uint8(v.n); return a }},
	{Key: "strict-priority", JSON: "strict_priority", Flag: "strict-priority", Kind: ArgBool,
		Doc: "dispatch strictly by priority, without the anti-starvation rotation",
		set: func(a QueueArgs, v argValue) QueueArgs { a.StrictPriority = v.n != 0; return a }},
	{Key: "max-length", JSON: "max_length", Flag: "max-length", Kind: ArgInt, Min: 0, Max: math.MaxInt64,
		Doc: "at most this many ready messages",
		set: func(a QueueArgs, v argValue) QueueArgs { a.MaxLength = v.n; return a }},
	{Key: "max-length-bytes", JSON: "max_length_bytes", Flag: "max-length-bytes", Kind: ArgInt, Min: 0, Max: math.MaxInt64,
		Doc: "at most this many ready body bytes",
		set: func(a QueueArgs, v argValue) QueueArgs { a.MaxLengthBytes = v.n; return a }},
	{Key: "overflow", JSON: "overflow", Flag: "overflow", Kind: ArgEnum, Enum: overflowNames[:], Default: "drop-head",
		Doc: "what a full queue does with one more message",
		set: func(a QueueArgs, v argValue) QueueArgs { a.Overflow = Overflow(v.n); return a }},
	{Key: "message-ttl", JSON: "message_ttl_ms", Flag: "ttl", Kind: ArgMillis, Min: 0, Max: MaxArgMillis,
		Doc: "a message expires this long after it was enqueued",
		set: func(a QueueArgs, v argValue) QueueArgs { a.MessageTTL = millis(v.n); return a }},
	{Key: "expires", JSON: "expires_ms", Flag: "expires", Kind: ArgMillis, Min: 1, Max: MaxArgMillis,
		Doc: "the queue is deleted after being unused this long",
		set: func(a QueueArgs, v argValue) QueueArgs { a.Expires = millis(v.n); return a }},
	{Key: "dead-letter-exchange", JSON: "dead_letter_exchange", Flag: "dlx", Kind: ArgString,
		Doc: "where dead messages are published",
		set: func(a QueueArgs, v argValue) QueueArgs { a.DeadLetterExchange = v.s; return a }},
	{Key: "dead-letter-routing-key", JSON: "dead_letter_routing_key", Flag: "dlrk", Kind: ArgString,
		Doc: "replaces dead messages' routing key (default: keep it)",
		set: func(a QueueArgs, v argValue) QueueArgs { a.DeadLetterRoutingKey = v.s; return a }},
	{Key: "delivery-limit", JSON: "delivery_limit", Flag: "delivery-limit", Kind: ArgInt, Min: 1, Max: math.MaxUint32,
		Doc: "a message delivered more than this many times is dead-lettered",
		set: func(a QueueArgs, v argValue) QueueArgs { a.DeliveryLimit = uint32(v.n); return a }},
	{Key: "retry-initial-ms", JSON: "retry_initial_ms", Flag: "retry-initial", Kind: ArgMillis, Min: 0, Max: MaxArgMillis,
		Doc: "a requeued message's first wait before it is ready again (0: no wait)",
		set: func(a QueueArgs, v argValue) QueueArgs { a.RetryInitial = millis(v.n); return a }},
	{Key: "retry-multiplier", JSON: "retry_multiplier", Flag: "retry-multiplier", Kind: ArgNumber, Min: 1, Max: 1000, Default: "1",
		Doc: "each further failure multiplies the wait by this",
		set: func(a QueueArgs, v argValue) QueueArgs { a.RetryMultiplier = v.f; return a }},
	{Key: "retry-max-ms", JSON: "retry_max_ms", Flag: "retry-max", Kind: ArgMillis, Min: 0, Max: MaxArgMillis,
		Doc: "the longest retry wait (0: no cap)",
		set: func(a QueueArgs, v argValue) QueueArgs { a.RetryMax = millis(v.n); return a }},
	{Key: "consumer-timeout-ms", JSON: "consumer_timeout_ms", Flag: "consumer-timeout", Kind: ArgMillis, Min: 1, Max: MaxArgMillis,
		Doc: "a delivery not settled in this time is taken back",
		set: func(a QueueArgs, v argValue) QueueArgs { a.ConsumerTimeout = millis(v.n); return a }},
	{Key: "replicas", JSON: "replicas", Flag: "replicas", Kind: ArgInt, Min: 1, Max: 5, Enum: []string{"1", "3", "5"},
		Doc: "copies of a durable queue in a cluster (not yet honoured: one node)",
		set: func(a QueueArgs, v argValue) QueueArgs { a.Replicas = uint8(v.n); return a }},
	{Key: "single-active-consumer", JSON: "single_active_consumer", Flag: "single-active", Kind: ArgBool,
		Doc: "only one consumer receives at a time; the next takes over when it leaves",
		set: func(a QueueArgs, v argValue) QueueArgs { a.SingleActiveConsumer = v.n != 0; return a }},
	{Key: "dedup-window-ms", JSON: "dedup_window_ms", Flag: "dedup-window", Kind: ArgMillis, Min: 1, Max: MaxArgMillis,
		Doc: "a message whose message_id was seen within this window is confirmed but not enqueued again",
		set: func(a QueueArgs, v argValue) QueueArgs { a.DedupWindow = millis(v.n); return a }},
}

// QueueArgDescs returns the queue arguments' descriptors, in a fixed
// order. The slice is the package's own: the caller must not modify it.
func QueueArgDescs() []QueueArgDesc { return queueArgDescs[:] }

// LookupQueueArg returns the descriptor of the queue argument with the
// protocol key key.
func LookupQueueArg(key string) (*QueueArgDesc, bool) {
	for i := range queueArgDescs {
		if queueArgDescs[i].Key == key {
			return &queueArgDescs[i], true
		}
	}
	return nil, false
}

// Want says what a valid value is, as the invalid_argument reason puts
// it after "want".
func (d *QueueArgDesc) Want() string {
	switch d.Kind {
	case ArgInt, ArgMillis:
		if len(d.Enum) > 0 {
			return orList(d.Enum)
		}
		return "an int in [" + strconv.FormatInt(d.Min, 10) + ", " + strconv.FormatInt(d.Max, 10) + "]"
	case ArgNumber:
		return "a number in [" + strconv.FormatInt(d.Min, 10) + ", " + strconv.FormatInt(d.Max, 10) + "]"
	case ArgBool:
		return "a bool"
	case ArgString:
		return "a string of at most " + strconv.Itoa(MaxNameLen) + " bytes"
	case ArgEnum:
		return orList(d.Enum)
	}
	panic("wire: BUG: queue argument " + d.Key + " has no kind")
}

// orList writes "a, b or c".
func orList(s []string) string {
	if len(s) < 2 {
		return strings.Join(s, "")
	}
	return strings.Join(s[:len(s)-1], ", ") + " or " + s[len(s)-1]
}

// Accepts reports whether v is a valid value of d's argument on its own
// (ParseQueueArgs also checks arguments against each other).
func (d *QueueArgDesc) Accepts(v Value) bool {
	_, err := d.check(v)
	return err == nil
}

// check reads v as d's value, or fails naming the key and what it wants.
func (d *QueueArgDesc) check(v Value) (argValue, error) {
	bad := func() (argValue, error) { return argValue{}, argErr(d.Key, "want "+d.Want()) }
	switch d.Kind {
	case ArgInt, ArgMillis:
		if v.Kind != KindInt || v.Int < d.Min || v.Int > d.Max {
			return bad()
		}
		if len(d.Enum) > 0 {
			s := strconv.FormatInt(v.Int, 10)
			for _, e := range d.Enum {
				if e == s {
					return argValue{n: v.Int}, nil
				}
			}
			return bad()
		}
		return argValue{n: v.Int}, nil
	case ArgNumber:
		switch {
		case v.Kind == KindFloat && v.Float >= float64(d.Min) && v.Float <= float64(d.Max):
			return argValue{f: v.Float}, nil
		case v.Kind == KindInt && v.Int >= d.Min && v.Int <= d.Max:
			return argValue{f: float64(v.Int)}, nil
		}
		return bad()
	case ArgBool:
		if v.Kind != KindBool {
			return bad()
		}
		return argValue{n: v.Int}, nil
	case ArgString:
		if v.Kind != KindString || len(v.Bytes) > MaxNameLen {
			return bad()
		}
		return argValue{s: string(v.Bytes)}, nil
	case ArgEnum:
		if v.Kind == KindString {
			for i, e := range d.Enum {
				if string(v.Bytes) == e {
					return argValue{n: int64(i)}, nil
				}
			}
		}
		return bad()
	}
	panic("wire: BUG: queue argument " + d.Key + " has no kind")
}
