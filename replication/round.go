package replication

// The round (design §3.2): Round proposes what the dirty groups buffered
// and handles their Readys (process, handle), applies committed entries as
// far as they are durable (apply, applyDurable, applyWaiting), sends or
// holds raft's messages (sendEarly, send), and adds each group's writes to
// the round's submission (submit; pipelined for a single node's solo
// groups).

import (
	"fmt"

	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
)

func (w *Worker) mark(g *Group) {
	if !g.queued {
		g.queued = true
		w.dirty = append(w.dirty, g)
	}
}

// Round runs one round at time now (ms, the shard's clock): it proposes
// what every dirty group buffered, collects and handles their Readys
// (up to 4 passes, so a group that became leader or advanced in this
// round proposes or applies at once), and submits the round's writes as
// one Append. It reports whether groups are still dirty (the shard should
// run another round soon).
func (w *Worker) Round(now int64) (more bool) {
	w.stats.Rounds++
	w.now = now
	if w.failed != nil {
		return false
	}
	for pass := 0; pass < 4 && len(w.dirty) > 0; pass++ {
		groups := w.dirty
		w.dirty, w.spare = w.spare[:0], groups
		for _, g := range groups {
			g.queued = false
			if g.err == nil {
				w.process(g, now)
			}
		}
		clear(groups)
	}
	if w.sub != nil {
		w.mu.Lock()
		w.queue = append(w.queue, w.sub)
		w.work.Signal()
		w.mu.Unlock()
		w.sub = nil
		w.stats.Appends++
	}
	return len(w.dirty) > 0
}

// process proposes g's buffered entries and handles its Ready.
func (w *Worker) process(g *Group, now int64) {
	// raft drops every proposal while a leadership transfer is pending:
	// what is buffered waits. An abandoned transfer (the target did not
	// take over within an election timeout) leaves this node leading, and
	// its next Ready (a heartbeat round) proposes it; a transfer that
	// succeeds drops it with the leadership (below), its waiters answered
	// at the step-down.
	if g.leader && g.rn.BasicStatus().LeadTransferee == raft.None {
		// Pace each entry below raft's uncommitted limit: what is left
		// waits for a later round (once applies brought unapplied down),
		// since raft would drop it, commands and all. One entry always
		// goes when nothing is unapplied (raft takes one of any size then).
		limit := w.cfg.MaxUncommittedBytes / 2
		k := 0
		for k < len(g.full) && (g.unapplied == 0 || g.unapplied+len(g.full[k]) <= limit) {
			g.propose(g.full[k])
			k++
		}
		if k > 0 {
			n := copy(g.full, g.full[k:])
			clear(g.full[n:])
			g.full = g.full[:n]
		}
		if len(g.full) == 0 && g.enc.Commands() > 0 && (g.unapplied == 0 || g.unapplied+g.enc.Len() <= limit) {
			g.propose(g.finish(now))
		}
		if len(g.full) > 0 || g.enc.Commands() > 0 {
			defer w.mark(g) // left for the next round
		}
	}
	if g.inflight {
		return
	}
	if g.resume != nil {
		rd := *g.resume
		g.resume = nil
		w.handle(g, rd, now)
		return
	}
	if !g.rn.HasReady() {
		if g.forceHS && !raft.IsEmptyHardState(g.pendingHS) {
			g.forceHS = false
			if err := w.submit(g, raft.Ready{}, g.pendingHS, true, false); err != nil {
				g.fail(err)
				return
			}
			g.pendingHS = raftpb.HardState{}
		}
		return
	}
	rd := g.rn.Ready()
	if rd.SoftState != nil {
		was := g.leader
		g.leader = rd.SoftState.RaftState == raft.StateLeader
		if g.leader != was {
			g.dropHanded()
			g.lost = nil // a new leader's progress starts from nothing
		}
		if g.leader && !was {
			// A new term: nothing is proposed in it yet. What this node
			// proposed as an earlier leader may have been overwritten and
			// is never applied; raft forgets its size here too.
			g.unapplied = 0
		}
		if was && !g.leader {
			// Commands buffered for a proposal this node may no longer
			// make: dropped (their waiters hear LeaderChanged).
			clear(g.full)
			g.full = g.full[:0]
			g.enc.Reset()
		}
		if f := w.cfg.LeaderChanged; f != nil && (g.lead != rd.SoftState.Lead || was != g.leader) {
			g.lead = rd.SoftState.Lead
			f(g, g.lead, g.leader)
		}
		g.lead = rd.SoftState.Lead
	}
	if !raft.IsEmptyHardState(rd.HardState) {
		g.commitIdx.Store(rd.HardState.Commit)
	}
	if !raft.IsEmptySnap(rd.Snapshot) {
		g.install(rd) // then the rest of rd (resume)
		return
	}
	g.dropStaged() // raft did not take it (or there was none)
	w.handle(g, rd, now)
}

// handle applies, sends and writes what a Ready holds (its snapshot, if
// any, installed already).
func (w *Worker) handle(g *Group, rd raft.Ready, now int64) {
	// raft's order: a Ready's entries are stored before its committed
	// entries are applied. Those stored already apply now; the rest (a
	// follower handed entries the others committed) once this Ready's
	// write is durable, in persisted.
	applied := g.fsm.AppliedIndex()
	if len(rd.Entries) > 0 && rd.Entries[0].Index <= g.st.durable {
		// rd overwrites entries this node made durable (a follower's
		// divergent suffix, cut as raft requires): what the log holds at
		// those indexes is not what rd commits there, so none of them is
		// durable until rd's write is (stage lowers it alike, later).
		g.st.durable = rd.Entries[0].Index - 1
	}
	if err := g.applyDurable(rd.CommittedEntries); err != nil {
		g.fail(err)
		return
	}
	g.maybeAutoSnapshot(applied, now)
	write := len(rd.Entries) > 0 || rd.MustSync
	if len(rd.Messages) > 0 {
		if hs := rd.HardState; write && !raft.IsEmptyHardState(hs) && (hs.Term != g.st.hs.Term || hs.Vote != g.st.hs.Vote) {
			// A new term or vote: nothing goes before it is on disk (a
			// candidate's vote request, a new term's first append).
			g.held = append(g.held, rd.Messages...)
		} else if write {
			g.sendEarly(rd.Messages)
		} else {
			// Nothing to write and nothing in flight: whatever these
			// acknowledge is durable already (a pre-vote answer, a
			// retransmitted append this node holds), so none waits.
			g.send(rd.Messages)
		}
	}
	hs := rd.HardState
	if raft.IsEmptyHardState(hs) {
		hs = g.pendingHS
	}
	if write && w.pipelined(g, rd) {
		// Raft hears now that the entries are stable (a single voter
		// commits them at once); applyDurable holds them back until
		// persisted says they are.
		if err := w.submit(g, rd, hs, false, true); err != nil {
			g.fail(err)
			return
		}
		g.pendingHS = raftpb.HardState{}
		if err := g.st.stage(rd.Entries); err != nil {
			g.fail(err)
			return
		}
		if g.flights > 0 {
			w.stats.Pipelined++
		}
		g.flights++
		g.rn.Advance(rd)
		w.mark(g)
		return
	}
	if write {
		if err := w.submit(g, rd, hs, false, false); err != nil {
			g.fail(err)
			return
		}
		g.pendingHS = raftpb.HardState{}
		return
	}
	// Nothing to write (a commit-only hard state is written lazily, with
	// the group's next entries): advance now.
	if !raft.IsEmptyHardState(rd.HardState) {
		g.pendingHS = rd.HardState
	}
	g.rn.Advance(rd)
	w.mark(g)
}

// pipelined reports whether g's Ready rd may be written pipelined
// (handle): on a single node (no transport: no other replica ever sees
// an entry before this node made it durable), a group that is its own
// only voter and leads, and rd changes neither term nor vote (those are
// made durable before anything follows, as usual). Its entries are then
// committed in raft's view before they are durable; nothing acts on
// that but applyDurable, which waits for the write.
func (w *Worker) pipelined(g *Group, rd raft.Ready) bool {
	if w.cfg.Send != nil || !g.leader || !g.solo() || len(rd.Messages) > 0 || g.inflight {
		return false
	}
	hs := rd.HardState
	return raft.IsEmptyHardState(hs) || hs.Term == g.st.hs.Term && hs.Vote == g.st.hs.Vote
}

// submit adds a group's batch (rd's entries and hs) to the round's
// Append; a pipelined one does not hold the group's next Ready.
func (w *Worker) submit(g *Group, rd raft.Ready, hs raftpb.HardState, hsOnly, piped bool) error {
	if w.sub == nil {
		if n := len(w.free); n > 0 {
			w.sub, w.free = w.free[n-1], w.free[:n-1]
		} else {
			w.sub = &submission{}
		}
	}
	sub := w.sub
	k := len(sub.batches)
	if k == len(sub.convs) {
		sub.convs = append(sub.convs, nil)
	}
	b, conv, err := g.st.batchTo(sub.convs[k][:0], rd.Entries, hs)
	sub.convs[k] = conv
	if err != nil {
		return err
	}
	for _, e := range b.Entries {
		sub.bytes += len(e.Data)
	}
	sub.batches = append(sub.batches, b)
	sub.groups = append(sub.groups, g)
	sub.readies = append(sub.readies, rd)
	sub.hss = append(sub.hss, hs)
	sub.hsOnly = append(sub.hsOnly, hsOnly)
	sub.piped = append(sub.piped, piped)
	if !piped {
		g.inflight = true
	}
	return nil
}

// apply applies committed entries to the FSM and lets the storage drop
// them from its tail cache.
func (g *Group) apply(ents []raftpb.Entry) error {
	for i := range ents {
		e := &ents[i]
		var data []byte
		switch e.Type {
		case raftpb.EntryNormal:
			data = e.Data
		case raftpb.EntryConfChange:
			var cc raftpb.ConfChange
			if err := cc.Unmarshal(e.Data); err != nil {
				return fmt.Errorf("replication: group %d: conf change %d: %w", g.id, e.Index, err)
			}
			g.setConf(*g.rn.ApplyConfChange(cc))
			g.forgetLost()
		case raftpb.EntryConfChangeV2:
			var cc raftpb.ConfChangeV2
			if err := cc.Unmarshal(e.Data); err != nil {
				return fmt.Errorf("replication: group %d: conf change %d: %w", g.id, e.Index, err)
			}
			g.setConf(*g.rn.ApplyConfChange(cc))
			g.forgetLost()
		}
		if _, err := g.fsm.Apply(e.Index, data); err != nil {
			return fmt.Errorf("replication: group %d: %w", g.id, err)
		}
		g.unapplied = max(0, g.unapplied-len(data))
		g.w.stats.Applied++
		if len(g.handed) > 0 && len(e.Data) > handMin {
			g.spend(e.Data)
		}
	}
	if n := len(ents); n > 0 {
		g.st.applied(ents[n-1].Index)
		g.appliedIdx.Store(ents[n-1].Index)
	}
	if len(g.spent) > 0 && len(g.bodies.entries) == 0 {
		g.recycle() // no view of the tail is out
	}
	return nil
}

// applyDurable applies committed entries ents in order as far as they
// are durable here (stored: a Ready's committed entries may include ones
// its own write, or a pipelined write in flight, is still storing) and
// keeps the rest, and any behind entries already waiting, in waiting for
// applyWaiting. Raft may count them applied: it hands them out once.
func (g *Group) applyDurable(ents []raftpb.Entry) error {
	if len(g.waiting) == 0 {
		k := 0
		for k < len(ents) && ents[k].Index <= g.st.durable {
			k++
		}
		if err := g.apply(ents[:k]); err != nil {
			return err
		}
		ents = ents[k:]
	}
	g.waiting = append(g.waiting, ents...)
	return g.applyWaiting()
}

// applyWaiting applies the waiting entries that are durable now.
func (g *Group) applyWaiting() error {
	k := 0
	for k < len(g.waiting) && g.waiting[k].Index <= g.st.durable {
		k++
	}
	if k == 0 {
		return nil
	}
	err := g.apply(g.waiting[:k])
	n := copy(g.waiting, g.waiting[k:])
	clear(g.waiting[n:]) // their data: the bodies
	g.waiting = g.waiting[:n]
	return err
}

// sendEarly sends what may go before the write is durable and holds the
// rest (the thesis's §10.2.1 rule: a leader's appends and heartbeats go
// at once; acknowledgements of durability wait).
func (g *Group) sendEarly(msgs []raftpb.Message) {
	var now []raftpb.Message
	for _, m := range msgs {
		switch m.Type {
		case raftpb.MsgAppResp, raftpb.MsgVoteResp, raftpb.MsgPreVoteResp:
			g.held = append(g.held, m)
		default:
			now = append(now, m)
		}
	}
	g.send(now)
}

func (g *Group) send(msgs []raftpb.Message) {
	n := 0
	for _, m := range msgs {
		if m.Type == raftpb.MsgSnap {
			g.sendSnapshot(m) // with its data and live entries (install.go)
			continue
		}
		if m.Type == raftpb.MsgAppResp && m.Reject && m.Term == g.lostTerm && g.st.last < g.lostCommit {
			m.Commit = g.lostCommit // (lost.go)
		}
		msgs[n] = m
		n++
	}
	msgs = msgs[:n]
	if len(msgs) == 0 {
		return
	}
	if g.w.cfg.Send == nil {
		g.fail(fmt.Errorf("replication: group %d has messages for peers and there is no transport (cluster step)", g.id))
		return
	}
	g.w.cfg.Send(g.id, msgs)
}
