package broker

import (
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/warren-mq/warren/segment"
	"github.com/warren-mq/warren/wire"
)

// TestDurableMessageOverEntryBound: a persistent message larger than one
// log entry can be (segment.MaxEntry, 32 MiB: a client's publish with
// max_frame raised toward wire.HardMaxFrame, 64 MiB, or an AMQP body
// under a raised max message size) is nacked, and the node goes on. It
// was proposed as it was: the log's write refused the entry ('segment: an
// entry over 33554432 bytes') and the node stopped (warrend exited:
// 'the log on disk could not be written'), each time a client sent one.
// A message just under the bound is taken, and recovered after a restart.
func TestDurableMessageOverEntryBound(t *testing.T) {
	fs := segment.NewMemFS()
	var fatal atomic.Value
	n := openDurNodeWith(t, fs, "/data", func(c *Config, m *MetaLogConfig) {
		c.Durable.Fatal = func(err error) { fatal.Store(err) }
	})
	q := declareDurable(t, n.b, "big", true)
	k := newDurSink()
	over := publish(n.b, q, k, true, strings.Repeat("b", segment.MaxEntry))
	// The node's stop (Fatal) tells the sink nothing: poll both.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		if err := fatal.Load(); err != nil {
			t.Fatalf("the node stopped: %v", err)
		}
		k.mu.Lock()
		done := k.confirmed(over)
		k.mu.Unlock()
		if done {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the over-large message was neither nacked nor confirmed within 10 s")
		}
	}
	if c := wire.Code(over.Codes[0]); c == wire.OK {
		t.Fatalf("a message of %d bytes was taken by a durable queue", segment.MaxEntry)
	}
	under := publish(n.b, q, k, true, strings.Repeat("u", segment.MaxEntry-1024))
	k.waitFor(t, "the message under the bound confirmed", func() bool { return k.confirmed(under) })
	if err := fatal.Load(); err != nil {
		t.Fatalf("the node stopped: %v", err)
	}
	if c := wire.Code(under.Codes[0]); c != wire.OK {
		t.Fatalf("a message of %d bytes: %v", segment.MaxEntry-1024, c)
	}
	n.close(t)
	n = openDurNode(t, fs)
	defer n.close(t)
	if err := n.b.WaitRecovered(t.Context()); err != nil {
		t.Fatal(err)
	}
	if st, ok := n.b.Queue("big"); !ok || st.Ready != 1 {
		t.Fatalf("after a restart the queue holds %+v (%v), want the one message taken", st, ok)
	}
}

// TestDurablePartOverEntryBound: one publish part of persistent messages
// to a durable queue with more bytes (five of 8 MiB, possible with
// max_frame raised) or more messages (70,000) than one entry holds is
// taken whole, in order, as Enqueues of its own: it was nacked whole,
// each message though small enough alone.
func TestDurablePartOverEntryBound(t *testing.T) {
	fs := segment.NewMemFS()
	n := openDurNode(t, fs)
	k := newDurSink()
	var big, many []string
	for i := range 5 {
		big = append(big, strings.Repeat(string(rune('a'+i)), 8<<20))
	}
	for i := range 70_000 {
		many = append(many, fmt.Sprintf("%06d", i))
	}
	parts := map[string][]string{"big": big, "many": many}
	for name, bodies := range parts {
		part := publish(n.b, declareDurable(t, n.b, name, true), k, true, bodies...)
		k.waitFor(t, "the part confirmed", func() bool { return k.confirmed(part) })
		for i, c := range part.Codes {
			if wire.Code(c) != wire.OK {
				t.Fatalf("message %d of %d in a part over one entry's bound: %v", i, len(bodies), wire.Code(c))
			}
		}
	}
	n.close(t)
	n = openDurNode(t, fs)
	defer n.close(t)
	if err := n.b.WaitRecovered(t.Context()); err != nil {
		t.Fatal(err)
	}
	for name, bodies := range parts {
		if st, ok := n.b.Queue(name); !ok || st.Ready != int64(len(bodies)) {
			t.Fatalf("after a restart queue %s holds %+v (%v), want its %d messages", name, st, ok, len(bodies))
		}
		// In order (a peek stops past 16 MiB of bodies: two of big's).
		msgs, err := n.b.PeekQueue(t.Context(), name, len(bodies))
		if err != nil || len(msgs) == 0 {
			t.Fatalf("peek %s: %d messages, %v", name, len(msgs), err)
		}
		for i, m := range msgs {
			if string(m.Body) != bodies[i] {
				t.Fatalf("queue %s: message %d is %q…, want %q…", name, i, m.Body[:min(len(m.Body), 8)], bodies[i][:min(len(bodies[i]), 8)])
			}
		}
	}
}
