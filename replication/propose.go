package replication

// What a group proposes: commands added (Add, AddEnqueue; split into
// entries of about entryBufMax), entries finished and proposed, the
// Ticks of time-driven work (Tick, NextWake), and a solo group's large
// proposal buffers handed to raft and recycled once applied (spend,
// recycle).

import (
	"errors"
	"unsafe"

	"github.com/warren-mq/warren/queue"
)

// LastSeq is the proposal seq of the last command added: that of the
// entry being built if it holds any, else that of the last one proposed
// (0 before any). Everything added so far is applied once an entry with
// this seq or a later one of this incarnation has been.
func (g *Group) LastSeq() uint64 {
	if g.enc.Commands() > 0 {
		return g.seq + 1
	}
	return g.seq
}

// Add buffers cmd for the group's next proposal (one entry per group per
// round, design §1.3) and returns the proposal seq of the entry it goes
// into: the entry is applied under that seq (Applied.Header.Seq, with
// Proposer node<<48 | shard), which is how a leader matches the confirms
// it holds to what was applied (§3.4). The command is encoded now: cmd
// may be reused when Add returns. Its time and message ids are set at
// apply.
func (g *Group) Add(cmd queue.Command) (seq uint64, err error) {
	if err := g.canAdd(); err != nil {
		return 0, err
	}
	err = g.enc.Add(cmd)
	if errors.Is(err, ErrEntryFull) {
		g.endEntry()
		err = g.enc.Add(cmd)
	}
	return g.added(err)
}

// AddEnqueue adds an Enqueue of msgs whose bodies src writes straight
// into the entry (EntryEncoder.AddEnqueue: one copy of each body, where
// building an Enqueue's Bodies for Add costs two); as Add.
func (g *Group) AddEnqueue(nowMs int64, msgs []queue.Message, src queue.BodySource) (seq uint64, err error) {
	if err := g.canAdd(); err != nil {
		return 0, err
	}
	err = g.enc.AddEnqueue(nowMs, msgs, src)
	if errors.Is(err, ErrEntryFull) {
		g.endEntry()
		err = g.enc.AddEnqueue(nowMs, msgs, src)
	}
	return g.added(err)
}

// canAdd says whether the group takes commands (and readies the
// encoder: presize).
func (g *Group) canAdd() error {
	if g.err != nil {
		return g.err
	}
	if !g.leader && (len(g.conf.Voters) > 1 || len(g.conf.Learners) > 0) {
		return ErrNotLeader
	}
	if g.w.failed != nil {
		return ErrWorkerStopped
	}
	g.presize()
	return nil
}

// Sizes of a busy group's entries: once an entry holds splitMin bytes
// (half of entryBufMax),
// it ends where its buffer is full, and a new one starts, rather than
// being copied into a buffer twice the size (a round of a busy queue
// brings megabytes, in amounts that vary from round to round); and a
// new entry's buffer is at most entryBufMax. So a busy queue's entries
// are about entryBufMax each, their buffers all of one size, which the
// pool of proposal buffers has at hand (growing by copies, from
// buffers of every size, the pool mostly missed: a fresh buffer, zeroed
// and faulted in, and a copy of every body, per entry).
const (
	splitMin    = entryBufMax / 2
	entryBufMax = 1 << 20
)

// presize gives an encoder with no buffer one of about the size of the
// group's last entry, and sets it to split.
func (g *Group) presize() {
	g.enc.split = splitMin
	if g.enc.buf == nil && g.encHint > handMin {
		g.enc.buf = propBuf(min(g.encHint+g.encHint/4, entryBufMax))
	}
}

// endEntry ends the entry being built (its encoder is full): proposed in
// the next round, before the next entry.
func (g *Group) endEntry() {
	g.full = append(g.full, g.finish(g.w.now))
	g.presize()
}

// added ends an Add: the seq of the entry the command went into.
func (g *Group) added(err error) (uint64, error) {
	if err != nil {
		return 0, err
	}
	g.w.mark(g)
	return g.seq + 1, nil
}

// finish takes the encoder's entry as a proposal of its own (raft keeps
// the bytes until applied) and resets the encoder.
func (g *Group) finish(now int64) []byte {
	g.seq++
	h := EntryHeader{NowMs: now, Proposer: g.w.cfg.NodeID<<48 | g.w.cfg.Shard, Seq: g.seq}
	// A large entry (a round of a busy queue): the proposal takes the
	// encoder's buffer (no copy: at 1 KiB a message, copies and the page
	// faults of fresh buffers were most of a durable queue's CPU) and the
	// next entry's buffer is allocated at its first Add at about this
	// size, so it does not grow by copies. A small one is copied out
	// exactly and the buffer kept (raft holds a proposal until it is
	// applied: not in a buffer sized for a burst), except a burst's
	// buffer, which not every group keeps. The hint decays: a burst's
	// size is not kept for good.
	//
	// A solo group's entries over handMin bytes that fill at least a
	// quarter of their buffer are handed over too, and their buffers come
	// back once applied (spend): copying a round's entry out for each of
	// many queues was a copy of every body. (A small entry in a buffer
	// sized for a burst is still copied out.)
	data := g.enc.Finish(h)
	g.encHint -= g.encHint / 8
	solo := g.solo()
	if len(data) > 256<<10 || solo && len(data) > handMin && len(data) >= cap(data)/4 {
		g.enc = EntryEncoder{}
		g.encHint = max(g.encHint, len(data))
		if solo && len(g.handed) < maxHanded {
			g.handed = append(g.handed, data)
		}
		return data
	}
	data = append([]byte(nil), data...)
	g.enc.Reset()
	if cap(g.enc.buf) > 256<<10 {
		putPropBuf(g.enc.buf) // copied out: nothing refers to it
		g.enc = EntryEncoder{}
	}
	return data
}

func (g *Group) propose(data []byte) {
	if err := g.rn.Propose(data); err != nil {
		// No leader, a transfer, or raft's size limit: the entry's commands
		// are not in the log (design §3.4: their confirms are nacked).
		g.w.stats.Dropped++
		g.w.cfg.Logger.Warn("replication: proposal dropped", "group", g.id, "err", err)
		return
	}
	g.unapplied += len(data)
	g.w.stats.Proposals++
}

// Tick adds a queue Tick command (design §1.4: time-driven work is a log
// decision) to every group this node leads whose queue's latest Timer
// (QueueFSM.WakeAt) is due at now, at most one per group per 10 ms; the
// next Round proposes it, alongside the group's other commands if any.
// It returns how many groups got one. Call it from the shard's timer,
// armed at NextWake. O(groups).
func (w *Worker) Tick(now int64) int {
	n := 0
	for _, g := range w.ids {
		if !g.leader || g.err != nil || w.failed != nil {
			continue
		}
		at, ok := g.fsm.WakeAt()
		if !ok || at > now || g.ticked && now-g.lastTick < 10 {
			continue
		}
		if _, err := g.Add(&queue.Tick{NowMs: now}); err != nil {
			continue
		}
		g.lastTick, g.ticked = now, true
		n++
	}
	return n
}

// NextWake is the earliest time a group this node leads needs a Tick, and
// whether any does. O(groups).
func (w *Worker) NextWake() (int64, bool) {
	at, any := int64(0), false
	for _, g := range w.ids {
		if !g.leader || g.err != nil {
			continue
		}
		if t, ok := g.fsm.WakeAt(); ok && (!any || t < at) {
			at, any = t, true
		}
	}
	return at, any
}

// maxHanded bounds handed and spent (past it, buffers are left to the
// GC). A busy queue's entries are about entryBufMax each, and 20,000
// messages of 1 KiB in flight (durable.sh's confirm windows) are 20 of
// them: with 16, the rest were built in fresh buffers.
const maxHanded = 64

// solo: the group has one voter and no learners (and is not changing
// that): nothing but this node's raft, storage and Body's views refers
// to its proposals' bytes.
func (g *Group) solo() bool {
	c := &g.conf
	return len(c.Voters) == 1 && len(c.VotersOutgoing) == 0 && len(c.Learners) == 0 && len(c.LearnersNext) == 0
}

// spend is the apply of a large entry, data: if it is the oldest of the
// group's own large proposals (the same bytes, not a copy read back from
// segment) and the group still has one voter, the buffer is spent. Then
// nothing will read it again: raft let go of it when the write was
// persisted (a single voter commits its entries only then, and the
// unstable log drops them), segment wrote it before that, the tail
// cache dropped it with this apply (g.st.applied), and no follower's
// append carries it. What remains is the views Body handed out of the
// tail (and the apply callbacks', over by now): recycle gives the buffer
// back once they are released. An earlier entry of this group's own
// proposer (by its header's seq) that is not the buffer handed is one
// finish copied out: passed over. Anything else (a proposal raft
// dropped, an entry read from segment, a change of voters or of leader)
// forgets every buffer handed: the GC takes them.
func (g *Group) spend(data []byte) {
	h := g.handed[0]
	if g.solo() && unsafe.SliceData(data) != unsafe.SliceData(h) && len(data) >= entryHeaderLen &&
		le.Uint64(data[16:]) == le.Uint64(h[16:]) && le.Uint64(data[24:]) < le.Uint64(h[24:]) {
		return
	}
	if !g.solo() || unsafe.SliceData(data) != unsafe.SliceData(h) || len(g.spent) >= maxHanded {
		g.dropHanded()
		return
	}
	g.spent = append(g.spent, g.handed[0])
	n := copy(g.handed, g.handed[1:])
	g.handed[n] = nil
	g.handed = g.handed[:n]
}

func (g *Group) dropHanded() {
	clear(g.handed)
	g.handed = g.handed[:0]
}

// recycle gives the spent proposal buffers back to segment's pool of
// large buffers (the next large entry of any group is built in one): no
// view of them is out.
func (g *Group) recycle() {
	for i, b := range g.spent {
		if putPropBuf(b) {
			g.w.stats.Recycled++
		}
		g.spent[i] = nil
	}
	g.spent = g.spent[:0]
}
