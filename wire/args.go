package wire

import (
	"math"
	"strconv"
	"time"
)

// Overflow is what a full queue does with one more message.
type Overflow uint8

const (
	DropHead         Overflow = iota // drop (and dead-letter) the oldest ready message
	RejectPublish                    // nack the new message with QueueFull
	RejectPublishDLX                 // nack it and dead-letter it
	// OverflowDeadLetter is drop-head that requires a dead-letter exchange:
	// the displaced (oldest) message is dead-lettered (reason maxlen),
	// never dropped.
	OverflowDeadLetter
)

func (o Overflow) String() string {
	if int(o) < len(overflowNames) {
		return overflowNames[o]
	}
	return "overflow(?)"
}

// QueueArgs are a queue's settings, carried in QueueDeclare.Args under the
// keys that QueueArgDescs lists (with their kinds and ranges). Zero values
// mean "not set" (no limit, no TTL, and so on).
type QueueArgs struct {
	MaxPriority          uint8         // max-priority
	StrictPriority       bool          // strict-priority
	MaxLength            int64         // max-length
	MaxLengthBytes       int64         // max-length-bytes
	Overflow             Overflow      // overflow
	MessageTTL           time.Duration // message-ttl
	Expires              time.Duration // expires
	DeadLetterExchange   string        // dead-letter-exchange
	DeadLetterRoutingKey string        // dead-letter-routing-key
	DeliveryLimit        uint32        // delivery-limit
	RetryInitial         time.Duration // retry-initial-ms
	RetryMultiplier      float64       // retry-multiplier (1 when not set)
	RetryMax             time.Duration // retry-max-ms
	ConsumerTimeout      time.Duration // consumer-timeout-ms
	Replicas             uint8         // replicas
	SingleActiveConsumer bool          // single-active-consumer
	DedupWindow          time.Duration // dedup-window-ms
}

func argErr(key, want string) error {
	return &Error{InvalidArgument, "queue argument " + key + ": " + want}
}

// ParseQueueArgs reads and range-checks queue arguments against their
// descriptors (QueueArgDescs). An unknown key is an error, so a misspelt
// argument never passes silently.
func ParseQueueArgs(t Table) (QueueArgs, error) {
	var a QueueArgs
	a.RetryMultiplier = 1 // retry-multiplier's Default (a test holds them equal)
	var seen uint64       // bit i: queueArgDescs[i] given
	for _, f := range t {
		i := -1
		for j := range queueArgDescs {
			if queueArgDescs[j].Key == f.Key {
				i = j
				break
			}
		}
		if i < 0 {
			return a, argErr(f.Key, "unknown key")
		}
		if seen&(1<<i) != 0 {
			return a, argErr(f.Key, "given twice")
		}
		seen |= 1 << i
		d := &queueArgDescs[i]
		v, err := d.check(f.Value)
		if err != nil {
			return a, err
		}
		a = d.set(a, v)
	}
	if a.Overflow == OverflowDeadLetter && a.DeadLetterExchange == "" {
		return a, argErr("overflow", "dead-letter needs a dead-letter-exchange: set one, or use drop-head to drop the oldest message")
	}
	return a, nil
}

// SubscribeArgs are a consumer's settings, carried in Subscribe.Args under
// the keys below. Zero values mean "not set".
type SubscribeArgs struct {
	// ConsumerTimeout overrides the queue's consumer-timeout-ms for this
	// consumer's deliveries ("consumer-timeout-ms" int ms ≥ 1).
	ConsumerTimeout time.Duration
}

// ParseSubscribeArgs reads and range-checks SUBSCRIBE arguments. An
// unknown key is an error, as for queue arguments.
func ParseSubscribeArgs(t Table) (SubscribeArgs, error) {
	var a SubscribeArgs
	fail := func(key, want string) error {
		return &Error{InvalidArgument, "subscribe argument " + key + ": " + want}
	}
	for i, f := range t {
		for _, g := range t[:i] {
			if g.Key == f.Key {
				return a, fail(f.Key, "given twice")
			}
		}
		switch f.Key {
		case "consumer-timeout-ms":
			const most = math.MaxInt64 / int64(time.Millisecond)
			if f.Value.Kind != KindInt || f.Value.Int < 1 || f.Value.Int > most {
				return a, fail(f.Key, "want an int in [1, "+strconv.FormatInt(most, 10)+"] (milliseconds)")
			}
			a.ConsumerTimeout = time.Duration(f.Value.Int) * time.Millisecond
		default:
			return a, fail(f.Key, "unknown key (the only one is consumer-timeout-ms)")
		}
	}
	return a, nil
}
