package broker

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"slices"
	"sort"
	"strings"
	"sync"
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
// into a new Broker from what survived. The invariants are checked on
// what the recovered broker delivers when every queue is drained.
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
}

func (a *crashSimStats) String() string {
	return fmt.Sprintf("clean restarts %d, crashes by a failed fsync or write %d, by a power cut %d (torn %d); confirmed persistent copies in durable queues %d, "+
		"acks and rejects on disk %d, copies delivered after recovery %d (dead letters %d), queues deleted %d (names declared again %d), seeds with a queue snapshot %d, with segment files %d",
		a.clean, a.failSync, a.powerCut, a.torn, a.confirmed, a.ackedOnDisk, a.found, a.dlFound, a.deletedSeen, a.redeclared, a.snapshotsOnDisk, a.segmentFiles)
}

// simQueue is the simulation's record of a queue it declared.
type simQueue struct {
	name      string // the broker's name for it
	key       string // the simulation's: its name, then name~N for the N-th redeclare after a delete
	logged    bool   // durable and not exclusive: a raft group, survives a crash
	exclusive bool
	ttl       bool   // message-ttl: its messages expire
	dropsHead bool   // max-length with drop-head: it drops (dead-letters) its oldest
	dlimit    bool   // delivery-limit: a requeued message may be dead-lettered
	rejects   bool   // max-length with reject-publish: a dead letter may be refused
	dlx       string // the queue its dead letters go to ("": none)
	declared  bool   // its declare was answered (a logged one is on disk)
	deleting  bool   // a delete was submitted
	deleted   bool   // ... and answered (on disk)
	purgedAt  int    // the publish counter when a purge was last submitted (-1: never)
}

// simExchange is the simulation's record of an exchange it declared.
type simExchange struct {
	durable           bool
	declared          bool // answered (a durable one is on disk)
	deleting, deleted bool // a delete was submitted; answered
}

// simBind is what the simulation knows of a binding.
type simBind uint8

const (
	bindNone  simBind = iota // never made
	bindMade                 // its bind was answered, and no end of it was deleted since
	bindMaybe                // its bind was not answered, or an end's delete was submitted
)

// simMsg is one published message (bodies are unique).
type simMsg struct {
	seq        int
	persistent bool
	expires    bool     // a per-message TTL
	queues     []string // where it was routed
	batch      *PublishBatch
	idx        int
}

// simCopy names one copy of a message: its body, the queue it is in, and
// the queues it died in on the way there (dead letters), sorted.
type simCopy struct{ body, queue, path string }

type simCopyState struct {
	delivered bool // delivered before the crash
	ackSent   bool // an ack was submitted
	rejected  bool // a reject was submitted
	onDisk    bool // an ack or reject, and a barrier on its queue answered after it
}

type simDelivery struct {
	consumer queue.ConsumerID
	qtag     uint64
	body     string
	path     string
	count    uint32
}

type simConsumer struct {
	queue string
	owner uint64
	alive bool
}

// simSink is where the simulation's publishes, consumers and requests
// report.
type simSink struct {
	mu        sync.Mutex
	frozen    bool
	confirmed map[*PublishBatch]bool
	got       []simDelivery
	subs      map[queue.ConsumerID]wire.Code
	answers   map[uint64]Result
	changed   chan struct{}
}

func newSimSink() *simSink {
	return &simSink{confirmed: map[*PublishBatch]bool{}, subs: map[queue.ConsumerID]wire.Code{}, answers: map[uint64]Result{},
		changed: make(chan struct{}, 1)}
}

func (k *simSink) poke() {
	select {
	case k.changed <- struct{}{}:
	default:
	}
}

func (k *simSink) Deliver(ds []Delivery) {
	k.mu.Lock()
	if !k.frozen {
		for _, d := range ds {
			k.got = append(k.got, simDelivery{consumer: d.Consumer, qtag: d.QTag, body: string(d.Msg.Body()), path: deathPath(d.Msg.Props()), count: d.DeliveryCount})
		}
	}
	k.mu.Unlock()
	k.poke()
}

func (k *simSink) Confirm(b *PublishBatch) {
	k.mu.Lock()
	if !k.frozen {
		k.confirmed[b] = true
	}
	k.mu.Unlock()
	k.poke()
}

func (k *simSink) Subscribed(id queue.ConsumerID, _ uint32, code wire.Code, _ string) {
	k.mu.Lock()
	k.subs[id] = code
	k.mu.Unlock()
	k.poke()
}

func (k *simSink) Answer(req uint64, r Result) {
	k.mu.Lock()
	k.answers[req] = r
	k.mu.Unlock()
	k.poke()
}
func (*simSink) Cancelled(queue.ConsumerID, wire.Code, string) {}
func (*simSink) LeaseExpired(queue.ConsumerID, uint64)         {}
func (*simSink) ConsumerGone(queue.ConsumerID)                 {}

// deathPath is the sorted set of queues a message's death history names.
func deathPath(props []byte) string {
	var p wire.Properties
	if err := wire.ParseProperties(props, &p); err != nil || !p.Has(wire.PropDeaths) {
		return ""
	}
	ds, err := wire.DecodeDeaths(p.Deaths)
	if err != nil {
		return "?"
	}
	var qs []string
	for _, d := range ds {
		qs = append(qs, d.Queue)
	}
	sort.Strings(qs)
	return strings.Join(slices.Compact(qs), ",")
}

func addToPath(path, q string) string {
	qs := []string{q}
	if path != "" {
		qs = append(qs, strings.Split(path, ",")...)
	}
	sort.Strings(qs)
	return strings.Join(slices.Compact(qs), ",")
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
	s.must(b.EndControlRun())
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

// publish publishes 1-3 messages through dx (one queue's key, or "all")
// or tx, persistent or transient, some with a per-message TTL, and maybe
// waits for the confirm.
func (s *crashSim) publish() {
	r := s.rng
	b := s.n.b
	ex, key := "dx", "all"
	switch x := r.IntN(10); {
	case x < 1:
		ex, key = "tx", ""
	case x < 2:
		if lx := s.liveExchanges(); len(lx) > 0 {
			ex, key = lx[r.IntN(len(lx))], ""
		}
	case x < 8:
		if qs := s.live(); len(qs) > 0 {
			key = qs[r.IntN(len(qs))].name
		}
	}
	view := b.View()
	refs, _ := view.Table.Route(nil, ex, []byte(key), nil)
	var qs []*Queue
	for _, ref := range refs {
		if q := view.Queue(ref); q != nil {
			qs = append(qs, q)
		}
	}
	n := 1 + r.IntN(3)
	persistent := r.IntN(4) != 0
	var p wire.Properties
	expires := r.IntN(6) == 0
	if expires {
		p.ExpirationMs = uint32(100 + r.IntN(2000))
		p.Set(wire.PropExpiration)
	}
	props := wire.AppendProperties(nil, &p)[2:]
	prio := uint8(r.IntN(6))
	pad := 0
	if r.IntN(5) == 0 {
		pad = r.IntN(3000)
	}
	if len(qs) == 0 {
		s.logf("publish via %s %q: routed nowhere", ex, key)
		return
	}
	var fl wire.MessageFlags
	if persistent {
		fl = wire.Persistent
	}
	ar := &Arena{}
	ar.Refs.Store(int64(n * len(qs)))
	batch := &PublishBatch{Sink: s.sink, Codes: make([]uint32, n)}
	msgs := make([]*StoredMsg, n)
	var names []string
	for _, q := range qs {
		names = append(names, s.cur[q.name])
	}
	var bodies []string
	for i := range n {
		s.nmsgs++
		body := fmt.Sprintf("m%d.", s.nmsgs) + strings.Repeat(".", pad)
		bodies = append(bodies, body[:min(len(body), 8)])
		msgs[i] = ar.add([]byte(ex), []byte(key), props, []byte(body), fl, prio)
		ar.Cost += int64(len(body)+len(props)) + StoredMsgOverhead
		s.msgs[body] = &simMsg{seq: s.nmsgs, persistent: persistent, expires: expires, queues: names, batch: batch, idx: i}
	}
	b.AddStoredBytes(ar.Cost)
	// One part per shard, its items grouped by queue.
	parts := make([][]EnqItem, len(b.shards))
	for _, q := range qs {
		for i, m := range msgs {
			meta := queue.Message{Size: uint32(len(m.Body())), Priority: prio, ExpirationMs: p.ExpirationMs, HasExpiration: expires}
			parts[q.shardIdx] = append(parts[q.shardIdx], EnqItem{Q: q, Msg: m, Meta: meta, Idx: i})
		}
	}
	pending := int32(1)
	for _, part := range parts {
		if len(part) > 0 {
			pending++
		}
	}
	batch.Pending.Store(pending)
	for _, part := range parts {
		if len(part) > 0 {
			b.Submit(Command{Kind: CmdPublish, Items: part, Batch: batch})
		}
	}
	batch.PartDone()
	wait := r.IntN(2) == 0
	s.logf("publish %v via %s %q to %v persistent=%v ttl=%v prio=%d wait=%v", bodies, ex, key, names, persistent, expires, prio, wait)
	if wait {
		s.wait("a confirm", func() bool { return s.sink.confirmed[batch] })
	}
}

// subscribe adds a consumer (prefetch 1-4) to a live queue.
func (s *crashSim) subscribe() {
	qs := s.live()
	if len(qs) == 0 {
		return
	}
	sq := qs[s.rng.IntN(len(qs))]
	q := s.n.b.topo.lookupQueue(sq.name)
	if q == nil {
		return
	}
	id := s.n.b.NewConsumerID()
	owner := uint64(1 + s.rng.IntN(3))
	s.consumers[id] = &simConsumer{queue: sq.key, owner: owner, alive: true}
	prefetch := uint32(1 + s.rng.IntN(4))
	s.n.b.Submit(Command{Kind: CmdSubscribe, Queue: q, Sink: s.sink, Spec: queue.ConsumerSpec{ID: id, Owner: queue.OwnerID(owner), Prefetch: prefetch}, Req: 1})
	s.logf("subscribe c%d to %s owner %d prefetch %d", id, sq.name, owner, prefetch)
	s.wait("a subscribe's answer", func() bool { _, ok := s.sink.subs[id]; return ok })
	s.absorb()
}

// settle acks, requeues or rejects an outstanding delivery, and maybe
// waits for its queue's barrier (an ack on disk).
func (s *crashSim) settle() {
	// Deliveries of consumers gone since are not outstanding.
	kept := s.open[:0]
	for _, i := range s.open {
		if s.consumers[s.delivery(i).consumer].alive {
			kept = append(kept, i)
		}
	}
	s.open = kept
	if len(s.open) == 0 {
		return
	}
	k := s.rng.IntN(len(s.open))
	d := s.delivery(s.open[k])
	s.open = slices.Delete(s.open, k, k+1)
	c := s.consumers[d.consumer]
	sq := s.queues[c.queue]
	if sq.deleting {
		return
	}
	q := s.n.b.topo.lookupQueue(sq.name)
	if q == nil {
		return
	}
	op := wire.SettleAck
	switch x := s.rng.IntN(10); {
	case x < 2:
		op = wire.SettleRequeue
	case x < 4:
		op = wire.SettleReject
	}
	key := simCopy{d.body, c.queue, d.path}
	st := s.copyState(key)
	switch op {
	case wire.SettleAck:
		st.ackSent = true
		s.pendAcks[c.queue] = append(s.pendAcks[c.queue], key)
	case wire.SettleReject:
		st.rejected = true
		s.pendAcks[c.queue] = append(s.pendAcks[c.queue], key)
	}
	s.n.b.Submit(Command{Kind: CmdSettle, Settles: []SettleItem{{Q: q, Consumer: d.consumer, Op: op, QTag: d.qtag}}})
	wait := s.rng.IntN(2) == 0
	s.logf("%v %q (path %q) in %s by c%d tag %d (count %d) wait=%v", op, d.body[:min(len(d.body), 8)], d.path, c.queue, d.consumer, d.qtag, d.count, wait)
	if wait {
		s.barrierQ(sq)
	}
}

// cancel cancels a live consumer (its deliveries requeued).
func (s *crashSim) cancel() {
	var ids []queue.ConsumerID
	for id, c := range s.consumers {
		if c.alive {
			ids = append(ids, id)
		}
	}
	if len(ids) == 0 {
		return
	}
	slices.Sort(ids)
	id := ids[s.rng.IntN(len(ids))]
	c := s.consumers[id]
	c.alive = false
	if sq := s.queues[c.queue]; sq.deleting {
		// Gone with its queue (a queue of that name now is another).
	} else if q := s.n.b.topo.lookupQueue(sq.name); q != nil {
		s.n.b.Submit(Command{Kind: CmdCancel, Queue: q, Consumer: id, Requeue: true})
	}
	s.logf("cancel c%d on %s", id, c.queue)
}

// down closes a connection: its consumers' deliveries go back, its
// exclusive queue goes.
func (s *crashSim) down() {
	owner := uint64(1 + s.rng.IntN(3))
	for _, c := range s.consumers {
		if c.owner == owner {
			c.alive = false
		}
	}
	if owner == 3 {
		if sq := s.queues["ex0"]; sq != nil && !sq.deleting {
			sq.deleting = true
			s.unsureOf("ex0")
		}
	}
	s.n.b.Submit(Command{Kind: CmdDown, Owner: owner})
	s.logf("down connection %d", owner)
}

// advance moves the clock and fires the timers (TTLs, snapshots' idle
// rule after 5 s).
func (s *crashSim) advance() {
	d := int64(1 + s.rng.IntN(2500))
	if s.rng.IntN(5) == 0 {
		d = 5000 + int64(s.rng.IntN(2000))
	}
	s.now.Add(d)
	s.n.b.FireTimers()
	s.logf("advance %d ms, fire timers", d)
	if s.rng.IntN(2) == 0 {
		s.barrierAll()
	}
}

func (s *crashSim) randomLive() *simQueue {
	qs := s.live()
	if len(qs) == 0 {
		return nil
	}
	return qs[s.rng.IntN(len(qs))]
}

func (s *crashSim) purge() {
	sq := s.randomLive()
	if sq == nil {
		return
	}
	q := s.n.b.topo.lookupQueue(sq.name)
	if q == nil {
		return
	}
	sq.purgedAt = s.nmsgs
	s.req++
	req := s.req
	s.n.b.Submit(Command{Kind: CmdPurge, Queue: q, Sink: s.sink, Req: req})
	s.logf("purge %s", sq.name)
	s.wait("a purge's answer", func() bool { _, ok := s.sink.answers[req]; return ok })
}

func (s *crashSim) deleteQueue() {
	sq := s.randomLive()
	if sq == nil {
		return
	}
	if s.rng.IntN(2) == 0 {
		// Late queues first: their names are declared again.
		for _, l := range s.live() {
			if strings.HasPrefix(l.name, "late") {
				sq = l
				break
			}
		}
	}
	sq.deleting = true
	s.unsureOf(sq.name)
	s.logf("delete %s", sq.name)
	if _, err := s.n.b.DeleteQueue(s.ctx, sq.name, false, false); err != nil {
		if s.ctx.Err() != nil || s.isFailure(err) {
			return
		}
		s.t.Fatalf("seed %d: deleting %s: %v", s.seed, sq.name, err)
	}
	sq.deleted = true
}

// declareLate declares a durable queue (maybe with a TTL) and binds it to
// dx, each its own answered request.
func (s *crashSim) declareLate() {
	name := fmt.Sprintf("late%d", len(s.order))
	key := name
	// Half the time, the name of a late queue whose delete was answered:
	// a new queue, which none of the old one's messages may reach.
	var reuse []*simQueue
	for _, k := range s.order {
		if sq := s.queues[k]; sq.deleted && strings.HasPrefix(sq.name, "late") && s.cur[sq.name] == k {
			reuse = append(reuse, sq)
		}
	}
	if len(reuse) > 0 && s.rng.IntN(2) == 0 {
		old := reuse[s.rng.IntN(len(reuse))]
		name = old.name
		key = fmt.Sprintf("%s~%d", name, len(s.order))
	}
	sq := &simQueue{name: name, key: key, logged: true, purgedAt: -1}
	var args wire.Table
	if s.rng.IntN(2) == 0 {
		sq.ttl = true
		args = wire.Table{{Key: "message-ttl", Value: wire.Int(int64(100 + s.rng.IntN(2000)))}}
	}
	s.queues[key] = sq
	s.cur[name] = key
	s.order = append(s.order, key)
	s.logf("declare %s (%s) ttl=%v", name, key, sq.ttl)
	if _, err := s.n.b.DeclareQueue(wire.QueueDeclare{Name: name, Durable: true, Args: args}); err != nil {
		if s.isFailure(err) {
			return
		}
		s.t.Fatalf("seed %d: declaring %s: %v", s.seed, name, err)
	}
	sq.declared = true
	if key != name {
		s.st.redeclared++
	}
	s.bindings["dx>"+name+" "+name] = bindMaybe
	if err := s.n.b.Bind(wire.Bind{Source: "dx", Destination: name, RoutingKey: name}); err != nil {
		if s.isFailure(err) {
			return
		}
		s.t.Fatalf("seed %d: binding %s: %v", s.seed, name, err)
	}
	s.bindings["dx>"+name+" "+name] = bindMade
}

// unsureOf marks every binding with an end named name as maybe there
// (its end's delete was submitted).
func (s *crashSim) unsureOf(name string) {
	for k, v := range s.bindings {
		src, rest, _ := strings.Cut(k, ">")
		dst, _, _ := strings.Cut(rest, " ")
		if v == bindMade && (src == name || dst == name) {
			s.bindings[k] = bindMaybe
		}
	}
}

// liveExchanges lists the late exchanges declared and not (being) deleted.
func (s *crashSim) liveExchanges() []string {
	var out []string
	for i := range s.nex {
		name := fmt.Sprintf("lx%d", i)
		if e := s.exchanges[name]; e != nil && e.declared && !e.deleting {
			out = append(out, name)
		}
	}
	return out
}

// declareExchange declares a fanout exchange, durable or not, and binds
// it to one or two live queues, each its own answered request.
func (s *crashSim) declareExchange() {
	name := fmt.Sprintf("lx%d", s.nex)
	s.nex++
	e := &simExchange{durable: s.rng.IntN(2) == 0}
	s.exchanges[name] = e
	s.logf("declare exchange %s durable=%v", name, e.durable)
	if err := s.n.b.DeclareExchange(wire.ExchangeDeclare{Name: name, Kind: wire.ExchangeFanout, Durable: e.durable}); err != nil {
		if s.isFailure(err) {
			return
		}
		s.t.Fatalf("seed %d: declaring exchange %s: %v", s.seed, name, err)
	}
	e.declared = true
	for range 1 + s.rng.IntN(2) {
		sq := s.randomLive()
		if sq == nil {
			return
		}
		k := name + ">" + sq.name + " "
		if s.bindings[k] == bindMade {
			continue
		}
		s.bindings[k] = bindMaybe
		s.logf("bind %s to %s", name, sq.name)
		if err := s.n.b.Bind(wire.Bind{Source: name, Destination: sq.name}); err != nil {
			if s.isFailure(err) {
				return
			}
			s.t.Fatalf("seed %d: binding %s to %s: %v", s.seed, name, sq.name, err)
		}
		s.bindings[k] = bindMade
	}
}

// deleteExchange deletes a late exchange.
func (s *crashSim) deleteExchange() {
	lx := s.liveExchanges()
	if len(lx) == 0 {
		return
	}
	name := lx[s.rng.IntN(len(lx))]
	e := s.exchanges[name]
	e.deleting = true
	s.unsureOf(name)
	s.logf("delete exchange %s", name)
	if err := s.n.b.DeleteExchange(name, false); err != nil {
		if s.isFailure(err) {
			return
		}
		s.t.Fatalf("seed %d: deleting exchange %s: %v", s.seed, name, err)
	}
	e.deleted = true
}

// isFailure reports whether a request failed because the node's log
// failed (the injected fsync error): waits until Fatal was told.
func (s *crashSim) isFailure(err error) bool {
	if !errors.Is(err, segment.ErrStopped) && !errors.Is(err, segment.ErrInjected) && !strings.Contains(err.Error(), "may not be on disk") {
		return false
	}
	select {
	case <-s.ctx.Done():
	case <-time.After(20 * time.Second):
		s.t.Fatalf("seed %d: a request failed (%v) and Fatal was not told", s.seed, err)
	}
	return true
}

// takeDrops lists the dead letters dropped since the last call, by reason.
func (s *crashSim) takeDrops() []string {
	var drops []string
	for r := range s.dlDrops {
		if n := s.dlDrops[r].Swap(0); n > 0 {
			drops = append(drops, fmt.Sprintf("%v %d", DLDrop(r), n))
		}
	}
	return drops
}

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
		fs = s.mem.Crash(torn)
		s.logf("crash (failed fsync: %v, torn bytes %d)", s.ctx.Err() != nil, torn)
		_ = old.b.CloseMetaLog(ctx)
		if err := old.b.Stop(ctx); err != nil {
			t.Fatalf("seed %d: the crashed node did not stop: %v", s.seed, err)
		}
		_ = old.log.Close()
	}

	s.logf("dead letters dropped before the crash: %v", s.takeDrops())
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
