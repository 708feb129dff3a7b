package broker

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync/atomic"
	"time"

	"github.com/warren-mq/warren/queue"
	"github.com/warren-mq/warren/replication"
	"github.com/warren-mq/warren/segment"
	"github.com/warren-mq/warren/wire"
)

// crashAndCheck cuts the power (what was synced survives, plus torn
// bytes of what was not), or stops the node cleanly, recovers a new node
// from what is left, drains it and checks the invariants.
func (s *crashSim) crashAndCheck(clean bool, torn int) {
	t := s.t
	s.absorb()
	s.checkFatal("before the crash")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	old := s.n
	var confirmed map[*PublishBatch]bool
	var fs segment.FS
	if clean {
		// A clean stop writes everything submitted before it: every
		// settle is on disk, every persistent message confirmed.
		old.close(t)
		s.checkFatal("at the clean stop")
		s.sink.mu.Lock()
		s.sink.frozen = true
		confirmed = s.sink.confirmed
		s.sink.mu.Unlock()
		for name, cs := range s.pendAcks {
			for _, c := range cs {
				s.copies[c].onDisk = true
			}
			delete(s.pendAcks, name)
		}
		fs = s.mem
		s.logf("clean stop")
	} else {
		// What the sink holds now was confirmed, delivered or answered
		// after its write was synced: it is in the copy taken next.
		s.sink.mu.Lock()
		s.sink.frozen = true
		confirmed = s.sink.confirmed
		s.sink.mu.Unlock()
		if torn%4 == 0 {
			// The unsynced bytes at the WAL's end reach the disk out of
			// order: a hole of torn+64 bytes torn/2 bytes in, the later
			// ones kept (a later write in flight survives, part of an
			// earlier one does not). WAL files only: a hole in a segment
			// file's unsynced tail is not recovered as torn yet.
			fs = s.mem.CrashHole(torn/2, torn+64, func(n string) bool { return strings.Contains(n, "/wal-") })
			s.logf("crash (failed fsync: %v, a hole of %d bytes %d bytes into the WAL's unsynced tail)", s.ctx.Err() != nil, torn+64, torn/2)
		} else {
			fs = s.mem.Crash(torn)
			s.logf("crash (failed fsync: %v, torn bytes %d)", s.ctx.Err() != nil, torn)
		}
		_ = old.b.CloseMetaLog(ctx)
		if err := old.b.Stop(ctx); err != nil {
			t.Fatalf("seed %d: the crashed node did not stop: %v", s.seed, err)
		}
		_ = old.log.Close()
	}

	s.logf("dead letters dropped before the crash: %v", s.takeDrops())
	if s.rng.IntN(3) == 0 {
		fs = s.recrash(fs.(*segment.MemFS))
	}
	s.now.Add(1000)
	if names, _ := fs.List("/data"); slices.ContainsFunc(names, func(n string) bool { return strings.HasPrefix(n, "seg-") }) {
		s.st.segmentFiles++
	}
	n2 := openDurNodeOpts(t, fs, "/data", s.segOpts, s.tweak(false))
	defer n2.close(t)
	b2 := n2.b
	if err := b2.WaitRecovered(ctx); err != nil {
		t.Fatalf("seed %d: recovery: %v", s.seed, err)
	}
	for _, gid := range n2.log.Groups() {
		if _, ok := n2.b.cfg.Durable.Snapshots.Latest(gid); ok && gid >= QueueGroupBase {
			s.st.snapshotsOnDisk++
			break
		}
	}
	s.checkTopology(b2)
	found := s.drain(b2)
	s.checkMessages(confirmed, found)
}

// recrash restarts the node on the disk m, as the first crash or stop
// left it, and crashes it again in or right after its recovery: one of
// the first 24 fsyncs from the start failing (recovery makes 8 to 21: the
// recovered WAL's at Open, its close mark, the metadata's and the queues'
// first writes), or
// a power cut once it has recovered (torn or not). Nothing happens in
// between but the recovery: what the checks expect is what they expect
// of the first crash alone. Returns the disk as the second crash left it.
func (s *crashSim) recrash(m *segment.MemFS) *segment.MemFS {
	t := s.t
	torn := 0
	if s.rng.IntN(2) == 0 {
		torn = 1 + s.rng.IntN(700)
	}
	failAt := 0
	if s.rng.IntN(2) == 0 {
		failAt = 1 + s.rng.IntN(24)
		m.FailSync(failAt)
		s.logf("restart with the %d-th fsync from now failing, then a crash (torn bytes %d)", failAt, torn)
	} else {
		s.logf("restart, then a power cut once recovered (torn bytes %d)", torn)
	}
	s.now.Add(1000)
	s.st.recrashes++
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var fatal atomic.Pointer[error]
	onFatal := func(err error) {
		fatal.CompareAndSwap(nil, &err)
		cancel()
	}
	crash := func() *segment.MemFS {
		m.FailSync(0)
		return m.Crash(torn)
	}
	l, err := segment.Open(m, "/data", s.segOpts)
	if err != nil {
		if failAt == 0 || !errors.Is(err, segment.ErrInjected) && !errors.Is(err, segment.ErrStopped) {
			t.Fatalf("seed %d: the restart before the second crash: %v", s.seed, err)
		}
		s.logf("the restart failed: %v", err)
		s.st.recrashFailed++
		return crash()
	}
	store, err := replication.OpenSnapStore(l)
	if err != nil {
		t.Fatalf("seed %d: the restart before the second crash: snapshot store: %v", s.seed, err)
	}
	cfg, mcfg := Config{Shards: 2, Durable: &DurableConfig{Log: l, Snapshots: store}}, MetaLogConfig{Log: l, Snapshots: store}
	s.tweak(false)(&cfg, &mcfg)
	cfg.Durable.Fatal, mcfg.Fatal = onFatal, onFatal
	b := New(cfg)
	b.Start()
	err = b.OpenMetaLog(ctx, mcfg)
	if err == nil {
		err = b.WaitRecovered(ctx)
	}
	out := crash() // the power cut, before the node stops (which writes)
	stop, stopCancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer stopCancel()
	_ = b.CloseMetaLog(stop)
	if serr := b.Stop(stop); serr != nil {
		t.Fatalf("seed %d: the node restarted before the second crash did not stop: %v", s.seed, serr)
	}
	_ = l.Close()
	if f := fatal.Load(); f != nil {
		err = *f
	}
	if err != nil {
		if failAt == 0 || !errors.Is(err, segment.ErrInjected) && !errors.Is(err, segment.ErrStopped) {
			t.Fatalf("seed %d: the restart before the second crash failed, with no failure injected: %v", s.seed, err)
		}
		s.logf("the recovery stopped: %v", err)
		s.st.recrashFailed++
	}
	s.takeDrops()
	return out
}

// checkTopology: the durable exchanges, queues and bindings whose
// declares were answered are back, unless their delete was answered;
// nothing non-durable or exclusive is.
func (s *crashSim) checkTopology(b *Broker) {
	t := s.t
	exs := map[string]bool{}
	for _, e := range b.Exchanges() {
		exs[e.Name] = true
		se := s.exchanges[e.Name]
		switch {
		case strings.HasPrefix(e.Name, "amq.") || e.Name == "":
		case se == nil:
			t.Errorf("seed %d: exchange %s after recovery was never declared", s.seed, e.Name)
		case !se.durable:
			t.Errorf("seed %d: exchange %s (non-durable) is back after recovery", s.seed, e.Name)
		case se.deleted:
			t.Errorf("seed %d: exchange %s is back after recovery, though its delete was answered", s.seed, e.Name)
		}
	}
	for name, se := range s.exchanges {
		if se.durable && se.declared && !se.deleting && !exs[name] {
			t.Errorf("seed %d: durable exchange %s (declare answered, never deleted) is gone after recovery", s.seed, name)
		}
	}
	have := map[string]bool{}
	for _, q := range b.Queues() {
		have[q.Name] = true
		sq := s.queues[s.cur[q.Name]]
		switch {
		case sq == nil:
			t.Errorf("seed %d: queue %s after recovery was never declared", s.seed, q.Name)
		case !sq.logged:
			t.Errorf("seed %d: queue %s (non-durable or exclusive) is back after recovery", s.seed, q.Name)
		case sq.deleted:
			t.Errorf("seed %d: queue %s is back after recovery, though its delete was answered", s.seed, q.Name)
		}
	}
	for _, key := range s.order {
		if sq := s.queues[key]; sq.logged && sq.declared && !sq.deleting && !have[sq.name] {
			t.Errorf("seed %d: durable queue %s (declare answered, never deleted) is gone after recovery", s.seed, key)
		}
	}
	bs := map[string]bool{}
	for _, x := range b.Bindings() {
		bs[x.Source+">"+x.Destination+" "+x.RoutingKey] = true
	}
	for k := range bs {
		src, rest, _ := strings.Cut(k, ">")
		dst, _, _ := strings.Cut(rest, " ")
		if !exs[src] || !have[dst] {
			t.Errorf("seed %d: binding %s after recovery: its ends are not both present", s.seed, k)
		}
		if s.bindings[k] == bindNone {
			t.Errorf("seed %d: binding %s after recovery was never made", s.seed, k)
		}
	}
	for k, v := range s.bindings {
		src, rest, _ := strings.Cut(k, ">")
		dst, _, _ := strings.Cut(rest, " ")
		if v == bindMade && exs[src] && s.exchanges[src].durable && have[dst] && !bs[k] {
			t.Errorf("seed %d: binding %s (durable ends, answered) is gone after recovery", s.seed, k)
		}
	}
}

// drain subscribes to every queue of the recovered node, expires what
// can expire (the clock an hour on), and returns what was delivered.
func (s *crashSim) drain(b *Broker) map[simCopy][]uint32 {
	t := s.t
	k := newSimSink()
	cons := map[queue.ConsumerID]string{}
	subscribed := map[string]bool{}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	settleAll := func() {
		for range 3 {
			for _, q := range b.topo.snapshotQueues() {
				if _, err := ask(ctx, q.shard, Command{Kind: CmdBarrier, Queue: q}); err != nil {
					t.Fatalf("seed %d: a barrier on %s after recovery: %v", s.seed, q.name, err)
				}
			}
		}
	}
	for round := range 3 {
		qs := b.topo.snapshotQueues()
		sort.Slice(qs, func(i, j int) bool { return qs[i].name < qs[j].name })
		for _, q := range qs {
			if subscribed[q.name] {
				continue
			}
			subscribed[q.name] = true
			id := b.NewConsumerID()
			cons[id] = s.cur[q.name]
			b.Submit(Command{Kind: CmdSubscribe, Queue: q, Sink: k, Spec: queue.ConsumerSpec{ID: id, Owner: 1000}, Req: 1})
		}
		settleAll()
		if round < 2 {
			s.now.Add(3_600_000)
			b.FireTimers()
			settleAll()
		}
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	for id, code := range k.subs {
		if code != wire.OK {
			t.Errorf("seed %d: subscribing to %s after recovery: %v", s.seed, cons[id], code)
		}
	}
	found := map[simCopy][]uint32{}
	for _, d := range k.got {
		c := simCopy{d.body, cons[d.consumer], d.path}
		found[c] = append(found[c], d.count)
		s.logf("after recovery: %.8q in %s (path %q) count %d", d.body, c.queue, c.path, d.count)
	}
	s.logf("recovered and drained: %d deliveries; dead letters dropped: %v", len(k.got), s.takeDrops())
	return found
}

// reach is the set of queues a message can be in: where it was routed,
// and the dead-letter targets of those, transitively.
func (s *crashSim) reach(m *simMsg) map[string]bool {
	out := map[string]bool{}
	todo := slices.Clone(m.queues)
	for len(todo) > 0 {
		q := todo[0]
		todo = todo[1:]
		if out[q] {
			continue
		}
		out[q] = true
		if sq := s.queues[q]; sq != nil && sq.dlx != "" {
			todo = append(todo, s.cur[sq.dlx])
		}
	}
	return out
}

// checkMessages checks the invariants on what the drain found.
func (s *crashSim) checkMessages(confirmed map[*PublishBatch]bool, found map[simCopy][]uint32) {
	t := s.t
	// Nothing invented: every copy delivered, before the crash or after,
	// is of a published message, in a queue it could reach, by a path of
	// queues it could reach.
	invented := func(c simCopy, when string) {
		m := s.msgs[c.body]
		if m == nil {
			t.Errorf("seed %d: %s: a message never published: %.16q in %s", s.seed, when, c.body, c.queue)
			return
		}
		r := s.reach(m)
		ok := r[c.queue]
		if c.path != "" {
			for _, q := range strings.Split(c.path, ",") {
				ok = ok && r[q] && q != c.queue
			}
		}
		if !ok {
			t.Errorf("seed %d: %s: %.16q in %s by way of %q, which it cannot reach (routed to %v)", s.seed, when, c.body, c.queue, c.path, m.queues)
		}
	}
	for c := range s.copies {
		invented(c, "before the crash")
	}
	for c, counts := range found {
		invented(c, "after recovery")
		s.st.found++
		if c.path != "" {
			s.st.dlFound++
		}
		if len(counts) > 1 && c.path == "" {
			// Published once, never dead-lettered: one copy, delivered once
			// to the drain's consumer (which settles nothing).
			t.Errorf("seed %d: %.16q in %s delivered %d times after recovery (delivery counts %v), want once", s.seed, c.body, c.queue, len(counts), counts)
		}
		st := s.copies[c]
		if st == nil {
			continue
		}
		if st.onDisk && (c.path == "" || s.clean) {
			t.Errorf("seed %d: %.16q in %s (path %q) came back after recovery, though its ack (or reject) was on disk (acked %v, rejected %v)",
				s.seed, c.body, c.queue, c.path, st.ackSent, st.rejected)
		}
		// Delivered before, it is back redelivered; a dead letter may be
		// back twice (see above), and once only as its new copy if the old
		// one was settled or removed since.
		redelivered := slices.ContainsFunc(counts, func(n uint32) bool { return n >= 2 })
		if st.delivered && s.queues[c.queue].logged && !redelivered && (c.path == "" || !s.mayBeGone(s.msgs[c.body], c, st)) {
			t.Errorf("seed %d: %.16q in %s (path %q) was delivered before the crash and after it with delivery counts %v, want one at least 2 (redelivered)",
				s.seed, c.body, c.queue, c.path, counts)
		}
	}
	for _, st := range s.copies {
		if st.onDisk {
			s.st.ackedOnDisk++
		}
	}
	for _, sq := range s.queues {
		if sq.deleted {
			s.st.deletedSeen++
		}
	}
	// Every confirmed persistent copy in a durable queue is accounted for.
	bodies := make([]string, 0, len(s.msgs))
	for body := range s.msgs {
		bodies = append(bodies, body)
	}
	sort.Strings(bodies)
	for _, body := range bodies {
		m := s.msgs[body]
		if !m.persistent || !confirmed[m.batch] || m.batch.Codes[m.idx] != 0 {
			continue
		}
		for _, qn := range m.queues {
			if !s.queues[qn].logged {
				continue
			}
			s.st.confirmed++
			if why := s.accounted(m, simCopy{body, qn, ""}, found); why != "" {
				t.Errorf("seed %d: confirmed persistent message %.16q routed to %s: %s", s.seed, body, qn, why)
			}
		}
	}
}

// mayDie reports whether copy c of m may have left its queue by a cause
// that dead-letters it (or drops it, without a dead-letter exchange).
func (s *crashSim) mayDie(m *simMsg, c simCopy, st *simCopyState) bool {
	sq := s.queues[c.queue]
	return st.rejected || sq.ttl || sq.dropsHead || sq.dlimit || m.expires && c.path == ""
}

// mayBeGone reports whether copy c of m may have left its queue at all:
// acked, its queue deleted or purged, or a cause that dead-letters it.
func (s *crashSim) mayBeGone(m *simMsg, c simCopy, st *simCopyState) bool {
	sq := s.queues[c.queue]
	return st.ackSent || sq.deleting || sq.purgedAt >= m.seq || s.mayDie(m, c, st)
}

// accounted says why copy c of m is missing unaccounted for ("" if it
// is accounted for): found after recovery, acked, its queue deleted or
// purged, or removed by a cause that dead-letters it, to a durable queue
// where its dead letter is accounted for in turn.
func (s *crashSim) accounted(m *simMsg, c simCopy, found map[simCopy][]uint32) string {
	if _, ok := found[c]; ok {
		return ""
	}
	st := s.copies[c]
	if st == nil {
		st = &simCopyState{}
	}
	sq := s.queues[c.queue]
	switch {
	case st.ackSent, sq.deleting, sq.purgedAt >= m.seq:
		return ""
	}
	if !s.mayDie(m, c, st) {
		return fmt.Sprintf("lost from %s (path %q): not delivered after recovery, never acked, nothing could remove it (delivered before the crash: %v)",
			c.queue, c.path, st.delivered)
	}
	if sq.dlx == "" || !s.queues[sq.dlx].logged {
		return "" // dropped, or dead-lettered to a non-durable queue
	}
	next := simCopy{c.body, sq.dlx, addToPath(c.path, c.queue)}
	if tq := s.queues[sq.dlx]; tq.deleting || tq.rejects {
		return "" // a dead letter to a deleted or full (reject-publish) queue is dropped
	}
	if why := s.accounted(m, next, found); why != "" {
		return fmt.Sprintf("gone from %s (path %q; it may have been dead-lettered: rejected %v, queue ttl %v, drop-head %v, delivery-limit %v, message ttl %v), and its dead letter: %s",
			c.queue, c.path, st.rejected, sq.ttl, sq.dropsHead, sq.dlimit, m.expires, why)
	}
	return ""
}
