package wire

import (
	"math"
	"testing"
	"time"
)

// TestQueueArgsPinned pins what ParseQueueArgs accepts and the exact
// invalid_argument reason it gives for each key, so that deriving the
// parser from the descriptor table (issue 12 item 8) changes nothing a
// client sees.
func TestQueueArgsPinned(t *testing.T) {
	good := Table{
		{Key: "max-priority", Value: Int(9)},
		{Key: "strict-priority", Value: Bool(true)},
		{Key: "max-length", Value: Int(0)},
		{Key: "max-length-bytes", Value: Int(math.MaxInt64)},
		{Key: "overflow", Value: String("reject-publish-dlx")},
		{Key: "message-ttl", Value: Int(0)},
		{Key: "expires", Value: Int(1)},
		{Key: "dead-letter-exchange", Value: String("dlx")},
		{Key: "dead-letter-routing-key", Value: String("")},
		{Key: "delivery-limit", Value: Int(math.MaxUint32)},
		{Key: "retry-initial-ms", Value: Int(100)},
		{Key: "retry-multiplier", Value: Float(2.5)},
		{Key: "retry-max-ms", Value: Int(10000)},
		{Key: "consumer-timeout-ms", Value: Int(30000)},
		{Key: "replicas", Value: Int(3)},
		{Key: "single-active-consumer", Value: Bool(true)},
		{Key: "dedup-window-ms", Value: Int(math.MaxInt64 / int64(time.Millisecond))},
	}
	a, err := ParseQueueArgs(good)
	if err != nil {
		t.Fatal(err)
	}
	want := QueueArgs{MaxPriority: 9, StrictPriority: true, MaxLength: 0, MaxLengthBytes: math.MaxInt64, Overflow: RejectPublishDLX,
		MessageTTL: 0, Expires: time.Millisecond, DeadLetterExchange: "dlx", DeliveryLimit: math.MaxUint32,
		RetryInitial: 100 * time.Millisecond, RetryMultiplier: 2.5, RetryMax: 10 * time.Second, ConsumerTimeout: 30 * time.Second,
		Replicas: 3, SingleActiveConsumer: true, DedupWindow: time.Duration(math.MaxInt64/int64(time.Millisecond)) * time.Millisecond}
	if a != want {
		t.Fatalf("parsed\n%+v\nwant\n%+v", a, want)
	}
	if a, err := ParseQueueArgs(nil); err != nil || a != (QueueArgs{RetryMultiplier: 1}) {
		t.Fatalf("no args: %+v %v", a, err)
	}
	if a, err := ParseQueueArgs(Table{{Key: "retry-multiplier", Value: Int(3)}}); err != nil || a.RetryMultiplier != 3 {
		t.Fatalf("int multiplier: %+v %v", a, err)
	}

	const ms = "9223372036854"
	for _, c := range []struct {
		key    string
		v      Value
		reason string
	}{
		{"max-priority", Int(0), "want an int in [1, 255]"},
		{"max-priority", Int(256), "want an int in [1, 255]"},
		{"max-priority", String("9"), "want an int in [1, 255]"},
		{"strict-priority", Int(1), "want a bool"},
		{"max-length", Int(-1), "want an int in [0, 9223372036854775807]"},
		{"max-length-bytes", Float(1), "want an int in [0, 9223372036854775807]"},
		{"overflow", String("explode"), "want drop-head, reject-publish, reject-publish-dlx or dead-letter"},
		{"message-ttl", Int(-1), "want an int in [0, " + ms + "]"},
		{"message-ttl", Int(math.MaxInt64/int64(time.Millisecond) + 1), "want an int in [0, " + ms + "]"},
		{"expires", Int(0), "want an int in [1, " + ms + "]"},
		{"dead-letter-exchange", Int(1), "want a string of at most 255 bytes"},
		{"dead-letter-routing-key", String(string(make([]byte, 256))), "want a string of at most 255 bytes"},
		{"delivery-limit", Int(0), "want an int in [1, 4294967295]"},
		{"delivery-limit", Int(math.MaxUint32 + 1), "want an int in [1, 4294967295]"},
		{"retry-initial-ms", Int(-1), "want an int in [0, " + ms + "]"},
		{"retry-multiplier", Float(0.5), "want a number in [1, 1000]"},
		{"retry-multiplier", Int(1001), "want a number in [1, 1000]"},
		{"retry-multiplier", String("2"), "want a number in [1, 1000]"},
		{"retry-max-ms", Bool(true), "want an int in [0, " + ms + "]"},
		{"consumer-timeout-ms", Int(0), "want an int in [1, " + ms + "]"},
		{"replicas", Int(2), "want 1, 3 or 5"},
		{"single-active-consumer", String("yes"), "want a bool"},
		{"dedup-window-ms", Int(0), "want an int in [1, " + ms + "]"},
		{"x-max-length", Int(1), "unknown key"},
	} {
		_, err := ParseQueueArgs(Table{{Key: c.key, Value: c.v}})
		e, ok := err.(*Error)
		if want := "queue argument " + c.key + ": " + c.reason; !ok || e.Code != InvalidArgument || e.Reason != want {
			t.Errorf("%s = %v: got %v, want invalid_argument %q", c.key, c.v, err, want)
		}
	}
	_, err = ParseQueueArgs(Table{{Key: "max-length", Value: Int(1)}, {Key: "max-length", Value: Int(1)}})
	if e, ok := err.(*Error); !ok || e.Reason != "queue argument max-length: given twice" {
		t.Errorf("twice: %v", err)
	}
}
