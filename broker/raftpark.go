package broker

import (
	"slices"
	"sync"
	"sync/atomic"

	"github.com/warren-mq/warren/queue"
	"go.etcd.io/raft/v3/raftpb"
)

// Parked raft messages (a new replicated queue's first election): each
// replica opens a queue's group as it applies the declare, and the
// preferred leader campaigns as it opens it, often before the other
// replicas have applied that entry. A message for a group not open on a
// node used to be dropped there, so those vote requests were lost and
// the first leader came only after raft's election timeout (1-2 s in
// production), which a client that declares and publishes at once waits
// for. Now such a message is held a little while instead, and stepped
// into the group as the node opens it: the first leader comes in a
// round trip after the last replica applies the declare.
//
// Only messages that can belong to nothing but the group's first open in
// this process are held, so none reaches a group it was not sent to:
//
//   - a queue id this node's metadata has not allocated yet (at or past
//     Meta's next id, by less than parkAhead): a declare not applied
//     here yet. Ids are allocated in order and never reused before they
//     wrap at 2^32, so it is no deleted queue's (a deleted queue's id is
//     below the next id: its messages are dropped, as before), and no
//     earlier copy of the queue on this node;
//   - a queue applied here whose shard has not created it yet
//     (createQueue, behind the apply in the shard's queue).
//
// Whatever is held is handed to the queue's createQueue, which steps it
// into the group it opens, or drops it (a node with no replica, a copy
// that did not open). A message late for its group is one raft allows
// (any message may be delayed): within one group, holding one changes
// nothing of raft's safety. Bounded so that no peer can make a node hold
// much for groups that never open: parkPerGroup messages of at most
// parkMsgBytes each, for at most parkGroups groups and parkBytes in all,
// each group's for at most parkTicks ticks (an election timeout: by then
// the candidate has campaigned again); past a bound a message is dropped,
// as before (raft resends).
type raftPark struct {
	mu     sync.Mutex
	ticks  uint64 // the metadata ticker's count (tick)
	groups map[uint64]*parkedGroup
	bytes  int
	// next is Meta's next queue id as last applied here (0 until the
	// cluster's topology is installed: nothing is held before).
	next atomic.Uint64
}

type parkedGroup struct {
	since uint64 // the tick its first message was held at
	msgs  []raftpb.Message
	bytes int
}

const (
	parkPerGroup = 8
	parkMsgBytes = 4 << 10
	parkGroups   = 256
	parkBytes    = 256 << 10
	parkTicks    = 10
	// parkAhead: how far past the next id a group may be held for (a
	// node that far behind catches up by raft's resends).
	parkAhead = 1024
)

// putLocked holds m for group gid if the bounds allow (mu held).
func (p *raftPark) putLocked(gid uint64, m raftpb.Message) bool {
	sz := m.Size()
	if sz > parkMsgBytes || p.bytes+sz > parkBytes {
		return false
	}
	g := p.groups[gid]
	if g == nil {
		if len(p.groups) >= parkGroups {
			return false
		}
		if p.groups == nil {
			p.groups = map[uint64]*parkedGroup{}
		}
		g = &parkedGroup{since: p.ticks}
		p.groups[gid] = g
	}
	if len(g.msgs) >= parkPerGroup {
		return false
	}
	g.msgs = append(g.msgs, m)
	g.bytes += sz
	p.bytes += sz
	return true
}

// parkUnknown holds m if gid is the group of a queue id this node's
// metadata has not allocated yet and no queue holds its slot. The look
// at the slot is under mu, as createQueue's take is: the queue's slot is
// set before its shard creates it, so a message held here is always
// there for the take.
func (b *Broker) parkUnknown(gid uint64, m raftpb.Message) bool {
	p := &b.park
	next := p.next.Load() // before the slot: a next past gid means its slot is set
	id := gid - QueueGroupBase
	if next == 0 || id >= 1<<32 || uint32(id)-uint32(next) >= parkAhead {
		return false
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if b.topo.slots.get(queue.QueueRef(id)) != nil {
		return false
	}
	return p.putLocked(gid, m)
}

// park holds m for a queue its shard has not created yet (on the shard).
func (p *raftPark) park(gid uint64, m raftpb.Message) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.putLocked(gid, m)
}

// take hands over (and forgets) what is held for group gid.
func (p *raftPark) take(gid uint64) []raftpb.Message {
	// Always under mu (no look at n first): a parkUnknown that saw the
	// slot empty may be about to hold a message for this group, and
	// holds mu until it has.
	p.mu.Lock()
	defer p.mu.Unlock()
	g := p.groups[gid]
	if g == nil {
		return nil
	}
	p.dropLocked(gid, g)
	return g.msgs
}

// takeParked is take for createQueue: once this node is leaving
// (TransferLeaderships), without a MsgTimeoutNow, which StepRaft refuses
// then (one held from before is dropped as if it came now).
func (b *Broker) takeParked(gid uint64) []raftpb.Message {
	msgs := b.park.take(gid)
	if b.leaving.Load() {
		msgs = slices.DeleteFunc(msgs, func(m raftpb.Message) bool { return m.Type == raftpb.MsgTimeoutNow })
	}
	return msgs
}

func (p *raftPark) dropLocked(gid uint64, g *parkedGroup) {
	delete(p.groups, gid)
	p.bytes -= g.bytes
}

// tick advances the park's clock (the metadata ticker) and drops what has
// been held for parkTicks.
func (p *raftPark) tick() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.ticks++
	if len(p.groups) == 0 {
		return
	}
	for gid, g := range p.groups {
		if p.ticks-g.since >= parkTicks {
			p.dropLocked(gid, g)
		}
	}
}
