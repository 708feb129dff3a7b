package replication

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/warren-mq/warren/segment"
	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
	"go.etcd.io/raft/v3/tracker"
)

// MetaGroupID is the metadata group's raft group (and segment group) id
// (design §4: 1 is the snapshot store, queues from 3 up).
const MetaGroupID = 2

// MetaGroup is the metadata raft group on one node (design §4): a single
// voter whose log is segment group 2, its snapshots in the SnapStore. It
// runs on one goroutine of its own, which is also its appender: each round
// takes every command added since the last round, proposes them as ONE
// entry, writes the entry (one segment Append, one fdatasync, shared by
// the group commit with anything else appending), and once raft commits
// it, tells the waiters. So a burst of declarations costs a few fsyncs,
// not one each.
//
// On one voter the state machine is applied when a command is added, by
// the caller, under the lock that orders the adds (Config.Lock): the
// leader's order of proposal is the log's order, and an entry that is
// appended either becomes durable or the node stops (Fatal) and recovers
// from the log, so the state a command sees is the state it will have at
// commit. What waits for the commit is every reply: a caller answers only
// once Wait(seq) returned (netio answers a run of control frames at its
// end). Replay at recovery applies the log's commands through Machine.
// This shortcut is for the single voter only: with several voters
// (MetaConfig.Peers) the loop applies at commit, on every node.
//
// The entry (this group's own format, versioned):
//
//	entry := 'M' u8 | version u8 (=1) | reserved [2]u8 (0) | n u32 | n × (len u32 | command)
//
// and with several voters version 2, which names its origin (MetaConfig.Done):
//
//	entry := 'M' u8 | 2 u8 | reserved [2]u8 (0) | n u32 | node u64 | epoch u64 | first seq u64 | n × (len u32 | command)
//
// or version 3 (what this build writes with several voters once every
// member reads it: MetaConfig.TagTerms), which also names the raft term
// its origin proposed it in:
//
//	entry := 'M' u8 | 3 u8 | reserved [2]u8 (0) | n u32 | node u64 | epoch u64 | first seq u64 | term u64 | n × (len u32 | command)
//
// where each command is the owner's encoding (broker.AppendMetaCommand).
// A version 3 entry that raft committed in another term than the one it
// names is applied as nothing, on every node (the term is the entry's
// own, in the log): a proposal counts only if the leader of the term it
// was made in appended it. That is what makes a proposal lost with a
// leadership safe to propose again (proposeLost).
type MetaGroup struct {
	cfg MetaConfig
	log *segment.Log
	rn  *raft.RawNode
	st  *raftStorage

	// pending: commands added since the last round (cfg.Lock).
	pending    [][]byte
	spare      [][]byte
	added      atomic.Uint64 // seq of the last command added
	entrySince int           // entries since the last snapshot (loop)
	bytesSince int

	mu      sync.Mutex
	durable uint64        // one voter: every command up to this seq is committed; several: every one up to it was collected by the loop
	open    []seqRun      // several voters: the collected seqs not resolved yet (applied, told unknown, or abandoned), in order
	changed chan struct{} // closed and replaced when durable or open moves or the group fails
	failed  error
	closing bool

	wake chan struct{}
	done chan struct{}
	buf  []byte

	// Several voters (MetaConfig.Peers): what Step and Tick hand the loop,
	// the loop's proposals not yet appended, its appended entries not yet
	// applied, and the last applied index.
	multi   bool
	inMu    sync.Mutex
	inbox   []raftpb.Message
	ticks   int
	gaveUp  []uint64             // seqs Abandon was told of, for the loop
	clock   uint64               // ticks the loop has stepped
	heard   map[uint64]uint64    // loop: peer → clock when a message from it was last stepped
	heardAt map[uint64]time.Time // g.mu: peer → when a message from it was last stepped (HeardAt)
	epoch   uint64               // this incarnation's tag on its entries (origin node, epoch)
	applied uint64
	status  raft.BasicStatus // g.mu
	// This node's commands collected from pending and not yet resolved,
	// in seq order (loop), the seq of the last collected, and the term of
	// the last committed entry this node has seen (applied or installed).
	inflight   []metaProposal
	collected  uint64
	commitTerm uint64
	openNext   []seqRun // loop: publishOpen's spare

	// Membership (members.go; several voters): the loop's copy, changed
	// at apply, and what readers see (g.mu). conf is raft's configuration
	// as of applied; confIndex the last conf change appended, leadFrom the
	// last index when this node became leader (raft takes a conf change
	// only once both are applied).
	members   Members
	conf      raftpb.ConfState
	confIndex uint64
	leadFrom  uint64
	view      memberView    // g.mu
	leadCh    chan struct{} // g.mu: closed and replaced when the leader changes
	removed   bool          // this node was removed (the loop stops)
	leading   bool          // raft's last SoftState said leader (loop)
	snapDue   bool          // a snapshot is wanted now (loop: sendSnapshot)
	changeSeq uint64        // seq of this node's conf change proposals (loop)
	changeW   map[uint64]*memberReq
	// What other goroutines hand the loop (inMu).
	reqs      []*memberReq
	transfers []*transferReq
	snapsIn   []*SnapshotMessage
	reports   []snapReport
	staged    *SnapshotMessage // loop
}

// metaProposal is one entry's worth of this node's commands, from seq
// first on, and the term it was last proposed in (0: to propose, again
// once known lost). gone marks the commands whose request gave up
// (Abandon; nil: none): never proposed again, and dropped with the
// entry once it is known lost.
type metaProposal struct {
	first uint64
	cmds  [][]byte
	term  uint64
	gone  []bool
	// untagged: proposed as a version 2 entry (a member could not read
	// version 3: MetaConfig.TagTerms), which names no term: it is never
	// known lost, so never proposed again.
	untagged bool
}

// seqRun is the seqs from first up to (not including) end.
type seqRun struct{ first, end uint64 }

// live is how many of p's commands no request gave up on.
func (p *metaProposal) live() int {
	n := len(p.cmds)
	for _, g := range p.gone {
		if g {
			n--
		}
	}
	return n
}

// liveRuns splits p into proposals of its commands no request gave up
// on, each a run of consecutive seqs, to propose (term 0).
func (p *metaProposal) liveRuns() []metaProposal {
	var out []metaProposal
	for i := 0; i < len(p.cmds); {
		if p.gone != nil && p.gone[i] {
			i++
			continue
		}
		j := i
		for j < len(p.cmds) && (p.gone == nil || !p.gone[j]) {
			j++
		}
		out = append(out, metaProposal{first: p.first + uint64(i), cmds: p.cmds[i:j:j]})
		i = j
	}
	return out
}

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

type snapReport struct {
	to uint64
	ok bool
}

// MetaConfig configures the metadata group.
type MetaConfig struct {
	Log       *segment.Log
	Snapshots *SnapStore
	// Machine is restored from the latest snapshot and replays the
	// committed log at OpenMeta (recovery); the running group does not
	// call it (the caller applies as it adds).
	Machine StateMachine
	// Lock is held by whoever calls Add (the order of adds is the order of
	// the log); the group's loop takes it to collect a round's commands
	// and to take a snapshot.
	Lock sync.Locker
	// Snapshot encodes the state after every command added so far; called
	// with Lock held.
	Snapshot func() []byte
	// SnapshotEntries: a snapshot is taken (and the log compacted to it)
	// once this many entries, or 8 MiB of them, were written since the
	// last (design §4; default 10,000).
	SnapshotEntries int
	NodeID          uint64 // default 1
	// Peers: every voter of the group, this node included (the cluster
	// step); none or one: a single voter. With several voters the caller
	// does NOT apply a command as it adds it: the loop applies every
	// committed command through Machine, on every node, under Lock (an
	// entry a leader appended can be lost with its leadership), and Wait
	// returns once the command is applied here. Send carries the group's
	// raft messages (a Transport), Step takes what peers send, and Tick
	// drives elections and heartbeats. Add on any node: the loop holds
	// what was added while no leader is known, then proposes it, and raft
	// forwards a follower's proposal to the leader. Each entry carries its
	// origin (node, incarnation, first seq) and the term it was proposed
	// in, so the origin's Wait(seq) returns once that command is applied
	// here (whatever became of the others), and Done is told each of its
	// commands' results. A proposal lost with a leadership (forwarded to a
	// leader that died or lost it before appending it, or appended by a
	// leader whose log the next one overwrote) is proposed again, once,
	// when this node has seen an entry of a later term committed
	// (proposeLost: from then on it can never commit); it is applied once,
	// and Wait returns with Done told its result. If a leader's snapshot
	// this node installs may hold it, its fate is unknown here: Done is
	// told ErrMetaOutcomeUnknown. A proposal lost with the same leader (a
	// dropped message: no new term tells) is not known lost until a term
	// changes: bound Wait with a context, and when it runs out, Abandon
	// the command, which is then never proposed again (it is still applied
	// if its entry commits under its own tag). Membership (members.go): after the
	// first snapshot, the snapshot's configuration and members win over
	// Peers; a follower behind the leader's snapshot installs it
	// (SendSnapshot, StepSnapshot).
	Peers []uint64
	Send  func(gid uint64, msgs []raftpb.Message)
	// Done (several voters) is told, under Lock, of each command this node
	// added, by seq, once it is applied here, with Machine.Apply's result.
	Done func(seq uint64, res any)
	// TagTerms (several voters) says whether every one of nodes (the
	// group's voters and learners, this node among them) reads version 3
	// entries (builds before it stop at one: a cluster upgraded one node
	// at a time would lose its quorum). Asked on the loop before each
	// proposal; false: the entry is written as version 2, without its
	// term, and is not proposed again if lost with its leader (nothing
	// could tell a late copy of it from the new one), as before version
	// 3. nil: every node does (one build).
	TagTerms func(nodes []uint64) bool
	// Cluster: several voters' mode whatever Peers holds: a node joining
	// an existing cluster (no Peers) starts with no configuration and
	// learns the group, its members and their addresses from the
	// leader's snapshot (SendSnapshot on the leader, StepSnapshot here).
	Cluster bool
	// Addrs are the members' cluster addresses before the group has a
	// snapshot holding them (Peers' at bootstrap; a joining node's, those
	// its join was answered with).
	Addrs map[uint64]string
	// OnMembers is told the membership and raft's configuration once
	// recovered and after each membership change applied or installed
	// (on the loop: it must not block).
	OnMembers func(Members, raftpb.ConfState)
	// OnRemoved is told once this node has applied its own removal (the
	// group stops; Wait returns ErrRemoved).
	OnRemoved func()
	// SendSnapshot streams the group's latest snapshot to a follower that
	// needs entries the log no longer holds (cluster.Transport.
	// SendSnapshot); done reports whether it was written. nil: such a
	// follower stays behind.
	SendSnapshot func(gid uint64, s *SnapshotMessage, done func(ok bool))
	// Fatal hears an Append failure (the node must stop and recover).
	Fatal  func(error)
	Logger *slog.Logger
}

// ErrMetaStopped: the metadata group is closed or stopped after a failed
// write; a change that was not durable before is not answered.
var ErrMetaStopped = errors.New("replication: the metadata group is stopped")

// ErrMetaOutcomeUnknown is what Done is told of a command whose entry
// this node cannot tell applied or lost: it installed a leader's snapshot
// that may hold it.
var ErrMetaOutcomeUnknown = errors.New("replication: this node installed a snapshot of the metadata that may or may not hold the change")

const (
	metaEntryMagic   = 'M'
	metaEntryVersion = 1
	// metaEntryVersionOrigin (several voters) adds the origin after n:
	// node u64 | epoch u64 | seq of the first command u64.
	metaEntryVersionOrigin = 2
	metaOriginHeader       = 32
	// metaEntryVersionTerm (several voters, this build) adds the term
	// the entry was proposed in after the origin.
	metaEntryVersionTerm = 3
	metaTermHeader       = 40
	metaSnapBytes        = 8 << 20
)

// OpenMeta recovers the metadata group from the log: cfg.Machine is
// restored from the group's latest snapshot and every committed command
// after it is applied to it (raft commits on one voter what the log holds
// beyond the last commit written). It returns the group ready for Start.
// A log that cannot be read (segment.ErrCorrupt names the file), a
// snapshot or an entry this build cannot decode, is an error.
func OpenMeta(cfg MetaConfig) (*MetaGroup, error) {
	if cfg.NodeID == 0 {
		cfg.NodeID = 1
	}
	if cfg.SnapshotEntries <= 0 {
		cfg.SnapshotEntries = 10_000
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	g := &MetaGroup{cfg: cfg, log: cfg.Log, changed: make(chan struct{}), wake: make(chan struct{}, 1), done: make(chan struct{}),
		multi: len(cfg.Peers) > 1 || cfg.Cluster, leadCh: make(chan struct{}), changeW: map[uint64]*memberReq{}}
	if g.multi && cfg.Send == nil {
		return nil, errors.New("replication: metadata group: several voters need MetaConfig.Send")
	}
	snap, data, ok, err := cfg.Snapshots.Load(MetaGroupID)
	if err != nil {
		return nil, fmt.Errorf("replication: metadata group: loading its snapshot: %w", err)
	}
	g.members = Members{Addrs: map[uint64]string{}}
	for _, id := range cfg.Peers {
		g.members.Addrs[id] = cfg.Addrs[id]
	}
	if len(cfg.Peers) == 0 {
		for id, a := range cfg.Addrs {
			g.members.Addrs[id] = a
		}
	}
	if ok {
		m, fsm, has, err := splitMetaImage(data)
		if err != nil {
			return nil, fmt.Errorf("replication: metadata group: its snapshot of entry %d: %w", snap.Index, err)
		}
		if has {
			g.members = m
		}
		if err := cfg.Machine.Restore(snap.Index, fsm); err != nil {
			return nil, fmt.Errorf("replication: metadata group: restoring its snapshot of entry %d: %w", snap.Index, err)
		}
		if ma, ok := cfg.Machine.(interface{ SetMembers([]uint64) }); ok && has {
			ma.SetMembers(g.members.IDs())
		}
	} else if g.multi && len(cfg.Peers) < 2 {
		snap = raftpb.SnapshotMetadata{} // joining: the leader's snapshot says who votes
	} else {
		snap = raftpb.SnapshotMetadata{ConfState: raftpb.ConfState{Voters: g.voters()}}
	}
	g.conf = snap.ConfState
	g.setMembersLocked()
	if g.st, err = openRaftStorage(cfg.Log, MetaGroupID, snap); err != nil {
		return nil, err
	}
	rc := groupConfig(cfg.NodeID, g.st, snap.Index, cfg.Logger)
	if g.multi {
		// Metadata commands carry their own time (the proposer stamps
		// them): a follower's proposals may go to the leader.
		rc.DisableProposalForwarding = false
		g.epoch = uint64(time.Now().UnixNano()) | 1
	}
	if g.rn, err = raft.NewRawNode(rc); err != nil {
		return nil, fmt.Errorf("replication: metadata group: %w", err)
	}
	if !g.multi {
		if err := g.rn.Campaign(); err != nil {
			return nil, fmt.Errorf("replication: metadata group: %w", err)
		}
	}
	if _, err := g.drive(true); err != nil {
		return nil, err
	}
	g.status = g.rn.BasicStatus()
	if ok && snap.Index > 0 {
		if err := cfg.Log.CompactAt(MetaGroupID, snap.Index, max(snap.Term, 1), nil); err != nil {
			return nil, fmt.Errorf("replication: metadata group: %w", err)
		}
	}
	if g.multi && slices.Contains(g.members.Removed, cfg.NodeID) {
		return nil, fmt.Errorf("%w: node %d was removed from the cluster's metadata group; it cannot serve again: start it with an empty data directory and a new --node-id to add it back", ErrRemoved, cfg.NodeID)
	}
	if g.multi && cfg.OnMembers != nil {
		cfg.OnMembers(g.members.Clone(), g.conf)
	}
	return g, nil
}

// drive handles Readys until raft has none: writes what must be written
// (one Append per Ready), and applies committed entries through Machine
// when replaying (recovery), else only notes them. It returns the last
// committed index it saw.
func (g *MetaGroup) drive(replay bool) (uint64, error) {
	last := uint64(0)
	for g.rn.HasReady() {
		rd := g.rn.Ready()
		for _, e := range rd.CommittedEntries {
			last = e.Index
			if e.Type == raftpb.EntryConfChange {
				g.applyConf(e)
				continue
			}
			if e.Type != raftpb.EntryNormal || len(e.Data) == 0 || !replay {
				continue
			}
			if _, _, _, term := metaOrigin(e.Data); term != 0 && term != e.Term {
				continue // proposed in another term: nothing (driveMulti)
			}
			if err := eachMetaCommand(e.Data, func(cmd []byte) error {
				_, err := g.cfg.Machine.Apply(e.Index, cmd)
				return err
			}); err != nil {
				return last, fmt.Errorf("replication: metadata group: entry %d: %w", e.Index, err)
			}
		}
		if len(rd.Entries) > 0 || rd.MustSync {
			b, err := g.st.batch(rd.Entries, rd.HardState)
			if err != nil {
				return last, err
			}
			if err := g.log.Append(b); err != nil {
				return last, err
			}
			if err := g.st.appended(rd.Entries, rd.HardState); err != nil {
				return last, err
			}
			for _, e := range rd.Entries {
				g.entrySince++
				g.bytesSince += len(e.Data)
			}
		}
		if n := len(rd.CommittedEntries); n > 0 {
			g.st.applied(rd.CommittedEntries[n-1].Index)
			g.applied = rd.CommittedEntries[n-1].Index
		}
		g.rn.Advance(rd)
	}
	return last, nil
}

func (g *MetaGroup) voters() []uint64 {
	if g.multi {
		return append([]uint64(nil), g.cfg.Peers...)
	}
	return []uint64{g.cfg.NodeID}
}

// Step hands the group a raft message from a peer (several voters; the
// transport's reader). Safe for concurrent use; the loop steps it.
func (g *MetaGroup) Step(m raftpb.Message) {
	g.inMu.Lock()
	g.inbox = append(g.inbox, m)
	g.inMu.Unlock()
	g.Kick()
}

// Tick advances the group's raft clock by one tick (several voters:
// every 100 ms). Safe for concurrent use.
func (g *MetaGroup) Tick() {
	if !g.multi {
		return
	}
	g.inMu.Lock()
	g.ticks++
	g.inMu.Unlock()
	g.Kick()
}

// Voters is how many voters the group has.
func (g *MetaGroup) Voters() int {
	if !g.multi {
		return 1
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	return len(g.view.conf.Voters)
}

// HeardAt is when the loop last stepped a raft message from node (a
// heartbeat's answer, a vote, an append): the zero time if never since
// this node started. On the leader, a live peer is heard every heartbeat
// (a node's liveness, as broker's homes judge it).
func (g *MetaGroup) HeardAt(node uint64) time.Time {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.heardAt[node]
}

// Status is raft's view of the group as of the loop's last round.
func (g *MetaGroup) Status() raft.BasicStatus {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.status
}

// roundMulti is round for several voters: step what peers sent and the
// ticks, propose what was added (once a leader is known: raft forwards a
// follower's proposal to it) and, on the leader, the membership changes
// and transfers asked for, then drive.
func (g *MetaGroup) roundMulti() error {
	g.inMu.Lock()
	msgs, ticks, reqs, transfers, snaps, reports, gaveUp := g.inbox, g.ticks, g.reqs, g.transfers, g.snapsIn, g.reports, g.gaveUp
	g.inbox, g.ticks, g.reqs, g.transfers, g.snapsIn, g.reports, g.gaveUp = nil, 0, nil, nil, nil, nil, nil
	g.inMu.Unlock()
	for range ticks {
		g.rn.Tick()
	}
	g.clock += uint64(ticks)
	for _, r := range reports {
		st := raft.SnapshotFinish
		if !r.ok {
			st = raft.SnapshotFailure
		}
		g.rn.ReportSnapshot(r.to, st)
	}
	if len(msgs) > 0 {
		now := time.Now()
		g.mu.Lock()
		if g.heardAt == nil {
			g.heardAt = map[uint64]time.Time{}
		}
		for _, m := range msgs {
			g.heardAt[m.From] = now
		}
		g.mu.Unlock()
	}
	for _, m := range msgs {
		if g.heard == nil {
			g.heard = map[uint64]uint64{}
		}
		g.heard[m.From] = g.clock
		if err := g.rn.Step(m); err != nil {
			g.cfg.Logger.Debug("replication: metadata group: a peer's message refused", "type", m.Type, "from", m.From, "err", err)
		}
	}
	for _, sm := range snaps {
		if g.staged == nil || g.staged.Msg.Snapshot.Metadata.Index <= sm.Msg.Snapshot.Metadata.Index {
			g.staged = sm
		}
		if err := g.rn.Step(sm.Msg); err != nil {
			g.cfg.Logger.Debug("replication: metadata group: a snapshot refused", "from", sm.Msg.From, "err", err)
		}
	}
	// Collected even with no leader known, so that a request giving up
	// meanwhile (Abandon) finds its command, and it is never proposed.
	g.cfg.Lock.Lock()
	cmds := g.pending
	g.pending = nil
	seq := g.added.Load()
	g.cfg.Lock.Unlock()
	if len(cmds) > 0 {
		g.inflight = append(g.inflight, metaProposal{first: seq - uint64(len(cmds)) + 1, cmds: cmds})
		g.collected = seq
	}
	if len(gaveUp) > 0 {
		g.giveUp(gaveUp)
	}
	if len(cmds) > 0 || len(gaveUp) > 0 {
		g.publishOpen()
	}
	bs := g.rn.BasicStatus()
	if bs.Lead != raft.None {
		g.proposeLost(bs.Term)
	}
	leader := bs.RaftState == raft.StateLeader
	for _, r := range reqs {
		g.proposeChange(r, leader)
	}
	for _, t := range transfers {
		t.done <- g.transfer(t.to, leader)
	}
	if leader && len(g.conf.Learners) > 0 && len(g.conf.Voters) < MaxMetaVoters && g.confFree() {
		g.promoteCaughtUp()
	}
	if err := g.driveMulti(); err != nil {
		return err
	}
	st := g.rn.BasicStatus()
	g.mu.Lock()
	if st.Lead != g.status.Lead {
		close(g.leadCh)
		g.leadCh = make(chan struct{})
	}
	g.status = st
	g.mu.Unlock()
	if st.RaftState != raft.StateLeader && len(g.changeW) > 0 {
		for seq, r := range g.changeW {
			r.done <- fmt.Errorf("%w: this node lost the leadership before the change was applied; it may still be applied", ErrNotMetaLeader)
			delete(g.changeW, seq)
		}
	}
	if g.removed {
		return ErrRemoved
	}
	// The first snapshot comes as soon as anything is applied: it keeps
	// the configuration and members, and with the log compacted past
	// entry 1 a node that joins gets the snapshot (never the log from
	// its start, whose first configuration is in no entry).
	if g.entrySince >= g.cfg.SnapshotEntries || g.bytesSince >= metaSnapBytes || (g.st.snap.Index == 0 && g.applied > 0) ||
		(g.snapDue && g.applied > g.st.snap.Index) {
		g.snapDue = false
		g.cfg.Lock.Lock()
		snap := g.cfg.Snapshot()
		g.cfg.Lock.Unlock()
		return g.snapshotAt(g.applied, snap)
	}
	return nil
}

// proposeLost proposes, in seq order, this node's collected commands
// not proposed yet or known lost (term 0), each entry tagged with term,
// raft's current term here (a leader is known). One raft refuses (a
// transfer, or the leader just went) waits for the next round.
//
// Why proposing a lost one again cannot apply it twice: an entry counts
// only if committed in the term it names (driveMulti), and it is known
// lost only once this node applied an entry of a later term: that
// entry's leader had committed it, so its log up to it is every node's
// for good, and the entry was not in it (this node applies in log order:
// it would have applied it first); after it, a log holds only entries of
// that term or later, where the old tag does not count. Raft may still
// append the old proposal (a forwarded MsgProp carries no term, and a
// node forwards it on to the leader it knows): applied as nothing.
func (g *MetaGroup) proposeLost(term uint64) {
	asked, tag := false, false
	for i := range g.inflight {
		p := &g.inflight[i]
		if p.term != 0 {
			continue
		}
		if !asked {
			asked, tag = true, g.tagTerms()
		}
		v := byte(metaEntryVersionTerm)
		if !tag {
			v = metaEntryVersionOrigin
		}
		data := []byte{metaEntryMagic, v, 0, 0}
		data = binary.LittleEndian.AppendUint32(data, uint32(len(p.cmds)))
		data = binary.LittleEndian.AppendUint64(data, g.cfg.NodeID)
		data = binary.LittleEndian.AppendUint64(data, g.epoch)
		data = binary.LittleEndian.AppendUint64(data, p.first)
		if tag {
			data = binary.LittleEndian.AppendUint64(data, term)
		}
		for _, c := range p.cmds {
			data = binary.LittleEndian.AppendUint32(data, uint32(len(c)))
			data = append(data, c...)
		}
		if err := g.rn.Propose(data); err != nil {
			g.cfg.Logger.Debug("replication: metadata group: proposal held for the next round", "commands", len(p.cmds), "err", err)
			return
		}
		p.term, p.untagged = term, !tag
	}
}

// tagTerms: whether every member reads version 3 entries (TagTerms).
func (g *MetaGroup) tagTerms() bool {
	if g.cfg.TagTerms == nil {
		return true
	}
	nodes := make([]uint64, 0, len(g.conf.Voters)+len(g.conf.Learners))
	nodes = append(append(nodes, g.conf.Voters...), g.conf.Learners...)
	return g.cfg.TagTerms(nodes)
}

// resolved drops this node's proposal whose first seq is first (applied),
// marks those an entry of a later term than theirs proved lost (to
// propose again: proposeLost; only their commands no request gave up
// on), and tells the waiters.
func (g *MetaGroup) resolved(first uint64) {
	lost := false
	for i := 0; i < len(g.inflight); i++ {
		p := &g.inflight[i]
		if first != 0 && p.first == first {
			g.inflight = slices.Delete(g.inflight, i, i+1)
			i--
			continue
		}
		if p.term != 0 && p.term < g.commitTerm && !p.untagged {
			live := p.liveRuns()
			g.cfg.Logger.Info("metadata group: a change proposed in an earlier term was lost with its leader; proposing it again",
				"term", p.term, "committed term", g.commitTerm, "commands", len(p.cmds), "given up", len(p.cmds)-p.live())
			g.inflight = slices.Replace(g.inflight, i, i+1, live...)
			i += len(live) - 1
			lost = lost || len(live) > 0
		}
	}
	if lost {
		g.Kick()
	}
	g.publishOpen()
}

// giveUp marks the commands of seqs as given up (Abandon): one not
// proposed yet never will be; one proposed may still commit under its
// tag (then it is applied, as any entry), but it is never proposed
// again. An entry all of whose commands were given up is forgotten.
func (g *MetaGroup) giveUp(seqs []uint64) {
	for _, seq := range seqs {
		i := slices.IndexFunc(g.inflight, func(p metaProposal) bool { return seq >= p.first && seq < p.first+uint64(len(p.cmds)) })
		if i < 0 {
			continue // resolved already, or never collected
		}
		p := &g.inflight[i]
		if p.gone == nil {
			p.gone = make([]bool, len(p.cmds))
		}
		p.gone[seq-p.first] = true
		switch {
		case p.live() == 0:
			g.inflight = slices.Delete(g.inflight, i, i+1)
		case p.term == 0:
			g.inflight = slices.Replace(g.inflight, i, i+1, p.liveRuns()...)
		}
	}
}

// publishOpen tells Wait which collected seqs are not resolved yet.
func (g *MetaGroup) publishOpen() {
	next := g.openNext[:0]
	for _, p := range g.inflight {
		next = append(next, seqRun{p.first, p.first + uint64(len(p.cmds))})
	}
	g.mu.Lock()
	if g.collected != g.durable || !slices.Equal(next, g.open) {
		g.durable = g.collected
		g.open, g.openNext = next, g.open
		close(g.changed)
		g.changed = make(chan struct{})
	} else {
		g.openNext = next
	}
	g.mu.Unlock()
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

// StepSnapshot hands the group a snapshot its leader sent (the
// transport's receiving side, for a MsgSnap): staged and stepped by the
// loop; raft then installs it, or answers that it is not needed.
func (g *MetaGroup) StepSnapshot(s *SnapshotMessage) {
	if s.Msg.Type != raftpb.MsgSnap || s.Msg.Snapshot == nil {
		return
	}
	g.inMu.Lock()
	g.snapsIn = append(g.snapsIn, s)
	g.inMu.Unlock()
	g.Kick()
}

// sendSnapshot sends the latest snapshot for raft's MsgSnap m (the
// descriptor only): the image from the store, streamed by the transport,
// which reports back.
func (g *MetaGroup) sendSnapshot(m raftpb.Message) {
	report := func(ok bool) {
		g.inMu.Lock()
		g.reports = append(g.reports, snapReport{to: m.To, ok: ok})
		g.inMu.Unlock()
		g.Kick()
	}
	if g.cfg.SendSnapshot == nil {
		g.rn.ReportSnapshot(m.To, raft.SnapshotFailure)
		return
	}
	meta, data, ok, err := g.cfg.Snapshots.Load(MetaGroupID)
	if err != nil || !ok || meta.Index < m.Snapshot.Metadata.Index {
		g.cfg.Logger.Warn("metadata group: no snapshot to send", "to", m.To, "err", err)
		g.rn.ReportSnapshot(m.To, raft.SnapshotFailure)
		return
	}
	if !slices.Contains(meta.ConfState.Voters, m.To) && !slices.Contains(meta.ConfState.Learners, m.To) {
		// raft refuses a snapshot whose configuration lacks the node (one
		// taken before it joined): take a new one, and raft asks again.
		g.snapDue = true
		g.rn.ReportSnapshot(m.To, raft.SnapshotFailure)
		return
	}
	s := &SnapshotMessage{Msg: m, Data: data}
	s.Msg.Snapshot = &raftpb.Snapshot{Metadata: meta}
	g.cfg.Logger.Info("metadata group: sending a snapshot to a node behind the log", "to", m.To, "entry", meta.Index, "bytes", len(data))
	g.cfg.SendSnapshot(MetaGroupID, s, report)
}

// install makes the leader's snapshot raft took durable and restores the
// state machine and members from it: the log's divergent suffix cut, the
// snapshot stored (a restart recovers to it from here), the log
// compacted to it.
func (g *MetaGroup) install(snap raftpb.Snapshot) error {
	meta := snap.Metadata
	s := g.staged
	if s == nil || s.Msg.Snapshot.Metadata.Index != meta.Index || s.Msg.Snapshot.Metadata.Term != meta.Term {
		return fmt.Errorf("replication: metadata group: raft installs snapshot %d (term %d), which was never staged", meta.Index, meta.Term)
	}
	g.staged = nil
	m, fsm, ok, err := splitMetaImage(s.Data)
	if err == nil && !ok {
		err = errors.New("an image without its membership")
	}
	if err != nil {
		return fmt.Errorf("replication: metadata group: the leader's snapshot %d: %w", meta.Index, err)
	}
	if g.st.last > meta.Index {
		if err := g.log.Truncate(MetaGroupID, meta.Index+1); err != nil {
			return err
		}
	}
	if err := g.cfg.Snapshots.Put(MetaGroupID, meta, s.Data); err != nil {
		return err
	}
	if err := g.log.CompactAt(MetaGroupID, meta.Index, meta.Term, nil); err != nil {
		return err
	}
	g.st.installed(meta)
	g.cfg.Lock.Lock()
	err = g.cfg.Machine.Restore(meta.Index, fsm)
	if ma, ok := g.cfg.Machine.(interface{ SetMembers([]uint64) }); ok && err == nil {
		ma.SetMembers(m.IDs())
	}
	g.cfg.Lock.Unlock()
	if err != nil {
		return fmt.Errorf("replication: metadata group: restoring the leader's snapshot %d: %w", meta.Index, err)
	}
	g.members, g.conf, g.applied = m, cloneConf(meta.ConfState), meta.Index
	g.entrySince, g.bytesSince = 0, 0
	// This node's proposals made in the snapshot's term or before may be
	// in it: their fate is unknown here (one made later is not in it).
	g.commitTerm = max(g.commitTerm, meta.Term)
	g.cfg.Lock.Lock()
	g.inflight = slices.DeleteFunc(g.inflight, func(p metaProposal) bool {
		if p.term == 0 || p.term > meta.Term {
			return false
		}
		if g.cfg.Done != nil {
			for i := range p.cmds {
				if p.gone == nil || !p.gone[i] {
					g.cfg.Done(p.first+uint64(i), ErrMetaOutcomeUnknown)
				}
			}
		}
		return true
	})
	g.cfg.Lock.Unlock()
	g.resolved(0)
	g.setMembersLocked()
	g.cfg.Logger.Info("metadata group: installed the leader's snapshot", "entry", meta.Index, "term", meta.Term,
		"voters", meta.ConfState.Voters, "learners", meta.ConfState.Learners)
	if g.cfg.OnMembers != nil {
		g.cfg.OnMembers(g.members.Clone(), g.conf)
	}
	if slices.Contains(m.Removed, g.cfg.NodeID) {
		g.removed = true
		if g.cfg.OnRemoved != nil {
			g.cfg.OnRemoved()
		}
	}
	return nil
}

// driveMulti handles Readys until raft has none: installs a leader's
// snapshot, writes the entries and hard state (one Append each,
// synchronous), then sends the messages (after the write: nothing goes
// out that the disk does not have yet; a snapshot raft wants sent is
// loaded and streamed), then applies the committed entries through
// Machine under Lock (conf changes through applyConf), tells Done of
// this node's commands, and moves the waiters' seq past them.
func (g *MetaGroup) driveMulti() error {
	for g.rn.HasReady() {
		rd := g.rn.Ready()
		if rd.SoftState != nil {
			if lead := rd.SoftState.RaftState == raft.StateLeader; lead && !g.leading {
				g.leadFrom = max(g.st.last, g.applied)
			}
			g.leading = rd.SoftState.RaftState == raft.StateLeader
		}
		if !raft.IsEmptySnap(rd.Snapshot) {
			if err := g.install(rd.Snapshot); err != nil {
				return err
			}
		}
		if len(rd.Entries) > 0 || rd.MustSync {
			b, err := g.st.batch(rd.Entries, rd.HardState)
			if err != nil {
				return err
			}
			if err := g.log.Append(b); err != nil {
				return err
			}
			if err := g.st.appended(rd.Entries, rd.HardState); err != nil {
				return err
			}
		}
		for _, e := range rd.Entries {
			g.entrySince++
			g.bytesSince += len(e.Data)
			if e.Type == raftpb.EntryConfChange {
				g.confIndex = max(g.confIndex, e.Index)
			}
		}
		if len(rd.Messages) > 0 {
			msgs := rd.Messages[:0:0]
			for _, m := range rd.Messages {
				if m.Type == raftpb.MsgSnap {
					g.sendSnapshot(m)
					continue
				}
				msgs = append(msgs, m)
			}
			if len(msgs) > 0 {
				g.cfg.Send(MetaGroupID, msgs)
			}
		}
		if len(rd.CommittedEntries) > 0 {
			for _, e := range rd.CommittedEntries {
				g.commitTerm = max(g.commitTerm, e.Term)
				if e.Type == raftpb.EntryConfChange {
					g.applyConf(e)
					g.applied = e.Index
					continue
				}
				if e.Type != raftpb.EntryNormal || len(e.Data) == 0 {
					continue
				}
				node, epoch, seq, term := metaOrigin(e.Data)
				if term != 0 && term != e.Term {
					// Proposed in another term (a forwarded proposal raft
					// appended late): it counts as nothing; its origin
					// proposes it again once it knows it lost.
					g.cfg.Logger.Debug("metadata group: an entry proposed in another term applied as nothing",
						"entry", e.Index, "term", e.Term, "proposed in", term, "node", node)
					continue
				}
				mine := node == g.cfg.NodeID && epoch == g.epoch
				first := seq
				g.cfg.Lock.Lock()
				err := eachMetaCommand(e.Data, func(cmd []byte) error {
					res, err := g.cfg.Machine.Apply(e.Index, cmd)
					if err == nil && mine {
						if g.cfg.Done != nil {
							g.cfg.Done(seq, res)
						}
						seq++
					}
					return err
				})
				g.cfg.Lock.Unlock()
				if err != nil {
					return fmt.Errorf("replication: metadata group: entry %d: %w", e.Index, err)
				}
				if mine {
					g.resolved(first)
				}
			}
			last := rd.CommittedEntries[len(rd.CommittedEntries)-1].Index
			g.st.applied(last)
			g.applied = last
			g.resolved(0)
		}
		g.rn.Advance(rd)
	}
	return nil
}

// metaOrigin is the origin of an entry with one (versions 2 and 3): its
// node, that node's incarnation, the seq of its first command, and
// (version 3) the term it was proposed in; zeros for version 1, a zero
// term for version 2.
func metaOrigin(b []byte) (node, epoch, seq, term uint64) {
	if len(b) < metaOriginHeader || (b[1] != metaEntryVersionOrigin && b[1] != metaEntryVersionTerm) {
		return 0, 0, 0, 0
	}
	if b[1] == metaEntryVersionTerm && len(b) >= metaTermHeader {
		term = binary.LittleEndian.Uint64(b[32:])
	}
	return binary.LittleEndian.Uint64(b[8:]), binary.LittleEndian.Uint64(b[16:]), binary.LittleEndian.Uint64(b[24:]), term
}

// eachMetaCommand calls fn with each command of an entry (views).
func eachMetaCommand(b []byte, fn func([]byte) error) error {
	if len(b) < 8 || b[0] != metaEntryMagic {
		return errors.New("not a metadata entry")
	}
	if b[1] != metaEntryVersion && b[1] != metaEntryVersionOrigin && b[1] != metaEntryVersionTerm {
		return fmt.Errorf("metadata entry version %d: this build reads %d to %d (a newer Warren wrote it: upgrade)", b[1], metaEntryVersion, metaEntryVersionTerm)
	}
	if b[2]|b[3] != 0 {
		return errors.New("metadata entry: reserved bytes are not zero")
	}
	n := binary.LittleEndian.Uint32(b[4:])
	if b[1] == metaEntryVersionOrigin {
		if len(b) < metaOriginHeader {
			return errors.New("metadata entry: its origin is cut short")
		}
		b = b[metaOriginHeader:]
	} else if b[1] == metaEntryVersionTerm {
		if len(b) < metaTermHeader {
			return errors.New("metadata entry: its origin is cut short")
		}
		b = b[metaTermHeader:]
	} else {
		b = b[8:]
	}
	for range n {
		if len(b) < 4 || uint64(binary.LittleEndian.Uint32(b)) > uint64(len(b)-4) {
			return errors.New("metadata entry: a command runs past its end")
		}
		l := binary.LittleEndian.Uint32(b)
		if err := fn(b[4 : 4+l]); err != nil {
			return err
		}
		b = b[4+l:]
	}
	if len(b) != 0 {
		return fmt.Errorf("metadata entry: %d trailing bytes", len(b))
	}
	return nil
}

// Add logs cmd (copied) after every command added before it and returns
// its seq, for Wait. The caller holds cfg.Lock and has applied cmd. It
// does not start a write: Wait (or Kick) does, so a run of adds followed
// by one Wait is one entry.
func (g *MetaGroup) Add(cmd []byte) uint64 {
	g.pending = append(g.pending, append([]byte(nil), cmd...))
	return g.added.Add(1)
}

// Kick starts a round for what was added (a change nobody waits for, such
// as a queue an expiry deleted, is still written soon).
func (g *MetaGroup) Kick() {
	select {
	case g.wake <- struct{}{}:
	default:
	}
}

// Added is the seq of the last command added.
func (g *MetaGroup) Added() uint64 { return g.added.Load() }

// Wait returns once the command of seq is committed (durable; one voter:
// so is every one before it; several voters: applied here, or its fate
// told unknown, whatever became of the commands before it), or with the
// error that stopped the group, or ctx's. A caller whose ctx ran out
// calls Abandon(seq) (several voters), or the command may be proposed
// again after a change of leader, and applied late.
func (g *MetaGroup) Wait(ctx context.Context, seq uint64) error {
	kicked := false
	for {
		g.mu.Lock()
		done := g.durable >= seq
		if g.multi && done {
			_, found := slices.BinarySearchFunc(g.open, seq, func(r seqRun, s uint64) int {
				switch {
				case r.end <= s:
					return -1
				case r.first > s:
					return 1
				}
				return 0
			})
			done = !found
		}
		failed, ch := g.failed, g.changed
		g.mu.Unlock()
		if done {
			return nil
		}
		if failed != nil {
			return failed
		}
		if !kicked {
			kicked = true
			g.Kick()
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// Abandon gives up on the command of seq (several voters; one voter: no
// effect): its request was answered without its result (Wait's ctx ran
// out). It is never proposed again, so never applied late, after a
// change of leader, when its requester has moved on; if its entry was
// appended by the leader of its term, it may still commit under its tag
// and is then applied, once, as any entry (Done is told, as of any
// command of this node's). Safe for concurrent use.
func (g *MetaGroup) Abandon(seq uint64) {
	if !g.multi {
		return
	}
	g.inMu.Lock()
	g.gaveUp = append(g.gaveUp, seq)
	g.inMu.Unlock()
	g.Kick()
}

// Start runs the group's loop.
func (g *MetaGroup) Start() { go g.loop() }

// Close writes what was added, stops the loop, and returns the error that
// stopped the group, if any. It does not close the log.
func (g *MetaGroup) Close(ctx context.Context) error {
	g.mu.Lock()
	g.closing = true
	g.mu.Unlock()
	select {
	case g.wake <- struct{}{}:
	default:
	}
	select {
	case <-g.done:
	case <-ctx.Done():
		return ctx.Err()
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.failed != nil && !errors.Is(g.failed, ErrMetaStopped) && !errors.Is(g.failed, ErrRemoved) {
		return g.failed
	}
	return nil
}

func (g *MetaGroup) loop() {
	defer close(g.done)
	for {
		<-g.wake
		for {
			g.mu.Lock()
			closing := g.failed == nil && g.closing
			g.mu.Unlock()
			round := g.round
			if g.multi {
				round = g.roundMulti
			}
			if err := round(); err != nil {
				g.fail(err)
				return
			}
			if !closing {
				break // what was added since waits for its Wait or Kick
			}
			if g.multi {
				g.fail(ErrMetaStopped) // a follower cannot commit what it holds
				return
			}
			if g.added.Load() == g.durableSeq() {
				g.fail(ErrMetaStopped)
				return
			}
		}
	}
}

func (g *MetaGroup) durableSeq() uint64 {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.durable
}

func (g *MetaGroup) fail(err error) {
	g.mu.Lock()
	if g.failed == nil {
		g.failed = err
		close(g.changed)
	}
	g.mu.Unlock()
	if errors.Is(err, ErrRemoved) {
		g.cfg.Logger.Warn("metadata group: this node was removed from the cluster; it stops", "node", g.cfg.NodeID)
		return
	}
	if !errors.Is(err, ErrMetaStopped) {
		g.cfg.Logger.Error("replication: the metadata group stopped", "err", err)
		if g.cfg.Fatal != nil {
			g.cfg.Fatal(err)
		}
	}
}

// round proposes the commands added since the last round as one entry,
// writes and commits it, tells the waiters, and snapshots when due.
func (g *MetaGroup) round() error {
	g.cfg.Lock.Lock()
	cmds := g.pending
	g.pending, g.spare = g.spare[:0], cmds
	seq := g.added.Load()
	var snap []byte
	snapDue := g.entrySince >= g.cfg.SnapshotEntries || g.bytesSince >= metaSnapBytes
	if snapDue {
		snap = g.cfg.Snapshot()
	}
	g.cfg.Lock.Unlock()
	if len(cmds) > 0 {
		g.buf = append(g.buf[:0], metaEntryMagic, metaEntryVersion, 0, 0)
		g.buf = binary.LittleEndian.AppendUint32(g.buf, uint32(len(cmds)))
		for _, c := range cmds {
			g.buf = binary.LittleEndian.AppendUint32(g.buf, uint32(len(c)))
			g.buf = append(g.buf, c...)
		}
		clear(cmds)
		// raft keeps the entry's bytes (its log, the storage's tail): a copy.
		if err := g.rn.Propose(append([]byte(nil), g.buf...)); err != nil {
			return fmt.Errorf("replication: metadata group: proposal refused: %w", err)
		}
	}
	if _, err := g.drive(false); err != nil {
		return err
	}
	// Single voter: drive ran until raft had nothing more, so everything
	// proposed is written and committed (an Append error returned above).
	if c := g.rn.BasicStatus().Commit; c < g.st.last {
		return fmt.Errorf("replication: metadata group: entry %d not committed after its write (commit %d)", g.st.last, c)
	}
	st := g.rn.BasicStatus()
	g.mu.Lock()
	g.status = st
	if seq > g.durable {
		g.durable = seq
		close(g.changed)
		g.changed = make(chan struct{})
	}
	g.mu.Unlock()
	if snapDue {
		return g.snapshotAt(g.st.last, snap)
	}
	return nil
}

// snapshotAt stores data, the state after every entry up to at (one
// voter: the last written, all applied at add; several: the last
// applied), and compacts the log to it.
func (g *MetaGroup) snapshotAt(at uint64, data []byte) error {
	term, err := g.st.Term(at)
	if err != nil {
		return fmt.Errorf("replication: metadata group: term of entry %d: %w", at, err)
	}
	meta := raftpb.SnapshotMetadata{Index: at, Term: term, ConfState: raftpb.ConfState{Voters: g.voters()}}
	if g.multi {
		meta.ConfState = cloneConf(g.conf)
		data = wrapMetaImage(g.members, data)
	}
	if err := g.cfg.Snapshots.Put(MetaGroupID, meta, data); err != nil {
		return err
	}
	// segment compacts only below a commit index it has on disk: write the
	// commit raft has (commit-only hard states are written lazily).
	if hs := g.rn.BasicStatus().HardState; hs.Commit > g.st.hs.Commit {
		b, err := g.st.batch(nil, hs)
		if err != nil {
			return err
		}
		if err := g.log.Append(b); err != nil {
			return err
		}
		if err := g.st.appended(nil, hs); err != nil {
			return err
		}
	}
	if err := g.log.Compact(MetaGroupID, at, nil); err != nil {
		return err
	}
	if err := g.st.compacted(meta); err != nil {
		return err
	}
	g.entrySince, g.bytesSince = 0, 0
	return nil
}
