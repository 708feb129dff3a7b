package replication

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/warren-mq/warren/segment"
	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
)

// metaNet carries three metadata groups' raft messages in memory (each
// one marshalled and unmarshalled, as the transport does), and lets a
// test cut a node off (a node killed: nothing to or from it), watch
// messages, or hold them back.
type metaNet struct {
	mu    sync.Mutex
	nodes []*metaNode
	down  map[uint64]bool
	// watch is told of every message before it is delivered (under mu);
	// true: the message is held back instead, in held.
	watch func(m raftpb.Message) bool
	held  []raftpb.Message
}

func (n *metaNet) send(gid uint64, msgs []raftpb.Message) {
	for _, m := range msgs {
		b, err := m.Marshal()
		if err != nil {
			panic(err)
		}
		var c raftpb.Message
		if err := c.Unmarshal(b); err != nil {
			panic(err)
		}
		n.mu.Lock()
		if n.down[c.From] || n.down[c.To] {
			n.mu.Unlock()
			continue
		}
		if n.watch != nil && n.watch(c) {
			n.held = append(n.held, c)
			n.mu.Unlock()
			continue
		}
		n.mu.Unlock()
		if g := n.nodes[c.To-1].g.Load(); g != nil {
			g.Step(c)
		}
	}
}

func (n *metaNet) setDown(id uint64, down bool) {
	n.mu.Lock()
	n.down[id] = down
	n.mu.Unlock()
}

// setWatch sets watch (under mu).
func (n *metaNet) setWatch(watch func(m raftpb.Message) bool) {
	n.mu.Lock()
	n.watch = watch
	n.mu.Unlock()
}

// locked is cond run under mu (for a cond that reads what watch writes).
func (n *metaNet) locked(cond func() bool) func() bool {
	return func() bool {
		n.mu.Lock()
		defer n.mu.Unlock()
		return cond()
	}
}

// newMetaTrioMem: newMetaTrio over metaNet.
func newMetaTrioMem(t *testing.T) (*metaNet, []*metaNode) {
	net := &metaNet{down: map[uint64]bool{}}
	net.nodes = make([]*metaNode, 3)
	for i := range net.nodes {
		n := &metaNode{fs: segment.NewMemFS()}
		net.nodes[i] = n
	}
	for i, n := range net.nodes {
		openMetaNodeSend(t, n, uint64(i+1), net.send)
		t.Cleanup(func() { closeMetaNode(n) })
	}
	return net, net.nodes
}

// metaLeaderAmong is metaLeader among nodes up (and with a leader every
// live node knows), ticking only those.
func metaLeaderAmong(t *testing.T, nodes []*metaNode, up []int) int {
	t.Helper()
	live := make([]*metaNode, len(up))
	for i, u := range up {
		live[i] = nodes[u]
	}
	lead := -1
	metaTickUntil(t, live, "a leader among the nodes up", func() bool {
		lead = -1
		for _, u := range up {
			st := nodes[u].g.Load().Status()
			if st.RaftState == raft.StateLeader {
				lead = u
			}
		}
		if lead < 0 {
			return false
		}
		for _, u := range up {
			if nodes[u].g.Load().Status().Lead != uint64(lead+1) {
				return false
			}
		}
		return true
	})
	return lead
}

// others: the two nodes but i.
func others(i int) []int { return []int{(i + 1) % 3, (i + 2) % 3} }

// newMetaTrioFirst is newMetaTrioMem with a leader elected, "declare a"
// added on it, and applied on the follower up[0] (up: the nodes but the
// leader).
func newMetaTrioFirst(t *testing.T) (net *metaNet, nodes []*metaNode, lead int, up []int) {
	t.Helper()
	net, nodes = newMetaTrioMem(t)
	lead = metaLeaderAmong(t, nodes, []int{0, 1, 2})
	metaAdd(t, nodes, lead, "declare a")
	up = others(lead)
	metaTickUntil(t, nodes, "the follower applying the first", func() bool { return nodes[up[0]].machine.list() == "declare a" })
	return net, nodes, lead, up
}

// TestMetaProposalLostWithLeaderIsProposedAgain: a follower's proposal
// forwarded to a leader that is gone before it appends it (killed: every
// message to it dropped) is proposed again once the new leader has
// committed an entry of its term, and applied exactly once on the
// nodes up; the follower's Wait returns (it no longer waits out its
// context). The same holds for a change nobody waits for (Add and
// Kick: the broker's clusterRemove).
func TestMetaProposalLostWithLeaderIsProposedAgain(t *testing.T) {
	for _, waited := range []bool{true, false} {
		t.Run(fmt.Sprintf("waited=%v", waited), func(t *testing.T) {
			net, nodes, lead, up := newMetaTrioFirst(t)
			f := up[0]

			// The leader dies; the follower does not know yet and forwards
			// its proposal to it (the network drops it).
			dropped := make(chan struct{})
			var once sync.Once
			L, F := uint64(lead+1), uint64(f+1)
			net.setWatch(func(m raftpb.Message) bool {
				if m.To != L && m.From != L {
					return false
				}
				if m.Type == raftpb.MsgProp && m.From == F {
					once.Do(func() { close(dropped) })
				}
				return true // held: never delivered
			})
			var done chan error
			if waited {
				done = waitAsync(nodes[f].g.Load(), addOn(nodes[f], "declare b"))
			} else {
				addOn(nodes[f], "declare b")
				nodes[f].g.Load().Kick()
			}
			<-dropped
			if got := nodes[f].g.Load().Status().Lead; got != L {
				t.Fatalf("the follower forwarded with leader %d, want the dead %d", got, L)
			}

			metaLeaderAmong(t, nodes, up)
			live := []*metaNode{nodes[up[0]], nodes[up[1]]}
			metaTickUntil(t, live, "both nodes up applying the change", metaAllApplied(live, "declare a,declare b"))
			if waited {
				metaAwait(t, live, "the follower's Wait", done)
			}
			// More rounds change nothing: applied once.
			metaAdd(t, nodes, up[1], "declare c")
			metaTickUntil(t, live, "both applying the next", func() bool {
				return nodes[up[0]].machine.list() == "declare a,declare b,declare c"
			})
			if got := nodes[up[1]].machine.list(); got != "declare a,declare b,declare c" {
				t.Fatalf("applied %q", got)
			}
		})
	}
}

// TestMetaProposalCommittedIsNotProposedAgain: a follower's proposal the
// leader appended and replicated to both followers before it died (so
// no follower knew it committed) is committed by the new leader and
// applied exactly once: the origin does not propose it again.
func TestMetaProposalCommittedIsNotProposedAgain(t *testing.T) {
	net, nodes, lead, up := newMetaTrioFirst(t)
	f := up[0]
	metaTickUntil(t, nodes, "the other follower applying the first", func() bool { return nodes[up[1]].machine.list() == "declare a" })
	L, F := uint64(lead+1), uint64(f+1)
	got := map[uint64]bool{}
	net.setWatch(func(m raftpb.Message) bool {
		if len(got) == 2 && (m.To == L || m.From == L) {
			return true // the leader is dead once both followers have the entry
		}
		if m.Type == raftpb.MsgApp && m.From == L {
			for _, e := range m.Entries {
				if node, _, _, _ := metaOrigin(e.Data); node == F {
					got[m.To] = true
				}
			}
		}
		return false
	})
	done := waitAsync(nodes[f].g.Load(), addOn(nodes[f], "declare b"))
	live := []*metaNode{nodes[up[0]], nodes[up[1]]}
	metaTickUntil(t, live, "both followers sent the entry", net.locked(func() bool { return len(got) == 2 }))
	metaLeaderAmong(t, nodes, up)
	metaAwait(t, live, "the follower's Wait", done)
	metaAdd(t, nodes, up[1], "declare c")
	metaTickUntil(t, live, "both applying the next", metaAllApplied(live, "declare a,declare b,declare c"))
}

// TestMetaStaleProposalCountsAsNothing: a follower's proposal held in
// the network while its leader is cut off is proposed again in the new
// leader's term and applied; the old proposal, delivered late to the old
// leader (now a follower, which forwards it on), is appended in the new
// term and applied as nothing: the change is applied exactly once, on
// every node, the old leader included.
func TestMetaStaleProposalCountsAsNothing(t *testing.T) {
	net, nodes, lead, up := newMetaTrioFirst(t)
	f := up[0]
	L, F := uint64(lead+1), uint64(f+1)
	var prop []raftpb.Message
	stale := false // an entry appended in a later term than it names
	watch := func(m raftpb.Message) bool {
		for _, e := range m.Entries {
			if _, _, _, term := metaOrigin(e.Data); m.Type == raftpb.MsgApp && term != 0 && term != e.Term {
				stale = true
			}
		}
		if m.To != L && m.From != L {
			return false
		}
		if m.Type == raftpb.MsgProp && m.From == F {
			prop = append(prop, m)
		}
		return true
	}
	net.setWatch(watch)
	done := waitAsync(nodes[f].g.Load(), addOn(nodes[f], "declare b"))
	live := []*metaNode{nodes[up[0]], nodes[up[1]]}
	metaTickUntil(t, live, "the proposal sent to the cut-off leader", net.locked(func() bool { return len(prop) > 0 }))
	newLead := metaLeaderAmong(t, nodes, up)
	metaAwait(t, live, "the follower's Wait", done)
	// Heal; once the old leader follows the new one, it gets the old
	// proposal and forwards it.
	net.setWatch(func(m raftpb.Message) bool { watch(m); return false })
	metaTickUntil(t, nodes, "the old leader following the new", func() bool {
		return nodes[lead].g.Load().Status().Lead == uint64(newLead+1)
	})
	nodes[lead].g.Load().Step(prop[0])
	metaTickUntil(t, nodes, "the old proposal appended in the new term", net.locked(func() bool { return stale }))
	// c comes after it in the log: applied, so is the old proposal.
	metaAdd(t, nodes, newLead, "declare c")
	metaTickUntil(t, nodes, "every node applying all three", metaAllApplied(nodes, "declare a,declare b,declare c"))
}

// TestMetaProposalLostWithSameLeader: a follower's proposal dropped on
// its way to the leader, which stays leader (no new term tells anyone it
// was lost): the follower's later command is applied and its Wait
// returns while the lost one is unresolved (Wait is per command, not
// for every one before it); once the lost one's request gives up
// (Abandon), it is never proposed again, even after a change of leader
// (which used to bring it back: a declare answered as timed out applied
// much later).
func TestMetaProposalLostWithSameLeader(t *testing.T) {
	net, nodes, lead, up := newMetaTrioFirst(t)
	f := up[0]
	L, F := uint64(lead+1), uint64(f+1)
	dropped := make(chan struct{})
	net.setWatch(func(m raftpb.Message) bool {
		if m.Type == raftpb.MsgProp && m.From == F && m.To == L {
			select {
			case <-dropped:
				return false
			default:
				close(dropped) // the first: lost
				return true
			}
		}
		return false
	})
	g := nodes[f].g.Load()
	lost := addOn(nodes[f], "declare b")
	g.Kick()
	<-dropped
	metaAwait(t, nodes, "the later command's Wait, the lost one unresolved", waitAsync(g, addOn(nodes[f], "declare c")))
	if got := nodes[f].machine.list(); got != "declare a,declare c" {
		t.Fatalf("applied %q", got)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := g.Wait(ctx, lost); err == nil {
		t.Fatal("the lost command's Wait returned")
	}
	g.Abandon(lost)
	metaAwait(t, nodes, "the lost command resolved by giving up", waitAsync(g, lost))

	// A new term: the follower learns its entry of the old term is lost.
	net.setDown(L, true)
	newLead := metaLeaderAmong(t, nodes, up)
	if nodes[newLead].g.Load().Status().Term <= nodes[lead].g.Load().Status().Term {
		t.Fatal("no new term")
	}
	live := []*metaNode{nodes[up[0]], nodes[up[1]]}
	metaAdd(t, nodes, newLead, "declare d")
	metaTickUntil(t, live, "the follower applying the new leader's", func() bool {
		return nodes[f].machine.list() == "declare a,declare c,declare d"
	})
	// The follower's next command comes after anything it proposes
	// again: b, had it been kept, would be applied before e.
	metaAwait(t, live, "the follower's next command", waitAsync(g, addOn(nodes[f], "declare e")))
	metaTickUntil(t, live, "both nodes up applying e, and not b", metaAllApplied(live, "declare a,declare c,declare d,declare e"))
}

// TestMetaAbandonedProposalCommitsOnce: a proposal the leader appended
// but had not committed when its request gave up (Abandon) still commits
// under its tag once the leader's messages get through, and is applied
// exactly once, on every node, through a later change of leader: giving
// up takes back nothing already in the log, and proposes nothing again.
func TestMetaAbandonedProposalCommitsOnce(t *testing.T) {
	net, nodes, lead, up := newMetaTrioFirst(t)
	f := up[0]
	metaTickUntil(t, nodes, "the other follower applying the first", func() bool { return nodes[up[1]].machine.list() == "declare a" })
	L, F := uint64(lead+1), uint64(f+1)
	heldTo := map[uint64]bool{}
	net.setWatch(func(m raftpb.Message) bool {
		if m.From != L || m.Type != raftpb.MsgApp {
			return false
		}
		for _, e := range m.Entries {
			if node, _, _, _ := metaOrigin(e.Data); node == F {
				heldTo[m.To] = true
				return true // the entry reaches no follower: not committed
			}
		}
		return false
	})
	g := nodes[f].g.Load()
	seq := addOn(nodes[f], "declare b")
	g.Kick()
	metaTickUntil(t, nodes, "the leader appending the follower's entry", net.locked(func() bool { return len(heldTo) == 2 }))
	g.Abandon(seq)
	metaAwait(t, nodes, "the command resolved by giving up", waitAsync(g, seq))
	if got := nodes[f].machine.list(); got != "declare a" {
		t.Fatalf("applied %q before the leader's messages got through", got)
	}
	net.mu.Lock()
	held := net.held
	net.watch, net.held = nil, nil
	net.mu.Unlock()
	for _, m := range held {
		nodes[m.To-1].g.Load().Step(m)
	}
	metaTickUntil(t, nodes, "every node applying the abandoned entry", metaAllApplied(nodes, "declare a,declare b"))
	net.setDown(L, true)
	newLead := metaLeaderAmong(t, nodes, up)
	live := []*metaNode{nodes[up[0]], nodes[up[1]]}
	metaAdd(t, nodes, newLead, "declare c")
	metaAwait(t, live, "the follower's next command", waitAsync(g, addOn(nodes[f], "declare d")))
	metaTickUntil(t, live, "both nodes up applying d, b once", metaAllApplied(live, "declare a,declare b,declare c,declare d"))
}

// TestMetaMixedVersions: while a member cannot read version 3 entries
// (TagTerms false: a cluster upgraded one node at a time; node 3 plays
// the old build, and no version 3 entry may reach it), every node's
// proposals are written as version 2 and applied everywhere; one lost
// with its leader is not proposed again (a version 2 entry names no
// term: a late copy could not be told from it), and its Wait runs out.
// Once every member reads version 3, entries are written so again.
func TestMetaMixedVersions(t *testing.T) {
	net, nodes := newMetaTrioMem(t)
	for _, n := range nodes {
		n.untagged.Store(true)
	}
	v3To := map[uint64]bool{} // nodes a version 3 entry was sent to
	watch := func(m raftpb.Message) bool {
		for _, e := range m.Entries {
			if len(e.Data) > 1 && e.Data[0] == metaEntryMagic && e.Data[1] == metaEntryVersionTerm {
				v3To[m.To] = true
			}
		}
		return false
	}
	net.setWatch(watch)
	lead := metaLeaderAmong(t, nodes, []int{0, 1, 2})
	for i := range nodes {
		metaAdd(t, nodes, i, fmt.Sprintf("declare %d", i+1))
	}
	metaTickUntil(t, nodes, "every node applying every node's", metaAllApplied(nodes, "declare 1,declare 2,declare 3"))
	if net.locked(func() bool { return len(v3To) > 0 })() {
		t.Fatalf("version 3 entries sent while a member could not read them: to %v", v3To)
	}

	// The leader is cut off as a follower forwards to it.
	up := others(lead)
	f := up[0]
	L, F := uint64(lead+1), uint64(f+1)
	dropped := make(chan struct{})
	var once sync.Once
	net.setWatch(func(m raftpb.Message) bool {
		watch(m)
		if m.To != L && m.From != L {
			return false
		}
		if m.Type == raftpb.MsgProp && m.From == F {
			once.Do(func() { close(dropped) })
		}
		return true
	})
	g := nodes[f].g.Load()
	lost := addOn(nodes[f], "declare b")
	g.Kick()
	<-dropped
	metaLeaderAmong(t, nodes, up)
	live := []*metaNode{nodes[up[0]], nodes[up[1]]}
	metaAwait(t, live, "the follower's next command", waitAsync(g, addOn(nodes[f], "declare c")))
	metaTickUntil(t, live, "both nodes up applying c, not b", metaAllApplied(live, "declare 1,declare 2,declare 3,declare c"))
	// Not proposed again, but not left waiting either: once an entry of
	// a later term is applied, its outcome is unknown (a late copy could
	// still be appended: it cannot be told from another), with no
	// request giving up on it (a background command has none).
	metaAwait(t, live, "the lost command resolved", waitAsync(g, lost))
	nodes[f].lock.Lock()
	res := nodes[f].done[lost]
	nodes[f].lock.Unlock()
	if err, _ := res.(error); !errors.Is(err, ErrMetaOutcomeUnknown) {
		t.Fatalf("Done told %v of the lost command, want ErrMetaOutcomeUnknown", res)
	}
	net.setWatch(watch)
	metaTickUntil(t, nodes, "the cut-off node catching up", metaAllApplied(nodes, "declare 1,declare 2,declare 3,declare c"))
	if net.locked(func() bool { return len(v3To) > 0 })() {
		t.Fatalf("version 3 entries sent while a member could not read them: to %v", v3To)
	}

	// Every member upgraded.
	for _, n := range nodes {
		n.untagged.Store(false)
	}
	for i := range nodes {
		metaAdd(t, nodes, i, fmt.Sprintf("bind %d", i+1))
	}
	metaTickUntil(t, nodes, "every node applying the last", metaAllApplied(nodes, "declare 1,declare 2,declare 3,declare c,bind 1,bind 2,bind 3"))
	if !net.locked(func() bool { return len(v3To) > 0 })() {
		t.Fatal("no version 3 entry once every member reads them")
	}
}
