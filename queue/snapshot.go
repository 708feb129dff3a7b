package queue

import (
	"encoding/binary"
	"errors"
	"fmt"
	"slices"

	"github.com/warren-mq/warren/wire"
)

// Snapshot format: a version byte, then every field of the machine in a
// fixed order as little-endian u64s (booleans and small ints widened), maps
// in ascending key order. It is an exact image: Restore(Snapshot()) behaves
// identically to the original under any later commands, and snapshots of
// equal machines are equal bytes. Replicas and recovery depend on that.
//
// Version 7 adds ConsumerSpec.Get (after Exclusive). Version 6 adds Config.HoldDeadLetters (after DedupWindowMs) and the held
// dead letters (after the dedup window: a count, then id, at, size,
// reason per held dead letter, ascending ids). Version 5 holds the retry
// multiplier as an integer (thousandths); version 4 held it as float64
// bits. Durable queues persist snapshots since version 5, so Restore
// reads 5 as well (as no hold and nothing held) and refuses anything
// older with an error that says so rather than read it with a guess.
const (
	snapshotVersion    = 7
	oldSnapshotVersion = 5 // the oldest version Restore reads
)

// ErrBadSnapshot is returned by Restore for input it cannot read.
var ErrBadSnapshot = errors.New("queue: malformed snapshot")

type snapW struct{ b []byte }

func (w *snapW) u(v uint64) { w.b = binary.LittleEndian.AppendUint64(w.b, v) }
func (w *snapW) i(v int64)  { w.u(uint64(v)) }
func (w *snapW) bool(v bool) {
	if v {
		w.u(1)
	} else {
		w.u(0)
	}
}
func (w *snapW) entry(e entry) {
	w.u(e.id)
	w.i(e.expireAt)
	w.u(uint64(e.size))
	w.u(uint64(e.deliveries))
	w.u(uint64(e.failed))
	w.u(uint64(e.prio))
}
func (w *snapW) heap(h timeHeap) {
	w.u(uint64(len(h)))
	for _, t := range h {
		w.i(t.at)
		w.entry(t.e)
	}
}
func (w *snapW) set(m map[uint64]struct{}) {
	keys := make([]uint64, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	w.u(uint64(len(keys)))
	for _, k := range keys {
		w.u(k)
	}
}

type snapR struct {
	b   []byte
	err error
}

func (r *snapR) u() uint64 {
	if len(r.b) < 8 {
		r.err = ErrBadSnapshot
		r.b = nil
		return 0
	}
	v := binary.LittleEndian.Uint64(r.b)
	r.b = r.b[8:]
	return v
}
func (r *snapR) i() int64   { return int64(r.u()) }
func (r *snapR) bool() bool { return r.u() != 0 }

// n reads a count, bounded by what the remaining input could hold.
func (r *snapR) n(perItem int) int {
	v := r.u()
	if v > uint64(len(r.b)/(8*perItem)) {
		r.err = ErrBadSnapshot
		r.b = nil
		return 0
	}
	return int(v)
}
func (r *snapR) entry() entry {
	return entry{id: r.u(), expireAt: r.i(), size: uint32(r.u()), deliveries: uint32(r.u()), failed: uint32(r.u()), prio: uint8(r.u())}
}
func (r *snapR) heap() timeHeap {
	n := r.n(7)
	h := make(timeHeap, 0, n)
	for k := 0; k < n; k++ {
		h = append(h, timed{at: r.i(), e: r.entry()})
	}
	return h
}
func (r *snapR) set() map[uint64]struct{} {
	n := r.n(1)
	m := make(map[uint64]struct{}, n)
	for k := 0; k < n; k++ {
		m[r.u()] = struct{}{}
	}
	return m
}

// Snapshot returns an exact image of the machine's state.
func (m *Machine) Snapshot() []byte {
	return m.AppendSnapshot(make([]byte, 0, m.SnapshotLen()))
}

// SnapshotLen is the length of the machine's Snapshot now.
func (m *Machine) SnapshotLen() int {
	words := 18 + 6 + 4 + 2 + 10 // config; ring state; rr to nextTag; lastUsed, deleted; stats
	for l := range m.levels {
		words += 1 + 6*m.levels[l].len()
	}
	words++
	for _, cs := range m.consumers {
		words += 12 + 10*(len(cs.out)-cs.head)
	}
	words += 2 + 7*(len(m.parked)+len(m.ttlWatch)) // heaps
	words += 2 + len(m.ttlReady) + len(m.dead)     // sets
	words += 1 + 2*(len(m.dedupOrder)-m.dedupHead)
	words += 1 + 4*len(m.held)
	return 1 + 8*words
}

// AppendSnapshot appends the machine's Snapshot to dst. Built in a
// buffer of SnapshotLen (a queue with many messages has a snapshot of
// megabytes: grown by append, it was copied about twice over, in fresh
// memory each time).
func (m *Machine) AppendSnapshot(dst []byte) []byte {
	w := &snapW{b: append(slices.Grow(dst, m.SnapshotLen()), snapshotVersion)}
	c := &m.cfg
	w.u(uint64(c.MaxPriority))
	w.bool(c.StrictPriority)
	w.i(int64(c.StarvationLimit))
	w.i(c.MaxLength)
	w.i(c.MaxLengthBytes)
	w.u(uint64(c.Overflow))
	w.i(c.MessageTTLMs)
	w.bool(c.DeadLetter)
	w.u(uint64(c.DeliveryLimit))
	w.i(c.RetryInitialMs)
	w.u(uint64(c.RetryMultiplierMilli))
	w.i(c.RetryMaxMs)
	w.i(c.ConsumerTimeout)
	w.bool(c.SingleActive)
	w.bool(c.AutoDelete)
	w.i(c.ExpiresMs)
	w.i(c.DedupWindowMs)
	w.bool(c.HoldDeadLetters)

	for l := range m.levels {
		r := &m.levels[l]
		w.u(uint64(r.len()))
		for k := 0; k < r.len(); k++ {
			w.entry(*r.at(k))
		}
	}
	w.i(int64(m.runFloor))
	w.i(int64(m.runCount))
	w.i(int64(m.lastLevel))
	w.i(int64(m.cursor))
	w.i(m.readyCount)
	w.i(m.readyBytes)

	w.u(uint64(len(m.consumers)))
	for _, cs := range m.consumers {
		w.u(uint64(cs.ID))
		w.u(uint64(cs.Owner))
		w.u(uint64(cs.Prefetch))
		w.u(uint64(cs.PrefetchBytes))
		w.i(int64(cs.Priority))
		w.bool(cs.AutoAck)
		w.bool(cs.Exclusive)
		w.bool(cs.Get)
		w.i(cs.TimeoutMs)
		w.u(cs.seq)
		w.bool(cs.cancelled)
		live := cs.out[cs.head:]
		w.u(uint64(len(live)))
		for _, o := range live {
			w.u(o.tag)
			w.i(o.deadline)
			w.i(o.floor)
			w.entry(o.e)
			w.bool(o.settled)
		}
	}
	w.i(int64(m.rr))
	w.u(m.arrivals)
	w.bool(m.cancelledAny)
	w.u(m.nextTag)

	w.heap(m.parked)
	w.heap(m.ttlWatch)
	w.set(m.ttlReady)
	w.set(m.dead)

	w.i(m.lastUsed)
	w.bool(m.deleted)

	live := m.dedupOrder[m.dedupHead:]
	w.u(uint64(len(live)))
	for _, d := range live {
		w.u(d.key)
		w.i(d.at)
	}
	w.u(uint64(len(m.held)))
	for _, id := range m.heldIDs() {
		h := m.held[id]
		w.u(id)
		w.i(h.at)
		w.u(uint64(h.size))
		w.u(uint64(h.reason))
	}

	s := &m.Stats
	for _, v := range []uint64{s.Enqueued, s.Delivered, s.Redelivered, s.Acked, s.Requeued, s.DeadLettered, s.Dropped, s.Rejected, s.Expired, s.Duplicates} {
		w.u(v)
	}
	return w.b
}

// Restore rebuilds a machine from a Snapshot.
func Restore(b []byte) (*Machine, error) {
	if len(b) == 0 {
		return nil, ErrBadSnapshot
	}
	version := b[0]
	if version < oldSnapshotVersion || version > snapshotVersion {
		return nil, fmt.Errorf("%w: version %d; this build reads versions %d to %d only", ErrBadSnapshot, b[0], oldSnapshotVersion, snapshotVersion)
	}
	r := &snapR{b: b[1:]}
	var c Config
	c.MaxPriority = uint8(r.u())
	c.StrictPriority = r.bool()
	c.StarvationLimit = int(r.i())
	c.MaxLength = r.i()
	c.MaxLengthBytes = r.i()
	c.Overflow = wire.Overflow(r.u())
	c.MessageTTLMs = r.i()
	c.DeadLetter = r.bool()
	c.DeliveryLimit = uint32(r.u())
	c.RetryInitialMs = r.i()
	mult := r.u()
	if mult < 1000 || mult > maxMultiplierMilli {
		return nil, ErrBadSnapshot
	}
	c.RetryMultiplierMilli = uint32(mult)
	c.RetryMaxMs = r.i()
	c.ConsumerTimeout = r.i()
	c.SingleActive = r.bool()
	c.AutoDelete = r.bool()
	c.ExpiresMs = r.i()
	c.DedupWindowMs = r.i()
	if version >= 6 {
		c.HoldDeadLetters = r.bool()
	}
	if r.err != nil {
		return nil, r.err
	}
	m := New(c, 0)
	for l := range m.levels {
		n := r.n(6)
		for k := 0; k < n; k++ {
			e := r.entry()
			if int(e.prio) != l {
				return nil, ErrBadSnapshot
			}
			m.levels[l].pushBack(e)
			m.nonEmpty[l>>6] |= 1 << (l & 63)
		}
	}
	m.runFloor = int(r.i())
	m.runCount = int(r.i())
	m.lastLevel = int(r.i())
	m.cursor = int(r.i())
	m.readyCount = r.i()
	m.readyBytes = r.i()

	nc := r.n(11)
	for k := 0; k < nc; k++ {
		cs := &consumer{}
		cs.ID = ConsumerID(r.u())
		cs.Owner = OwnerID(r.u())
		cs.Prefetch = uint32(r.u())
		cs.PrefetchBytes = uint32(r.u())
		cs.Priority = int16(r.i())
		cs.AutoAck = r.bool()
		cs.Exclusive = r.bool()
		if version >= 7 {
			cs.Get = r.bool()
		}
		cs.TimeoutMs = r.i()
		cs.seq = r.u()
		cs.cancelled = r.bool()
		no := r.n(10)
		for j := 0; j < no; j++ {
			o := outstanding{tag: r.u(), deadline: r.i(), floor: r.i(), e: r.entry(), settled: r.bool()}
			if !o.settled {
				cs.live++
				cs.liveBytes += uint64(o.e.size)
			}
			cs.out = append(cs.out, o)
		}
		if m.byID[cs.ID] != nil {
			return nil, ErrBadSnapshot
		}
		m.consumers = append(m.consumers, cs)
		m.byID[cs.ID] = cs
		m.unacked += cs.live
		if !cs.cancelled {
			m.active++
			if cs.Get {
				m.gets++
			}
		}
	}
	m.regroup()
	m.rr = int(r.i())
	m.arrivals = r.u()
	m.cancelledAny = r.bool()
	m.nextTag = r.u()

	m.parked = r.heap()
	m.ttlWatch = r.heap()
	m.ttlReady = r.set()
	m.dead = r.set()

	m.lastUsed = r.i()
	m.deleted = r.bool()

	nd := r.n(2)
	for k := 0; k < nd; k++ {
		d := dedupMark{key: r.u(), at: r.i()}
		m.dedupOrder = append(m.dedupOrder, d)
		m.dedupSeen[d.key] = d.at
	}
	if version >= 6 {
		nh := r.n(4)
		var last uint64
		for k := 0; k < nh; k++ {
			id, at, size, reason := r.u(), r.i(), r.u(), r.u()
			if k > 0 && id <= last || size > 1<<32-1 || reason > 255 {
				return nil, ErrBadSnapshot
			}
			last = id
			if m.held == nil {
				m.held = map[uint64]heldDeadLetter{}
			}
			m.held[id] = heldDeadLetter{at: at, size: uint32(size), reason: wire.DeathReason(reason)}
			m.heldBytes += int64(size)
		}
	}
	s := &m.Stats
	for _, p := range []*uint64{&s.Enqueued, &s.Delivered, &s.Redelivered, &s.Acked, &s.Requeued, &s.DeadLettered, &s.Dropped, &s.Rejected, &s.Expired, &s.Duplicates} {
		*p = r.u()
	}
	if r.err != nil {
		return nil, r.err
	}
	if len(r.b) != 0 {
		return nil, ErrBadSnapshot
	}
	if err := m.checkInvariants(); err != nil {
		return nil, err
	}
	return m, nil
}
