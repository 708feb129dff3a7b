package replication

import (
	"context"
	"fmt"
	"slices"
	"time"

	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
	"go.etcd.io/raft/v3/tracker"
)

type memberView struct {
	m    Members
	conf raftpb.ConfState
}

type memberReq struct {
	c    MemberChange
	done chan error // buffered: the result, once applied (or refused)
}

type transferReq struct {
	to   uint64
	done chan transferRes
}

type transferRes struct {
	to  uint64
	err error
}

// confFree: raft would take a conf change now (none appended and not
// applied, and this leader applied what it had when elected).
func (g *MetaGroup) confFree() bool {
	return g.applied >= g.confIndex && g.applied >= g.leadFrom
}

// proposeChange checks r on the leader and proposes it; its result comes
// when it is applied here (applyConf).
func (g *MetaGroup) proposeChange(r *memberReq, leader bool) {
	switch {
	case g.removed:
		r.done <- ErrRemoved
		return
	case !leader:
		r.done <- ErrNotMetaLeader
		return
	case !g.confFree():
		r.done <- ErrChangePending
		return
	}
	if err := checkChange(g.members, g.conf, r.c); err != nil {
		r.done <- err
		return
	}
	g.changeSeq++
	if err := g.rn.ProposeConfChange(confChange(r.c, g.cfg.NodeID, g.epoch, g.changeSeq)); err != nil {
		r.done <- fmt.Errorf("replication: metadata group: %w", err)
		return
	}
	g.changeW[g.changeSeq] = r
	g.confIndex = max(g.confIndex, g.st.last+1) // raised to the entry's index once appended
}

// promoteCaughtUp proposes a caught-up learner's promotion (the leader;
// one at a time, the lowest id first).
func (g *MetaGroup) promoteCaughtUp() {
	commit := g.rn.BasicStatus().Commit
	best := uint64(0)
	g.rn.WithProgress(func(id uint64, typ raft.ProgressType, pr tracker.Progress) {
		if typ == raft.ProgressTypeLearner && pr.Match >= commit && (best == 0 || id < best) {
			best = id
		}
	})
	if best == 0 {
		return
	}
	g.changeSeq++
	c := MemberChange{Op: MemberPromote, Node: best}
	if err := g.rn.ProposeConfChange(confChange(c, g.cfg.NodeID, g.epoch, g.changeSeq)); err == nil {
		g.confIndex = max(g.confIndex, g.st.last+1)
		g.cfg.Logger.Info("metadata group: promoting a caught-up learner to voter", "node", best)
	}
}

// transfer starts a leadership transfer to node to (0: the voter whose
// log is the most caught up).
func (g *MetaGroup) transfer(to uint64, leader bool) transferRes {
	if !leader {
		return transferRes{err: ErrNotMetaLeader}
	}
	if to == 0 {
		best, bestMatch := uint64(0), uint64(0)
		g.rn.WithProgress(func(id uint64, typ raft.ProgressType, pr tracker.Progress) {
			// Heard from within an election timeout (10 ticks): a voter
			// not heard from lately may be down (or stopping too). Not
			// raft's RecentActive, which every quorum check clears (a
			// leader of a few ticks read false for every peer).
			if h, ok := g.heard[id]; typ != raft.ProgressTypePeer || id == g.cfg.NodeID || !ok || g.clock-h > 10 {
				return
			}
			if best == 0 || pr.Match > bestMatch || (pr.Match == bestMatch && id < best) {
				best, bestMatch = id, pr.Match
			}
		})
		if best == 0 {
			return transferRes{err: fmt.Errorf("%w: no other voter (heard from lately) to hand the leadership to", ErrMemberRefused)}
		}
		to = best
	}
	if to == g.cfg.NodeID {
		return transferRes{to: to}
	}
	if !slices.Contains(g.conf.Voters, to) {
		return transferRes{err: fmt.Errorf("%w: node %d is not a voter of the metadata group (voters: %s)", ErrMemberUnknown, to, idList(g.conf.Voters))}
	}
	g.rn.TransferLeader(to)
	return transferRes{to: to}
}

// applyConf applies a committed conf change: checked again (every node
// decides the same), applied to raft (or as nothing, when refused), to
// the members, and its result told to this node's proposer.
func (g *MetaGroup) applyConf(e raftpb.Entry) {
	var cc raftpb.ConfChange
	err := cc.Unmarshal(e.Data)
	var c MemberChange
	var node, epoch, seq uint64
	if err == nil {
		c, node, epoch, seq, err = memberChangeOf(cc)
	}
	if err == nil {
		err = checkChange(g.members, g.conf, c)
	}
	if err != nil {
		g.rn.ApplyConfChange(raftpb.ConfChange{}) // applied as nothing
		g.cfg.Logger.Warn("metadata group: membership change refused at apply", "entry", e.Index, "err", err)
	} else {
		g.conf = *g.rn.ApplyConfChange(cc)
		applyMember(&g.members, c)
		g.cfg.Logger.Info("metadata group: membership changed", "entry", e.Index, "op", c.Op, "node", c.Node, "addr", c.Addr,
			"voters", g.conf.Voters, "learners", g.conf.Learners)
		if ma, ok := g.cfg.Machine.(interface{ SetMembers([]uint64) }); ok {
			g.cfg.Lock.Lock()
			ma.SetMembers(g.members.IDs())
			g.cfg.Lock.Unlock()
		}
		if c.Op == MemberRemove && c.Node == g.cfg.NodeID {
			g.removed = true
		}
	}
	g.setMembersLocked()
	if node == g.cfg.NodeID && epoch == g.epoch {
		if r := g.changeW[seq]; r != nil {
			r.done <- err
			delete(g.changeW, seq)
		}
	}
	if g.cfg.OnMembers != nil {
		g.cfg.OnMembers(g.members.Clone(), g.conf)
	}
	if g.removed && g.cfg.OnRemoved != nil {
		g.cfg.OnRemoved()
	}
}

// setMembersLocked publishes the loop's membership to readers.
func (g *MetaGroup) setMembersLocked() {
	g.mu.Lock()
	g.view = memberView{m: g.members.Clone(), conf: cloneConf(g.conf)}
	g.mu.Unlock()
}

func cloneConf(c raftpb.ConfState) raftpb.ConfState {
	return raftpb.ConfState{Voters: slices.Clone(c.Voters), Learners: slices.Clone(c.Learners)}
}

// Members is the membership as of the last round: the addresses, the
// removed ids, and raft's configuration (voters and learners).
func (g *MetaGroup) Members() (Members, raftpb.ConfState) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.view.m.Clone(), cloneConf(g.view.conf)
}

// ChangeMember proposes a membership change on the leader and returns
// once it is applied here, with its refusal if the check at apply
// refused it. ErrNotMetaLeader: this node does not lead (ask the leader);
// ErrChangePending: raft has a change not yet applied (retry).
func (g *MetaGroup) ChangeMember(ctx context.Context, c MemberChange) error {
	if !g.multi {
		return fmt.Errorf("%w: a single node has no membership to change (start nodes with --peers or --join)", ErrMemberRefused)
	}
	r := &memberReq{c: c, done: make(chan error, 1)}
	g.inMu.Lock()
	g.reqs = append(g.reqs, r)
	g.inMu.Unlock()
	g.Kick()
	select {
	case err := <-r.done:
		return err
	case <-g.done:
		return ErrMetaStopped
	case <-ctx.Done():
		return fmt.Errorf("the membership change was not applied in time (it may still be): %w", ctx.Err())
	}
}

// TransferLeadership hands the leadership to node to (0: the most
// caught-up voter) and returns the new leader once this node sees it, or
// ctx's error. ErrNotMetaLeader: this node does not lead.
func (g *MetaGroup) TransferLeadership(ctx context.Context, to uint64) (uint64, error) {
	if !g.multi {
		return 0, fmt.Errorf("%w: a single node", ErrMemberRefused)
	}
	for {
		t := &transferReq{to: to, done: make(chan transferRes, 1)}
		g.inMu.Lock()
		g.transfers = append(g.transfers, t)
		g.inMu.Unlock()
		g.Kick()
		var res transferRes
		select {
		case res = <-t.done:
		case <-g.done:
			return 0, ErrMetaStopped
		case <-ctx.Done():
			return 0, ctx.Err()
		}
		if res.err != nil {
			return 0, res.err
		}
		// raft abandons a transfer after an election timeout: ask again
		// while ctx allows.
		retry := time.NewTimer(2 * time.Second)
		for {
			g.mu.Lock()
			lead, ch := g.status.Lead, g.leadCh
			g.mu.Unlock()
			if lead == res.to {
				retry.Stop()
				return lead, nil
			}
			select {
			case <-ch:
				continue
			case <-retry.C:
			case <-g.done:
				retry.Stop()
				return 0, ErrMetaStopped
			case <-ctx.Done():
				retry.Stop()
				return 0, fmt.Errorf("node %d did not take the leadership in time: %w", res.to, ctx.Err())
			}
			break
		}
		// Again to the same node if one was named; else to the most
		// caught-up voter then (the first may have gone).
	}
}
