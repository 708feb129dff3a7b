package wire

import (
	"strings"
	"testing"
)

// TestOverflowDeadLetter: overflow "dead-letter" (issue 11 item 30) is
// accepted with a dead-letter exchange and refused, saying what to do,
// without one.
func TestOverflowDeadLetter(t *testing.T) {
	a, err := ParseQueueArgs(Table{{Key: "overflow", Value: String("dead-letter")}, {Key: "dead-letter-exchange", Value: String("dlx")}})
	if err != nil {
		t.Fatalf("overflow dead-letter with a dead-letter exchange refused: %v", err)
	}
	if a.Overflow.String() != "dead-letter" {
		t.Fatalf("overflow reads back as %q", a.Overflow)
	}
	_, err = ParseQueueArgs(Table{{Key: "overflow", Value: String("dead-letter")}})
	if err == nil || !strings.Contains(err.Error(), "dead-letter-exchange") {
		t.Fatalf("overflow dead-letter without a dead-letter exchange: %v, want an error naming dead-letter-exchange", err)
	}
	if e, ok := err.(*Error); !ok || e.Code != InvalidArgument {
		t.Fatalf("error %#v, want invalid_argument", err)
	}
}

// TestParseSubscribeArgs: consumer-timeout-ms (issue 11 item 5) is an int
// ≥ 1; anything else is invalid_argument naming the argument.
func TestParseSubscribeArgs(t *testing.T) {
	a, err := ParseSubscribeArgs(Table{{Key: "consumer-timeout-ms", Value: Int(1500)}})
	if err != nil || a.ConsumerTimeout.Milliseconds() != 1500 {
		t.Fatalf("got %+v, %v", a, err)
	}
	if a, err := ParseSubscribeArgs(nil); err != nil || a.ConsumerTimeout != 0 {
		t.Fatalf("no args: %+v, %v", a, err)
	}
	for _, bad := range []Table{
		{{Key: "consumer-timeout-ms", Value: Int(0)}},
		{{Key: "consumer-timeout-ms", Value: Int(-5)}},
		{{Key: "consumer-timeout-ms", Value: String("30000")}},
		{{Key: "consumer-timeout-ms", Value: Float(10)}},
		{{Key: "consumer-timeout-ms", Value: Int(1)}, {Key: "consumer-timeout-ms", Value: Int(2)}},
		{{Key: "x-priority", Value: Int(1)}},
	} {
		_, err := ParseSubscribeArgs(bad)
		if e, ok := err.(*Error); !ok || e.Code != InvalidArgument || !strings.Contains(e.Reason, bad[len(bad)-1].Key) {
			t.Errorf("%v: got %v, want invalid_argument naming the key", bad, err)
		}
	}
}
