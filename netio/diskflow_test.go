package netio_test

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/warren-mq/warren/client"
	"github.com/warren-mq/warren/netio"
	"github.com/warren-mq/warren/netio/warrentest"
)

// TestDiskAlarmBlocksPublishers: with the data filesystem's free space
// (faked) below the free-disk limit, a persistent publisher is blocked as
// under the memory alarm while a consumer still drains the queue; once
// the free space is back above the limit the publisher is read again and
// its message confirmed and delivered.
func TestDiskAlarmBlocksPublishers(t *testing.T) {
	const limit = 1 << 30
	var free atomic.Int64
	free.Store(10 << 30)
	s := warrentest.StartServer(t, &netio.Config{
		TickInterval: 5 * time.Millisecond, DiskFreeLimit: limit, DiskCheckInterval: time.Millisecond,
		DiskFree: func() (int64, bool) { return free.Load(), true },
	})
	ctx := ctxT(t)
	pubConn := dial(t, s)
	pub := channel(t, pubConn)
	if _, err := pub.DeclareQueue(ctx, "d", client.QueueOptions{}); err != nil {
		t.Fatal(err)
	}
	const n = 10
	for i := 0; i < n; i++ {
		if _, err := pub.PublishAsync(ctx, "", client.Message{RoutingKey: "d", Body: []byte("x"), Persistent: true}); err != nil {
			t.Fatal(err)
		}
	}
	must(t, pub.WaitConfirms(ctx))

	free.Store(100 << 20) // below the limit
	until(t, s, "the disk alarm", func() bool { return s.Overview().DiskAlarm })
	if !s.Overview().FlowBlocked {
		t.Fatal("disk alarm on but flow not blocked")
	}
	if _, err := pub.PublishAsync(ctx, "", client.Message{RoutingKey: "d", Body: []byte("late"), Persistent: true}); err != nil {
		t.Fatal(err)
	}
	until(t, s, "the persistent publisher to be blocked", func() bool {
		for _, ci := range s.Connections() {
			if ci.Blocked {
				return true
			}
		}
		return false
	})
	// A consumer still drains what is there.
	cs, err := channel(t, dial(t, s)).Consume(ctx, "d", client.ConsumeOptions{AutoAck: true})
	must(t, err)
	deadline := time.After(20 * time.Second)
	for i := 0; i < n; i++ {
		select {
		case <-cs.Deliveries():
		case <-deadline:
			t.Fatalf("%d of %d delivered during the disk alarm", i, n)
		}
	}
	settled(t, s)
	if q := queueStats(s, "d"); q.Ready != 0 || q.Published != n {
		t.Fatalf("during the disk alarm: ready %d, published %d, want 0 and %d (the blocked publish not taken)", q.Ready, q.Published, n)
	}

	free.Store(5 << 30) // above it again
	until(t, s, "the disk alarm to clear", func() bool { return !s.Overview().DiskAlarm && !s.Overview().FlowBlocked })
	must(t, pub.WaitConfirms(ctx))
	select {
	case d := <-cs.Deliveries():
		if string(d.Body) != "late" {
			t.Fatalf("delivered %q after the alarm, want late", d.Body)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the blocked publish was not delivered after the alarm cleared")
	}
}
