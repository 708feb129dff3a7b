package broker

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/warren-mq/warren/queue"
	"github.com/warren-mq/warren/replication"
	"github.com/warren-mq/warren/segment"
	"github.com/warren-mq/warren/wire"
)

// benchSink counts confirms and collects the queue tags delivered, for
// the benchmark to ack.
type benchSink struct {
	mu        sync.Mutex
	confirmed int
	tags      []SettleItem
	queues    []*Queue // by consumer id - 1
	changed   chan struct{}
}

func (k *benchSink) poke() {
	select {
	case k.changed <- struct{}{}:
	default:
	}
}
func (k *benchSink) Deliver(ds []Delivery) {
	k.mu.Lock()
	for _, d := range ds {
		k.tags = append(k.tags, SettleItem{Q: k.queues[d.Consumer-1], Consumer: d.Consumer, Op: wire.SettleAck, QTag: d.QTag})
	}
	k.mu.Unlock()
	k.poke()
}
func (k *benchSink) Confirm(b *PublishBatch) {
	k.mu.Lock()
	k.confirmed += len(b.Codes)
	k.mu.Unlock()
	k.poke()
}
func (*benchSink) Subscribed(queue.ConsumerID, uint32, wire.Code, string) {}
func (*benchSink) Answer(uint64, Result)                                  {}
func (*benchSink) Cancelled(queue.ConsumerID, wire.Code, string)          {}
func (*benchSink) LeaseExpired(queue.ConsumerID, uint64)                  {}
func (*benchSink) ConsumerGone(queue.ConsumerID)                          {}

// writeBytes is what this process has caused to be written to storage
// (/proc/self/io write_bytes), or -1 where that is not available.
func writeBytes() int64 {
	b, err := os.ReadFile("/proc/self/io")
	if err != nil {
		return -1
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "write_bytes: "); ok {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				return -1
			}
			return n
		}
	}
	return -1
}

func cpuNanos() int64 {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return ru.Utime.Nano() + ru.Stime.Nano()
}

// BenchmarkDurablePersistent1K: persistent 1 KiB messages into one
// durable queue (or 100) through the whole broker (shard, worker round, raft,
// segment with its real fdatasyncs under a temp dir, or segment's MemFS
// with WARREN_BENCH_MEMFS=1), confirmed, delivered to a consumer and
// acked, with up to 16 batches of 64 in flight (round robin over the queues). One op is one message;
// cpu-ns/msg is the process's CPU time (every goroutine: the broker, the
// appender, the fsyncs) per message, the figure to compare with
// warrend's CPU per message.
//
// The deep variants keep 312 batches (~20,000 messages) in flight, as
// many as durable.sh's two producers' confirm windows over the wire: many
// entries are still live when their WAL file is sealed. The metrics per
// message: wal-B (written to WAL files), moved-B (copied from the WAL
// into segment files), compacted-B (copied by segment compaction) and
// written-B (what the process caused to be written, /proc/self/io: all
// of it, the page cache's writeback included).
func BenchmarkDurablePersistent1K(b *testing.B) {
	for _, nq := range []int{1, 100} {
		b.Run(fmt.Sprintf("queues=%d", nq), func(b *testing.B) { benchDurable(b, nq, 16) })
		b.Run(fmt.Sprintf("queues=%d/deep", nq), func(b *testing.B) { benchDurable(b, nq, 312) })
	}
}

func benchDurable(b *testing.B, nq, window int) {
	const per = 64
	var fs segment.FS = segment.OSFS{}
	dir := b.TempDir()
	if os.Getenv("WARREN_BENCH_MEMFS") != "" {
		fs, dir = segment.NewMemFS(), "/data"
	}
	l, err := segment.Open(fs, dir, segment.Options{})
	if err != nil {
		b.Fatal(err)
	}
	store, err := replication.OpenSnapStore(l)
	if err != nil {
		b.Fatal(err)
	}
	br := New(Config{Shards: 2, Durable: &DurableConfig{Log: l, Snapshots: store}})
	br.Start()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if err := br.OpenMetaLog(ctx, MetaLogConfig{Log: l, Snapshots: store}); err != nil {
		b.Fatal(err)
	}
	defer func() {
		_ = br.CloseMetaLog(ctx)
		_ = br.Stop(ctx)
		_ = l.Close()
	}()
	k := &benchSink{changed: make(chan struct{}, 1)}
	qs := make([]*Queue, nq)
	for i := range qs {
		name := fmt.Sprintf("q%d", i)
		if _, err := br.DeclareQueueAs(&wire.QueueDeclare{Name: name, Durable: true}, 0, "u"); err != nil {
			b.Fatal(err)
		}
		if err := br.MetaSync(ctx); err != nil {
			b.Fatal(err)
		}
		qs[i] = br.topo.lookupQueue(name)
		k.queues = append(k.queues, qs[i])
		qs[i].shard.submit(Command{Kind: CmdSubscribe, Queue: qs[i], Sink: k, Spec: queue.ConsumerSpec{ID: queue.ConsumerID(i + 1), Owner: 7, Prefetch: uint32(4 * per * window)}, Req: 1})
	}
	next := 0

	body := make([]byte, 1024)
	var frame []byte // a batch's messages: exchange "x", key "q", body
	for range per {
		frame = append(append(frame, 'x', 'q'), body...)
	}
	publishBatch := func() {
		q := qs[next%nq]
		next++
		// One arena, one copy of the batch as sent, nothing zeroed, as
		// netio's publish makes (wire.PublishBatch.Own).
		ar := &Arena{Buf: append([]byte(nil), frame...)}
		ar.Refs.Store(per)
		items := make([]EnqItem, per)
		for i := range items {
			o := i * (2 + len(body))
			mv := ar.Msg(ar.Buf[o:o+1], ar.Buf[o+1:o+2], nil, ar.Buf[o+2:o+2+len(body)], wire.Persistent, 0)
			m := &mv
			ar.Cost += int64(len(body)) + StoredMsgOverhead
			items[i] = EnqItem{Q: q, Msg: m, Meta: queue.Message{Size: uint32(len(body))}, Idx: i}
		}
		br.AddStoredBytes(ar.Cost)
		batch := &PublishBatch{Sink: k, Codes: make([]uint32, per)}
		batch.Pending.Store(1)
		br.Submit(Command{Kind: CmdPublish, Items: items, Batch: batch})
	}
	var tags []SettleItem
	sent, acked := 0, 0
	// run publishes n messages (in batches) and waits until all are
	// confirmed and acked.
	run := func(n int) {
		target := sent + n
		for {
			k.mu.Lock()
			conf := k.confirmed
			tags, k.tags = k.tags, tags[:0]
			k.mu.Unlock()
			if len(tags) > 0 {
				acked += len(tags)
				br.Submit(Command{Kind: CmdSettle, Settles: tags})
				tags = nil // the broker owns it now
			}
			progress := len(tags) > 0
			for sent < target && sent-conf < per*window {
				publishBatch()
				sent += per
				progress = true
			}
			if conf >= target && acked >= target {
				return
			}
			if !progress {
				select {
				case <-k.changed:
				case <-time.After(10 * time.Second):
					b.Fatalf("stuck: sent %d confirmed %d acked %d", sent, conf, acked)
				}
			}
		}
	}
	run(per * window * 4) // warm up
	n := (b.N + per - 1) / per * per
	b.SetBytes(1024)
	b.ReportAllocs()
	b.ResetTimer()
	st0, wb0 := l.Stats(), writeBytes()
	cpu0 := cpuNanos()
	run(n)
	cpu := cpuNanos() - cpu0
	b.StopTimer()
	st, wb := l.Stats(), writeBytes()
	b.ReportMetric(float64(cpu)/float64(n), "cpu-ns/msg")
	per1 := func(a, b uint64) float64 { return float64(a-b) / float64(n) }
	b.ReportMetric(per1(st.WALBytes, st0.WALBytes), "wal-B/msg")
	b.ReportMetric(per1(st.MovedBytes, st0.MovedBytes), "moved-B/msg")
	b.ReportMetric(per1(st.CompactedBytes, st0.CompactedBytes), "compacted-B/msg")
	if s := st.Syncs - st0.Syncs; s > 0 {
		b.ReportMetric(float64(n)/float64(s), "msgs/sync")
	}
	if wb >= 0 {
		b.ReportMetric(float64(wb-wb0)/float64(n), "written-B/msg")
	}
}
