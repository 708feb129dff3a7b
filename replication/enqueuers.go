package replication

import (
	"encoding/binary"
	"errors"
	"fmt"
	"slices"

	"github.com/warren-mq/warren/queue"
)

// # Enqueuer deduplication (design/replication.md §6.4)
//
// A node that does not lead a replicated queue forwards its clients'
// publishes to the leader. When the leader changes, or a forward or its
// confirm is lost, the origin cannot tell whether what it sent was
// applied; sending it again must not enqueue it twice. So the origin
// numbers what it sends to each queue: an enqueuer (a stream of the
// origin's, named by an id of the origin node's: node<<48 | a number of
// its own) counts its messages to the queue contiguously from 1 (qseq),
// and sends them in a publish-from frame: Origin{enqueuer, incarnation,
// qseq} and the Enqueue. Every replica keeps, per queue, the last qseq
// applied of each enqueuer (the enqueuer table, in the FSM state and its
// snapshot) and applies of a publish-from only what lies above it:
//
//   - qseq > last+1: a part before it is missing (lost on the way, or in
//     a log entry a leader change dropped): nothing is applied, and the
//     origin is told to resend from last+1 (FromGap).
//   - qseq+n-1 ≤ last: every message was applied before (a resend):
//     nothing is applied, and the origin is told they are in (FromDuplicate).
//   - otherwise the messages above last are applied (Skipped: those
//     before), and last becomes qseq+n-1 (FromApplied).
//
// The incarnation tells a new life of an enqueuer id (the origin node
// restarted, or the origin started the stream over) from the old one: a
// publish-from with a higher incarnation than the table's starts the
// enqueuer over at last = 0, one with a lower incarnation is refused
// (FromStale: its origin has moved on and answers it no more). An
// enqueuer-down frame removes an enqueuer (the origin ends the stream), or
// with EveryEnqueuer every enqueuer of a node (the node left the cluster).
//
// The table is bounded (MaxEnqueuers per queue): a publish-from of an
// enqueuer not in a full table is refused (FromFull), and its origin nacks
// it; nothing of it was applied.

// MaxEnqueuers bounds a queue's enqueuer table (about 24 bytes each).
const MaxEnqueuers = 4096

// EveryEnqueuer, as an enqueuer id's low 48 bits in an enqueuer-down,
// names every enqueuer of the node in its top 16 bits.
const EveryEnqueuer = 1<<48 - 1

const (
	publishFromLen  = 24 // enqueuer u64 | incarnation u64 | qseq u64
	enqueuerDownLen = 16 // enqueuer u64 | incarnation u64
)

// Origin names the enqueuer a publish-from comes from, and where its part
// starts.
type Origin struct {
	Enqueuer    uint64 // node<<48 | the node's own number for the stream
	Incarnation uint64 // higher: a new life of the enqueuer (starts over at qseq 1)
	QSeq        uint64 // the qseq of the part's first message (from 1)
}

func parseOrigin(b []byte) Origin {
	o := Origin{Enqueuer: le.Uint64(b), Incarnation: le.Uint64(b[8:])}
	if len(b) >= publishFromLen {
		o.QSeq = le.Uint64(b[16:])
	}
	return o
}

// AddFrom appends enq as a publish-from of origin o (see Add).
func (e *EntryEncoder) AddFrom(o Origin, enq *queue.Enqueue) error {
	var pre [publishFromLen]byte
	le.PutUint64(pre[:], o.Enqueuer)
	le.PutUint64(pre[8:], o.Incarnation)
	le.PutUint64(pre[16:], o.QSeq)
	return e.addFrame(kindPublishFrom, pre[:], enq, nil)
}

// PublishFromBytes is the encoding's length of a publish-from Enqueue of n
// messages whose log forms (BodySource.BodyLen) total bodies bytes: one
// over MaxCommandBytes is ErrCommandTooLarge.
func PublishFromBytes(n, bodies int) int { return publishFromLen + 15 + (28+4)*n + bodies }

// AddEnqueueFrom appends, as a publish-from of origin o, an Enqueue whose
// bodies src writes (see AddEnqueue).
func (e *EntryEncoder) AddEnqueueFrom(o Origin, nowMs int64, msgs []queue.Message, src queue.BodySource) error {
	var pre [publishFromLen]byte
	le.PutUint64(pre[:], o.Enqueuer)
	le.PutUint64(pre[8:], o.Incarnation)
	le.PutUint64(pre[16:], o.QSeq)
	return e.addFrame(kindPublishFrom, pre[:], nil, &enqueueSrc{nowMs, msgs, src})
}

// AddEnqueuerDown appends an enqueuer-down: enqueuer (of incarnations up
// to inc) leaves the table.
func (e *EntryEncoder) AddEnqueuerDown(enqueuer, inc uint64) error {
	var pre [enqueuerDownLen]byte
	le.PutUint64(pre[:], enqueuer)
	le.PutUint64(pre[8:], inc)
	return e.addFrame(kindEnqueuerDown, pre[:], nil, nil)
}

// AddFrom adds enq to the group's next entry as a publish-from of origin o
// (a publish another node forwarded here); as Add.
func (g *Group) AddFrom(o Origin, enq *queue.Enqueue) (seq uint64, err error) {
	return g.addWith(func() error { return g.enc.AddFrom(o, enq) })
}

// AddEnqueueFrom adds, as a publish-from of origin o, an Enqueue whose
// bodies src writes into the entry (EntryEncoder.AddEnqueue); as Add.
func (g *Group) AddEnqueueFrom(o Origin, nowMs int64, msgs []queue.Message, src queue.BodySource) (seq uint64, err error) {
	return g.addWith(func() error { return g.enc.AddEnqueueFrom(o, nowMs, msgs, src) })
}

// AddEnqueuerDown adds an enqueuer-down to the group's next entry; as Add.
func (g *Group) AddEnqueuerDown(enqueuer, inc uint64) (seq uint64, err error) {
	return g.addWith(func() error { return g.enc.AddEnqueuerDown(enqueuer, inc) })
}

// addWith is Add for an encoder call other than Add.
func (g *Group) addWith(add func() error) (uint64, error) {
	if err := g.canAdd(); err != nil {
		return 0, err
	}
	err := add()
	if errors.Is(err, ErrEntryFull) {
		g.endEntry()
		err = add()
	}
	return g.added(err)
}

// FromOutcome is what became of a publish-from (Applied.From).
type FromOutcome uint8

const (
	FromNone      FromOutcome = iota // not a publish-from
	FromApplied                      // applied (Skipped: how many at its front were applied before)
	FromDuplicate                    // every message was applied before: nothing applied
	FromGap                          // a part before it is missing: nothing applied; resend from ResendFrom
	FromFull                         // an enqueuer new to a full table: refused, nothing applied
	FromStale                        // an earlier incarnation of an enqueuer: refused, nothing applied
)

func (o FromOutcome) String() string {
	return [...]string{"none", "applied", "duplicate", "gap", "full", "stale"}[o]
}

// FromResult is what the FSM did with a publish-from (Applied.From).
type FromResult struct {
	Origin     Origin
	Outcome    FromOutcome
	N          int    // messages in the part
	Skipped    int    // FromApplied: messages at its front applied before (not again)
	ResendFrom uint64 // FromGap: the first qseq the queue is missing
}

type enqueuerState struct{ inc, last uint64 }

// enqueuerTable is a queue's enqueuers: the last qseq applied of each.
// Replicated state: every replica changes it alike, in log order.
type enqueuerTable struct {
	m map[uint64]enqueuerState
}

// admit decides what of a publish-from of n messages from o is applied,
// and records it.
func (t *enqueuerTable) admit(o Origin, n int) FromResult {
	r := FromResult{Origin: o, N: n}
	e, ok := t.m[o.Enqueuer]
	switch {
	case ok && o.Incarnation < e.inc:
		r.Outcome = FromStale
		return r
	case !ok && len(t.m) >= MaxEnqueuers:
		r.Outcome = FromFull
		return r
	case !ok || o.Incarnation > e.inc:
		e = enqueuerState{inc: o.Incarnation}
	}
	switch {
	case o.QSeq > e.last+1 || o.QSeq == 0:
		r.Outcome, r.ResendFrom = FromGap, e.last+1
		return r
	case o.QSeq+uint64(n) <= e.last+1:
		r.Outcome = FromDuplicate
		return r
	}
	r.Outcome, r.Skipped = FromApplied, int(e.last+1-o.QSeq)
	e.last = o.QSeq + uint64(n) - 1
	if t.m == nil {
		t.m = map[uint64]enqueuerState{}
	}
	t.m[o.Enqueuer] = e
	return r
}

// duplicate reports whether admit would find a publish-from of n
// messages from o a duplicate (every message applied before); it changes
// nothing.
func (t *enqueuerTable) duplicate(o Origin, n int) bool {
	e, ok := t.m[o.Enqueuer]
	return ok && o.Incarnation == e.inc && o.QSeq != 0 && o.QSeq+uint64(n) <= e.last+1
}

// down removes enqueuer (every enqueuer of its node, with EveryEnqueuer)
// of incarnations up to inc.
func (t *enqueuerTable) down(enqueuer, inc uint64) {
	if enqueuer&EveryEnqueuer != EveryEnqueuer {
		if e, ok := t.m[enqueuer]; ok && e.inc <= inc {
			delete(t.m, enqueuer)
		}
		return
	}
	for id, e := range t.m {
		if id>>48 == enqueuer>>48 && e.inc <= inc {
			delete(t.m, id)
		}
	}
}

// hasNode reports whether an enqueuer of node is in the table.
func (t *enqueuerTable) hasNode(node uint64) bool {
	for id := range t.m {
		if id>>48 == node {
			return true
		}
	}
	return false
}

// Len is the number of enqueuers.
func (t *enqueuerTable) Len() int { return len(t.m) }

// Snapshot section: n u32 | reserved u32 (=0) | n × (enqueuer u64 |
// incarnation u64 | last u64), by enqueuer ascending (equal tables, equal
// bytes).
func (t *enqueuerTable) appendTo(b []byte) []byte {
	b = binary.LittleEndian.AppendUint32(b, uint32(len(t.m)))
	b = binary.LittleEndian.AppendUint32(b, 0)
	ids := make([]uint64, 0, len(t.m))
	for id := range t.m {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	for _, id := range ids {
		e := t.m[id]
		b = binary.LittleEndian.AppendUint64(b, id)
		b = binary.LittleEndian.AppendUint64(b, e.inc)
		b = binary.LittleEndian.AppendUint64(b, e.last)
	}
	return b
}

// parseEnqueuers reads a snapshot's table section; it returns the rest.
func parseEnqueuers(b []byte) (enqueuerTable, []byte, error) {
	var t enqueuerTable
	if len(b) < 8 {
		return t, nil, fmt.Errorf("%w: truncated enqueuer table", ErrBadFSMSnapshot)
	}
	n := int(binary.LittleEndian.Uint32(b))
	if binary.LittleEndian.Uint32(b[4:]) != 0 {
		return t, nil, fmt.Errorf("%w: reserved enqueuer table bytes are not zero", ErrBadFSMSnapshot)
	}
	b = b[8:]
	if n > MaxEnqueuers || n*24 > len(b) {
		return t, nil, fmt.Errorf("%w: an enqueuer table of %d enqueuers in %d bytes (at most %d)", ErrBadFSMSnapshot, n, len(b), MaxEnqueuers)
	}
	if n > 0 {
		t.m = make(map[uint64]enqueuerState, n)
	}
	var prev uint64
	for i := range n {
		id := binary.LittleEndian.Uint64(b)
		if i > 0 && id <= prev {
			return t, nil, fmt.Errorf("%w: enqueuer table not in ascending order", ErrBadFSMSnapshot)
		}
		prev = id
		t.m[id] = enqueuerState{inc: binary.LittleEndian.Uint64(b[8:]), last: binary.LittleEndian.Uint64(b[16:])}
		b = b[24:]
	}
	return t, b, nil
}
