// Package sim is the multi-node deterministic simulation of durable queues
// (design/replication.md §7, "multi-node deterministic simulation"): N
// nodes in one goroutine, each with its own segment.MemFS, segment.Log and
// replication.Worker, running queue groups with every node a voter; a
// seeded fake network (a replication.Transport) that delays (a few
// messages by seconds: they arrive terms later), drops, duplicates and
// reorders raft messages and partitions and heals the nodes; a virtual
// clock that drives raft ticks, disk latency and the workload; nodes
// crashed at random syncs (the failing fsync stops segment,
// the crash keeps synced bytes plus a torn piece of the rest, MemFS.Crash)
// and restarted from their logs; and random queue commands (publish,
// subscribe, cancel, settle ack/requeue/reject/extend, down, tick, purge)
// proposed at the current leader.
//
// Checked while it runs and once healed:
//   - at most one leader per term, over every node and incarnation, and
//     one vote per node per term (its vote requests and granted votes);
//   - log matching: two nodes' logs that hold an entry of the same index
//     and term hold the same entries up to it;
//   - state-machine safety: replicas' FSM snapshots (the queue.Machine
//     encoding and the FSM header) are byte-equal at equal applied index;
//   - a publish is applied at one index only, on every node;
//   - every publish applied anywhere (committed: a leader confirmed it) is,
//     once the network heals and every node is back, applied on every
//     replica;
//   - a replica's live entries (those still holding a message) are all in
//     its stored log.
//
// Run(seed) is deterministic: the same seed gives the same run (the
// appender goroutines' completions are collected as soon as they are
// posted and run at a virtual time the seed decides).
//
// Leaders are also asked to transfer leadership at random.
//
// Snapshots: every node takes its own (the worker's policy, and at
// random) into its SnapStore and compacts its log to them; nodes restart
// from their latest snapshot (Worker.Recover). A follower that needs
// entries its leader compacted away gets the leader's snapshot with the
// live entries it lacks over the same network (delayed, dropped,
// partitioned; the sender hears whether it arrived) and installs it
// (replication/install.go), crashes included: the checks above then
// hold across installs (an installed FSM must be byte-equal to the others
// at its index; a publish at or below a node's snapshot is checked by
// that equality rather than by its apply).
//
// Not simulated: conf changes.
//
// Files: sim.go the run (Config, Run, the event queue and the loop),
// node.go a node and its worker's rounds, network.go the fake network,
// faults.go the faults and the heal, workload.go the queue commands
// proposed, check.go the invariants.
package sim

import (
	"bytes"
	"container/heap"
	crand "crypto/rand"
	"fmt"
	"io"
	"math/rand/v2"
	"runtime"

	"github.com/warren-mq/warren/queue"
	"github.com/warren-mq/warren/replication"
	"github.com/warren-mq/warren/segment"
)

// Config sizes a run. The zero value of a field takes its default.
type Config struct {
	Nodes  int // voters (default 3)
	Groups int // queue groups, each on every node (default 1–3, by seed)
	Ops    int // workload operations before the heal (default 300)
	// NoFaults turns off drops, duplicates, partitions and crashes (delay
	// and reordering stay).
	NoFaults bool
	// Trace, when set, gets one line per notable event.
	Trace io.Writer
}

// Result counts what a run did.
type Result struct {
	VirtualMs  int64
	Events     int
	Proposed   int // commands added at a leader
	Publishes  int // publishes committed (applied somewhere)
	Messages   int // raft messages sent
	Dropped    int // dropped by the network (faults and partitions)
	Crashes    int // of which SyncFails came from a failed fsync
	SyncFails  int
	Restarts   int // clean ones (Worker and Log closed, reopened)
	Transfers  int // leadership transfers asked for
	Partitions int
	Leaders    int // distinct (group, term) leaders seen
	Checks     int // snapshot comparisons at an equal index
	Snapshots  int // snapshots taken (compacting the log)
	Installs   int // leaders' snapshots installed by a follower
	SnapsSent  int // snapshots a leader sent
}

const (
	tickMs     = 100 // raft tick (design §3.7)
	dataDir    = "/data"
	firstGroup = 10
)

// Run runs one seeded simulation and returns the first invariant broken
// (nil: none).
func Run(seed uint64, cfg Config) (Result, error) {
	if cfg.Nodes == 0 {
		cfg.Nodes = 3
	}
	if cfg.Ops == 0 {
		cfg.Ops = 300
	}
	s := &sim{
		r:       rand.New(rand.NewPCG(seed, 0x5133)),
		cfg:     cfg,
		leaders: map[termKey]uint64{},
		snaps:   map[termKey][]byte{},
		votes:   map[voteKey]uint64{},
		commits: map[uint64]commit{},
		pool:    replication.NewInlinePool(),
		g:       goid(),
	}
	defer s.pool.Close()
	// raft draws its randomized election timeouts from crypto/rand.Reader
	// (go.etcd.io/raft/v3 globalRand): the run supplies a seeded stream,
	// so that the same seed elects the same leaders at the same ticks.
	// Runs must not overlap (TestSim runs seeds one after another).
	saved := crand.Reader
	crand.Reader = seededReader{rand.New(rand.NewPCG(seed, 0xe1ec7))}
	defer func() { crand.Reader = saved }()
	if s.cfg.Groups == 0 {
		s.cfg.Groups = 1 + s.r.IntN(3)
	}
	for i := range s.cfg.Groups {
		s.groups = append(s.groups, &groupSpec{gid: uint64(firstGroup + i), cfg: randomQueueConfig(s.r), tags: map[queue.ConsumerID][]uint64{}})
	}
	s.disk = 1 + s.r.IntN(20)
	s.net = &network{s: s, cut: map[[2]uint64]bool{}}
	if !cfg.NoFaults {
		s.net.drop, s.net.dup, s.net.late = s.r.IntN(10), s.r.IntN(5), s.r.IntN(3) // percent
	}
	for id := uint64(1); id <= uint64(s.cfg.Nodes); id++ {
		n := &node{s: s, id: id, fs: segment.NewMemFS()}
		s.nodes = append(s.nodes, n)
		if err := n.start(); err != nil {
			return s.res, err
		}
		// Each node's raft clock ticks at its own phase.
		s.every(int64(1+s.r.IntN(tickMs)), tickMs, func() bool { n.tick(); return true })
	}
	s.err = s.loop()
	for _, n := range s.nodes {
		n.stop()
	}
	s.res.VirtualMs = s.now
	s.res.Leaders = len(s.leaders)
	return s.res, s.err
}

// seededReader is a deterministic byte stream (for raft's election
// timeouts, not for secrets).
type seededReader struct{ r *rand.Rand }

func (s seededReader) Read(b []byte) (int, error) {
	for i := range b {
		b[i] = byte(s.r.Uint32())
	}
	return len(b), nil
}

type sim struct {
	r      *rand.Rand
	cfg    Config
	now    int64
	events eventQueue
	seq    uint64
	nodes  []*node
	groups []*groupSpec
	net    *network
	pool   *replication.Pool
	res    Result
	err    error
	uid    uint64
	// leaders: (group, term) → the node that led it.
	leaders map[termKey]uint64
	// snaps: (group, applied index) → the FSM snapshot there.
	snaps map[termKey][]byte
	// votes: (group, term, voter) → the candidate it voted for.
	votes map[voteKey]uint64
	// commits: publish uid → where it was first applied.
	commits map[uint64]commit
	healed  bool
	healAt  int64
	disk    int // disk latency: 0..disk-1 ms per Append
	g       uint64
}

// goid is the calling goroutine's id. The simulation runs on one
// goroutine; the appenders post from theirs. Completions the worker posts
// from the simulation's own goroutine (the inline pool's: snapshot
// writes, compactions, installs) are run later as events, in the order
// posted.
func goid() uint64 {
	var b [32]byte
	s := b[:runtime.Stack(b[:], false)]
	s = bytes.TrimPrefix(s, []byte("goroutine "))
	var id uint64
	for _, c := range s {
		if c < '0' || c > '9' {
			break
		}
		id = id*10 + uint64(c-'0')
	}
	return id
}

type termKey struct{ gid, n uint64 }

type commit struct{ gid, index uint64 }

type groupSpec struct {
	gid uint64
	cfg queue.Config
	// tags: the latest delivery tags per consumer (from any replica: they
	// are the same everywhere), for settles.
	tags map[queue.ConsumerID][]uint64
}

func (s *sim) tracef(format string, args ...any) {
	if s.cfg.Trace != nil {
		fmt.Fprintf(s.cfg.Trace, "%7d ", s.now)
		fmt.Fprintf(s.cfg.Trace, format, args...)
		fmt.Fprintln(s.cfg.Trace)
	}
}

func (s *sim) fail(format string, args ...any) {
	if s.err == nil {
		s.err = fmt.Errorf("at %d ms: %s", s.now, fmt.Sprintf(format, args...))
		s.tracef("FAIL: %v", s.err)
	}
}

// ---- events ----

type event struct {
	at  int64
	seq uint64
	fn  func()
}

type eventQueue []event

func (q eventQueue) Len() int { return len(q) }
func (q eventQueue) Less(i, j int) bool {
	return q[i].at < q[j].at || q[i].at == q[j].at && q[i].seq < q[j].seq
}
func (q eventQueue) Swap(i, j int) { q[i], q[j] = q[j], q[i] }
func (q *eventQueue) Push(x any)   { *q = append(*q, x.(event)) }
func (q *eventQueue) Pop() any {
	old := *q
	e := old[len(old)-1]
	*q = old[:len(old)-1]
	return e
}

func (s *sim) at(t int64, fn func()) {
	s.seq++
	heap.Push(&s.events, event{at: max(t, s.now), seq: s.seq, fn: fn})
}

// every runs fn at first and then every period ms while it returns true.
func (s *sim) every(first, period int64, fn func() bool) {
	var run func()
	run = func() {
		if fn() {
			s.at(s.now+period, run)
		}
	}
	s.at(first, run)
}

// loop runs the workload, then heals everything and runs until every
// replica caught up, checking as it goes.
func (s *sim) loop() error {
	ops := 0
	var next func()
	next = func() {
		if s.op() {
			ops++
		}
		// Ops counts commands proposed (an op finds no leader during
		// elections); a run that cannot elect one for 2 minutes heals.
		if ops >= s.cfg.Ops || s.now > 120_000 {
			s.heal()
			return
		}
		s.at(s.now+1+int64(s.r.IntN(40)), next)
	}
	s.at(1, next)
	if !s.cfg.NoFaults {
		s.every(int64(200+s.r.IntN(500)), int64(300+s.r.IntN(2000)), func() bool {
			if !s.healed {
				s.fault()
			}
			return !s.healed
		})
	}
	var settledAt int64 = -1
	for len(s.events) > 0 && s.err == nil {
		ev := heap.Pop(&s.events).(event)
		s.now = ev.at
		s.res.Events++
		ev.fn()
		s.flush()
		if s.err != nil {
			break
		}
		s.checkLeaders()
		s.checkSnapshots()
		if s.res.Events%500 == 0 {
			s.checkLogs()
		}
		if s.healed {
			if s.caughtUp() {
				if settledAt < 0 {
					settledAt = s.now
				}
				// A little longer, so commit indexes reach everyone.
				if s.now-settledAt > 3*tickMs {
					break
				}
			} else {
				settledAt = -1
			}
			if s.now-s.healedAt() > 60_000 {
				s.fail("no progress 60 s after the heal: %s", s.describe())
			}
		}
	}
	if s.err != nil {
		return s.err
	}
	if !s.healed {
		return fmt.Errorf("the event queue ran dry before the heal")
	}
	s.checkLogs()
	s.checkFinal()
	return s.err
}

func (s *sim) healedAt() int64 { return s.healAt }
