package netio_test

import (
	"errors"
	"net"
	"runtime"
	"runtime/metrics"
	"sync/atomic"
	"testing"
	"time"

	"github.com/warren-mq/warren/client"
	"github.com/warren-mq/warren/netio"
	"github.com/warren-mq/warren/netio/warrentest"
	"github.com/warren-mq/warren/wire"
)

// rawWatch reads everything the broker sends a raw connection in the
// background and records what the memory tests look at.
type rawWatch struct {
	heartbeats   atomic.Int64
	heartbeat    chan struct{} // one per heartbeat (buffered; dropped when full)
	flowOff      atomic.Int64  // FLOW(active=false) frames seen
	flowOn       atomic.Int64  // FLOW(active=true) frames seen
	maxConfirmed atomic.Uint64
	confirmed    chan uint64 // every confirm's last sequence (buffered; dropped when full)
	closed       chan struct{}
}

func watchRaw(r *rawConn) *rawWatch {
	w := &rawWatch{confirmed: make(chan uint64, 1024), closed: make(chan struct{}), heartbeat: make(chan struct{}, 64)}
	buf := append([]byte(nil), r.buf...)
	go func() {
		defer close(w.closed)
		tmp := make([]byte, 64<<10)
		for {
			f, n, err := wire.Split(buf, wire.HardMaxFrame)
			if err != nil {
				return
			}
			if n > 0 {
				b, err := wire.Decode(f, wire.HardMaxFrame, nil)
				buf = buf[n:]
				if err != nil {
					return
				}
				switch b := b.(type) {
				case *wire.Heartbeat:
					w.heartbeats.Add(1)
					select {
					case w.heartbeat <- struct{}{}:
					default:
					}
				case *wire.Flow:
					if b.Active {
						w.flowOn.Add(1)
					} else {
						w.flowOff.Add(1)
					}
				case *wire.Confirm:
					last := b.Ranges[len(b.Ranges)-1].Last
					if last > w.maxConfirmed.Load() {
						w.maxConfirmed.Store(last)
					}
					select {
					case w.confirmed <- last:
					default:
					}
				case *wire.Close:
					return
				}
				continue
			}
			_ = r.nc.SetReadDeadline(time.Time{})
			m, err := r.nc.Read(tmp)
			if err != nil {
				return
			}
			buf = append(buf, tmp[:m]...)
		}
	}()
	return w
}

func connInfo(s *netio.Server, id uint64) (netio.ConnInfo, bool) {
	for _, ci := range s.Connections() {
		if ci.ID == id {
			return ci, true
		}
	}
	return netio.ConnInfo{}, false
}

// TestFlowIgnoringPublisherIsBlocked: a publisher that keeps writing after
// FLOW(active=false) stops being read (its socket is no longer drained, so
// TCP pushes back on it): what the broker holds stays near the watermark
// whatever the client does, and the connection is not closed for the
// heartbeats it could not send; once the queue is purged the connection
// is read again and its publishes are confirmed.
func TestFlowIgnoringPublisherIsBlocked(t *testing.T) {
	const watermark = 8 << 20
	s := warrentest.StartServer(t, &netio.Config{MemoryHighWater: watermark, TickInterval: 10 * time.Millisecond})
	ctx := ctxT(t)
	good := channel(t, dial(t, s))
	if _, err := good.DeclareQueue(ctx, "flood", client.QueueOptions{}); err != nil {
		t.Fatal(err)
	}
	before := map[uint64]bool{}
	for _, ci := range s.Connections() {
		before[ci.ID] = true
	}
	// 500 ms heartbeats; it never sends one. (With 200 ms a CI run under
	// -race at load 13 saw the connection reset before it was blocked: a
	// loop starved of CPU for 2 intervals, 400 ms, closes it for
	// heartbeat_timeout; the blocked phase below still outlasts 2 × 500 ms.)
	r := rawDial(t, s, 500)
	var id uint64
	for _, ci := range s.Connections() {
		if !before[ci.ID] {
			id = ci.ID
		}
	}
	r.write(wire.AppendFrame(nil, 1, &wire.ChannelOpen{Req: 1}))
	if _, ok := r.read().(*wire.OKReply); !ok {
		t.Fatal("no CHANNEL_OPEN reply")
	}
	w := watchRaw(r)

	// The writer ignores FLOW and writes 32-message batches of 1 KiB
	// messages, up to 64 MiB (8 × the watermark). A write that makes no
	// progress for 300 ms is reported, and retried.
	const limit = 64 << 20
	stalls := make(chan int, 1) // bytes written when a write timed out
	var stop atomic.Bool
	type result struct {
		lastSeq uint64
		err     error
	}
	writerDone := make(chan result, 1)
	go func() {
		body := make([]byte, 1024)
		seq, written := uint64(1), 0
		var frame []byte
		for written < limit && !stop.Load() {
			var mark wire.BatchMark
			frame, mark = wire.BeginPublish(frame[:0], 1, seq, nil)
			for i := 0; i < 32; i++ {
				frame = wire.AppendMessage(frame, &wire.Message{RoutingKey: []byte("flood"), Body: body})
			}
			frame = mark.End(frame, 32)
			seq += 32
			for rest := frame; len(rest) > 0; {
				_ = r.nc.SetWriteDeadline(time.Now().Add(300 * time.Millisecond))
				n, err := r.nc.Write(rest)
				written += n
				rest = rest[n:]
				var ne net.Error
				if errors.As(err, &ne) && ne.Timeout() {
					select {
					case stalls <- written:
					default:
					}
					continue
				}
				if err != nil {
					writerDone <- result{err: err}
					return
				}
			}
		}
		if !stop.Load() {
			writerDone <- result{err: errors.New("wrote 64 MiB against an 8 MiB watermark without being held back")}
			return
		}
		writerDone <- result{lastSeq: seq - 1}
	}()

	// Blocked, and then held back by TCP: two timed-out writes in a row
	// without progress.
	blockedDeadline := time.After(60 * time.Second)
	for {
		changed := s.Changed() // before the check: a change in between is not missed
		if ci, ok := connInfo(s, id); ok && ci.Blocked {
			break
		}
		select {
		case res := <-writerDone:
			t.Fatalf("publisher ignoring FLOW never blocked: %v (FLOW(false) frames seen: %d, stored bytes %.0f)", res.err, w.flowOff.Load(), metricValue(s, "warren_stored_message_bytes"))
		case <-blockedDeadline:
			t.Fatal("the publisher's connection was never reported blocked")
		case <-changed:
		}
	}
	written, prev := 0, -1
	for written != prev {
		prev = written
		select {
		case written = <-stalls:
		case res := <-writerDone:
			t.Fatalf("writer finished while blocked: %v", res.err)
		case <-time.After(60 * time.Second):
			t.Fatal("writes never stalled while blocked")
		}
	}
	stored := metricValue(s, "warren_stored_message_bytes")
	t.Logf("writes stalled after %d bytes; stored %.0f bytes; FLOW(false) seen %d", written, stored, w.flowOff.Load())
	if w.flowOff.Load() == 0 {
		t.Fatal("the publisher was never sent FLOW(active=false)")
	}
	// A publish that would cross the watermark waits (one publisher: no
	// other frame can pass the check at the same time).
	if stored > watermark {
		t.Fatalf("stored %.0f bytes with a watermark of %d", stored, watermark)
	}
	ci, ok := connInfo(s, id)
	if !ok || !ci.Blocked {
		t.Fatalf("the publisher's connection is not reported blocked: %+v (found %v)", ci, ok)
	}
	if written > 4*watermark {
		t.Fatalf("the client wrote %d bytes before being held back", written)
	}
	if v := metricValue(s, "warren_connections_blocked"); v < 1 {
		t.Fatalf("warren_connections_blocked = %v", v)
	}
	// Blocked for longer than two heartbeat intervals: it is not closed
	// for the heartbeats the broker did not read.
	for drained := false; !drained; {
		select {
		case <-w.heartbeat:
		default:
			drained = true
		}
	}
	for range 3 {
		select {
		case <-w.heartbeat:
		case <-time.After(10 * time.Second):
			t.Fatal("the broker stopped sending heartbeats to the blocked connection")
		}
	}
	if _, ok := connInfo(s, id); !ok {
		t.Fatal("the blocked connection was closed")
	}

	// Purge: the alarm clears, the connection is read again and everything
	// it wrote is confirmed.
	stop.Store(true)
	var res result
	deadline := time.After(20 * time.Second)
	for res.lastSeq == 0 || w.maxConfirmed.Load() < res.lastSeq {
		if _, err := good.PurgeQueue(ctx, "flood"); err != nil {
			t.Fatal(err)
		}
		select {
		case res = <-writerDone:
			if res.err != nil {
				t.Fatal(res.err)
			}
		case <-w.confirmed:
		case <-w.closed:
			t.Fatal("the blocked publisher's connection was closed")
		case <-deadline:
			t.Fatalf("confirmed up to %d of %d after the purge", w.maxConfirmed.Load(), res.lastSeq)
		}
	}
	if w.flowOn.Load() == 0 {
		t.Fatal("no FLOW(active=true) after the purge")
	}
	aliveCheck(t, s, good)
}

// heapGrowth runs fn and returns how much the Go heap's live bytes grew.
func heapGrowth(fn func()) int64 {
	before := liveHeap()
	fn()
	return liveHeap() - before
}

// TestStoredBytesCountPerMessageOverhead: the gauge the watermark is
// compared with counts what stored messages cost the heap, not only their
// bytes: empty messages are not free.
func TestStoredBytesCountPerMessageOverhead(t *testing.T) {
	s := warrentest.StartServer(t, &netio.Config{QueueSoftLimit: -1})
	ctx := ctxT(t)
	ch := channel(t, dial(t, s))
	ch.DeclareQueue(ctx, "empty", client.QueueOptions{})
	msgs := make([]client.Message, 100)
	for i := range msgs {
		msgs[i] = client.Message{RoutingKey: "empty"}
	}
	must(t, ch.PublishBatch(ctx, "", msgs))
	base := metricValue(s, "warren_stored_message_bytes")
	const n = 50_000
	grew := heapGrowth(func() {
		for i := 0; i < n/len(msgs); i++ {
			must(t, ch.PublishBatch(ctx, "", msgs))
		}
	})
	counted := metricValue(s, "warren_stored_message_bytes") - base
	t.Logf("%d empty messages: heap +%d bytes, counted +%.0f", n, grew, counted)
	if counted < 0.75*float64(grew) || counted > 2*float64(grew) {
		t.Fatalf("counted %.0f bytes for %d empty messages that took %d bytes of heap", counted, n, grew)
	}
}

// TestSurvivorArenaCounted: a message keeps its publish batch's arena
// alive, and the gauge says so: one surviving message per batch counts
// what the heap really holds.
func TestSurvivorArenaCounted(t *testing.T) {
	s := warrentest.StartServer(t, &netio.Config{QueueSoftLimit: -1})
	ctx := ctxT(t)
	ch := channel(t, dial(t, s))
	ch.DeclareQueue(ctx, "keep", client.QueueOptions{})
	ch.DeclareQueue(ctx, "drop", client.QueueOptions{})
	body := make([]byte, 1024)
	batch := make([]client.Message, 256)
	for i := range batch {
		batch[i] = client.Message{RoutingKey: "drop", Body: body}
	}
	batch[0].RoutingKey = "keep"
	const batches = 40
	grew := heapGrowth(func() {
		for i := 0; i < batches; i++ {
			must(t, ch.PublishBatch(ctx, "", batch))
		}
		if _, err := ch.PurgeQueue(ctx, "drop"); err != nil {
			t.Fatal(err)
		}
	})
	counted := metricValue(s, "warren_stored_message_bytes")
	t.Logf("%d survivors of %d-message batches: heap +%d bytes, counted %.0f", batches, len(batch), grew, counted)
	if counted < 0.75*float64(grew) {
		t.Fatalf("counted %.0f bytes for %d survivors pinning %d bytes of heap", counted, batches, grew)
	}
}

// liveHeap is the Go heap's live bytes after a full collection.
func liveHeap() int64 {
	runtime.GC()
	runtime.GC()
	s := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
	metrics.Read(s)
	return int64(s[0].Value.Uint64())
}

// TestGoHeapRaisesTheAlarm: the alarm looks at the Go runtime's own
// figures too, not only at the bytes the broker counted: live heap the
// broker did not count (here a test ballast) pauses publishers, and they
// resume once it is gone.
func TestGoHeapRaisesTheAlarm(t *testing.T) {
	s := warrentest.StartServer(t, &netio.Config{MemoryHighWater: 1 << 20, TickInterval: 10 * time.Millisecond})
	ballast := make([]byte, 48<<20) // past the watermark and the broker's 32 MiB allowance
	for i := 0; i < len(ballast); i += 4096 {
		ballast[i] = 1
	}
	runtime.GC()
	t0 := time.Now()
	until(t, s, "the alarm", func() bool { return metricValue(s, "warren_flow_blocked") == 1 })
	t.Logf("alarm after %v", time.Since(t0))
	runtime.KeepAlive(ballast)
	ballast = nil
	// Nothing the broker counted changes: it notices the heap shrink by
	// itself (it collects while the alarm is on and its own count is low).
	until(t, s, "the alarm to clear", func() bool { return metricValue(s, "warren_flow_blocked") == 0 })
	t.Logf("cleared after %v", time.Since(t0))
}

// TestStalledAutoAckConsumerHoldsItsWindow: an auto-ack consumer that
// stops reading holds at most its window of deliveries in the broker (the
// rest stay in the queue), and when it dies nothing it was not given is
// lost: what it was not settled for goes to the next consumer.
func TestStalledAutoAckConsumerHoldsItsWindow(t *testing.T) {
	const window, n, size = 100, 20_000, 1024
	s := warrentest.StartServer(t, &netio.Config{MaxPrefetch: window, QueueSoftLimit: -1})
	ctx := ctxT(t)
	good := channel(t, dial(t, s))
	good.DeclareQueue(ctx, "stall", client.QueueOptions{})
	body := make([]byte, size)
	for i := 0; i < n; i++ {
		if _, err := good.PublishAsync(ctx, "", client.Message{RoutingKey: "stall", Body: body}); err != nil {
			t.Fatal(err)
		}
	}
	must(t, good.WaitConfirms(ctx))

	before := map[uint64]bool{}
	for _, ci := range s.Connections() {
		before[ci.ID] = true
	}
	r := rawDial(t, s, 0)
	_ = r.nc.(*net.TCPConn).SetReadBuffer(64 << 10)
	var id uint64
	for _, ci := range s.Connections() {
		if !before[ci.ID] {
			id = ci.ID
		}
	}
	r.write(wire.AppendFrame(nil, 1, &wire.ChannelOpen{Req: 1}))
	r.read()
	r.write(wire.AppendFrame(nil, 1, &wire.Subscribe{Req: 2, Queue: "stall", AutoAck: true}))
	r.read() // SUBSCRIBE_OK; from now on it reads nothing

	// Stalled: the socket takes nothing more, and the whole window is
	// written but held unsettled.
	// Nothing announces a written delivery (that would cost per message):
	// the connection's state is read until it shows.
	var ci netio.ConnInfo
	polled(t, "the stalled consumer's window to be held", func() bool {
		ci, _ = connInfo(s, id)
		return ci.AutoAcksHeld == window || queueStats(s, "stall").Ready == 0
	})
	q := queueStats(s, "stall")
	t.Logf("stalled: ready %d, unacked %d, settled %d, outbound %d bytes", q.Ready, q.Unacked, q.Acked, ci.OutboundBytes)
	if q.Unacked != window {
		t.Fatalf("%d unacked for a window of %d", q.Unacked, window)
	}
	if q.Ready < n/2 {
		t.Fatalf("the broker took %d of %d messages off the queue for a consumer that reads nothing", n-q.Ready, n)
	}
	if limit := int64(window*(size+64) + 512<<10); ci.OutboundBytes > limit {
		t.Fatalf("%d bytes held for a stalled consumer with a window of %d", ci.OutboundBytes, window)
	}

	// It dies: everything it was not settled for is delivered to another
	// consumer.
	_ = r.nc.(*net.TCPConn).SetLinger(0)
	r.nc.Close()
	until(t, s, "the stalled connection to close", func() bool { _, open := connInfo(s, id); return !open })
	settled(t, s)
	q = queueStats(s, "stall")
	if q.Consumers != 0 || q.Unacked != 0 {
		t.Fatalf("after the stalled consumer died: %d consumers, %d unacked, want 0 and 0", q.Consumers, q.Unacked)
	}
	if q.Ready+int64(q.Acked) != n {
		t.Fatalf("ready %d + settled %d != %d published", q.Ready, q.Acked, n)
	}
	cs, err := channel(t, dial(t, s)).Consume(ctx, "stall", client.ConsumeOptions{AutoAck: true})
	must(t, err)
	deadline := time.After(20 * time.Second)
	for i := int64(0); i < q.Ready; i++ {
		select {
		case <-cs.Deliveries():
		case <-deadline:
			t.Fatalf("%d of %d delivered to the next consumer", i, q.Ready)
		}
	}
}
