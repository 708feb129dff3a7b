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
