package sim

// The seeded fake network between the nodes (network, endpoint: a
// replication.Transport): raft messages and snapshots marshalled, delayed,
// dropped, duplicated and cut by partitions, and the one-vote-per-term
// check made as votes are sent.

import (
	"bytes"
	"errors"

	"github.com/warren-mq/warren/replication"
	"github.com/warren-mq/warren/segment"
	"go.etcd.io/raft/v3/raftpb"
)

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
