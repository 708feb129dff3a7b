package broker

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/warren-mq/warren/queue"
	"github.com/warren-mq/warren/replication"
	"github.com/warren-mq/warren/wire"
	"go.etcd.io/raft/v3/raftpb"
)

// The topology of a cluster (design §4 on several nodes): every change
// is a command proposed to the metadata group, whose voters are every
// node; it is applied at commit on every node through the same
// MetaMachine and sink (topology.ApplyMetaEffects), and the request is
// answered once it is applied on the node that made it, with the result
// that apply gave. On one node nothing here runs: a change is applied as
// it is added (applyLocked), as before.

// DefaultMetaTimeout bounds how long a topology request waits for the
// cluster to apply it (MetaLogConfig.Timeout).
const DefaultMetaTimeout = 10 * time.Second

// metaCluster is the topology's state in a cluster (topology.mu).
type metaCluster struct {
	g       *replication.MetaGroup
	timeout time.Duration
	waiting map[uint64]struct{}   // seqs a request waits for
	results map[uint64]MetaResult // their results, once applied here
	// removes: this node's queue deletions proposed without a waiter
	// (clusterRemove), by seq, until applied here (or told unknown), or
	// until a clusterSync found one not applied when the timeout after
	// it was proposed ran out. A sync waits only for those its own
	// request asked for (syncFor), each until then at most. (One not
	// applied may still be: proposed again at the next change of
	// leader.)
	removes map[uint64]removal
	stop    chan struct{} // stops the ticker
	stopped chan struct{}
	// tickQueues ticks the replicated queue groups with the metadata
	// group (nil without them).
	tickQueues func()
	// balance runs the leader balancer every balanceTicks ticks.
	balance func()
	// place proposes MetaPlaceReplicas when the metadata leader finds a
	// queue to move, and MetaDropHome for the queues of dead homes (every
	// placeTicks; moves.go, homed.go); ownHomes drops this node's own
	// queues of an earlier life (every tick until none, homed.go).
	place    func()
	ownHomes func()
	ownAt    int // the tick ownHomes last proposed at (the ticker's, as tickN)
	tickN    int // the ticker's count of ticks
	// forward carries a membership request to the leader (members.go).
	forward func(ctx context.Context, node uint64, op byte, body []byte) ([]byte, error)
	// removed: this node was removed from the cluster (members.go).
	removed   atomic.Bool
	onRemoved func()
}

// balanceTicks: the leader balancer runs every 100 ticks (10 s at the
// production tick of 100 ms; design §6.2).
const balanceTicks = 100

// placeTicks: the metadata leader looks for replicas to move every 20
// ticks (2 s at the production tick).
const placeTicks = 20

// ownHomesTicks: a restarted node proposes the drop of its earlier
// life's queues at most every 5 ticks until it is applied (it serves
// once it is: MetaReady).
const ownHomesTicks = 5

func (cl *metaCluster) tick(every time.Duration) {
	defer close(cl.stopped)
	tk := time.NewTicker(every)
	defer tk.Stop()
	for n := 1; ; n++ {
		select {
		case <-tk.C:
			cl.tickN = n
			cl.g.Tick()
			if cl.tickQueues != nil {
				cl.tickQueues()
			}
			if cl.balance != nil && n%balanceTicks == 0 {
				cl.balance()
			}
			if cl.place != nil && n%placeTicks == 0 {
				cl.place()
			}
			if cl.ownHomes != nil && n-cl.ownAt >= ownHomesTicks {
				cl.ownHomes()
			}
		case <-cl.stop:
			return
		}
	}
}

func (cl *metaCluster) stopTick() {
	select {
	case <-cl.stop:
	default:
		close(cl.stop)
	}
	<-cl.stopped
}

// clusterMachine applies committed commands: while OpenMetaLog recovers,
// to the recovered state; then to the live topology (the loop holds
// topology.mu), publishing the routing view after each.
type clusterMachine struct {
	t    *topology
	live bool
	rec  *MetaMachine
	park *raftPark // told Meta's next queue id after each change
}

func (m *clusterMachine) Apply(index uint64, cmd []byte) (any, error) {
	if !m.live {
		return m.rec.Apply(index, cmd)
	}
	t := m.t
	res, err := (&MetaMachine{Meta: t.meta, Sink: t}).Apply(index, cmd)
	if t.dirty.Load() {
		t.publishLocked()
	}
	m.park.next.Store(t.meta.NextID()) // after the effects: a queue's slot is set before
	return res, err
}

func (m *clusterMachine) Snapshot() ([]byte, error) {
	if !m.live {
		return m.rec.Snapshot()
	}
	return m.t.meta.Snapshot(), nil
}

// Restore installs a snapshot: the leader's, on a node that fell behind
// its log (replication's snapshot install); the live topology moves to
// it through the effects that turn one state into the other.
func (m *clusterMachine) Restore(index uint64, snap []byte) error {
	if !m.live {
		return m.rec.Restore(index, snap)
	}
	t := m.t
	if err := (&MetaMachine{Meta: t.meta, Sink: t}).Restore(index, snap); err != nil {
		return err
	}
	if t.dirty.Load() {
		t.publishLocked()
	}
	m.park.next.Store(t.meta.NextID())
	return nil
}

// SetMembers gives placement the cluster's nodes, in log order on every
// node (a membership change applied or installed).
func (m *clusterMachine) SetMembers(ids []uint64) {
	if !m.live {
		m.rec.Meta.SetNodes(ids)
		return
	}
	m.t.meta.SetNodes(ids)
}

// openClusterMeta is OpenMetaLog with several voters: it recovers the
// state the log holds committed, installs it, and starts the group. It
// does not wait for a leader (there may be none until the other nodes
// start): Broker.MetaStatus says when this node has one and is caught up.
// No NodeUp is logged: non-durable exchanges outlive a node's restart in
// a cluster; its non-durable and exclusive queues are dropped by the
// MetaDropHome it proposes once it has a leader (homed.go).
func (b *Broker) openClusterMeta(ctx context.Context, cfg MetaLogConfig) error {
	t := b.topo
	t.restoring.Store(true)
	defer b.topologyRestored()
	addrs := cfg.Addrs
	if _, has := cfg.Snapshots.Latest(replication.MetaGroupID); !has && cfg.Log.LastIndex(replication.MetaGroupID) == 0 && len(cfg.Peers) < 2 {
		// A new node: ask the cluster to add it, then learn the rest
		// from the leader's snapshot.
		if cfg.Join == nil {
			return errors.New("broker: this node holds no cluster state: give --join, or --peers listing the cluster's first nodes")
		}
		m, err := cfg.Join(ctx)
		if err != nil {
			return fmt.Errorf("broker: joining the cluster: %w", err)
		}
		addrs = m
		b.log.Info("joined the cluster: a learner of its metadata group until it has caught up", "node", cfg.NodeID, "members", len(m))
	}
	rec := NewMetaWithLimits(len(b.shards), noMetaLimits)
	nodes := cfg.Peers
	if len(nodes) < 2 {
		nodes = nil
		for id := range addrs {
			nodes = append(nodes, id)
		}
	}
	rec.SetNodes(nodes)
	m := &clusterMachine{t: t, rec: &MetaMachine{Meta: rec}, park: &b.park}
	cl := &metaCluster{timeout: cfg.Timeout, waiting: map[uint64]struct{}{}, results: map[uint64]MetaResult{}, removes: map[uint64]removal{},
		stop: make(chan struct{}), stopped: make(chan struct{}), forward: cfg.Forward, onRemoved: cfg.OnRemoved}
	if cl.timeout <= 0 {
		cl.timeout = DefaultMetaTimeout
	}
	if dc := b.cfg.Durable; dc != nil && dc.NodeID != 0 {
		cl.tickQueues, cl.balance = b.tickGroups, b.balanceLeaders
		cl.place = func() {
			t.placeIfNeeded()
			t.dropDeadHomes(dc.NodeID, b.homeInc(), false)
		}
		cl.ownHomes = func() { t.dropDeadHomes(dc.NodeID, b.homeInc(), true) }
	}
	g, err := replication.OpenMeta(replication.MetaConfig{
		Log: cfg.Log, Snapshots: cfg.Snapshots, Machine: m,
		Lock: &t.mu, Snapshot: func() []byte { return t.meta.Snapshot() },
		SnapshotEntries: cfg.SnapshotEntries, Fatal: cfg.Fatal, Logger: b.log,
		NodeID: cfg.NodeID, Peers: peersOrNone(cfg.Peers), Send: cfg.Send,
		Cluster: true, Addrs: addrs, SendSnapshot: cfg.SendSnapshot,
		OnMembers: func(m replication.Members, _ raftpb.ConfState) {
			if cfg.OnMembers != nil {
				cfg.OnMembers(m.Addrs, m.Removed)
			}
			b.nodesRemoved(m.Removed)
		},
		OnRemoved: func() { b.NoteRemoved("it applied its own removal") },
		// Version 3 entries once every member reads them (its hello says
		// so): none of an older build's while a cluster is upgraded.
		TagTerms: func(nodes []uint64) bool { return b.metaTagTerms(cfg.NodeID, nodes) },
		Done: func(seq uint64, res any) {
			delete(cl.removes, seq)
			if _, ok := cl.waiting[seq]; ok {
				r, is := res.(MetaResult)
				if err, _ := res.(error); !is && err != nil {
					// replication.ErrMetaOutcomeUnknown
					r = refuse(wire.PreconditionFailed, "this node cannot tell whether the cluster applied the change (it caught up from a snapshot of the cluster's metadata, or the change's leader changed while a member's build could not read the newer metadata format): check, and retry it if it was not")
				}
				cl.results[seq] = r
			}
		},
	})
	if err != nil {
		return err
	}
	cl.g = g
	t.mu.Lock()
	t.meta.SetNodes(rec.Nodes())
	err = (&MetaMachine{Meta: t.meta, Sink: t}).Restore(0, rec.Snapshot())
	if err == nil {
		m.live = true
		b.park.next.Store(t.meta.NextID())
		t.mlog.Store(g)
		t.cl.Store(cl)
	}
	t.mu.Unlock()
	if err != nil {
		return fmt.Errorf("broker: installing the recovered topology: %w", err)
	}
	t.publishIfDirty()
	g.Start()
	every := cfg.TickEvery
	if every <= 0 {
		every = 100 * time.Millisecond
	}
	go cl.tick(every)
	b.log.Info("topology recovered (cluster)", "node", cfg.NodeID, "voters", cfg.Peers, "exchanges", rec.NumExchanges(),
		"queues", rec.NumQueues(), "bindings", rec.NumBindings())
	return nil
}

// StepRaft hands this node's raft group gid a message a peer sent (a
// cluster transport's Deliver): the metadata group's, or a replicated
// queue's, stepped on its shard. A message for a group not open here is
// dropped (raft resends), unless it is for a queue this node has not
// applied or created yet: held until the group opens (raftpark.go), so a
// new queue's first election needs no election timeout.
func (b *Broker) StepRaft(gid uint64, m raftpb.Message) {
	if gid == replication.MetaGroupID {
		if g := b.topo.mlog.Load(); g != nil {
			g.Step(m)
		}
		return
	}
	if m.Type == raftpb.MsgTimeoutNow && b.leaving.Load() {
		// A node handing its queues on (TransferLeaderships) takes none
		// back (another node's balancer may offer them): raft abandons
		// the transfer after an election timeout.
		return
	}
	if gid < QueueGroupBase || gid-QueueGroupBase > 1<<32 || b.cfg.Durable == nil {
		return
	}
	q := b.topo.slots.get(queue.QueueRef(gid - QueueGroupBase))
	if q == nil {
		if b.parkUnknown(gid, m) { // a declare not applied here yet
			return
		}
		// Not held: dropped, unless the declare's apply set the slot
		// since the look above (then it goes to the shard, as below).
		if q = b.topo.slots.get(queue.QueueRef(gid - QueueGroupBase)); q == nil {
			return
		}
	}
	s := q.shard
	s.submit(Command{Kind: cmdPost, post: func() {
		if g := q.grp; g != nil && !q.gone && g.ID() == gid {
			if err := s.rw.Step(gid, m); err != nil {
				s.b.log.Debug("replicated queue: raft message dropped", "group", gid, "err", err)
			}
			return
		}
		if _, created := s.queues[q]; !created && !q.gone {
			b.park.park(gid, m) // createQueue, queued behind, takes it
		}
	}})
}

// onQueueGroup runs fn on the shard of the queue whose raft group is gid,
// if that group is open there (not a group of a deleted queue, nor of an
// earlier queue in the same slot); a group not open here is ignored.
func (b *Broker) onQueueGroup(gid uint64, fn func(s *shard, q *Queue)) {
	if gid < QueueGroupBase || gid-QueueGroupBase > 1<<32 || b.cfg.Durable == nil {
		return
	}
	q := b.topo.slots.get(queue.QueueRef(gid - QueueGroupBase))
	if q == nil {
		return
	}
	s := q.shard
	s.submit(Command{Kind: cmdPost, post: func() {
		if g := q.grp; g != nil && !q.gone && g.ID() == gid {
			fn(s, q)
		}
	}})
}

// tickGroups ticks every shard's replicated queue groups (raft's clock).
func (b *Broker) tickGroups() {
	b.park.tick()
	for _, s := range b.shards {
		if s.rw != nil {
			s.submit(Command{Kind: cmdPost, post: func() {
				s.rw.RaftTick()
				s.moveTick()
				if len(s.streams) > 0 {
					s.now = s.b.NowMs()
					s.checkForwards()
				}
				if s.idx == 0 {
					s.b.helloOrigins()
				}
				if len(s.fc.byID)+len(s.fc.links)+len(s.fc.purges)+len(s.fc.status) > 0 {
					s.now = s.b.NowMs()
					s.tickForwarded()
				}
			}})
		}
	}
}

// MetaGroup is the metadata group (nil before OpenMetaLog): a cluster's
// transport hands it what peers send (Step) and ticks it (Tick).
func (b *Broker) MetaGroup() *replication.MetaGroup { return b.topo.mlog.Load() }

// MetaStatus is the metadata group's state on this node.
type MetaStatus struct {
	Node    uint64 `json:"node"`
	Leader  uint64 `json:"leader"` // 0: none known
	Term    uint64 `json:"term"`
	Commit  uint64 `json:"commit"`
	Applied uint64 `json:"applied"`
	Voters  int    `json:"voters"`
}

// MetaStatus says who leads the metadata group and how far this node has
// applied it (ok false without a metadata log).
func (b *Broker) MetaStatus() (MetaStatus, bool) {
	g := b.topo.mlog.Load()
	if g == nil {
		return MetaStatus{}, false
	}
	st := g.Status()
	return MetaStatus{Node: st.ID, Leader: st.Lead, Term: st.Term, Commit: st.Commit, Applied: st.Applied, Voters: g.Voters()}, true
}

// clusterChange proposes c and waits until it is applied here (the
// metadata group proposes it again if it was lost with its leader), or
// the timeout: the request's answer in a cluster. It waits for c alone,
// not for the changes this node proposed before it. A change not applied
// in time is abandoned: the metadata group never proposes it again, so
// it is applied only if its entry commits as first proposed (at once,
// under the same leader), never later, after a change of leader, when
// the client has moved on.
func (t *topology) clusterChange(cl *metaCluster, c *MetaCommand) MetaResult {
	if cl.removed.Load() {
		return refuse(wire.PreconditionFailed, "this node was removed from the cluster: it no longer serves")
	}
	t.mu.Lock()
	c.NowMs = t.now()
	t.mbuf = AppendMetaCommand(t.mbuf[:0], c)
	if len(t.mbuf) > maxMetaCommand {
		// Past what any change the machine takes can be; larger than
		// an entry the log takes (segment.MaxEntry), every node would
		// stop at the write.
		t.mu.Unlock()
		return refuse(wire.InvalidArgument, fmt.Sprintf("the change is %d bytes encoded, larger than the metadata log takes (%d)", len(t.mbuf), maxMetaCommand))
	}
	if _, err := DecodeMetaCommand(t.mbuf); err != nil {
		// Never proposed: every node would stop at it, now and at each
		// start. The fronts' checks should have refused it first.
		t.mu.Unlock()
		return refuse(wire.InvalidArgument, "the change cannot be stored in the metadata log: "+err.Error())
	}
	seq := cl.g.Add(t.mbuf)
	cl.waiting[seq] = struct{}{}
	t.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), cl.timeout)
	err := cl.g.Wait(ctx, seq)
	cancel()
	t.mu.Lock()
	res, ok := cl.results[seq]
	delete(cl.results, seq)
	delete(cl.waiting, seq)
	t.mu.Unlock()
	if !ok && err != nil {
		cl.g.Abandon(seq)
	}
	switch {
	case ok:
		return res
	case err == nil:
		// The metadata group proposes again a change lost with its
		// leader, and tells Done of every change it resolves: not met.
		return refuse(wire.InternalError, "the metadata group gave no result for the change")
	case errors.Is(err, context.DeadlineExceeded):
		lead := "none known"
		if l := cl.g.Status().Lead; l != 0 {
			lead = fmt.Sprintf("node %d", l)
		}
		return refuse(wire.PreconditionFailed, fmt.Sprintf("the cluster did not apply the change within %v (metadata leader: %s); it may still be applied", cl.timeout, lead))
	default:
		return refuse(wire.InternalError, "the metadata group stopped: "+err.Error())
	}
}

// removal is a queue deletion this node proposed (metaCluster.removes).
type removal struct {
	conn  uint64    // the connection that asked for it, 0 for none (auto-delete, expiry, an owner gone, a forward: its answer waits for it by queue)
	queue uint64    // the queue's id
	until time.Time // waited for until then at most
}

// syncFor names the queue deletions a sync waits for in a cluster: those
// connection conn asked for (its control run's end: EndControlRun), and
// queue's (an operator's delete, a deleted queue's log removed, a
// forwarded delete's answer to its origin: purgeSink). Zero:
// none (every other request waited for its own change: clusterChange).
type syncFor struct{ conn, queue uint64 }

// clusterRemove proposes a queue's deletion without waiting (its shard
// asks, and deletes its own copy at once); every node drops the queue
// when the deletion is applied there. conn is the connection that asked
// for it (0: none), whose control run's end waits for it.
func (t *topology) clusterRemove(cl *metaCluster, q *Queue, conn uint64) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.queues[uint64(q.id)] != q {
		return false
	}
	c := MetaCommand{Op: MetaDeleteQueue, NowMs: t.now(), Queue: wire.QueueDeclare{Name: q.name}, QueueID: uint64(q.id)}
	t.mbuf = AppendMetaCommand(t.mbuf[:0], &c)
	cl.removes[cl.g.Add(t.mbuf)] = removal{conn: conn, queue: uint64(q.id), until: time.Now().Add(cl.timeout)}
	cl.g.Kick()
	return true
}

// clusterSync waits until the queue deletions this node proposed that
// for names (syncFor) are applied here, bounded by the cluster timeout,
// and each by the timeout after it was proposed: one not applied by then
// fails the sync that saw it run out ("it may still be applied": it is
// proposed again at the next change of leader), and no later one waits
// for it. No sync waits for another request's deletion, nor for one no
// request asked for: a deletion lost on its way to a leader that stays
// holds up nothing else.
func (t *topology) clusterSync(ctx context.Context, cl *metaCluster, what syncFor) error {
	if what == (syncFor{}) {
		return nil
	}
	parent := ctx
	ctx, cancel := context.WithTimeout(ctx, cl.timeout)
	defer cancel()
	type pending struct {
		seq uint64
		by  time.Time
	}
	var rs []pending
	t.mu.Lock()
	for seq, r := range cl.removes {
		if (what.conn != 0 && r.conn == what.conn) || (what.queue != 0 && r.queue == what.queue) {
			rs = append(rs, pending{seq, r.until})
		}
	}
	t.mu.Unlock()
	var failed error
	for _, r := range rs {
		wctx, wcancel := context.WithDeadline(ctx, r.by)
		err := cl.g.Wait(wctx, r.seq)
		wcancel()
		switch {
		case err == nil:
		case errors.Is(err, context.DeadlineExceeded) && !time.Now().Before(r.by):
			// Its own time ran out: answered (here) as not applied, once.
			t.mu.Lock()
			delete(cl.removes, r.seq)
			t.mu.Unlock()
			failed = err
		default:
			failed = err
		}
		if ctx.Err() != nil {
			break
		}
	}
	switch {
	case failed == nil:
		return nil
	case parent.Err() != nil:
		return parent.Err()
	case errors.Is(failed, context.DeadlineExceeded):
		lead := "none known"
		if l := cl.g.Status().Lead; l != 0 {
			lead = fmt.Sprintf("node %d", l)
		}
		return &wire.Error{Code: wire.PreconditionFailed, Reason: fmt.Sprintf("the cluster did not apply the queue deletion within %v (metadata leader: %s); it may still be applied", cl.timeout, lead)}
	default:
		return &wire.Error{Code: wire.InternalError, Reason: "the metadata group stopped: " + failed.Error()}
	}
}

// clusterDeclareQueue is declareQueue in a cluster: a generated name is
// drawn here and carried in the command, as on one node.
func (t *topology) clusterDeclareQueue(cl *metaCluster, d *wire.QueueDeclare, owner uint64, user string) (*Queue, error) {
	c := MetaCommand{Op: MetaDeclareQueue, User: user, Conn: owner, Queue: *d}
	if dc := t.shards[0].b.cfg.Durable; !placed(d) && dc != nil && dc.NodeID != 0 {
		// It lives on this node (homed.go).
		c.Home, c.HomeInc = dc.NodeID, t.shards[0].b.homeInc()
	}
	if d.Name == "" && !d.Passive {
		if _, err := wire.ParseQueueArgs(d.Args); err != nil {
			return nil, err
		}
		t.mu.Lock()
		for c.Queue.Name == "" || t.meta.HasQueue(c.Queue.Name) {
			c.Queue.Name = generatedQueueName()
		}
		t.mu.Unlock()
		c.Generated = true
	}
	r := t.clusterChange(cl, &c)
	if err := r.Err(); err != nil {
		return nil, err
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	q := t.queues[r.QueueID]
	if q == nil {
		return nil, reqErr(wire.NotFound, "queue %q was deleted as it was declared", c.Queue.Name)
	}
	return q, nil
}

// MetaReady says whether this node can serve topology: without a cluster,
// once the metadata log is open; in a cluster, once the metadata group
// has a leader and this node has applied every entry it knows committed.
func (b *Broker) MetaReady() bool {
	st, ok := b.MetaStatus()
	if !ok {
		return false
	}
	if b.topo.cl.Load() == nil {
		return true
	}
	if b.MetaRemoved() {
		return false
	}
	// A node that restarted serves once its queues of the earlier life
	// are dropped (homed.go): a client redeclaring one here must get a
	// new queue, not one about to go.
	return st.Leader != 0 && st.Commit > 0 && st.Applied >= st.Commit && !b.ownOldHomes()
}

// WaitMetaReady waits until MetaReady (polling every 20 ms; in a cluster
// the other nodes may still be starting).
func (b *Broker) WaitMetaReady(ctx context.Context) error {
	tk := time.NewTicker(20 * time.Millisecond)
	defer tk.Stop()
	for !b.MetaReady() {
		select {
		case <-tk.C:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

// peersOrNone: a joining node's group starts with no voters (the
// leader's snapshot says who votes), not with itself alone.
func peersOrNone(p []uint64) []uint64 {
	if len(p) < 2 {
		return nil
	}
	return p
}
