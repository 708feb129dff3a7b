package broker

import (
	"slices"
	"strconv"
	"time"

	"github.com/warren-mq/warren/replication"
	"github.com/warren-mq/warren/wire"
)

// Homed queues (issue 14, "any node serves any client", for queues that
// are not replicated): in a cluster a non-durable or exclusive queue
// lives on one node, its home, the node whose client declared it. The
// metadata records the home and its incarnation (the node's start time,
// Broker.seqBase) when the declare is applied, so every node knows it.
// The home holds the queue's only copy, in memory, and serves it as a
// replicated queue's leader serves one; every other node holds no copy
// (q.remote) and forwards to the home what its clients do with it, as it
// does for a replicated queue it holds no replica of: publishes
// (forward_enqueue.go: the home enqueues a forwarded part and confirms it once
// enqueued), consumers, gets and purges (forward_consume.go). An
// exclusive queue's owner is a connection on its home (connection ids
// are the cluster's: node << 32 | a count), so a consumer or purge of
// one on any other node is refused, as the home refuses another
// connection's.
//
// A home's queues do not outlive it: a node that restarts finds its
// queues of the earlier incarnation in the metadata and proposes
// MetaDropHome for them (every node drops them when it is applied; it
// serves once they are gone: MetaReady), and
// the metadata leader proposes it for a node removed from the cluster,
// and for a node down: one it has heard neither a hello from (every
// ForwardTimeout/4, forward_consume.go) nor a metadata raft message (a
// heartbeat's answer) for homeDownMs, the queues of
// the incarnation it heard last and earlier. A leader that never heard
// the node since it started does not declare it down (a restart or a
// removal drops its queues). All are checked every placeTicks
// (dropDeadHomes), so a proposal lost with a change of metadata leader is
// made again. A home cut off from the others is declared down alike: its
// queues go, and it drops them too once it hears the cluster again.
//
// On one node nothing here runs: no queue has a home (MetaCommand.Home
// is 0), and non-durable queues are local as ever.

// homeKey is a home node and its incarnation.
type homeKey struct{ node, inc uint64 }

// dropHome is MetaDropHome: every queue whose home is c.Home, of an
// incarnation up to c.HomeInc with HomeUpTo (what this build proposes),
// or of any with HomeInc 0, is removed with its bindings. So a restarted
// node's drop committed after it restarted again leaves that later life's
// queues.
//
// The legacy form, HomeInc without HomeUpTo (a restarted node's own drop,
// written by b09a9d2..4334fcd, and by no build since), removes every
// incarnation's queues but HomeInc's, later ones too: what it did when
// written, and so what the snapshots those builds took and every node
// that applied it live hold. Reading it otherwise would make a replay of
// their logs differ from their snapshots and from the other nodes.
func (m *Meta) dropHome(c *MetaCommand) (MetaResult, []MetaEffect) {
	if c.Home == 0 {
		return refuse(wire.InvalidArgument, "a home node to drop needs its id"), nil
	}
	var effs []MetaEffect
	for _, q := range m.Queues() {
		mq := m.queues[q.Name]
		if mq.home != c.Home || (c.HomeUpTo && mq.homeInc > c.HomeInc) || (!c.HomeUpTo && c.HomeInc != 0 && mq.homeInc == c.HomeInc) {
			continue
		}
		effs = append(effs, m.removeQueue(mq))
	}
	return MetaResult{}, effs
}

// deadHomes lists the MetaDropHome commands the state asks for, as node
// self (of incarnation inc) sees it: its own queues of earlier incarnations,
// and, when lead, those of nodes no longer members, and those of the
// nodes down says are down (down reports the last incarnation heard of a
// node that is, as a home incarnation). Cheap: it looks at the (node,
// incarnation) pairs that hold queues, not at the queues.
func (m *Meta) deadHomes(self, inc uint64, lead bool, down func(node uint64) (uint64, bool)) []MetaCommand {
	var out []MetaCommand
	var gone, dead []uint64
	own := false
	for k := range m.homes {
		switch {
		case k.node == self:
			own = own || k.inc < inc
		case !lead:
		case !slices.Contains(m.Nodes(), k.node):
			gone = append(gone, k.node)
		case down != nil:
			if last, ok := down(k.node); ok && k.inc <= last {
				dead = append(dead, k.node)
			}
		}
	}
	if own {
		// Those before this life only (inc is odd: inc-1 is none's).
		out = append(out, MetaCommand{Op: MetaDropHome, Home: self, HomeInc: inc - 1, HomeUpTo: true})
	}
	slices.Sort(gone)
	for _, n := range slices.Compact(gone) {
		out = append(out, MetaCommand{Op: MetaDropHome, Home: n})
	}
	slices.Sort(dead)
	for _, n := range slices.Compact(dead) {
		last, _ := down(n)
		out = append(out, MetaCommand{Op: MetaDropHome, Home: n, HomeInc: last, HomeUpTo: true})
	}
	return out
}

// dropDeadHomes proposes the MetaDropHome commands the metadata asks for
// (every placeTicks, from the cluster's ticker; own: only this node's
// own, every ownHomesTicks until none is left), without waiting. The
// ticker's goroutine calls it.
func (t *topology) dropDeadHomes(self, inc uint64, own bool) {
	cl := t.cl.Load()
	if cl == nil || cl.removed.Load() {
		return
	}
	st := cl.g.Status()
	if st.Lead == 0 {
		return
	}
	b := t.shards[0].b
	now := time.Now()
	down := func(node uint64) (uint64, bool) { return b.homeDown(node, now, cl.g.HeardAt(node)) }
	t.mu.Lock()
	defer t.mu.Unlock()
	cs := t.meta.deadHomes(self, inc, st.Lead == st.ID && !own, down)
	if own && len(cs) > 0 {
		cl.ownAt = cl.tickN
	}
	for i := range cs {
		cs[i].NowMs = t.now()
		t.mbuf = AppendMetaCommand(t.mbuf[:0], &cs[i])
		cl.g.Add(t.mbuf)
		why := "removed from the cluster"
		switch {
		case cs[i].Home == self:
			why = "restarted"
		case cs[i].HomeUpTo:
			why = "down: not heard from for " + strconv.FormatInt(b.homeDownMs(), 10) + " ms"
		}
		t.log.Info("dropping the non-durable and exclusive queues of a node (they live on one node)", "node", cs[i].Home, "why", why)
	}
	if len(cs) > 0 {
		cl.g.Kick()
	}
}

// homeDownMs: a node not heard from for this long (3 × ForwardTimeout,
// 30 s by default) is down as a home: the metadata leader drops its
// queues.
func (b *Broker) homeDownMs() int64 {
	d := b.cfg.Durable.ForwardTimeout
	if d <= 0 {
		d = defaultForwardTimeout
	}
	return 3 * d.Milliseconds()
}

// homeDown reports whether node is down as a home at now, and the home
// incarnation this node heard of it last; a node never heard from is not.
// Down: neither its hello (forward_consume.go) nor any metadata raft
// message (raft: when the metadata group last heard it; on the leader,
// every heartbeat of a live node) came for homeDownMs. Hellos alone do
// not say: the forward queue to a busy peer drops them when full.
func (b *Broker) homeDown(node uint64, now, raft time.Time) (uint64, bool) {
	o := &b.origins
	o.mu.Lock()
	defer o.mu.Unlock()
	inc, at := o.inc[node], o.heardAt[node]
	if raft.After(at) {
		at = raft
	}
	if inc == 0 || now.Sub(at).Milliseconds() < b.homeDownMs() {
		return 0, false
	}
	return inc | 1, true
}

// ownOldHomes reports whether the metadata, as applied here, still has
// queues of this node's earlier lives (MetaReady waits until not).
func (b *Broker) ownOldHomes() bool {
	dc := b.cfg.Durable
	if dc == nil || dc.NodeID == 0 {
		return false
	}
	t := b.topo
	t.mu.Lock()
	defer t.mu.Unlock()
	for k := range t.meta.homes {
		if k.node == dc.NodeID && k.inc < b.homeInc() {
			return true
		}
	}
	return false
}

// homeInc is this node's incarnation as a home: its start time
// (Broker.seqBase), never 0.
func (b *Broker) homeInc() uint64 { return b.seqBase | 1 }

// homedElsewhere reports whether q lives on another node (homed.go).
func (q *Queue) homedElsewhere(self uint64) bool { return q.home != 0 && q.home != self }

// homeEnqueuer is what the home of a queue keeps of one origin's stream
// to it: its incarnation and the last qseq enqueued.
type homeEnqueuer struct{ inc, last uint64 }

// homeAdmit decides what of a forwarded part of n messages from o the
// home of q enqueues, by the rules of a replicated queue's enqueuer
// table (replication/enqueuers.go), kept in memory only: the queue is.
// So a part sent again (its answer lost, or late) is not enqueued twice
// while the home lives.
func (q *Queue) homeAdmit(o replication.Origin, n int) replication.FromResult {
	r := replication.FromResult{Origin: o, N: n}
	e, ok := q.homeEnq[o.Enqueuer]
	switch {
	case ok && o.Incarnation < e.inc:
		r.Outcome = replication.FromStale
		return r
	case !ok && len(q.homeEnq) >= replication.MaxEnqueuers:
		r.Outcome = replication.FromFull
		return r
	case !ok || o.Incarnation > e.inc:
		e = homeEnqueuer{inc: o.Incarnation}
	}
	switch {
	case o.QSeq > e.last+1 || o.QSeq == 0:
		r.Outcome, r.ResendFrom = replication.FromGap, e.last+1
		return r
	case o.QSeq+uint64(n) <= e.last+1:
		r.Outcome = replication.FromDuplicate
		return r
	}
	r.Outcome, r.Skipped = replication.FromApplied, int(e.last+1-o.QSeq)
	e.last = o.QSeq + uint64(n) - 1
	if q.homeEnq == nil {
		q.homeEnq = map[uint64]homeEnqueuer{}
	}
	q.homeEnq[o.Enqueuer] = e
	return r
}

// homeDuplicate reports whether homeAdmit would find a forwarded part of
// n messages from o a duplicate (every message enqueued before); it
// changes nothing.
func (q *Queue) homeDuplicate(o replication.Origin, n int) bool {
	e, ok := q.homeEnq[o.Enqueuer]
	return ok && o.Incarnation == e.inc && o.QSeq != 0 && o.QSeq+uint64(n) <= e.last+1
}

// forwardedBefore reports whether q holds every message of a forwarded
// part of n messages from o already (a resend whose answer was lost):
// its answer is a confirm, whatever holds new publishes back.
func (q *Queue) forwardedBefore(o replication.Origin, n int) bool {
	if q.grp != nil {
		return q.grp.FSM().Duplicate(o, n)
	}
	return q.homeDuplicate(o, n)
}

// forwardedDuplicate answers a forwarded part whose messages q holds
// already (forwardedBefore): confirmed, not enqueued again; on a
// reject-publish queue nacked instead, as applying it would (homeAdmit,
// appliedEnqueue).
func (s *shard) forwardedDuplicate(q *Queue, items []EnqItem, batch *PublishBatch) {
	s.b.fwdDuplicates.Add(uint64(len(items)))
	reject := q.args.Overflow == wire.RejectPublish || q.args.Overflow == wire.RejectPublishDLX
	for _, it := range items {
		if reject {
			batch.Nack(it.Idx, wire.InternalNack)
		}
		s.release(it.Msg)
	}
	batch.PartDone()
}

// enqueueForwarded enqueues a part another node forwarded to q, which
// lives here (its home): confirmed once enqueued (codes in batch),
// what was enqueued before not again (homeAdmit).
func (s *shard) enqueueForwarded(q *Queue, items []EnqItem, batch *PublishBatch, k *fwdSink) {
	r := q.homeAdmit(k.origin, len(items))
	skip := len(items)
	switch r.Outcome {
	case replication.FromApplied:
		skip = r.Skipped
	case replication.FromGap:
		k.from = r.ResendFrom
	case replication.FromFull, replication.FromStale:
		k.refused = true
	}
	if r.Outcome == replication.FromApplied || r.Outcome == replication.FromDuplicate {
		s.b.fwdDuplicates.Add(uint64(skip))
		if q.args.Overflow == wire.RejectPublish || q.args.Overflow == wire.RejectPublishDLX {
			// Whether the full queue took them the first time is not
			// remembered: nacked (each may be in the queue), as a
			// replicated queue does.
			for i := range skip {
				batch.Nack(items[i].Idx, wire.InternalNack)
			}
		}
	}
	for _, it := range items[:skip] {
		s.release(it.Msg)
	}
	if skip == len(items) {
		batch.PartDone()
		return
	}
	s.enqueue(items[skip:], batch, nil)
}

// homeEnqueuerDown forgets an origin's ended stream to q (its 'D').
func (q *Queue) homeEnqueuerDown(enq, inc uint64) {
	if e, ok := q.homeEnq[enq]; ok && e.inc <= inc {
		delete(q.homeEnq, enq)
	}
}

// homeRefusal is the refusal of a consumer, get or purge of exclusive
// queue q on a node that is not its home: the connection that owns it
// is on the home.
func homeRefusal(q *Queue) (wire.Code, string) {
	return wire.ResourceLocked, "queue " + strconv.Quote(LocalName(q.name)) + " is exclusive to another connection (on node " +
		strconv.FormatUint(q.home, 10) + ")"
}
