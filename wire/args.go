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

var overflowNames = [...]string{"drop-head", "reject-publish", "reject-publish-dlx", "dead-letter"}

func (o Overflow) String() string {
	if int(o) < len(overflowNames) {
		return overflowNames[o]
	}
	return "overflow(?)"
}

// QueueArgs are a queue's settings, carried in QueueDeclare.Args under the
// keys below. Zero values mean "not set" (no limit, no TTL, and so on).
type QueueArgs struct {
	MaxPriority          uint8         // "max-priority" int 1..255: priority levels 0..n
	StrictPriority       bool          // "strict-priority" bool: no anti-starvation
	MaxLength            int64         // "max-length" int ≥ 0: ready messages
	MaxLengthBytes       int64         // "max-length-bytes" int ≥ 0: ready body bytes
	Overflow             Overflow      // "overflow" string: drop-head | reject-publish | reject-publish-dlx | dead-letter
	MessageTTL           time.Duration // "message-ttl" int ms ≥ 0
	Expires              time.Duration // "expires" int ms ≥ 1: delete when unused this long
	DeadLetterExchange   string        // "dead-letter-exchange" string
	DeadLetterRoutingKey string        // "dead-letter-routing-key" string
	DeliveryLimit        uint32        // "delivery-limit" int ≥ 1
	RetryInitial         time.Duration // "retry-initial-ms" int ms ≥ 0
	RetryMultiplier      float64       // "retry-multiplier" float or int ≥ 1 (default 1)
	RetryMax             time.Duration // "retry-max-ms" int ms ≥ 0
	ConsumerTimeout      time.Duration // "consumer-timeout-ms" int ms ≥ 1
	Replicas             uint8         // "replicas" int: 1, 3 or 5
	SingleActiveConsumer bool          // "single-active-consumer" bool
	DedupWindow          time.Duration // "dedup-window-ms" int ms ≥ 1
}

func argErr(key, want string) error {
	return &Error{InvalidArgument, "queue argument " + key + ": " + want}
}

// ParseQueueArgs reads and range-checks queue arguments. An unknown key is
// an error, so a misspelt argument never passes silently.
func ParseQueueArgs(t Table) (QueueArgs, error) {
	var a QueueArgs
	a.RetryMultiplier = 1
	seen := map[string]bool{}
	for _, f := range t {
		if seen[f.Key] {
			return a, argErr(f.Key, "given twice")
		}
		seen[f.Key] = true
		v := f.Value
		intIn := func(lo, hi int64) (int64, error) {
			if v.Kind != KindInt || v.Int < lo || v.Int > hi {
				return 0, argErr(f.Key, "want an int in ["+itoa(int(lo))+", "+itoa(int(hi))+"]")
			}
			return v.Int, nil
		}
		ms := func(lo int64) (time.Duration, error) {
			n, err := intIn(lo, math.MaxInt64/int64(time.Millisecond))
			return time.Duration(n) * time.Millisecond, err
		}
		str := func() (string, error) {
			if v.Kind != KindString || len(v.Bytes) > MaxNameLen {
				return "", argErr(f.Key, "want a string of at most 255 bytes")
			}
			return string(v.Bytes), nil
		}
		boolean := func() (bool, error) {
			if v.Kind != KindBool {
				return false, argErr(f.Key, "want a bool")
			}
			return v.Int != 0, nil
		}
		var err error
		var n int64
		switch f.Key {
		case "max-priority":
			n, err = intIn(1, 255)
			a.MaxPriority = uint8(n)
		case "strict-priority":
			a.StrictPriority, err = boolean()
		case "max-length":
			a.MaxLength, err = intIn(0, math.MaxInt64)
		case "max-length-bytes":
			a.MaxLengthBytes, err = intIn(0, math.MaxInt64)
		case "overflow":
			var s string
			if s, err = str(); err == nil {
				err = argErr(f.Key, "want drop-head, reject-publish, reject-publish-dlx or dead-letter")
				for i, name := range overflowNames {
					if s == name {
						a.Overflow, err = Overflow(i), nil
					}
				}
			}
		case "message-ttl":
			a.MessageTTL, err = ms(0)
		case "expires":
			a.Expires, err = ms(1)
		case "dead-letter-exchange":
			a.DeadLetterExchange, err = str()
		case "dead-letter-routing-key":
			a.DeadLetterRoutingKey, err = str()
		case "delivery-limit":
			n, err = intIn(1, math.MaxUint32)
			a.DeliveryLimit = uint32(n)
		case "retry-initial-ms":
			a.RetryInitial, err = ms(0)
		case "retry-multiplier":
			switch {
			case v.Kind == KindFloat && v.Float >= 1 && v.Float <= 1000:
				a.RetryMultiplier = v.Float
			case v.Kind == KindInt && v.Int >= 1 && v.Int <= 1000:
				a.RetryMultiplier = float64(v.Int)
			default:
				err = argErr(f.Key, "want a number in [1, 1000]")
			}
		case "retry-max-ms":
			a.RetryMax, err = ms(0)
		case "consumer-timeout-ms":
			a.ConsumerTimeout, err = ms(1)
		case "replicas":
			n, err = intIn(1, 5)
			if err == nil && n%2 == 0 {
				err = argErr(f.Key, "want 1, 3 or 5")
			}
			a.Replicas = uint8(n)
		case "single-active-consumer":
			a.SingleActiveConsumer, err = boolean()
		case "dedup-window-ms":
			a.DedupWindow, err = ms(1)
		default:
			err = argErr(f.Key, "unknown key")
		}
		if err != nil {
			return a, err
		}
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
