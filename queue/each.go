package queue

import "sort"

// EachMessage calls fn for every message the queue holds, whatever its
// state: ready (in priority-level ring order, skipping entries that expired
// in place and were already dead-lettered or dropped), parked for a retry
// backoff (in heap order), and out with a consumer (per consumer, in tag
// order), and held dead letters (Config.HoldDeadLetters; in id order).
// Each message is reported once, with its size. It reads the
// state and changes nothing; fn must not call back into the machine.
//
// A durable queue rebuilds its live-entry set from it after a restore
// (design/replication.md §2.3), so it lists exactly the messages whose
// bodies a caller must still keep: every message for which no Remove,
// DeadLetter (unless held), Drop, RejectPublish or Duplicate effect has
// been emitted.
// It costs O(held messages).
func (m *Machine) EachMessage(fn func(id uint64, size uint32)) {
	for l := range m.levels {
		r := &m.levels[l]
		for i := 0; i < r.len(); i++ {
			e := r.at(i)
			if _, gone := m.dead[e.id]; gone {
				continue
			}
			fn(e.id, e.size)
		}
	}
	for _, t := range m.parked {
		fn(t.e.id, t.e.size)
	}
	for _, c := range m.consumers {
		for i := c.head; i < len(c.out); i++ {
			if o := &c.out[i]; !o.settled {
				fn(o.e.id, o.e.size)
			}
		}
	}
	if len(m.held) > 0 {
		for _, id := range m.heldIDs() {
			fn(id, m.held[id].size)
		}
	}
}

// EachOwner calls fn for the owner of every consumer the queue tracks
// (active, or cancelled with deliveries still out), once per consumer, in
// the machine's consumer order. A durable queue recovered after a restart
// sends a Down for each: those connections are gone.
func (m *Machine) EachOwner(fn func(OwnerID)) {
	for _, c := range m.consumers {
		fn(c.Owner)
	}
}

// Outstanding calls fn, in tag order, with a Deliver effect for each of
// consumer id's deliveries still out (not settled) whose tag is above
// afterTag: the same Consumer, Tag, Msg, DeliveryCount and FailedCount as
// the Deliver that handed it out. A new leader re-emits them for a
// consumer that resumes (design/replication.md §6.4, consumer resume):
// the origin node sends the last tag it delivered, and the leader sends
// what follows. It reads the state and changes nothing (no counter
// moves, no lease restarts); fn must not call back into the machine. It
// returns ErrUnknownConsumer when the queue has no consumer id (a
// cancelled one with deliveries still out is known). O(log out + listed).
func (m *Machine) Outstanding(id ConsumerID, afterTag uint64, fn func(Effect)) error {
	c := m.byID[id]
	if c == nil {
		return ErrUnknownConsumer
	}
	out := c.out[c.head:]
	i := sort.Search(len(out), func(i int) bool { return out[i].tag > afterTag })
	for ; i < len(out); i++ {
		if o := &out[i]; !o.settled {
			fn(Effect{Kind: Deliver, Consumer: c.ID, Tag: o.tag, Msg: o.e.id, DeliveryCount: o.e.deliveries, FailedCount: o.e.failed})
		}
	}
	return nil
}
