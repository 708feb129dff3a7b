package sim

// The faults injected while the workload runs (partitions, failed syncs,
// crashes and clean restarts, segment maintenance, snapshots, leadership
// transfers), and the heal that ends them.

import (
	"go.etcd.io/raft/v3/raftpb"
)

func (s *sim) fault() {
	switch k := s.r.IntN(13); {
	case k < 3: // partition: a random side against the rest
		clear(s.net.cut)
		side := map[uint64]bool{}
		for _, n := range s.nodes {
			side[n.id] = s.r.IntN(2) == 0
		}
		for _, a := range s.nodes {
			for _, b := range s.nodes {
				if side[a.id] != side[b.id] {
					s.net.cut[[2]uint64{a.id, b.id}] = true
				}
			}
		}
		s.res.Partitions++
		s.tracef("partition %v", side)
	case k < 5:
		clear(s.net.cut)
		s.tracef("network heals")
	case k < 8: // a sync fails soon on one node: it crashes with torn bytes
		n := s.nodes[s.r.IntN(len(s.nodes))]
		if n.up {
			n.armed = true
			n.fs.FailSync(1 + s.r.IntN(4))
			s.tracef("node %d: a sync will fail", n.id)
		}
	case k < 9: // a crash between writes, or a clean restart
		n := s.nodes[s.r.IntN(len(s.nodes))]
		switch {
		case !n.up:
		case n.armed || s.r.IntN(3) > 0:
			n.crash(s.r.IntN(2048))
		default:
			s.res.Restarts++
			s.tracef("node %d restarts cleanly", n.id)
			n.stop()
			if err := n.log.Close(); err != nil {
				s.fail("node %d: closing its log: %v", n.id, err)
				return
			}
			if err := n.start(); err != nil {
				s.fail("%v", err)
			}
		}
	case k < 10: // segment maintenance (moves WAL entries into segment files)
		n := s.nodes[s.r.IntN(len(s.nodes))]
		// Not with a sync failure armed: maintenance syncs several files in
		// parallel, and which of them failed would differ from run to run.
		if n.up && !n.armed {
			err := n.log.Maintain()
			s.tracef("node %d: segment maintenance: %v", n.id, err)
		}
	case k < 11: // a node snapshots a group and compacts its log
		n := s.nodes[s.r.IntN(len(s.nodes))]
		gs := s.groups[s.r.IntN(len(s.groups))]
		if !n.up {
			break
		}
		g := n.group(gs.gid)
		err := g.Snapshot(n.store, func(meta raftpb.SnapshotMetadata, err error) {
			s.tracef("node %d group %d: snapshot at %d: %v", n.id, gs.gid, meta.Index, err)
			if err == nil {
				s.res.Snapshots++
			}
		})
		if err != nil {
			s.tracef("node %d group %d: snapshot: %v", n.id, gs.gid, err)
		}
		n.dirty = true
	default: // a leader hands a group to another voter
		gs := s.groups[s.r.IntN(len(s.groups))]
		if n, g := s.leader(gs); g != nil {
			to := uint64(1 + s.r.IntN(len(s.nodes)))
			s.res.Transfers++
			s.tracef("group %d: node %d transfers leadership to %d", gs.gid, n.id, to)
			g.TransferLeadership(to)
			n.dirty = true
		}
	}
}

// heal ends the faults: the network is whole and lossless, crashed nodes
// restart, and pending sync failures are disarmed.
func (s *sim) heal() {
	s.healed = true
	s.healAt = s.now
	clear(s.net.cut)
	s.net.drop, s.net.dup, s.net.late = 0, 0, 0
	for _, n := range s.nodes {
		n.fs.FailSync(0)
	}
	s.tracef("heal")
	for _, n := range s.nodes {
		if !n.up {
			s.tracef("node %d restarts (heal)", n.id)
			if err := n.start(); err != nil {
				s.fail("%v", err)
				return
			}
		}
	}
}
