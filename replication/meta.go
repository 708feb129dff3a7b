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
)

// The metadata group is in several files: this one opens it, runs its
// loop and the single voter's round; meta_multi.go is several voters'
// round (raft messages in, entries written, sent and applied);
// meta_proposals.go this node's proposals and their fate (the entry's
// commands read back, a lost proposal proposed again, Wait, Abandon);
// meta_members.go membership changes and leadership transfers;
// meta_snapshot.go snapshots taken, sent and installed.

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
	// 3: once an entry of a later term is applied before it, Done is
	// told ErrMetaOutcomeUnknown of its commands (and their results too,
	// should a late copy be applied after all). nil: every node does
	// (one build).
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
// that may hold it, or (proposed as version 2: TagTerms) an entry of a
// later term was applied before it, and it may still be appended late.
var ErrMetaOutcomeUnknown = errors.New("replication: this node cannot tell whether the metadata change was applied (it installed a snapshot that may hold it, or it was proposed untagged and its leader changed)")

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
	// metaEntryBytes bounds the commands of one entry: a round's commands
	// past it are proposed as several entries (one command alone may be
	// larger), so that no entry is one the log refuses (segment.MaxEntry:
	// a control run of 600 bindings of 60 KiB arguments made one of
	// 36 MiB, and the node stopped).
	metaEntryBytes = 4 << 20
)

// metaChunks splits cmds into runs of at most metaEntryBytes of commands
// (with their lengths), each run non-empty.
func metaChunks(cmds [][]byte) [][][]byte {
	var out [][][]byte
	start, size := 0, 0
	for i, c := range cmds {
		if i > start && size+4+len(c) > metaEntryBytes {
			out = append(out, cmds[start:i:i])
			start, size = i, 0
		}
		size += 4 + len(c)
	}
	if start < len(cmds) {
		out = append(out, cmds[start:])
	}
	return out
}

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

// metaDriveBytes bounds what one round proposes before it writes and
// commits it: half of raft's MaxUncommittedEntriesSize.
const metaDriveBytes = 32 << 20

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
	proposed := 0 // bytes proposed and not yet driven to disk
	for _, run := range metaChunks(cmds) {
		g.buf = append(g.buf[:0], metaEntryMagic, metaEntryVersion, 0, 0)
		g.buf = binary.LittleEndian.AppendUint32(g.buf, uint32(len(run)))
		for _, c := range run {
			g.buf = binary.LittleEndian.AppendUint32(g.buf, uint32(len(c)))
			g.buf = append(g.buf, c...)
		}
		if proposed > 0 && proposed+len(g.buf) > metaDriveBytes {
			// Written and committed before more is proposed: raft drops
			// a proposal past MaxUncommittedEntriesSize (64 MiB), and a
			// round of many chunks reached it (the node stopped).
			if _, err := g.drive(false); err != nil {
				return err
			}
			proposed = 0
		}
		// raft keeps the entry's bytes (its log, the storage's tail): a copy.
		if err := g.rn.Propose(append([]byte(nil), g.buf...)); err != nil {
			return fmt.Errorf("replication: metadata group: proposal refused: %w", err)
		}
		proposed += len(g.buf)
	}
	clear(cmds)
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
