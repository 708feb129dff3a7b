package sim

// The invariants checked while the simulation runs and once it is healed
// (one leader per term, snapshots equal at equal index, log matching,
// every committed publish applied everywhere), and what caughtUp and
// describe say of the nodes.

import (
	"bytes"
	"fmt"
	"slices"

	"github.com/warren-mq/warren/segment"
	"go.etcd.io/raft/v3"
)

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
			if g.Installing() {
				continue // the log is compacted to the snapshot, the FSM not restored yet
			}
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
