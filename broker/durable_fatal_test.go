package broker

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/warren-mq/warren/queue"
	"github.com/warren-mq/warren/replication"
	"github.com/warren-mq/warren/segment"
)

// TestDurableSyncFailureIsFatal: a failed fsync of a durable queue's log
// entry reaches DurableConfig.Fatal with the error (warrend then exits
// non-zero), the message it held is not confirmed, and the next start
// recovers every message that was confirmed before.
func TestDurableSyncFailureIsFatal(t *testing.T) {
	mem := segment.NewMemFS()
	l, err := segment.Open(mem, "/data", segment.Options{})
	if err != nil {
		t.Fatal(err)
	}
	store, err := replication.OpenSnapStore(l)
	if err != nil {
		t.Fatal(err)
	}
	fatal := make(chan error, 4)
	onFatal := func(err error) {
		select {
		case fatal <- err:
		default:
		}
	}
	b := New(Config{Shards: 1, Durable: &DurableConfig{Log: l, Snapshots: store, Fatal: onFatal}})
	b.Start()
	if err := b.OpenMetaLog(t.Context(), MetaLogConfig{Log: l, Snapshots: store, Fatal: onFatal}); err != nil {
		t.Fatal(err)
	}
	q := declareDurable(t, b, "dq", true)
	k := newDurSink()
	ok := publish(b, q, k, true, "a", "b")
	k.waitFor(t, "the first confirm", func() bool { return k.confirmed(ok) })

	mem.FailSync(1)
	lost := publish(b, q, k, true, "c")
	var got error
	select {
	case got = <-fatal:
	case <-time.After(20 * time.Second):
		t.Fatal("a failed fsync of the queue's entry did not reach Fatal")
	}
	if !errors.Is(got, segment.ErrInjected) || !strings.Contains(got.Error(), "/data/") {
		t.Fatalf("Fatal(%v), want the sync's error (segment.ErrInjected) naming the file under /data", got)
	}
	t.Logf("Fatal: %v", got)
	k.mu.Lock()
	early := k.confirmed(lost)
	k.mu.Unlock()
	if early {
		t.Fatal("the message whose sync failed was confirmed")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_ = b.CloseMetaLog(ctx)
	_ = b.Stop(ctx)

	// The next start, on what reached the disk.
	n2 := openDurNode(t, mem.Crash(0))
	defer n2.close(t)
	if err := n2.b.WaitRecovered(t.Context()); err != nil {
		t.Fatal(err)
	}
	q2 := n2.b.topo.lookupQueue("dq")
	if q2 == nil {
		t.Fatal("the durable queue is gone after the restart")
	}
	barrier(t, q2.shard)
	k2 := newDurSink()
	q2.shard.submit(Command{Kind: CmdSubscribe, Queue: q2, Sink: k2, Spec: queue.ConsumerSpec{ID: 1, Owner: 7}, Req: 1})
	k2.waitFor(t, "the confirmed messages after the restart", func() bool { return len(k2.got) >= 2 })
	k2.mu.Lock()
	defer k2.mu.Unlock()
	if k2.got[0].body != "a" || k2.got[1].body != "b" {
		t.Fatalf("after the restart: %v, want a and b first", k2.got)
	}
}
