package sim

// The workload: each group's random queue configuration, and one random
// queue command at a time proposed at a group's leader.

import (
	"encoding/binary"
	"math/rand/v2"

	"github.com/warren-mq/warren/queue"
	"github.com/warren-mq/warren/replication"
	"github.com/warren-mq/warren/wire"
	"go.etcd.io/raft/v3"
)

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
