package sim

// A simulated node: its MemFS, log, snapshot store and worker, started
// (and restarted from its log), stopped, crashed with a torn tail; the
// sink that records where each publish was applied; its raft ticks and
// worker rounds, with every disk completion run after a simulated latency.

import (
	"encoding/binary"
	"fmt"
	"time"

	"github.com/warren-mq/warren/queue"
	"github.com/warren-mq/warren/replication"
	"github.com/warren-mq/warren/segment"
	"go.etcd.io/raft/v3/raftpb"
)

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
			n.completeLater(fn)
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
	later := n.later
	n.later = nil
	for _, fn := range later {
		n.completeLater(fn)
	}
}

// completeLater runs an appender's completion fn after a random disk
// latency (in posting order: no earlier than the last one's), unless the
// node crashed meanwhile; a completion that failed the node crashes it.
func (n *node) completeLater(fn func()) {
	s := n.s
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
