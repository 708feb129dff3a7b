package broker

import (
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
