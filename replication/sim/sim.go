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
package sim

import (
	"bytes"
	"container/heap"
	crand "crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"runtime"
	"slices"
	"time"

	"github.com/warren-mq/warren/queue"
	"github.com/warren-mq/warren/replication"
	"github.com/warren-mq/warren/segment"
	"github.com/warren-mq/warren/wire"
	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
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

// ---- nodes ----

type node struct {
	s      *sim
	id     uint64
	fs     *segment.MemFS
	log    *segment.Log
	w      *replication.Worker
	inbox  chan func()
	groups []*replication.Group
	up     bool
	inc    int // incarnation: events of an earlier one are void
	skew   int64
	dirty  bool
	fatal  error
	armed  bool // a sync failure is armed (MemFS.FailSync)
	// diskAt: when the last scheduled completion runs (completions run in
	// order).
	diskAt int64
	// applied: publish uid → index, per group, in this incarnation.
	applied map[uint64]map[uint64]uint64
	// checked: per group, the applied index last compared.
	checked map[uint64]uint64
	// base: per group, the snapshot index this incarnation started from
	// or last installed (publishes at or below it were not applied here).
	base  map[uint64]uint64
	store *replication.SnapStore
	later []func() // completions posted from the simulation's goroutine
}

func (n *node) clock() int64 { return n.s.now + n.skew }

func (n *node) start() error {
	s := n.s
	l, err := segment.Open(n.fs, dataDir, segment.Options{Manual: true, WALSize: 32 << 10, SegmentSize: 64 << 10})
	if err != nil {
		return fmt.Errorf("node %d: segment.Open after a crash: %w", n.id, err)
	}
	n.log = l
	store, err := replication.OpenSnapStore(l)
	if err != nil {
		return fmt.Errorf("node %d: opening its snapshot store: %w", n.id, err)
	}
	n.store = store
	n.later = nil
	n.base = map[uint64]uint64{}
	n.inbox = make(chan func(), 16)
	n.fatal = nil
	n.armed = false
	n.skew = int64(s.r.IntN(61)) - 30
	n.applied = map[uint64]map[uint64]uint64{}
	n.checked = map[uint64]uint64{}
	n.w = replication.NewWorker(l, replication.WorkerConfig{
		NodeID: n.id,
		Post: func(fn func()) {
			if goid() == s.g {
				n.later = append(n.later, fn)
				return
			}
			n.inbox <- fn
		},
		Fatal:        func(err error) { n.fatal = err },
		Send:         endpoint{s.net, n}.Send,
		SendSnapshot: endpoint{s.net, n}.SendSnapshot,
		Snapshots:    store,
		SnapshotDone: func(g *replication.Group, meta raftpb.SnapshotMetadata, err error) {
			if err == nil {
				s.res.Snapshots++
				s.tracef("node %d group %d: snapshot at %d", n.id, g.ID(), meta.Index)
			}
		},
		Installed: func(g *replication.Group, meta raftpb.SnapshotMetadata) {
			s.res.Installs++
			n.base[g.ID()] = meta.Index
			s.tracef("node %d group %d: installed the leader's snapshot at %d (term %d)", n.id, g.ID(), meta.Index, meta.Term)
		},
		Pool: s.pool,
	})
	n.groups = n.groups[:0]
	voters := raftpb.ConfState{}
	for id := uint64(1); id <= uint64(s.cfg.Nodes); id++ {
		voters.Voters = append(voters.Voters, id)
	}
	for _, gs := range s.groups {
		n.applied[gs.gid] = map[uint64]uint64{}
		g, err := n.w.Recover(gs.gid, store, voters, func() *queue.Machine { return queue.New(gs.cfg, 0) }, n.sink(gs))
		if err != nil {
			return fmt.Errorf("node %d: recovering group %d: %w", n.id, gs.gid, err)
		}
		n.base[gs.gid] = g.FSM().AppliedIndex()
		n.groups = append(n.groups, g)
	}
	n.up = true
	n.dirty = true
	n.inc++
	return nil
}

// stop ends the worker (its appender is idle: every Append's completion
// was collected). The log is dropped without Close: a crash does not
// close files.
func (n *node) stop() {
	if n.w != nil {
		n.w.Close()
		n.w = nil
	}
	n.up = false
	n.inc++
}

// crash stops the node and keeps what a power cut would: synced bytes
// plus up to torn bytes of the rest.
func (n *node) crash(torn int) {
	n.s.res.Crashes++
	n.s.tracef("node %d crashes (torn %d)", n.id, torn)
	n.stop()
	n.fs = n.fs.Crash(torn)
	n.log = nil
	down := int64(50 + n.s.r.IntN(2000))
	inc := n.inc
	n.s.at(n.s.now+down, func() {
		if n.inc != inc || n.up {
			return
		}
		n.s.tracef("node %d restarts", n.id)
		if err := n.start(); err != nil {
			n.s.fail("%v", err)
		}
	})
}

func (n *node) sink(gs *groupSpec) replication.Sink {
	return func(a *replication.Applied) {
		if a.Err != nil {
			return
		}
		if e, ok := a.Command.(*queue.Enqueue); ok && len(e.Bodies) > 0 && len(e.Bodies[0]) == 8 {
			uid := binary.LittleEndian.Uint64(e.Bodies[0])
			m := n.applied[gs.gid]
			if at, ok := m[uid]; ok && at != a.Index {
				n.s.fail("node %d group %d: publish %d applied at entry %d and again at %d", n.id, gs.gid, uid, at, a.Index)
			}
			m[uid] = a.Index
			if c, ok := n.s.commits[uid]; !ok {
				n.s.commits[uid] = commit{gs.gid, a.Index}
				n.s.res.Publishes++
			} else if c.gid != gs.gid || c.index != a.Index {
				n.s.fail("node %d: publish %d applied at group %d entry %d; elsewhere at group %d entry %d", n.id, uid, gs.gid, a.Index, c.gid, c.index)
			}
		}
		for _, e := range a.Effects {
			if e.Kind == queue.Deliver {
				ts := append(gs.tags[e.Consumer], e.Tag)
				if len(ts) > 16 {
					ts = ts[len(ts)-16:]
				}
				gs.tags[e.Consumer] = ts
			}
		}
	}
}

// tick advances every group's raft clock.
func (n *node) tick() {
	if !n.up {
		return
	}
	for _, g := range n.groups {
		g.RaftTick()
	}
	n.dirty = true
}

// round runs the worker's rounds until it has nothing dirty, collecting
// each Append's completion as soon as the appender posts it and running
// it after a simulated disk latency.
func (n *node) round() {
	s := n.s
	for i := 0; n.up && i < 8; i++ {
		before := n.w.Stats().Appends
		more := n.w.Round(n.clock())
		if n.w.Stats().Appends > before {
			var fn func()
			select {
			case fn = <-n.inbox:
			case <-time.After(30 * time.Second):
				s.fail("node %d: no completion from the appender in 30 s", n.id)
				return
			}
			n.diskAt = max(n.diskAt, s.now+int64(s.r.IntN(s.disk)))
			inc := n.inc
			s.at(n.diskAt, func() {
				if n.inc != inc || !n.up {
					return // crashed meanwhile: the completion is lost
				}
				fn()
				n.dirty = true
				if n.fatal != nil {
					s.tracef("node %d: %v", n.id, n.fatal)
					s.res.SyncFails++
					n.crash(s.r.IntN(3) * s.r.IntN(4096))
				}
			})
		}
		if !more {
			n.dirty = false
			return
		}
	}
	if n.up {
		inc := n.inc
		s.at(s.now+1, func() {
			if n.inc == inc {
				n.dirty = true
			}
		})
	}
	n.dirty = false
}

func (s *sim) flush() {
	for pass := 0; pass < 4; pass++ {
		any := false
		for _, n := range s.nodes {
			if n.up && n.dirty {
				any = true
				n.round()
			}
			n.schedule()
		}
		if !any {
			return
		}
	}
}

// schedule runs the completions the node's worker posted from the
// simulation's goroutine (the inline pool's) as events after a disk
// latency, in the order posted.
func (n *node) schedule() {
	s := n.s
	later := n.later
	n.later = nil
	for _, fn := range later {
		n.diskAt = max(n.diskAt, s.now+int64(s.r.IntN(s.disk)))
		inc := n.inc
		s.at(n.diskAt, func() {
			if n.inc != inc || !n.up {
				return // crashed meanwhile: the completion is lost
			}
			fn()
			n.dirty = true
			if n.fatal != nil {
				s.tracef("node %d: %v", n.id, n.fatal)
				s.res.SyncFails++
				n.crash(s.r.IntN(3) * s.r.IntN(4096))
			}
		})
	}
}

// ---- network ----

// network is the seeded fake network: every message is marshalled (as a
// real transport does: no memory shared between nodes), delayed 1–30 ms
// (so messages reorder), dropped and duplicated at the run's rates, and
// dropped between nodes a partition separates.
type network struct {
	s         *sim
	drop, dup int // percent
	late      int // percent of messages delayed up to 3 s more
	cut       map[[2]uint64]bool
}

// endpoint is one node's side of the network.
type endpoint struct {
	net  *network
	from *node
}

var _ replication.Transport = endpoint{}

func (e endpoint) Send(gid uint64, msgs []raftpb.Message) {
	net, s := e.net, e.net.s
	for _, m := range msgs {
		s.res.Messages++
		if m.From != e.from.id {
			s.fail("node %d sends a message from %d", e.from.id, m.From)
			return
		}
		// One vote per node per term: a vote request is the sender's vote
		// for itself, a granted vote response its vote for the candidate.
		switch {
		case m.Type == raftpb.MsgVote:
			s.vote(gid, m.Term, m.From, m.From)
		case m.Type == raftpb.MsgVoteResp && !m.Reject:
			s.vote(gid, m.Term, m.From, m.To)
		}
		if net.cut[[2]uint64{m.From, m.To}] || s.r.IntN(100) < net.drop {
			s.res.Dropped++
			continue
		}
		b, err := m.Marshal()
		if err != nil {
			s.fail("marshal %v: %v", m.Type, err)
			return
		}
		copies := 1
		if s.r.IntN(100) < net.dup {
			copies = 2
		}
		for range copies {
			to := s.nodes[m.To-1]
			delay := 1 + int64(s.r.IntN(30))
			if s.r.IntN(100) < net.late {
				delay += int64(s.r.IntN(3000)) // arrives terms later
			}
			s.at(s.now+delay, func() { net.deliver(to, gid, b) })
		}
	}
}

// SendSnapshot carries a snapshot with its live entries as one message
// (copied: nothing shared between nodes), subject to the same delays,
// drops and partitions; the sender hears whether it was delivered.
func (e endpoint) SendSnapshot(gid uint64, sm *replication.SnapshotMessage) {
	net, s := e.net, e.net.s
	from, inc := e.from, e.from.inc
	if sm.Release != nil {
		defer sm.Release() // (copied below)
	}
	s.res.Messages++
	s.res.SnapsSent++
	m := sm.Msg
	s.tracef("group %d: node %d sends its snapshot at %d to %d (%d live entries)", gid, m.From, m.Snapshot.Metadata.Index, m.To, len(sm.Entries))
	report := func(ok bool) {
		if from.inc == inc && from.up {
			from.w.ReportSnapshot(gid, m.To, ok)
			from.dirty = true
		}
	}
	to := s.nodes[m.To-1]
	delay := 1 + int64(s.r.IntN(30))
	if net.cut[[2]uint64{m.From, m.To}] || s.r.IntN(100) < net.drop {
		s.res.Dropped++
		s.at(s.now+delay, func() { report(false) })
		return
	}
	b, err := m.Marshal()
	if err != nil {
		s.fail("marshal %v: %v", m.Type, err)
		return
	}
	data := bytes.Clone(sm.Data)
	ents := make([]segment.Entry, len(sm.Entries))
	for i, x := range sm.Entries {
		ents[i] = segment.Entry{Index: x.Index, Term: x.Term, Data: bytes.Clone(x.Data)}
	}
	if s.r.IntN(100) < net.late {
		delay += int64(s.r.IntN(3000))
	}
	s.at(s.now+delay, func() {
		if !to.up || net.cut[[2]uint64{m.From, m.To}] {
			s.res.Dropped++
			report(false)
			return
		}
		var got raftpb.Message
		if err := got.Unmarshal(b); err != nil {
			s.fail("unmarshal: %v", err)
			return
		}
		if err := to.w.StepSnapshot(gid, &replication.SnapshotMessage{Msg: got, Data: data, Entries: ents}); err != nil {
			if !errors.Is(err, replication.ErrWorkerStopped) {
				s.fail("node %d: step a snapshot from %d: %v", to.id, m.From, err)
			}
			report(false)
			return
		}
		to.dirty = true
		report(true)
	})
}

func (s *sim) vote(gid, term, voter, for_ uint64) {
	k := voteKey{gid, term, voter}
	if prev, ok := s.votes[k]; !ok {
		s.votes[k] = for_
	} else if prev != for_ {
		s.fail("group %d: node %d voted for %d and for %d in term %d", gid, voter, prev, for_, term)
	}
}

type voteKey struct{ gid, term, voter uint64 }

func (net *network) deliver(to *node, gid uint64, b []byte) {
	if !to.up {
		return
	}
	var m raftpb.Message
	if err := m.Unmarshal(b); err != nil {
		net.s.fail("unmarshal: %v", err)
		return
	}
	if net.cut[[2]uint64{m.From, m.To}] {
		net.s.res.Dropped++
		return
	}
	if err := to.w.Step(gid, m); err != nil {
		if errors.Is(err, replication.ErrWorkerStopped) {
			return
		}
		net.s.fail("node %d: step %v from %d: %v", to.id, m.Type, m.From, err)
		return
	}
	to.dirty = true
}

// ---- faults ----

func (s *sim) fault() {
	switch k := s.r.IntN(13); {
	case k < 3: // partition: a random side against the rest
		clear(s.net.cut)
		side := map[uint64]bool{}
		for _, n := range s.nodes {
			side[n.id] = s.r.IntN(2) == 0
		}
		for _, a := range s.nodes {
			for _, b := range s.nodes {
				if side[a.id] != side[b.id] {
					s.net.cut[[2]uint64{a.id, b.id}] = true
				}
			}
		}
		s.res.Partitions++
		s.tracef("partition %v", side)
	case k < 5:
		clear(s.net.cut)
		s.tracef("network heals")
	case k < 8: // a sync fails soon on one node: it crashes with torn bytes
		n := s.nodes[s.r.IntN(len(s.nodes))]
		if n.up {
			n.armed = true
			n.fs.FailSync(1 + s.r.IntN(4))
			s.tracef("node %d: a sync will fail", n.id)
		}
	case k < 9: // a crash between writes, or a clean restart
		n := s.nodes[s.r.IntN(len(s.nodes))]
		switch {
		case !n.up:
		case n.armed || s.r.IntN(3) > 0:
			n.crash(s.r.IntN(2048))
		default:
			s.res.Restarts++
			s.tracef("node %d restarts cleanly", n.id)
			n.stop()
			if err := n.log.Close(); err != nil {
				s.fail("node %d: closing its log: %v", n.id, err)
				return
			}
			if err := n.start(); err != nil {
				s.fail("%v", err)
			}
		}
	case k < 10: // segment maintenance (moves WAL entries into segment files)
		n := s.nodes[s.r.IntN(len(s.nodes))]
		// Not with a sync failure armed: maintenance syncs several files in
		// parallel, and which of them failed would differ from run to run.
		if n.up && !n.armed {
			err := n.log.Maintain()
			s.tracef("node %d: segment maintenance: %v", n.id, err)
		}
	case k < 11: // a node snapshots a group and compacts its log
		n := s.nodes[s.r.IntN(len(s.nodes))]
		gs := s.groups[s.r.IntN(len(s.groups))]
		if !n.up {
			break
		}
		g := n.group(gs.gid)
		err := g.Snapshot(n.store, func(meta raftpb.SnapshotMetadata, err error) {
			s.tracef("node %d group %d: snapshot at %d: %v", n.id, gs.gid, meta.Index, err)
			if err == nil {
				s.res.Snapshots++
			}
		})
		if err != nil {
			s.tracef("node %d group %d: snapshot: %v", n.id, gs.gid, err)
		}
		n.dirty = true
	default: // a leader hands a group to another voter
		gs := s.groups[s.r.IntN(len(s.groups))]
		if n, g := s.leader(gs); g != nil {
			to := uint64(1 + s.r.IntN(len(s.nodes)))
			s.res.Transfers++
			s.tracef("group %d: node %d transfers leadership to %d", gs.gid, n.id, to)
			g.TransferLeadership(to)
			n.dirty = true
		}
	}
}

// heal ends the faults: the network is whole and lossless, crashed nodes
// restart, and pending sync failures are disarmed.
func (s *sim) heal() {
	s.healed = true
	s.healAt = s.now
	clear(s.net.cut)
	s.net.drop, s.net.dup, s.net.late = 0, 0, 0
	for _, n := range s.nodes {
		n.fs.FailSync(0)
	}
	s.tracef("heal")
	for _, n := range s.nodes {
		if !n.up {
			s.tracef("node %d restarts (heal)", n.id)
			if err := n.start(); err != nil {
				s.fail("%v", err)
				return
			}
		}
	}
}

// ---- workload ----

func randomQueueConfig(r *rand.Rand) queue.Config {
	cfg := queue.Config{MaxPriority: uint8(r.IntN(3)), DeadLetter: r.IntN(2) == 0}
	if r.IntN(3) == 0 {
		cfg.MaxLength = int64(5 + r.IntN(30))
		cfg.Overflow = wire.Overflow(r.IntN(3))
	}
	if r.IntN(3) == 0 {
		cfg.MessageTTLMs = int64(50 + r.IntN(2000))
	}
	if r.IntN(3) == 0 {
		cfg.DeliveryLimit = uint32(1 + r.IntN(4))
	}
	if r.IntN(4) == 0 {
		cfg.ConsumerTimeout = int64(100 + r.IntN(2000))
	}
	return cfg
}

// leader is the node that leads gs at the highest term, if any.
func (s *sim) leader(gs *groupSpec) (*node, *replication.Group) {
	var ln *node
	var lg *replication.Group
	var term uint64
	for _, n := range s.nodes {
		if !n.up {
			continue
		}
		g := n.group(gs.gid)
		if st := g.Status(); st.RaftState == raft.StateLeader && st.Term > term {
			ln, lg, term = n, g, st.Term
		}
	}
	return ln, lg
}

func (n *node) group(gid uint64) *replication.Group { return n.groups[gid-firstGroup] }

// op proposes one random command at the group's current leader, if it
// has one.
func (s *sim) op() bool {
	gs := s.groups[s.r.IntN(len(s.groups))]
	n, g := s.leader(gs)
	if g == nil {
		return false
	}
	if s.r.IntN(4) == 0 {
		// Sometimes at any node that believes it leads: a deposed leader
		// cut off by a partition proposes entries that are overwritten.
		for _, o := range s.nodes {
			if o.up && o != n && o.group(gs.gid).Leader() {
				n, g = o, o.group(gs.gid)
				break
			}
		}
	}
	r := s.r
	c := queue.ConsumerID(1 + r.IntN(3))
	var cmd queue.Command
	switch k := r.IntN(20); {
	case k < 8:
		s.uid++
		e := &queue.Enqueue{}
		nm := 1 + r.IntN(3)
		for i := range nm {
			m := queue.Message{Size: uint32(8 + r.IntN(100)), Priority: uint8(r.IntN(3))}
			if r.IntN(5) == 0 {
				m.ExpirationMs, m.HasExpiration = uint32(r.IntN(1000)), true
			}
			e.Msgs = append(e.Msgs, m)
			body := make([]byte, 8)
			if i == 0 {
				binary.LittleEndian.PutUint64(body, s.uid)
			} else {
				body = append(body, 'x')
			}
			e.Bodies = append(e.Bodies, body)
		}
		cmd = e
	case k < 10:
		cmd = &queue.Subscribe{Spec: queue.ConsumerSpec{ID: c, Owner: queue.OwnerID(c % 2), Prefetch: uint32(r.IntN(5)), AutoAck: r.IntN(6) == 0}}
	case k < 11:
		cmd = &queue.Cancel{Consumer: c, Requeue: r.IntN(2) == 0}
	case k < 17:
		ts := gs.tags[c]
		if len(ts) == 0 {
			cmd = &queue.Tick{}
			break
		}
		tag := ts[r.IntN(len(ts))]
		first := tag
		if r.IntN(3) == 0 {
			first = 0
		}
		cmd = &queue.Settle{Consumer: c, Op: wire.SettleOp(1 + r.IntN(4)), First: first, Last: tag}
	case k < 18:
		cmd = &queue.Down{Owner: queue.OwnerID(r.IntN(2))}
	case k < 19:
		cmd = &queue.Tick{}
	default:
		cmd = &queue.Purge{}
	}
	if _, err := g.Add(cmd); err != nil {
		s.tracef("node %d group %d: add: %v", n.id, gs.gid, err)
		return false
	}
	s.res.Proposed++
	n.dirty = true
	return true
}

// ---- invariants ----

// checkLeaders: at most one leader per term.
func (s *sim) checkLeaders() {
	for _, n := range s.nodes {
		if !n.up {
			continue
		}
		for _, g := range n.groups {
			st := g.Status()
			if st.RaftState != raft.StateLeader {
				continue
			}
			k := termKey{g.ID(), st.Term}
			if prev, ok := s.leaders[k]; !ok {
				s.leaders[k] = n.id
				s.tracef("group %d: node %d leads term %d", g.ID(), n.id, st.Term)
			} else if prev != n.id {
				s.fail("group %d: nodes %d and %d both lead term %d", g.ID(), prev, n.id, st.Term)
			}
			if err := g.Err(); err != nil {
				s.fail("node %d group %d stopped: %v", n.id, g.ID(), err)
			}
		}
	}
}

// checkSnapshots: replicas' snapshots are byte-equal at equal applied
// index (compared whenever a replica's applied index moved).
func (s *sim) checkSnapshots() {
	for _, n := range s.nodes {
		if !n.up {
			continue
		}
		for _, g := range n.groups {
			if err := g.Err(); err != nil {
				s.fail("node %d group %d stopped: %v", n.id, g.ID(), err)
				return
			}
			idx := g.FSM().AppliedIndex()
			if idx == 0 || n.checked[g.ID()] == idx {
				continue
			}
			n.checked[g.ID()] = idx
			snap, err := g.FSM().Snapshot()
			if err != nil {
				s.fail("node %d group %d: snapshot: %v", n.id, g.ID(), err)
				return
			}
			k := termKey{g.ID(), idx}
			if prev, ok := s.snaps[k]; !ok {
				s.snaps[k] = snap
			} else {
				s.res.Checks++
				if !bytes.Equal(prev, snap) {
					s.fail("group %d: node %d's snapshot at applied index %d differs from another replica's at the same index (%d vs %d bytes)", g.ID(), n.id, idx, len(snap), len(prev))
					return
				}
			}
		}
	}
}

// checkLogs: log matching between every pair of up nodes, and every
// replica's live entries stored in its log.
func (s *sim) checkLogs() {
	for _, gs := range s.groups {
		var up []*node
		for _, n := range s.nodes {
			if n.up {
				up = append(up, n)
			}
		}
		for i, a := range up {
			for _, b := range up[i+1:] {
				if err := logsMatch(a, b, gs.gid); err != nil {
					s.fail("group %d: %v", gs.gid, err)
					return
				}
			}
			g := a.group(gs.gid)
			for _, idx := range g.FSM().LiveEntries(nil, g.FSM().AppliedIndex()) {
				es, release, err := a.log.EntriesView(gs.gid, idx, idx+1)
				if err != nil || len(es) != 1 {
					s.fail("node %d group %d: live entry %d is not in its log: %v", a.id, gs.gid, idx, err)
					return
				}
				release()
			}
		}
	}
}

func readLog(n *node, gid uint64) ([]segment.Entry, error) {
	lo, hi := n.log.FirstIndex(gid), n.log.LastIndex(gid)
	if hi < lo {
		return nil, nil
	}
	es, release, err := n.log.EntriesView(gid, lo, hi+1)
	if err != nil {
		return nil, fmt.Errorf("node %d: reading %d..%d: %w", n.id, lo, hi, err)
	}
	defer release()
	out := make([]segment.Entry, len(es))
	for i, e := range es {
		out[i] = segment.Entry{Index: e.Index, Term: e.Term, Data: slices.Clone(e.Data)}
	}
	return out, nil
}

// logsMatch: if a and b hold an entry of the same index and term, they
// hold the same entries up to it.
func logsMatch(a, b *node, gid uint64) error {
	ea, err := readLog(a, gid)
	if err != nil {
		return err
	}
	eb, err := readLog(b, gid)
	if err != nil {
		return err
	}
	if len(ea) == 0 || len(eb) == 0 {
		return nil
	}
	// Compared where both logs hold entries (each starts after its own
	// snapshot).
	lo := max(ea[0].Index, eb[0].Index)
	hi := min(ea[len(ea)-1].Index, eb[len(eb)-1].Index)
	at := func(es []segment.Entry, i uint64) segment.Entry { return es[i-es[0].Index] }
	for k := hi; k >= lo && k > 0; k-- {
		if at(ea, k).Term != at(eb, k).Term {
			continue
		}
		for i := lo; i <= k; i++ {
			x, y := at(ea, i), at(eb, i)
			if x.Index != i || y.Index != i || x.Term != y.Term || !bytes.Equal(x.Data, y.Data) {
				return fmt.Errorf("log matching: nodes %d and %d agree on entry %d (term %d) but differ at entry %d (terms %d, %d; %d and %d bytes)",
					a.id, b.id, k, at(ea, k).Term, i, x.Term, y.Term, len(x.Data), len(y.Data))
			}
		}
		break
	}
	return nil
}

// caughtUp: every node is up, each group has a leader every node
// follows, and every replica applied the leader's whole log.
func (s *sim) caughtUp() bool {
	for _, gs := range s.groups {
		ln, lg := s.leader(gs)
		if lg == nil {
			return false
		}
		last := ln.log.LastIndex(gs.gid)
		st := lg.Status()
		if st.Commit != last {
			return false
		}
		for _, n := range s.nodes {
			if !n.up {
				return false
			}
			g := n.group(gs.gid)
			if g.Status().Lead != ln.id || g.FSM().AppliedIndex() != last {
				return false
			}
		}
	}
	return true
}

// checkFinal: once healed and caught up, every publish committed anywhere
// is applied on every replica, and the replicas' states are equal.
func (s *sim) checkFinal() {
	for _, gs := range s.groups {
		var want []byte
		for _, n := range s.nodes {
			g := n.group(gs.gid)
			snap, _ := g.FSM().Snapshot()
			if want == nil {
				want = snap
			} else if !bytes.Equal(want, snap) {
				s.fail("group %d: node %d's final state differs from node 1's", gs.gid, n.id)
				return
			}
		}
	}
	uids := make([]uint64, 0, len(s.commits))
	for uid := range s.commits {
		uids = append(uids, uid)
	}
	slices.Sort(uids)
	for _, uid := range uids {
		c := s.commits[uid]
		for _, n := range s.nodes {
			if c.index <= n.base[c.gid] {
				continue // in the snapshot it started from or installed (its state was compared)
			}
			if at, ok := n.applied[c.gid][uid]; !ok || at != c.index {
				s.fail("publish %d, committed at group %d entry %d, is not applied on node %d (found at %d, %v)", uid, c.gid, c.index, n.id, at, ok)
				return
			}
		}
	}
}

func (s *sim) describe() string {
	var b bytes.Buffer
	for _, gs := range s.groups {
		fmt.Fprintf(&b, "group %d:", gs.gid)
		for _, n := range s.nodes {
			if !n.up {
				fmt.Fprintf(&b, " [node %d down]", n.id)
				continue
			}
			g := n.group(gs.gid)
			st := g.Status()
			fmt.Fprintf(&b, " [node %d %v term %d lead %d commit %d applied %d last %d]", n.id, st.RaftState, st.Term, st.Lead, st.Commit, g.FSM().AppliedIndex(), n.log.LastIndex(gs.gid))
		}
		b.WriteString("; ")
	}
	return b.String()
}
