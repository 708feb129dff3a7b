package queue

import (
	"cmp"
	"math"
	"math/bits"
	"slices"

	"github.com/warren-mq/warren/wire"
)

// ---- consumers ----

// Subscribe adds a consumer.
func (m *Machine) Subscribe(now int64, spec ConsumerSpec) ([]Effect, error) {
	m.begin(now)
	for _, c := range m.consumers {
		if c.ID == spec.ID {
			return nil, ErrConsumerExists
		}
		if c.Exclusive && !c.cancelled && !spec.Get {
			// A get is no consumer: RabbitMQ hands a ready message to
			// basic.get on a queue another consumes exclusively.
			return nil, ErrExclusive
		}
	}
	if spec.Exclusive && m.activeConsumers() > 0 {
		return nil, ErrNotExclusive
	}
	m.arrivals++
	c := &consumer{ConsumerSpec: spec, seq: m.arrivals}
	i, _ := slices.BinarySearchFunc(m.consumers, c, func(a, b *consumer) int {
		if a.Priority != b.Priority {
			return int(b.Priority) - int(a.Priority)
		}
		return int(a.seq) - int(b.seq)
	})
	m.consumers = slices.Insert(m.consumers, i, c)
	m.byID[c.ID] = c
	m.active++
	if c.Get {
		m.gets++
	}
	m.regroup()
	m.lastUsed = now
	return m.finish(now), nil
}

func (m *Machine) find(id ConsumerID) *consumer { return m.byID[id] }

// Cancel stops deliveries to a consumer. With requeue, its outstanding
// deliveries return to the queue now (as on channel close); without, they
// stay settleable and the consumer goes once they are settled.
func (m *Machine) Cancel(now int64, id ConsumerID, requeue bool) ([]Effect, error) {
	m.begin(now)
	c := m.find(id)
	if c == nil || (c.cancelled && !requeue) {
		return nil, ErrUnknownConsumer
	}
	m.cancel(c)
	m.cancelledAny = true
	if requeue {
		m.returnAll(now, c)
	}
	m.lastUsed = now
	if m.cfg.AutoDelete && !c.Get && !m.hasConsumer() {
		m.deleteOnce()
	}
	return m.finish(now), nil
}

// Down returns everything held by the consumers of owner (a connection
// or channel that went away) and removes them.
func (m *Machine) Down(now int64, owner OwnerID) []Effect {
	m.begin(now)
	had := false
	for i := 0; i < len(m.consumers); {
		c := m.consumers[i]
		if c.Owner != owner {
			i++
			continue
		}
		had = had || !c.Get
		m.cancel(c)
		m.returnAll(now, c)
		m.consumers = slices.Delete(m.consumers, i, i+1)
		delete(m.byID, c.ID)
		m.regroup()
	}
	if had && m.cfg.AutoDelete && !m.hasConsumer() {
		m.deleteOnce()
	}
	return m.finish(now)
}

// hasConsumer reports whether an active consumer other than a get is
// left (auto-delete's test; a scan, on a consumer leaving only).
func (m *Machine) hasConsumer() bool {
	for _, c := range m.consumers {
		if !c.cancelled && !c.Get {
			return true
		}
	}
	return false
}

// deleteOnce emits DeleteQueue the first time the queue decides to go.
func (m *Machine) deleteOnce() {
	if !m.deleted {
		m.deleted = true
		m.emit(Effect{Kind: DeleteQueue})
	}
}

// returnAll takes back every outstanding delivery of c, restoring their
// original order at the head of their levels.
func (m *Machine) returnAll(now int64, c *consumer) {
	m.scratch = m.scratch[:0]
	for i := c.head; i < len(c.out); i++ {
		if !c.out[i].settled {
			m.scratch = append(m.scratch, c.out[i].e)
		}
	}
	m.unacked -= c.live
	c.out, c.head, c.live, c.liveBytes = c.out[:0], 0, 0, 0
	m.requeue(now, m.scratch)
}

// requeue returns entries (in delivery order) to the head of their levels,
// counting a failure, applying the delivery limit and retry backoff.
func (m *Machine) requeue(now int64, es []entry) {
	for i := len(es) - 1; i >= 0; i-- {
		e := es[i]
		e.failed++
		m.Stats.Requeued++
		// "Delivered more than delivery-limit times": with limit L the
		// message gets L+1 deliveries, and the (L+1)th failure kills it.
		if m.cfg.DeliveryLimit > 0 && e.deliveries > m.cfg.DeliveryLimit {
			m.kill(e, wire.ReasonDeliveryLimit)
			continue
		}
		if d := m.backoff(e.failed); d > 0 {
			m.parked.push(timed{at: now + d, e: e})
			continue
		}
		m.pushReady(e, true)
	}
}

// maxRetryMs is the longest retry wait: the largest retry-max-ms a
// declare accepts (the longest time.Duration in ms, about 292 years), and
// the cap when none is set.
const maxRetryMs = math.MaxInt64 / 1_000_000

// maxMultiplierMilli is the largest retry multiplier, ×1000, in thousandths.
const maxMultiplierMilli = 1_000_000

// backoff is the wait (ms) before the n-th failure's message is ready
// again: about min(initial × multiplier^(n−1), max), computed in integers
// as spec §7.2 states it, so every replica gets the same: in nanoseconds,
// w₁ = initial × 10⁶ and w(k+1) = ⌊w(k) × M / 1000⌋ (M the multiplier in
// thousandths), and the wait is min(⌊w(n) / 10⁶⌋, max), max being
// maxRetryMs when none is set. Since M ≥ 1000 the steps never decrease,
// so they stop once w reaches the cap: the loop runs at most
// min(n, steps to the cap) times (at most about 30,000, for a multiplier
// of 1.001 and no cap, and only for a message that has already waited out
// that many growing waits). No allocation.
func (m *Machine) backoff(n uint32) int64 {
	initial := m.cfg.RetryInitialMs
	if initial <= 0 {
		return 0
	}
	capMs := m.cfg.RetryMaxMs
	if capMs <= 0 || capMs > maxRetryMs {
		capMs = maxRetryMs
	}
	if initial >= capMs {
		return capMs
	}
	// capNs ≤ maxRetryMs × 10⁶ < 2⁶³: w fits, and a product whose
	// quotient would not fit 64 bits (hi ≥ 1000) is past the cap.
	w, capNs := uint64(initial)*1_000_000, uint64(capMs)*1_000_000
	mult := uint64(m.cfg.RetryMultiplierMilli)
	for k := uint32(1); k < n && w < capNs && mult > 1000; k++ {
		hi, lo := bits.Mul64(w, mult)
		if hi >= 1000 {
			return capMs
		}
		w, _ = bits.Div64(hi, lo, 1000)
	}
	return min(int64(w/1_000_000), capMs)
}

// ---- settlement ----

// Settle applies op to consumer id's outstanding deliveries with tags in
// first..last (first == 0: every outstanding tag ≤ last). Tags in the range
// that are not outstanding are skipped; a range that matches none is
// ErrUnknownTag. Extend takes the new lease in arg ms (0: the queue's
// consumer timeout).
func (m *Machine) Settle(now int64, id ConsumerID, op wire.SettleOp, first, last uint64, argMs uint32) ([]Effect, error) {
	m.begin(now)
	c := m.find(id)
	if c == nil {
		return nil, ErrUnknownConsumer
	}
	if op < wire.SettleAck || op > wire.SettleExtend {
		return nil, ErrSettleOp
	}
	start := c.head
	if first > 0 {
		start = c.lowerBound(first)
	}
	m.scratch = m.scratch[:0]
	matched := 0
	for i := start; i < len(c.out) && c.out[i].tag <= last; i++ {
		o := &c.out[i]
		if o.settled {
			continue
		}
		matched++
		switch op {
		case wire.SettleExtend:
			lease := int64(argMs)
			if lease == 0 {
				lease = m.leaseMs(c)
			}
			if lease > 0 && now+lease > o.deadline {
				o.deadline = now + lease
			}
			continue
		case wire.SettleAck:
			m.Stats.Acked++
			m.emit(Effect{Kind: Remove, Msg: o.e.id})
		case wire.SettleRequeue:
			m.scratch = append(m.scratch, o.e)
		case wire.SettleReject:
			o.e.failed++
			m.kill(o.e, wire.ReasonRejected)
		}
		o.settled = true
		c.live--
		m.unacked--
		c.liveBytes -= uint64(o.e.size)
	}
	if matched == 0 {
		return nil, ErrUnknownTag
	}
	m.compact(c)
	m.requeue(now, m.scratch)
	return m.finish(now), nil
}

// lowerBound is the index in c.out of the first delivery from c.head
// with a tag ≥ tag. Acks mostly come in order, so the head is checked
// before searching.
func (c *consumer) lowerBound(tag uint64) int {
	if c.head >= len(c.out) || c.out[c.head].tag >= tag {
		return c.head
	}
	i, _ := slices.BinarySearchFunc(c.out[c.head:], tag, func(o outstanding, t uint64) int {
		return cmp.Compare(o.tag, t)
	})
	return c.head + i
}

// LiveRun is how many of tags (ascending), from the first, are consumer
// id's consecutive live deliveries: tags[0] is live and each next tag is
// the consumer's next live delivery after the one before. Settling the
// range tags[0]..tags[k-1] then settles exactly those k deliveries, which
// lets a caller holding single tags (deliveries round-robined among
// consumers have tags that are not consecutive numbers) settle a run with
// one Settle. 0 for an unknown consumer or a first tag that is not live.
// A query: it changes nothing.
func (m *Machine) LiveRun(id ConsumerID, tags []uint64) int {
	c := m.find(id)
	if c == nil || len(tags) == 0 {
		return 0
	}
	k := 0
	for i := c.lowerBound(tags[0]); i < len(c.out) && k < len(tags); i++ {
		if o := &c.out[i]; !o.settled {
			if o.tag != tags[k] {
				break
			}
			k++
		}
	}
	return k
}

// compact advances c's head past settled slots and reclaims space.
func (m *Machine) compact(c *consumer) {
	for c.head < len(c.out) && c.out[c.head].settled {
		c.head++
	}
	if c.head == len(c.out) {
		c.out, c.head = c.out[:0], 0
	} else if c.head > 64 && c.head > len(c.out)/2 {
		n := copy(c.out, c.out[c.head:])
		c.out, c.head = c.out[:n], 0
	}
}
