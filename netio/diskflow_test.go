package netio_test

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/warren-mq/warren/client"
	"github.com/warren-mq/warren/netio"
	"github.com/warren-mq/warren/netio/warrentest"
	"github.com/warren-mq/warren/wire"
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
	// A publisher that ignores FLOW is blocked by the broker (not read);
	// the client's publisher waits for FLOW(active=true) or is blocked.
	before := map[uint64]bool{}
	for _, ci := range s.Connections() {
		before[ci.ID] = true
	}
	r := rawDial(t, s, 0)
	var rawID uint64
	for _, ci := range s.Connections() {
		if !before[ci.ID] {
			rawID = ci.ID
		}
	}
	r.write(wire.AppendFrame(nil, 1, &wire.ChannelOpen{Req: 1}))
	reply := r.read()
	if f, ok := reply.(*wire.Flow); ok && !f.Active {
		reply = r.read() // FLOW(active=false), sent at open during the alarm
	}
	if _, ok := reply.(*wire.OKReply); !ok {
		t.Fatalf("%T, want the CHANNEL_OPEN reply", reply)
	}
	frame, mark := wire.BeginPublish(nil, 1, 1, nil)
	frame = wire.AppendMessage(frame, &wire.Message{Flags: wire.Persistent, RoutingKey: []byte("d"), Body: []byte("raw")})
	r.write(mark.End(frame, 1))
	until(t, s, "the FLOW-ignoring persistent publisher to be blocked", func() bool {
		ci, ok := connInfo(s, rawID)
		return ok && ci.Blocked
	})
	published := make(chan error, 1)
	go func() {
		_, err := pub.PublishAsync(ctx, "", client.Message{RoutingKey: "d", Body: []byte("late"), Persistent: true})
		published <- err
	}()
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
	until(t, s, "the raw publisher to be read again", func() bool { ci, ok := connInfo(s, rawID); return ok && !ci.Blocked })
	must(t, <-published)
	must(t, pub.WaitConfirms(ctx))
	got := map[string]bool{}
	for len(got) < 2 {
		select {
		case d := <-cs.Deliveries():
			got[string(d.Body)] = true
		case <-time.After(20 * time.Second):
			t.Fatalf("after the alarm cleared only %v was delivered, want raw and late", got)
		}
	}
	if !got["raw"] || !got["late"] {
		t.Fatalf("after the alarm: %v, want raw and late", got)
	}
}
