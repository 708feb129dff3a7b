package queue

import (
	"math"

	"github.com/warren-mq/warren/wire"
)

// ---- time ----

// Tick advances time: ready messages past their TTL are dead-lettered
// wherever they are in the queue, parked retries whose backoff is over
// become ready, deliveries past their lease are taken back, and an unused
// queue past its expiry is deleted.
func (m *Machine) Tick(now int64) []Effect {
	m.begin(now)
	for {
		at, ok := m.ttlWatch.peek()
		if !ok || at > now {
			break
		}
		t := m.ttlWatch.pop()
		if _, ready := m.ttlReady[t.e.id]; !ready {
			continue // delivered (or dropped) since
		}
		delete(m.ttlReady, t.e.id)
		m.dead[t.e.id] = struct{}{}
		m.readyCount--
		m.readyBytes -= int64(t.e.size)
		m.Stats.Expired++
		m.kill(t.e, wire.ReasonExpired)
	}
	for {
		at, ok := m.parked.peek()
		if !ok || at > now {
			break
		}
		m.pushReady(m.parked.pop().e, true)
	}
	if m.leases() {
		for _, c := range m.consumers {
			m.expireLeases(now, c)
		}
	}
	if m.cfg.ExpiresMs > 0 && m.activeConsumers() == 0 && now-m.lastUsed >= m.cfg.ExpiresMs {
		m.deleteOnce()
	}
	return m.finish(now)
}

func (m *Machine) expireLeases(now int64, c *consumer) {
	m.scratch = m.scratch[:0]
	for i := c.head; i < len(c.out); i++ {
		o := &c.out[i]
		if o.settled || o.deadline == 0 || o.deadline > now {
			continue
		}
		m.emit(Effect{Kind: LeaseExpired, Consumer: c.ID, Tag: o.tag})
		m.scratch = append(m.scratch, o.e)
		o.settled = true
		c.live--
		m.unacked--
		c.liveBytes -= uint64(o.e.size)
	}
	if len(m.scratch) > 0 {
		m.compact(c)
		m.requeue(now, m.scratch)
	}
}

// nextWake is the earliest time Tick has work: a TTL, a retry, a lease or
// the queue's expiry.
func (m *Machine) nextWake(now int64) (int64, bool) {
	at, ok := int64(math.MaxInt64), false
	consider := func(t int64) {
		if t < at {
			at, ok = t, true
		}
	}
	for len(m.ttlWatch) > 0 {
		if _, ready := m.ttlReady[m.ttlWatch[0].e.id]; ready {
			consider(m.ttlWatch[0].at)
			break
		}
		m.ttlWatch.pop() // stale watch: the message left the ready set
	}
	if t, has := m.parked.peek(); has {
		consider(t)
	}
	if m.leases() {
		for _, c := range m.consumers {
			if c.head >= len(c.out) {
				continue
			}
			if f := c.out[c.head].floor; f > now {
				consider(f) // a lower bound of every lease (see outstanding.floor)
				continue
			}
			// The head's lease was extended past its floor: find the
			// earliest live deadline the slow way (rare).
			for i := c.head; i < len(c.out); i++ {
				if o := &c.out[i]; !o.settled && o.deadline != 0 {
					consider(o.deadline)
				}
			}
		}
	}
	if m.cfg.ExpiresMs > 0 && !m.deleted && m.activeConsumers() == 0 {
		consider(m.lastUsed + m.cfg.ExpiresMs)
	}
	return at, ok
}

// Purge removes every message not out with a consumer (ready, and parked
// for a retry backoff) and returns how many went.
func (m *Machine) Purge(now int64) (int64, []Effect) {
	m.begin(now)
	n := int64(0)
	for m.readyCount > 0 {
		e := m.popLowest()
		m.emit(Effect{Kind: Remove, Msg: e.id})
		n++
	}
	// Messages waiting out a retry backoff await no ack either: they go
	// too, in the order their waits would have ended.
	for len(m.parked) > 0 {
		m.emit(Effect{Kind: Remove, Msg: m.parked.pop().e.id})
		n++
	}
	m.lastUsed = now
	return n, m.finish(now)
}
