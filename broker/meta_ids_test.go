package broker

import (
	"math"
	"strconv"
	"testing"

	"github.com/warren-mq/warren/queue"
	"github.com/warren-mq/warren/wire"
)

// TestMetaQueueIDsWrap: queue ids are 32-bit refs; after the last one the
// counter wraps and skips the ids still in use, so a broker that has seen
// 2^32 declares (a connection declaring a temporary queue every
// millisecond for 50 days) still declares queues.
func TestMetaQueueIDsWrap(t *testing.T) {
	m := NewMeta(1)
	metaDo(t, m, qDecl("keep"), wire.OK, "") // id 1, still in use when the counter wraps
	// Fast-forward the counter through a snapshot: one id before the end.
	snap := m.Snapshot()
	snap[1], snap[2], snap[3], snap[4], snap[5], snap[6], snap[7], snap[8] = 0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0
	if err := m.Restore(snap); err != nil {
		t.Fatal(err)
	}
	r, _ := metaDo(t, m, qDecl("last"), wire.OK, "")
	if r.QueueID != math.MaxUint32 {
		t.Fatalf("id %d, want %d", r.QueueID, uint64(math.MaxUint32))
	}
	r, _ = metaDo(t, m, qDecl("wrapped"), wire.OK, "")
	if r.QueueID != 2 {
		t.Fatalf("after the last id: id %d, want 2 (1 is in use)", r.QueueID)
	}
	again := NewMeta(1)
	if err := again.Restore(m.Snapshot()); err != nil {
		t.Fatalf("a snapshot after the wrap does not restore: %v", err)
	}
	r, _ = metaDo(t, again, qDecl("next"), wire.OK, "")
	if r.QueueID != 3 {
		t.Fatalf("restored after the wrap: id %d, want 3", r.QueueID)
	}
}

// TestQueueSlotsFreeEmptyChunks: the ref → queue table holds memory for
// the queues that exist, not for every id ever handed out: declaring and
// deleting queues for ever does not grow it.
func TestQueueSlotsFreeEmptyChunks(t *testing.T) {
	var s queueSlots
	qs := make([]*Queue, 20<<slotBits)
	for i := range qs {
		qs[i] = &Queue{name: strconv.Itoa(i)}
	}
	live := map[queue.QueueRef]bool{}
	for i := range qs {
		ref := queue.QueueRef(i + 1)
		s.set(ref, qs[i])
		live[ref] = true
		if i >= 100 { // 100 queues live at a time
			old := queue.QueueRef(i + 1 - 100)
			s.set(old, nil)
			delete(live, old)
		}
	}
	for ref := range live {
		if s.get(ref) == nil {
			t.Fatalf("live ref %d lost", ref)
		}
	}
	if n := s.chunks(); n > 2 {
		t.Fatalf("%d chunks of %d slots held for %d live queues after %d declared", n, 1<<slotBits, len(live), len(qs))
	}
}

// chunks counts the chunks the table holds.
func (s *queueSlots) chunks() int {
	d := s.dir.Load()
	if d == nil {
		return 0
	}
	n := 0
	for k := range d.chunks {
		if d.chunks[k].Load() != nil {
			n++
		}
	}
	return n
}
