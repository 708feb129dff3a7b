package broker

import (
	"bytes"
	"context"
	"fmt"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/warren-mq/warren/queue"
	"github.com/warren-mq/warren/replication"
	"github.com/warren-mq/warren/segment"
	"github.com/warren-mq/warren/wire"
)

// holdFS is a segment.FS whose file syncs can be held: while held, a Sync
// announces itself on entered and waits for release.
type holdFS struct {
	segment.FS
	held    atomic.Bool
	entered chan struct{}
	release chan struct{}
}

func newHoldFS(fs segment.FS) *holdFS {
	return &holdFS{FS: fs, entered: make(chan struct{}, 16), release: make(chan struct{})}
}

func (h *holdFS) Open(name string) (segment.File, error) {
	f, err := h.FS.Open(name)
	if err != nil {
		return nil, err
	}
	return holdFile{File: f, h: h}, nil
}

type holdFile struct {
	segment.File
	h *holdFS
}

func (f holdFile) Sync() error {
	if f.h.held.Load() {
		f.h.entered <- struct{}{}
		<-f.h.release
	}
	return f.File.Sync()
}

// durSink records what a durable queue's shard hands it, copying each
// delivery (a durable queue's message is a view valid during Deliver).
type durSink struct {
	mu       sync.Mutex
	confirms []*PublishBatch
	got      []durDelivery
	subs     []wire.Code
	reasons  []string // the subscribes' refusals
	answers  []Result
	changed  chan struct{}
}

type durDelivery struct {
	body       string
	tag        uint64
	count      uint32
	persistent bool
}

func newDurSink() *durSink { return &durSink{changed: make(chan struct{}, 1)} }

func (k *durSink) poke() {
	select {
	case k.changed <- struct{}{}:
	default:
	}
}
func (k *durSink) Deliver(ds []Delivery) {
	k.mu.Lock()
	for _, d := range ds {
		k.got = append(k.got, durDelivery{body: string(d.Msg.Body()), tag: d.QTag, count: d.DeliveryCount, persistent: d.Msg.Flags&wire.Persistent != 0})
	}
	k.mu.Unlock()
	k.poke()
}
func (k *durSink) Confirm(b *PublishBatch) {
	k.mu.Lock()
	k.confirms = append(k.confirms, b)
	k.mu.Unlock()
	k.poke()
}
func (k *durSink) Subscribed(_ queue.ConsumerID, _ uint32, code wire.Code, reason string) {
	k.mu.Lock()
	k.subs = append(k.subs, code)
	k.reasons = append(k.reasons, reason)
	k.mu.Unlock()
	k.poke()
}
func (k *durSink) Answer(_ uint64, r Result) {
	k.mu.Lock()
	k.answers = append(k.answers, r)
	k.mu.Unlock()
	k.poke()
}
func (*durSink) Cancelled(queue.ConsumerID, wire.Code, string) {}
func (*durSink) LeaseExpired(queue.ConsumerID, uint64)         {}
func (*durSink) ConsumerGone(queue.ConsumerID)                 {}

// waitFor waits (10 s at most) until cond holds under k's lock.
func (k *durSink) waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.NewTimer(10 * time.Second)
	defer deadline.Stop()
	for {
		k.mu.Lock()
		ok := cond()
		k.mu.Unlock()
		if ok {
			return
		}
		select {
		case <-k.changed:
		case <-deadline.C:
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

func (k *durSink) confirmed(b *PublishBatch) bool {
	for _, c := range k.confirms {
		if c == b {
			return true
		}
	}
	return false
}

// durNode is a broker with durable queues and a logged topology over one
// segment.Log on fs, as warrend runs it with --data.
type durNode struct {
	b   *Broker
	log *segment.Log
}

func openDurNode(t *testing.T, fs segment.FS, dir ...string) *durNode {
	t.Helper()
	path := "/data"
	if len(dir) > 0 {
		path = dir[0]
	}
	return openDurNodeWith(t, fs, path, nil)
}

// openDurNodeWith is openDurNode in directory path, with tweak (if not
// nil) changing the broker's and the metadata log's configuration before
// they start (a fake clock, Fatal handlers).
func openDurNodeWith(t *testing.T, fs segment.FS, path string, tweak func(*Config, *MetaLogConfig)) *durNode {
	t.Helper()
	return openDurNodeOpts(t, fs, path, segment.Options{}, tweak)
}

// openDurNodeOpts is openDurNodeWith with its log opened with opts.
func openDurNodeOpts(t *testing.T, fs segment.FS, path string, opts segment.Options, tweak func(*Config, *MetaLogConfig)) *durNode {
	t.Helper()
	l, err := segment.Open(fs, path, opts)
	if err != nil {
		t.Fatal(err)
	}
	store, err := replication.OpenSnapStore(l)
	if err != nil {
		t.Fatal(err)
	}
	cfg := Config{Shards: 2, Durable: &DurableConfig{Log: l, Snapshots: store}}
	mcfg := MetaLogConfig{Log: l, Snapshots: store}
	if tweak != nil {
		tweak(&cfg, &mcfg)
	}
	b := New(cfg)
	b.Start()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := b.OpenMetaLog(ctx, mcfg); err != nil {
		t.Fatal(err)
	}
	return &durNode{b: b, log: l}
}

func (n *durNode) close(t *testing.T) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := n.b.CloseMetaLog(ctx); err != nil {
		t.Fatal(err)
	}
	if err := n.b.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if err := n.log.Close(); err != nil {
		t.Fatal(err)
	}
}

// publish submits one batch of messages to q (bodies as given, persistent
// or not) and returns the batch.
func publish(b *Broker, q *Queue, k Sink, persistent bool, bodies ...string) *PublishBatch {
	ar := &Arena{}
	ar.Refs.Store(int64(len(bodies)))
	var fl wire.MessageFlags
	if persistent {
		fl = wire.Persistent
	}
	items := make([]EnqItem, len(bodies))
	for i, s := range bodies {
		m := ar.add([]byte("x"), []byte("rk"), nil, []byte(s), fl, 0)
		ar.Cost += int64(len(s)) + StoredMsgOverhead
		items[i] = EnqItem{Q: q, Msg: m, Meta: queue.Message{Size: uint32(len(s))}, Idx: i}
	}
	b.AddStoredBytes(ar.Cost)
	batch := &PublishBatch{Sink: k, Codes: make([]uint32, len(bodies))}
	batch.Pending.Store(1)
	b.Submit(Command{Kind: CmdPublish, Items: items, Batch: batch})
	return batch
}

func declareDurable(t *testing.T, b *Broker, name string, durable bool) *Queue {
	t.Helper()
	if _, err := b.DeclareQueueAs(&wire.QueueDeclare{Name: name, Durable: durable}, 0, "u"); err != nil {
		t.Fatal(err)
	}
	if err := b.MetaSync(t.Context()); err != nil { // as a control run's reply waits for it
		t.Fatal(err)
	}
	q := b.topo.lookupQueue(name)
	if q == nil {
		t.Fatalf("queue %s not found after its declare", name)
	}
	barrier(t, q.shard)
	return q
}

// TestDurableConfirmAfterSync: a persistent message published to a
// durable queue is confirmed only once its entry is on disk (its sync
// returned); a transient one in the same queue is confirmed at once.
func TestDurableConfirmAfterSync(t *testing.T) {
	mem := segment.NewMemFS()
	fs := newHoldFS(mem)
	l, err := segment.Open(fs, "/data", segment.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close() }) // after the broker's stop (cleanups run last first)
	store, err := replication.OpenSnapStore(l)
	if err != nil {
		t.Fatal(err)
	}
	b := startBroker(t, Config{Shards: 1, Durable: &DurableConfig{Log: l, Snapshots: store}})
	q := declareDurable(t, b, "dq", true)
	k := newDurSink()

	// A first persistent message: once it is confirmed, every earlier write
	// (the group's election) is done.
	first := publish(b, q, k, true, "first")
	k.waitFor(t, "the first confirm", func() bool { return k.confirmed(first) })

	fs.held.Store(true)
	p := publish(b, q, k, true, "persistent")
	select {
	case <-fs.entered:
	case <-time.After(10 * time.Second):
		t.Fatal("no sync started for the persistent message")
	}
	tr := publish(b, q, k, false, "transient")
	k.waitFor(t, "the transient message's confirm while the sync is held", func() bool { return k.confirmed(tr) })
	barrier(t, q.shard)
	k.mu.Lock()
	early := k.confirmed(p)
	k.mu.Unlock()
	if early {
		t.Fatal("the persistent message was confirmed before its sync returned")
	}
	fs.held.Store(false)
	close(fs.release)
	k.waitFor(t, "the persistent message's confirm after the sync", func() bool { return k.confirmed(p) })
}

// TestDurableBacklogHoldsNoBodies: a durable queue's bodies are in its log
// only: a backlog of 10,000 1 KiB persistent messages leaves the
// stored-bytes gauge where it was (a non-durable queue's would hold them
// all), and a consumer gets every body back, from the log.
func TestDurableBacklogHoldsNoBodies(t *testing.T) {
	n := openDurNode(t, segment.NewMemFS())
	defer n.close(t)
	b := n.b
	q := declareDurable(t, b, "dq", true)
	k := newDurSink()
	const count, size = 10_000, 1024
	var batches []*PublishBatch
	body := func(i int) string { return fmt.Sprintf("%04d", i) + string(bytes.Repeat([]byte{'.'}, size-4)) }
	for i := 0; i < count; i += 100 {
		var bs []string
		for j := i; j < i+100; j++ {
			bs = append(bs, body(j))
		}
		batches = append(batches, publish(b, q, k, true, bs...))
	}
	k.waitFor(t, "every confirm", func() bool { return len(k.confirms) == len(batches) })
	barrier(t, q.shard)
	if got := b.StoredBytes(); got > 64<<10 {
		t.Errorf("stored bytes with %d durable 1 KiB messages ready = %d, want about 0 (bodies in the log only)", count, got)
	}
	if r := q.ready.Load(); r != count {
		t.Fatalf("ready = %d, want %d", r, count)
	}
	q.shard.submit(Command{Kind: CmdSubscribe, Queue: q, Sink: k, Spec: queue.ConsumerSpec{ID: 1, Owner: 9, Prefetch: 0}, Req: 1})
	k.waitFor(t, "every delivery", func() bool { return len(k.got) == count })
	for i, d := range k.got {
		if d.body != body(i) || !d.persistent {
			t.Fatalf("delivery %d: body %.8q... persistent %v, want %.8q...", i, d.body, d.persistent, body(i))
		}
	}
}

// restartCase publishes to a durable queue, consumes part, acks part, and
// checks what a restarted node (after stop, a clean close or a crash)
// redelivers.
func TestDurableQueueSurvivesRestart(t *testing.T) {
	for _, crash := range []bool{false, true} {
		t.Run(map[bool]string{false: "clean", true: "crash"}[crash], func(t *testing.T) {
			mem := segment.NewMemFS()
			n := openDurNode(t, mem)
			b := n.b
			q := declareDurable(t, b, "dq", true)
			k := newDurSink()
			var bodies []string
			for i := range 10 {
				bodies = append(bodies, fmt.Sprintf("m%d", i))
			}
			batch := publish(b, q, k, true, bodies...)
			k.waitFor(t, "the confirm", func() bool { return k.confirmed(batch) })
			q.shard.submit(Command{Kind: CmdSubscribe, Queue: q, Sink: k, Spec: queue.ConsumerSpec{ID: 1, Owner: 7, Prefetch: 5}, Req: 1})
			k.waitFor(t, "five deliveries", func() bool { return len(k.got) == 5 })
			k.mu.Lock()
			acked := []uint64{k.got[0].tag, k.got[1].tag}
			k.mu.Unlock()
			for _, tag := range acked {
				b.Submit(Command{Kind: CmdSettle, Settles: []SettleItem{{Q: q, Consumer: 1, Op: wire.SettleAck, QTag: tag}}})
			}
			// The acks are in the log before this later message's entry:
			// its confirm says both are on disk.
			sync := publish(b, q, k, true, "m10")
			k.waitFor(t, "the acks' sync", func() bool { return k.confirmed(sync) && len(k.got) == 7 })

			fs := segment.FS(mem)
			if crash {
				fs = mem.Crash(0)
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				defer cancel()
				_ = b.Stop(ctx)
			} else {
				n.close(t)
			}

			n2 := openDurNode(t, fs)
			defer n2.close(t)
			// Recovered: the queue's log is applied, its count is right
			// before anyone asks the shard anything.
			if err := n2.b.WaitRecovered(t.Context()); err != nil {
				t.Fatal(err)
			}
			q2 := n2.b.topo.lookupQueue("dq")
			if q2 == nil {
				t.Fatal("the durable queue is gone after the restart")
			}
			if r := q2.ready.Load(); r != 9 {
				t.Errorf("ready once recovered = %d, want 9", r)
			}
			barrier(t, q2.shard)
			k2 := newDurSink()
			q2.shard.submit(Command{Kind: CmdSubscribe, Queue: q2, Sink: k2, Spec: queue.ConsumerSpec{ID: 1, Owner: 7, Prefetch: 0}, Req: 1})
			k2.waitFor(t, "nine deliveries after the restart", func() bool { return len(k2.got) >= 9 })
			barrier(t, q2.shard)
			k2.mu.Lock()
			defer k2.mu.Unlock()
			var got []string
			for _, d := range k2.got {
				got = append(got, fmt.Sprintf("%s/%d", d.body, d.count))
			}
			// m0, m1 acked; m2..m6 were delivered and unacked (redelivered,
			// count 2); m7..m10 never delivered.
			want := []string{"m2/2", "m3/2", "m4/2", "m5/2", "m6/2", "m7/1", "m8/1", "m9/1", "m10/1"}
			if fmt.Sprint(got) != fmt.Sprint(want) {
				t.Errorf("after the restart the consumer got %v, want %v", got, want)
			}
		})
	}
}

// countSink counts confirms and keeps nothing.
type countSink struct {
	waitSink
	confirms atomic.Int64
	changed  chan struct{}
}

func (k *countSink) Confirm(*PublishBatch) {
	k.confirms.Add(1)
	select {
	case k.changed <- struct{}{}:
	default:
	}
}

// TestDurableHeapPerMessage: a durable backlog costs the heap what the
// queue's machine and live index keep per message, not its body: at most
// 64 bytes per ready message (design §2.2, DESIGN §4) over 200,000
// messages of 256 B, in a log on the real filesystem (a MemFS would keep
// the log itself on the heap). 200,000 rather than 100,000: the buffers a
// node reuses (up to a few MiB) stay well under the budget per message.
func TestDurableHeapPerMessage(t *testing.T) {
	if testing.Short() || raceEnabled {
		t.Skip("writes 55 MB to a temporary directory (and the race detector changes the heap measured)")
	}
	n := openDurNode(t, segment.OSFS{}, t.TempDir())
	defer n.close(t)
	b := n.b
	q := declareDurable(t, b, "dq", true)
	k := &countSink{waitSink: make(waitSink, 1), changed: make(chan struct{}, 1)}
	const count, per, size = 200_000, 1000, 256
	body := string(bytes.Repeat([]byte{'.'}, size))
	bodies := make([]string, per)
	for i := range bodies {
		bodies[i] = body
	}
	heap := func() uint64 {
		runtime.GC()
		runtime.GC()
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		return ms.HeapAlloc
	}
	deadline := time.NewTimer(60 * time.Second)
	defer deadline.Stop()
	fill := func(batches int64) {
		t.Helper()
		want := k.confirms.Load() + batches
		for range batches {
			publish(b, q, k, true, bodies...)
		}
		for k.confirms.Load() < want {
			select {
			case <-k.changed:
			case <-deadline.C:
				t.Fatalf("%d of %d batches confirmed", k.confirms.Load(), want)
			}
		}
		barrier(t, q.shard)
	}
	// A first 10,000 grow the buffers a node keeps whatever its backlog
	// (segment's write buffers, the shard's scratch): the next 100,000
	// measure what each queued message costs.
	fill(10)
	before := heap()
	fill(count / per)
	if r := q.ready.Load(); r != count+10*per {
		t.Fatalf("ready = %d, want %d", r, count+10*per)
	}
	after := heap()
	per64 := (int64(after) - int64(before)) / count
	t.Logf("heap: %d B before, %d B after %d durable %d B messages: %d B per message", before, after, count, size, per64)
	if per64 > 64 {
		t.Errorf("heap per ready durable message = %d B, want at most 64 (bodies in the log only)", per64)
	}
}

// TestDurableQueueRestartsFromASnapshot: once acks free enough of a
// durable queue's log, it is snapshotted and compacted (design §2.4);
// after a restart the queue comes back from the snapshot and the log
// after it, with every unacked message's body still in the log.
func TestDurableQueueRestartsFromASnapshot(t *testing.T) {
	mem := segment.NewMemFS()
	n := openDurNode(t, mem)
	b := n.b
	q := declareDurable(t, b, "dq", true)
	k := newDurSink()
	const count, acked = 3000, 2500
	pad := string(bytes.Repeat([]byte{'.'}, 1020))
	var want []string
	for i := 0; i < count; i += 100 {
		var bs []string
		for j := i; j < i+100; j++ {
			bs = append(bs, fmt.Sprintf("%04d", j)+pad)
		}
		want = append(want, bs...)
		// One at a time: each its own entry (a round takes every publish
		// it finds into one), so acking the first 2,500 kills entries.
		p := publish(b, q, k, true, bs...)
		k.waitFor(t, "a confirm", func() bool { return k.confirmed(p) })
	}
	q.shard.submit(Command{Kind: CmdSubscribe, Queue: q, Sink: k, Spec: queue.ConsumerSpec{ID: 1, Owner: 7}, Req: 1})
	k.waitFor(t, "every delivery", func() bool { return len(k.got) == count })
	k.mu.Lock()
	first, last := k.got[0].tag, k.got[acked-1].tag
	k.mu.Unlock()
	b.Submit(Command{Kind: CmdSettle, Settles: []SettleItem{{Q: q, Consumer: 1, Op: wire.SettleAck, QTag: first}}})
	for tag := first + 1; tag <= last; tag++ {
		b.Submit(Command{Kind: CmdSettle, Settles: []SettleItem{{Q: q, Consumer: 1, Op: wire.SettleAck, QTag: tag}}})
	}
	sync := publish(b, q, k, true, "after")
	k.waitFor(t, "the acks' sync", func() bool { return k.confirmed(sync) })
	gid := queueGroup(q.id)
	n.close(t) // waits for the snapshot's write (the pool drains)

	n2 := openDurNode(t, mem)
	defer n2.close(t)
	store := n2.b.cfg.Durable.Snapshots
	if _, ok := store.Latest(gid); !ok {
		t.Fatal("no snapshot of the queue was taken (2.5 MB of its log acked)")
	}
	q2 := n2.b.topo.lookupQueue("dq")
	if q2 == nil {
		t.Fatal("the durable queue is gone after the restart")
	}
	k2 := newDurSink()
	q2.shard.submit(Command{Kind: CmdSubscribe, Queue: q2, Sink: k2, Spec: queue.ConsumerSpec{ID: 1, Owner: 7}, Req: 1})
	k2.waitFor(t, "the unacked messages after the restart", func() bool { return len(k2.got) >= count-acked+1 })
	barrier(t, q2.shard)
	k2.mu.Lock()
	defer k2.mu.Unlock()
	if len(k2.got) != count-acked+1 {
		t.Fatalf("got %d messages after the restart, want %d", len(k2.got), count-acked+1)
	}
	for i, d := range k2.got[:count-acked] {
		if d.body != want[acked+i] || d.count != 2 {
			t.Fatalf("delivery %d after the restart: %.4q count %d, want %.4q count 2", i, d.body, d.count, want[acked+i])
		}
	}
	if d := k2.got[count-acked]; d.body != "after" || d.count != 2 { // it went to the consumer too
		t.Errorf("last delivery after the restart: %q count %d, want \"after\" count 2", d.body, d.count)
	}
}

// TestDurablePendingBytesCount: messages added to a durable queue's log
// and not yet applied (their write in flight) count in the stored-bytes
// gauge the memory watermark reads, so a publisher outrunning the disk
// is held back as one outrunning consumers is; applied, they no longer
// count (their bodies are in the log only).
func TestDurablePendingBytesCount(t *testing.T) {
	fs := newHoldFS(segment.NewMemFS())
	l, err := segment.Open(fs, "/data", segment.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close() })
	store, err := replication.OpenSnapStore(l)
	if err != nil {
		t.Fatal(err)
	}
	b := startBroker(t, Config{Shards: 1, Durable: &DurableConfig{Log: l, Snapshots: store}})
	q := declareDurable(t, b, "dq", true)
	k := newDurSink()
	first := publish(b, q, k, true, "first")
	k.waitFor(t, "the first confirm", func() bool { return k.confirmed(first) })
	barrier(t, q.shard) // the shard folds its byte changes into the gauge after the confirm goes out
	base := b.StoredBytes()

	fs.held.Store(true)
	p := publish(b, q, k, true, "x")
	select {
	case <-fs.entered:
	case <-time.After(10 * time.Second):
		t.Fatal("no sync started")
	}
	body := string(bytes.Repeat([]byte{'.'}, 1024))
	var bs []string
	for range 100 {
		bs = append(bs, body)
	}
	more := publish(b, q, k, true, bs...)
	barrier(t, q.shard)
	if got := b.StoredBytes() - base; got < 100*1024 {
		t.Errorf("stored bytes with 100 KiB proposed and not yet applied = +%d, want at least +%d", got, 100*1024)
	}
	fs.held.Store(false)
	close(fs.release)
	k.waitFor(t, "the confirms", func() bool { return k.confirmed(p) && k.confirmed(more) })
	barrier(t, q.shard)
	if got := b.StoredBytes() - base; got != 0 {
		t.Errorf("stored bytes once applied = %+d, want +0", got)
	}
}

// TestDeletedDurableQueueLogIsRemoved: a deleted durable queue's group
// (its log, and its snapshot) is removed at the next start, so a queue
// that gets the same group id (its Meta id reused after 2^32 wraps)
// starts empty instead of replaying the old log.
func TestDeletedDurableQueueLogIsRemoved(t *testing.T) {
	for _, crash := range []bool{false, true} {
		t.Run(map[bool]string{false: "clean", true: "crash"}[crash], func(t *testing.T) { deletedDurableQueueLogIsRemoved(t, crash) })
	}
}

func deletedDurableQueueLogIsRemoved(t *testing.T, crash bool) {
	mem := segment.NewMemFS()
	n := openDurNode(t, mem)
	q := declareDurable(t, n.b, "dq", true)
	id := q.id
	gid := queueGroup(id)
	k := newDurSink()
	batch := publish(n.b, q, k, true, "a", "b", "c")
	k.waitFor(t, "the confirm", func() bool { return k.confirmed(batch) })
	if _, err := n.b.DeleteQueue(t.Context(), "dq", false, false); err != nil {
		t.Fatal(err)
	}
	fs := segment.FS(mem)
	if crash {
		fs = mem.Crash(0)
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = n.b.Stop(ctx)
	} else {
		n.close(t)
	}

	n2 := openDurNode(t, fs)
	defer n2.close(t)
	if err := n2.b.WaitRecovered(t.Context()); err != nil {
		t.Fatal(err)
	}
	if slices.Contains(n2.log.Groups(), gid) || n2.log.LastIndex(gid) != 0 {
		t.Fatalf("the deleted queue's group %d is still in the log after a restart: entries %d..%d",
			gid, n2.log.FirstIndex(gid), n2.log.LastIndex(gid))
	}
	if _, ok := n2.b.cfg.Durable.Snapshots.Latest(gid); ok {
		t.Fatalf("the deleted queue's group %d still has a snapshot", gid)
	}
	// A new queue with the same id (as after the ids wrap) starts empty.
	n2.b.topo.mu.Lock()
	n2.b.topo.meta.nextID = uint64(id)
	n2.b.topo.mu.Unlock()
	q2 := declareDurable(t, n2.b, "dq2", true)
	if q2.id != id {
		t.Fatalf("setup: the new queue got id %d, want %d", q2.id, id)
	}
	if err := n2.b.WaitRecovered(t.Context()); err != nil {
		t.Fatal(err)
	}
	barrier(t, q2.shard)
	if r := q2.ready.Load(); r != 0 {
		t.Fatalf("a new queue with the deleted queue's group id has %d ready messages, want 0", r)
	}
}
