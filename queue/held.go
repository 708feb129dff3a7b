package queue

import (
	"slices"

	"github.com/warren-mq/warren/wire"
)

// At-least-once dead-lettering (Config.HoldDeadLetters). A dead letter's
// DeadLetter effect asks the caller to republish it, as without the
// option; the machine then keeps it among its held dead letters (not
// ready, never delivered, not counted by Ready or the length limits) and
// the caller keeps its body, until SettleDeadLetter says every target
// has it: that command's Remove frees it. A caller that loses its
// republishes (a crash) finds the held dead letters in the machine it
// recovers (snapshot and log) and republishes them
// (EachHeldDeadLetter): a target may then get one twice, none is lost.
// The held set is state like any other: in the snapshot, and changed
// only by commands, so every replica holds the same.

// heldDeadLetter is a dead letter kept until its targets have it.
type heldDeadLetter struct {
	at     int64 // the death's time: the time of the command that killed it
	size   uint32
	reason wire.DeathReason
}

// HeldDeadLetters is the number of dead letters held until their
// targets have them, and their body bytes. O(1).
func (m *Machine) HeldDeadLetters() (n int, bytes int64) { return len(m.held), m.heldBytes }

// IsHeldDeadLetter reports whether message id is a held dead letter.
func (m *Machine) IsHeldDeadLetter(id uint64) bool {
	_, ok := m.held[id]
	return ok
}

// EachHeldDeadLetter calls fn for every held dead letter, in id order,
// with the reason and the time of its death (what its DeadLetter effect
// said, and the time of the command that emitted it). It changes
// nothing; fn must not call back into the machine. O(held · log held).
func (m *Machine) EachHeldDeadLetter(fn func(id uint64, reason wire.DeathReason, atMs int64)) {
	for _, id := range m.heldIDs() {
		h := m.held[id]
		fn(id, h.reason, h.at)
	}
}

func (m *Machine) heldIDs() []uint64 {
	ids := make([]uint64, 0, len(m.held))
	for id := range m.held {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return ids
}

// SettleDeadLetter ends the hold of dead letter id: its targets have it.
// It emits a Remove of it (free its body). A message that is not a held
// dead letter (settled already: a settle repeated after a recovery) is
// ignored: no effect but the usual Timer.
func (m *Machine) SettleDeadLetter(now int64, id uint64) []Effect {
	m.begin(now)
	if h, ok := m.held[id]; ok {
		delete(m.held, id)
		m.heldBytes -= int64(h.size)
		m.emit(Effect{Kind: Remove, Msg: id})
	}
	return m.finish(now)
}
