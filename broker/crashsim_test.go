package broker

import (
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/warren-mq/warren/queue"
	"github.com/warren-mq/warren/segment"
	"github.com/warren-mq/warren/wire"
)

// The node-wide crash simulation (issue 13, "Show": crash simulation;
// design/replication.md §7, the single-node crash simulation): a real
// Broker with durable queues and a logged topology over one segment.Log on
// a MemFS, driven by a seeded random workload, crashed at a random sync
// point (an injected fsync or write failure, or a power cut while writes
// are in flight, torn writes included) or stopped cleanly, and recovered
// into a new Broker from what survived. One seed in three crashes again
// in or right after that recovery (recrash: one of its first 24 fsyncs
// failing, or a power cut once recovered) before the last recovery. The
// invariants are checked on what the recovered broker delivers when
// every queue is drained.
//
// A failing seed prints itself and its trace; rerun it alone with
//
//	go test ./broker -run TestCrashSim -crashsim.seed=N -v
//
// The workload, the crash point (which step, which fsync from there) and
// the torn bytes are functions of the seed; how the broker's goroutines
// interleave is not (how many rounds a write takes, so which fsync a
// number names, can vary), so a single seed runs crashsim.repeat times
// and stops at its first failure. make soak-crash runs 100,000 seeds.
var (
	crashSimSeed   = flag.Int64("crashsim.seed", -1, "TestCrashSim: run only this seed (crashsim.repeat times, the trace printed with -v)")
	crashSimRepeat = flag.Int("crashsim.repeat", 100, "TestCrashSim: runs of the one seed crashsim.seed names")
	crashSimSeeds  = flag.Int("crashsim.seeds", 0, "TestCrashSim: seeds 1..N (0: 1,000, or 50 under -race)")
)

// Dead letters between durable queues are at-least-once (issue 13, Build
// item 9): a confirmed persistent message that left its durable queue by a
// dead-lettering cause (rejected, expired, over max-length, over the
// delivery limit) must be in the durable queue it was dead-lettered to, or
// accounted for there. After a crash a dead letter may be there twice: the
// source holds it until the target has it on disk, and sends it again if
// the crash took its record of that (its SettleDeadLetter entry); so a
// dead letter whose ack reached the target's disk may come back after a
// crash, with a delivery count of 1, and must not after a clean restart.

func TestCrashSim(t *testing.T) {
	if *crashSimSeed >= 0 {
		for i := range max(*crashSimRepeat, 1) {
			st := runCrashSim(t, uint64(*crashSimSeed), i == 0 && testing.Verbose())
			if t.Failed() {
				t.Logf("seed %d failed on run %d", *crashSimSeed, i+1)
				return
			}
			if i == 0 {
				t.Logf("seed %d: %s", *crashSimSeed, &st)
			}
		}
		return
	}
	seeds := *crashSimSeeds
	if seeds == 0 {
		seeds = 1000
		if raceEnabled {
			seeds = 50
		}
	}
	start := time.Now()
	var tot crashSimStats
	for seed := 1; seed <= seeds; seed++ {
		st := runCrashSim(t, uint64(seed), false)
		if t.Failed() {
			return
		}
		tot.add(st)
	}
	el := time.Since(start)
	t.Logf("%d seeds in %v (%.0f seeds/s): %s", seeds, el.Round(time.Millisecond), float64(seeds)/el.Seconds(), &tot)
}

// crashSimStats counts what the seeds exercised, so a run shows that the
// crashes hit something.
type crashSimStats struct {
	seeds, clean, failSync, powerCut, torn   int
	confirmed, ackedOnDisk, found, dlFound   int
	deletedSeen, snapshotsOnDisk, redeclared int
	segmentFiles                             int // seeds whose crash left a segment file (WAL moved)
	recrashes                                int // seeds crashed a second time, in or right after the recovery (recrash)
	recrashFailed                            int // of those, recoveries stopped by their failed fsync
}

func (a *crashSimStats) add(b crashSimStats) {
	a.seeds += b.seeds
	a.clean += b.clean
	a.failSync += b.failSync
	a.powerCut += b.powerCut
	a.torn += b.torn
	a.confirmed += b.confirmed
	a.ackedOnDisk += b.ackedOnDisk
	a.found += b.found
	a.dlFound += b.dlFound
	a.deletedSeen += b.deletedSeen
	a.snapshotsOnDisk += b.snapshotsOnDisk
	a.redeclared += b.redeclared
	a.segmentFiles += b.segmentFiles
	a.recrashes += b.recrashes
	a.recrashFailed += b.recrashFailed
}

func (a *crashSimStats) String() string {
	return fmt.Sprintf("clean restarts %d, crashes by a failed fsync or write %d, by a power cut %d (torn %d); confirmed persistent copies in durable queues %d, "+
		"acks and rejects on disk %d, copies delivered after recovery %d (dead letters %d), queues deleted %d (names declared again %d), seeds with a queue snapshot %d, with segment files %d, crashed again in or right after the recovery %d (%d of them stopped by a failed fsync)",
		a.clean, a.failSync, a.powerCut, a.torn, a.confirmed, a.ackedOnDisk, a.found, a.dlFound, a.deletedSeen, a.redeclared, a.snapshotsOnDisk, a.segmentFiles, a.recrashes, a.recrashFailed)
}

// crashSim is one seed's run.
type crashSim struct {
	t     *testing.T
	seed  uint64
	rng   *rand.Rand
	now   atomic.Int64
	mem   *segment.MemFS
	n     *durNode
	sink  *simSink
	ctx   context.Context // cancelled when the node reports a failed write (Fatal)
	stop  context.CancelFunc
	trace []string
	print bool

	// fatal is the first failure the node reported (Fatal); armed says a
	// failure was injected. One not injected is a bug the sim reports:
	// otherwise its cancelled context ends the barriers early, and the
	// checks after a clean stop count settles as on disk that never were.
	fatal     atomic.Pointer[error]
	armed     bool
	fatalSeen bool // reported

	queues    map[string]*simQueue // by key (simQueue.key)
	cur       map[string]string    // a queue name → the key of its latest declaration
	order     []string             // queue keys in declaration order
	msgs      map[string]*simMsg
	nmsgs     int
	copies    map[simCopy]*simCopyState
	consumers map[queue.ConsumerID]*simConsumer
	seen      int // deliveries of sink.got taken into outstanding
	open      []int
	pendAcks  map[string][]simCopy // acks submitted since the queue's last barrier
	req       uint64
	bindings  map[string]simBind // "src>dst key" → what is known of it
	exchanges map[string]*simExchange
	nex       int // late exchanges declared
	st        crashSimStats
	dlDrops   [NumDLDrops]atomic.Int64 // dead letters dropped, by reason (both nodes)
	segOpts   segment.Options
	clean     bool // the node was stopped cleanly, not crashed
}

func (s *crashSim) logf(format string, args ...any) {
	line := fmt.Sprintf("t=%d ", s.now.Load()) + fmt.Sprintf(format, args...)
	s.trace = append(s.trace, line)
	if s.print {
		s.t.Log(line)
	}
}

// runCrashSim runs one seed; a failure reports the seed and its trace.
func runCrashSim(t *testing.T, seed uint64, print bool) crashSimStats {
	s := &crashSim{t: t, seed: seed, rng: rand.New(rand.NewPCG(seed, 0x13)), mem: segment.NewMemFS(), print: print,
		queues: map[string]*simQueue{}, cur: map[string]string{}, msgs: map[string]*simMsg{}, copies: map[simCopy]*simCopyState{},
		consumers: map[queue.ConsumerID]*simConsumer{}, pendAcks: map[string][]simCopy{}, bindings: map[string]simBind{},
		exchanges: map[string]*simExchange{}}
	s.st.seeds = 1
	s.now.Store(1_000_000)
	defer func() {
		if t.Failed() {
			if !print {
				t.Logf("trace of seed %d:\n%s", seed, strings.Join(s.trace, "\n"))
			}
			t.Logf("crashsim: seed %d failed; reproduce with: go test ./broker -run TestCrashSim -crashsim.seed=%d -v", seed, seed)
		}
	}()
	s.ctx, s.stop = context.WithCancel(context.Background())
	defer s.stop()
	if s.rng.IntN(2) == 0 {
		// Small files: WAL rotations, moves into segment files and their
		// compactions happen within the workload, and get crashed too.
		s.segOpts = segment.Options{WALSize: int64(2<<10 + s.rng.IntN(14<<10)), SegmentSize: int64(1<<10 + s.rng.IntN(8<<10))}
		s.logf("segment files: WAL %d bytes, segments %d bytes", s.segOpts.WALSize, s.segOpts.SegmentSize)
	}
	s.n = openDurNodeOpts(t, s.mem, "/data", s.segOpts, s.tweak(true))
	s.sink = newSimSink()
	s.setup()

	steps := 20 + s.rng.IntN(100)
	crashAt := s.rng.IntN(steps + 1)
	// 1 in 10: a clean stop and restart; else half a failed fsync, half a
	// power cut.
	mode := s.rng.IntN(10)
	clean, failSync := mode == 0, mode > 5
	torn := 0
	if s.rng.IntN(2) == 0 {
		torn = 1 + s.rng.IntN(700)
	}
	for i := 0; i < steps && s.ctx.Err() == nil; i++ {
		if i == crashAt {
			if !failSync {
				break // a power cut (or a stop) now, with what the last steps left in flight
			}
			k := 1 + s.rng.IntN(4)
			if s.rng.IntN(4) == 0 {
				s.armed = true
				s.logf("arm: the %d-th write from now fails", k)
				s.mem.FailWrite(k)
			} else {
				s.armed = true
				s.logf("arm: the %d-th fsync from now fails", k)
				s.mem.FailSync(k)
			}
		}
		s.step()
	}
	if failSync && s.ctx.Err() == nil && crashAt < steps {
		s.barrierAll() // writes something, so the armed failure happens
	}
	switch {
	case clean:
		s.st.clean++
		s.clean = true
		torn = 0
	case s.ctx.Err() != nil:
		s.st.failSync++
	default:
		s.st.powerCut++
	}
	if torn > 0 {
		s.st.torn++
	}
	s.crashAndCheck(clean, torn)
	return s.st
}

// checkFatal reports a failure of the node that the sim did not inject.
func (s *crashSim) checkFatal(when string) {
	s.t.Helper()
	if p := s.fatal.Load(); p != nil && !s.armed && !s.fatalSeen {
		s.fatalSeen = true
		s.t.Errorf("seed %d: %s: the node stopped on a failure the sim did not inject: %v", s.seed, when, *p)
	}
}

// tweak gives a node the simulation's clock, manual timers and Fatal.
func (s *crashSim) tweak(first bool) func(*Config, *MetaLogConfig) {
	return func(c *Config, m *MetaLogConfig) {
		c.Clock = s.now.Load
		c.ManualTicks = true
		c.DeadLetterDropped = func(r DLDrop) { s.dlDrops[r].Add(1) }
		if first {
			fatal := func(err error) {
				s.fatal.CompareAndSwap(nil, &err)
				s.stop()
			}
			c.Durable.Fatal = fatal
			m.Fatal = fatal
		}
	}
}

func (s *crashSim) must(err error) {
	s.t.Helper()
	if err != nil {
		s.t.Fatalf("seed %d: setup: %v", s.seed, err)
	}
}

// setup declares the topology in one control run: durable exchanges dx
// (direct) and dlx (direct, the dead-letter exchange, keyed by target
// queue name), the non-durable fanout tx; durable queues d0.. with random
// TTLs, max-lengths, priorities, delivery limits and dead-letter targets
// (later d's, dl0, dl1, or the non-durable tdl: the dead-letter graph has
// no cycle), a non-durable t0 and an exclusive durable ex0 (owned by
// connection 3).
func (s *crashSim) setup() {
	b := s.n.b
	r := s.rng
	b.BeginControlRun()
	s.must(b.DeclareExchangeAs(&wire.ExchangeDeclare{Name: "dx", Kind: wire.ExchangeDirect, Durable: true}, "u"))
	s.must(b.DeclareExchangeAs(&wire.ExchangeDeclare{Name: "dlx", Kind: wire.ExchangeDirect, Durable: true}, "u"))
	s.must(b.DeclareExchangeAs(&wire.ExchangeDeclare{Name: "tx", Kind: wire.ExchangeFanout}, "u"))
	s.exchanges["dx"] = &simExchange{durable: true, declared: true}
	s.exchanges["dlx"] = &simExchange{durable: true, declared: true}
	s.exchanges["tx"] = &simExchange{declared: true}
	nd := 2 + r.IntN(3)
	var names []string
	for i := range nd {
		names = append(names, fmt.Sprintf("d%d", i))
	}
	targets := func(i int) []string {
		out := []string{"dl0", "dl1", "tdl"}
		for j := i + 1; j < nd; j++ {
			out = append(out, names[j])
		}
		return out
	}
	declare := func(name string, durable, exclusive bool, args wire.Table, sq *simQueue) {
		owner := uint64(0)
		if exclusive {
			owner = 3
		}
		_, err := b.DeclareQueueAs(&wire.QueueDeclare{Name: name, Durable: durable, Exclusive: exclusive, Args: args}, owner, "u")
		s.must(err)
		sq.name, sq.key, sq.logged, sq.exclusive, sq.purgedAt = name, name, durable && !exclusive, exclusive, -1
		s.queues[name] = sq
		s.cur[name] = name
		s.order = append(s.order, name)
	}
	randomArgs := func(sq *simQueue, dlTargets []string, dlChance int) wire.Table {
		var args wire.Table
		if r.IntN(4) == 0 {
			sq.ttl = true
			args = append(args, wire.Field{Key: "message-ttl", Value: wire.Int(int64(200 + r.IntN(3000)))})
		}
		if r.IntN(4) == 0 {
			args = append(args, wire.Field{Key: "max-length", Value: wire.Int(int64(2 + r.IntN(5)))})
			if r.IntN(4) == 0 {
				args = append(args, wire.Field{Key: "overflow", Value: wire.String("reject-publish")})
				sq.rejects = true
			} else {
				sq.dropsHead = true
			}
		}
		if r.IntN(4) == 0 {
			args = append(args, wire.Field{Key: "max-priority", Value: wire.Int(5)})
		}
		if r.IntN(6) == 0 {
			sq.dlimit = true
			args = append(args, wire.Field{Key: "delivery-limit", Value: wire.Int(int64(1 + r.IntN(3)))})
		}
		if len(dlTargets) > 0 && r.IntN(100) < dlChance {
			sq.dlx = dlTargets[r.IntN(len(dlTargets))]
			args = append(args, wire.Field{Key: "dead-letter-exchange", Value: wire.String("dlx")},
				wire.Field{Key: "dead-letter-routing-key", Value: wire.String(sq.dlx)})
		}
		return args
	}
	for i, name := range names {
		sq := &simQueue{}
		declare(name, true, false, randomArgs(sq, targets(i), 70), sq)
	}
	for _, name := range []string{"dl0", "dl1"} {
		sq := &simQueue{}
		declare(name, true, false, randomArgs(sq, nil, 0), sq)
	}
	declare("tdl", false, false, nil, &simQueue{})
	t0 := &simQueue{}
	declare("t0", false, false, randomArgs(t0, []string{"dl0"}, 50), t0)
	declare("ex0", true, true, nil, &simQueue{})
	who := Requester{User: "u", Conn: 3}
	bind := func(src, dst, key string) {
		s.must(b.BindAs(&wire.Bind{Source: src, Destination: dst, RoutingKey: key}, who))
		s.bindings[src+">"+dst+" "+key] = bindMade
	}
	for _, name := range s.order {
		bind("dx", name, name)
		bind("dlx", name, name)
		if r.IntN(3) == 0 {
			bind("dx", name, "all")
		}
	}
	bind("tx", "d0", "")
	bind("tx", "t0", "")
	s.must(b.EndControlRun(0))
	for _, name := range s.order {
		s.queues[name].declared = true
		sq := s.queues[name]
		s.logf("declared %s logged=%v ttl=%v drop-head=%v reject-publish=%v delivery-limit=%v dlx=%q", name, sq.logged, sq.ttl, sq.dropsHead, sq.rejects, sq.dlimit, sq.dlx)
	}
}

// live lists the queues declared and not (being) deleted.
func (s *crashSim) live() []*simQueue {
	var out []*simQueue
	for _, name := range s.order {
		if sq := s.queues[name]; sq.declared && !sq.deleting {
			out = append(out, sq)
		}
	}
	return out
}

// step runs one random step of the workload.
func (s *crashSim) step() {
	s.absorb()
	switch r := s.rng.IntN(100); {
	case r < 30:
		s.publish()
	case r < 40:
		s.subscribe()
	case r < 70:
		s.settle()
	case r < 73:
		s.cancel()
	case r < 75:
		s.down()
	case r < 84:
		s.advance()
	case r < 86:
		s.purge()
	case r < 89:
		s.deleteQueue()
	case r < 92:
		s.declareLate()
	case r < 93:
		s.declareExchange()
	case r < 94:
		s.deleteExchange()
	default:
		s.barrierAll()
	}
}

// wait waits until cond holds under the sink's lock; false if the node
// failed meanwhile (the crash).
func (s *crashSim) wait(what string, cond func() bool) bool {
	s.t.Helper()
	deadline := time.NewTimer(20 * time.Second)
	defer deadline.Stop()
	for {
		s.sink.mu.Lock()
		ok := cond()
		s.sink.mu.Unlock()
		if ok {
			return true
		}
		select {
		case <-s.sink.changed:
		case <-s.ctx.Done():
			return false
		case <-deadline.C:
			s.t.Fatalf("seed %d: timed out waiting for %s (no failure injected)", s.seed, what)
		}
	}
}

// barrierQ waits until everything submitted to q before it is done (a
// logged queue: applied from its log, so on disk); false if the node
// failed meanwhile.
func (s *crashSim) barrierQ(sq *simQueue) bool {
	s.t.Helper()
	q := s.n.b.topo.lookupQueue(sq.name)
	if q == nil {
		return true
	}
	ctx, cancel := context.WithTimeout(s.ctx, 20*time.Second)
	defer cancel()
	c := Command{Kind: CmdBarrier}
	if sq.logged {
		c.Queue = q
	}
	if _, err := ask(ctx, q.shard, c); err != nil {
		if s.ctx.Err() != nil {
			return false
		}
		s.t.Fatalf("seed %d: a barrier on %s was not answered: %v", s.seed, sq.name, err)
	}
	if sq.logged {
		for _, c := range s.pendAcks[sq.key] {
			s.copies[c].onDisk = true
		}
		delete(s.pendAcks, sq.key)
	}
	return true
}

// barrierAll barriers every live queue twice (the second pass covers
// the dead letters the first caused).
func (s *crashSim) barrierAll() {
	s.logf("barrier all")
	for range 2 {
		for _, sq := range s.live() {
			if !s.barrierQ(sq) {
				return
			}
		}
	}
}

func (s *crashSim) copyState(c simCopy) *simCopyState {
	st := s.copies[c]
	if st == nil {
		st = &simCopyState{}
		s.copies[c] = st
	}
	return st
}

// absorb takes the deliveries made since the last step: each is
// outstanding until settled or returned.
func (s *crashSim) absorb() {
	s.sink.mu.Lock()
	got := s.sink.got[s.seen:]
	s.sink.mu.Unlock()
	for i, d := range got {
		c := s.consumers[d.consumer]
		if c == nil {
			s.t.Fatalf("seed %d: a delivery to consumer %d, which the simulation never made", s.seed, d.consumer)
		}
		s.copyState(simCopy{d.body, c.queue, d.path}).delivered = true
		if c.alive {
			s.open = append(s.open, s.seen+i)
		}
	}
	s.seen += len(got)
}

func (s *crashSim) delivery(i int) simDelivery {
	s.sink.mu.Lock()
	defer s.sink.mu.Unlock()
	return s.sink.got[i]
}
