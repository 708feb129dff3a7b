package replication

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/warren-mq/warren/queue"
)

// Applied is what a QueueFSM hands its sink after each command of an
// entry: the command, the time it ran at, and its effects. Everything in
// it is valid only during the call (the FSM reuses it, the command is a
// decoder's view and the effects belong to the machine): copy what you
// keep.
type Applied struct {
	Index  uint64      // the entry's raft index
	Header EntryHeader // the entry's header (proposer, seq: the leader's pending confirms)
	Cmd    int         // the command's position in the entry
	NowMs  int64       // the time it was applied at: max(Header.NowMs, the previous entry's)
	// Command is the command as applied: its NowMs is NowMs and an
	// Enqueue's message ids are set (index<<16 | slot).
	Command queue.Command
	Effects []queue.Effect
	// From: for the Enqueue of a publish-from (a publish another node
	// forwarded), what the enqueuer table let through (enqueuers.go): the
	// Command's Msgs are then only the messages applied (none unless
	// From.Outcome is FromApplied), From.Skipped of the part's before them.
	From FromResult
	// Err is the machine's refusal of a command a client got wrong (an
	// unknown consumer, an exclusive conflict, ...): the state did not
	// change, every replica refused it alike, and the leader answers the
	// client with it. A settle of a tag no longer outstanding
	// (queue.ErrUnknownTag: taken back by a lease expiry, or a settle
	// replayed or resent) is not reported: it is ignored (design §1.1).
	Err error
}

// Sink receives each applied command (see Applied). On a leader it
// carries out the effects (deliveries, confirms, dead letters); on a
// follower, and while replaying, it does nothing. A nil Sink drops them.
type Sink func(a *Applied)

// QueueFSM applies a durable queue's committed log entries to its
// queue.Machine (design/replication.md §2.1). It is deterministic: every
// replica applying the same entries from the same snapshot computes the
// same state, effects and snapshot bytes.
//
//   - Time: the commands of an entry run at now = max(entry now_ms,
//     lastNow), so time never goes backwards across leader changes or
//     clock steps; lastNow is kept in the snapshot.
//   - Message ids: the i-th message of the entry's Enqueue commands gets
//     index<<16 | i, so ids increase with the log as the Machine requires.
//   - Enqueuer deduplication (enqueuers.go): a publish-from applies only
//     the messages its enqueuer has not had applied; the enqueuer table is
//     replicated state, in the snapshot.
//   - Bookkeeping on every replica (each compacts its own log): the live
//     entry set (entries that still hold a message) and the time of the
//     latest Timer effect (WakeAt: a new leader arms its timer from it).
//   - An entry applies whole or not at all: it is checked completely
//     (framing, every command, the message cap) before its first command
//     runs. A bad entry is an error and changes nothing; the group must
//     stop rather than skip it (replicas would diverge).
//
// Empty entries (raft's no-ops, and conf changes, which the raft worker
// applies itself) must be applied too, as Apply(index, nil), so the FSM
// sees every index once and in order.
//
// It implements StateMachine. Not safe for concurrent use: the shard that
// owns the queue applies its entries.
type QueueFSM struct {
	m       *queue.Machine
	live    liveIndex
	lastNow int64
	wakeAt  int64 // At of the latest Timer effect; 0: none pending
	enq     enqueuerTable
	applied uint64
	bytes   uint64 // entry bytes applied since made or restored (the snapshot policy)
	sink    Sink

	dec  EntryDecoder
	a    Applied
	slot uint64
	each func(int, queue.Command) error // f.applyCommand, bound once
}

var _ StateMachine = (*QueueFSM)(nil)

// Errors of QueueFSM.
var (
	// ErrApplyOrder: an entry applied out of order, or twice.
	ErrApplyOrder = errors.New("replication: entries must be applied once each, in index order")
	// ErrBadFSMSnapshot: bytes that are not a QueueFSM snapshot.
	ErrBadFSMSnapshot = errors.New("replication: malformed queue snapshot")
	// ErrLiveIndex: an effect frees a message no live entry holds (a bug;
	// the group stops rather than compact a body still needed).
	ErrLiveIndex = errors.New("replication: live-entry set out of step with the queue")
)

// maxIndex bounds raft indexes: 48 bits, message ids are index<<16 | slot.
const maxIndex = 1<<48 - 1

// NewQueueFSM returns an FSM over m (a new queue, queue.New with its
// declare time) whose next entry is applied+1: 0 for a group whose log
// starts at 1, or the index of the bootstrap snapshot. m must hold no
// message (a restored queue comes back through Restore).
func NewQueueFSM(m *queue.Machine, applied uint64, sink Sink) *QueueFSM {
	f := &QueueFSM{m: m, applied: applied, sink: sink}
	f.each = f.applyCommand
	f.live.rebuild(m)
	return f
}

// RestoreQueueFSM returns an FSM restored from a snapshot taken at index
// (QueueFSM.Snapshot), whose next entry is index+1.
func RestoreQueueFSM(index uint64, snap []byte, sink Sink) (*QueueFSM, error) {
	f := &QueueFSM{sink: sink}
	f.each = f.applyCommand
	if err := f.Restore(index, snap); err != nil {
		return nil, err
	}
	return f, nil
}

// Machine is the queue the FSM applies to; read it, never command it.
func (f *QueueFSM) Machine() *queue.Machine { return f.m }

// SetSink replaces the sink (a new leader takes over the effects).
func (f *QueueFSM) SetSink(s Sink) { f.sink = s }

// AppliedIndex is the index of the last entry applied.
func (f *QueueFSM) AppliedIndex() uint64 { return f.applied }

// LastNow is the time the last entry was applied at.
func (f *QueueFSM) LastNow() int64 { return f.lastNow }

// WakeAt is when the queue next needs a Tick (the latest Timer effect),
// and whether it needs one at all.
func (f *QueueFSM) WakeAt() (int64, bool) { return f.wakeAt, f.wakeAt != 0 }

// LiveEntries appends the indexes of the entries at or below upTo that
// still hold a message, ascending (segment.Log.Compact's live list).
func (f *QueueFSM) LiveEntries(dst []uint64, upTo uint64) []uint64 {
	return f.live.appendLive(dst, upTo)
}

// AppliedBytes is the number of entry bytes applied since the FSM was made
// or restored.
func (f *QueueFSM) AppliedBytes() uint64 { return f.bytes }

// DeadBytes is the number of log bytes applied entries no longer need
// (what a snapshot lets compaction reclaim), since the FSM was made or
// restored.
func (f *QueueFSM) DeadBytes() uint64 { return f.live.deadBytes }

// Apply applies the committed entry data at raft index index (see
// QueueFSM). Its result is always nil: an entry's commands report through
// the sink, during the call.
func (f *QueueFSM) Apply(index uint64, data []byte) (any, error) {
	if index != f.applied+1 {
		return nil, fmt.Errorf("%w: entry %d after entry %d", ErrApplyOrder, index, f.applied)
	}
	if index > maxIndex {
		return nil, fmt.Errorf("replication: entry index %d past 2^48: message ids would overflow", index)
	}
	if len(data) == 0 {
		f.applied = index
		return nil, nil
	}
	h, msgs, err := f.dec.Check(data)
	if err != nil {
		return nil, fmt.Errorf("entry %d: %w", index, err)
	}
	now := max(h.NowMs, f.lastNow)
	f.lastNow = now
	f.live.add(index, uint32(msgs), uint32(min(len(data), 1<<32-1)))
	f.a = Applied{Index: index, Header: h, NowMs: now}
	f.slot = 0
	err = f.dec.Each(data, f.each)
	// The decoder must not keep the entry alive until the next one: on a
	// replay its data is a copy of a whole Ready's entries (up to 8 MiB
	// per group, raft's MaxCommittedSizePerReady), so an idle queue would
	// pin that much after its last apply, and 100 queues ~800 MB.
	f.dec.Release()
	f.a = Applied{}
	if err != nil {
		return nil, fmt.Errorf("entry %d: %w", index, err)
	}
	f.applied = index
	f.bytes += uint64(len(data))
	return nil, nil
}

// Enqueuers is the number of enqueuers in the queue's table.
func (f *QueueFSM) Enqueuers() int { return f.enq.Len() }

// Duplicate reports whether every message of a publish-from of n
// messages from o has been applied (its apply would be FromDuplicate): a
// resend whose answer was lost, which a leader can confirm before it
// proposes anything. It changes nothing.
func (f *QueueFSM) Duplicate(o Origin, n int) bool { return f.enq.duplicate(o, n) }

// HasEnqueuersOf reports whether an enqueuer of node is in the queue's
// table.
func (f *QueueFSM) HasEnqueuersOf(node uint64) bool { return f.enq.hasNode(node) }

// fromFrame applies the enqueuer side of a publish-from (trimming c to
// what is applied: false, nothing) or an enqueuer-down (false).
func (f *QueueFSM) fromFrame(fr *Frame, c *queue.Enqueue) (bool, error) {
	if fr.Down {
		f.enq.down(fr.Origin.Enqueuer, fr.Origin.Incarnation)
		return false, nil
	}
	r := f.enq.admit(fr.Origin, len(c.Msgs))
	f.a.From = r
	skip := len(c.Msgs)
	if r.Outcome == FromApplied {
		skip = r.Skipped
	}
	// The entry was counted with every message of the part: those not
	// applied hold nothing. They keep their slots: a message's id is its
	// place among the entry's messages, where Group.Body finds its body.
	f.slot += uint64(skip)
	for range skip {
		if !f.live.release(f.a.Index << 16) {
			return false, fmt.Errorf("%w: a publish-from's skipped messages (entry %d)", ErrLiveIndex, f.a.Index)
		}
	}
	c.Msgs = c.Msgs[skip:]
	if c.Bodies != nil {
		c.Bodies = c.Bodies[skip:]
	}
	return r.Outcome == FromApplied, nil
}

// applyCommand runs one command of the entry in f.a.
func (f *QueueFSM) applyCommand(i int, cmd queue.Command) error {
	now := f.a.NowMs
	f.a.From = FromResult{}
	if fr := f.dec.Frame(); fr.From || fr.Down {
		c, _ := cmd.(*queue.Enqueue)
		apply, err := f.fromFrame(fr, c)
		if err != nil || fr.Down {
			return err
		}
		if !apply {
			if f.sink != nil {
				c.NowMs = now
				f.a.Cmd, f.a.Command, f.a.Effects, f.a.Err = i, cmd, nil, nil
				f.sink(&f.a)
			}
			return nil
		}
	}
	switch c := cmd.(type) {
	case *queue.Enqueue:
		c.NowMs = now
		base := f.a.Index << 16
		for k := range c.Msgs {
			c.Msgs[k].ID = base | f.slot
			f.slot++
		}
	case *queue.Settle:
		c.NowMs = now
	case *queue.Subscribe:
		c.NowMs = now
	case *queue.Cancel:
		c.NowMs = now
	case *queue.Down:
		c.NowMs = now
	case *queue.Tick:
		c.NowMs = now
	case *queue.Purge:
		c.NowMs = now
	case *queue.SettleDeadLetter:
		c.NowMs = now
	}
	effs, err := f.m.Apply(cmd)
	switch {
	case err == queue.ErrUnknownTag:
		effs, err = nil, nil // changed nothing: the wake time stands
	case err == nil:
		f.wakeAt = 0 // the machine says when it needs a Tick, if it does
	}
	for k := range effs {
		e := &effs[k]
		switch e.Kind {
		case queue.Timer:
			f.wakeAt = e.At
			continue
		case queue.RejectPublish:
			// reject-publish-dlx: a DeadLetter (or Drop) of the same
			// message follows; that one frees it.
			if k+1 < len(effs) && effs[k+1].Msg == e.Msg && (effs[k+1].Kind == queue.DeadLetter || effs[k+1].Kind == queue.Drop) {
				continue
			}
		case queue.DeadLetter:
			if f.m.IsHeldDeadLetter(e.Msg) {
				// Held until its targets have it (queue.Config.
				// HoldDeadLetters): the SettleDeadLetter's Remove frees it.
				continue
			}
		case queue.Remove, queue.Drop, queue.Duplicate:
		default:
			continue
		}
		if !f.live.release(e.Msg) {
			return fmt.Errorf("%w: command %d (%s): %s of message %#x (entry %d), which holds no message", ErrLiveIndex, i, cmd.Kind(), e.Kind, e.Msg, e.Msg>>16)
		}
	}
	if f.sink != nil {
		f.a.Cmd, f.a.Command, f.a.Effects, f.a.Err = i, cmd, effs, err
		f.sink(&f.a)
	}
	return nil
}

// FSM snapshot: a 32-byte header, then (version 2) the enqueuer table
// (enqueuerTable.appendTo), then the machine's own snapshot
// (queue.Machine.Snapshot, versioned on its own).
//
//	version u8 (1 or 2) | reserved [7]u8 (=0) | applied u64 | last_now i64 | wake_at i64 | [enqueuers] | machine...
//
// Version 1 (no table) is written while the table is empty: what an
// earlier build wrote restores, and such a state is written as it wrote it.
const (
	fsmSnapVersion          = 1
	fsmSnapVersionEnqueuers = 2
	fsmSnapHeaderLen        = 32
)

// Snapshot encodes the state after the last applied entry: the FSM header
// and the machine's exact image (no bodies: they stay in the log, in the
// live entries). Equal states give equal bytes.
func (f *QueueFSM) Snapshot() ([]byte, error) {
	// One buffer of the snapshot's size: the machine's image is appended
	// in place, not built apart and copied.
	b := make([]byte, fsmSnapHeaderLen, fsmSnapHeaderLen+8+24*f.enq.Len()+f.m.SnapshotLen())
	b[0] = fsmSnapVersion
	binary.LittleEndian.PutUint64(b[8:], f.applied)
	binary.LittleEndian.PutUint64(b[16:], uint64(f.lastNow))
	binary.LittleEndian.PutUint64(b[24:], uint64(f.wakeAt))
	if f.enq.Len() > 0 {
		b[0] = fsmSnapVersionEnqueuers
		b = f.enq.appendTo(b)
	}
	return f.m.AppendSnapshot(b), nil
}

// Restore replaces the state with that of a snapshot taken at index, and
// rebuilds the live entry set from the restored machine. On error the FSM
// is unchanged.
func (f *QueueFSM) Restore(index uint64, snap []byte) error {
	if len(snap) < fsmSnapHeaderLen {
		return fmt.Errorf("%w: %d bytes, shorter than its %d-byte header", ErrBadFSMSnapshot, len(snap), fsmSnapHeaderLen)
	}
	if snap[0] != fsmSnapVersion && snap[0] != fsmSnapVersionEnqueuers {
		return fmt.Errorf("%w: version %d (this build reads %d and %d; a newer Warren wrote it: upgrade this node)", ErrBadFSMSnapshot, snap[0], fsmSnapVersion, fsmSnapVersionEnqueuers)
	}
	for _, r := range snap[1:8] {
		if r != 0 {
			return fmt.Errorf("%w: reserved header bytes are not zero", ErrBadFSMSnapshot)
		}
	}
	applied := binary.LittleEndian.Uint64(snap[8:])
	if applied != index {
		return fmt.Errorf("%w: taken at entry %d, restored as entry %d", ErrBadFSMSnapshot, applied, index)
	}
	rest := snap[fsmSnapHeaderLen:]
	var enq enqueuerTable
	if snap[0] == fsmSnapVersionEnqueuers {
		var err error
		if enq, rest, err = parseEnqueuers(rest); err != nil {
			return err
		}
	}
	m, err := queue.Restore(rest)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrBadFSMSnapshot, err)
	}
	f.m = m
	f.enq = enq
	f.applied = applied
	f.lastNow = int64(binary.LittleEndian.Uint64(snap[16:]))
	f.wakeAt = int64(binary.LittleEndian.Uint64(snap[24:]))
	f.live.rebuild(m)
	return nil
}
