package broker

// bodyStore maps a queue's message ids (dense, increasing) to bodies.
// Recent ids live in a window of a slice indexed by id-base: put, get and
// del are index operations, not hashing. A message held for long (an
// unacked one at the head while thousands behind it are acked) would pin
// the window, so once it spans more than twice the live count, pinned
// heads move to a small map: memory stays proportional to the messages
// held.
//
// The window is s[head:]; s[:head] are slots already let go of (nil). When
// s is full and at least half of it is let go of, the window moves down to
// the start instead of growing a new array, so a queue settled in order
// (put at the tail, del at the head) reuses one array: no allocation per
// message, and no garbage of pointer slices for the collector to sweep.
type bodyStore struct {
	base uint64       // id of s[head]
	s    []*StoredMsg // nil: gone
	head int
	live int
	far  map[uint64]*StoredMsg
}

// bodiesKeepMax: a store whose window drains keeps its array for the next
// messages up to this many slots (8 bytes each); a bigger one is dropped.
const bodiesKeepMax = 4096

// span is the number of ids in the window, live or gone.
func (b *bodyStore) span() int { return len(b.s) - b.head }

func (b *bodyStore) put(id uint64, m *StoredMsg) {
	if b.span() == 0 && b.live == len(b.far) {
		b.base = id
	}
	if id != b.base+uint64(b.span()) {
		panic("netio: BUG: message ids must be dense and increasing")
	}
	if len(b.s) == cap(b.s) && b.head >= len(b.s)/2 && b.head > 0 {
		n := copy(b.s, b.s[b.head:])
		clear(b.s[n:])
		b.s, b.head = b.s[:n], 0
	}
	b.s = append(b.s, m)
	b.live++
}

func (b *bodyStore) get(id uint64) *StoredMsg {
	if id < b.base {
		return b.far[id]
	}
	if i := id - b.base; i < uint64(b.span()) {
		return b.s[b.head+int(i)]
	}
	return nil
}

func (b *bodyStore) del(id uint64) *StoredMsg {
	var m *StoredMsg
	if id < b.base {
		m = b.far[id]
		if m != nil {
			delete(b.far, id)
		}
	} else if i := id - b.base; i < uint64(b.span()) {
		m = b.s[b.head+int(i)]
		b.s[b.head+int(i)] = nil
	}
	if m == nil {
		return nil
	}
	b.live--
	b.trim()
	return m
}

func (b *bodyStore) trim() {
	for b.head < len(b.s) {
		switch {
		case b.s[b.head] == nil:
		case b.span() > 2*b.live+1024:
			if b.far == nil {
				b.far = map[uint64]*StoredMsg{}
			}
			b.far[b.base] = b.s[b.head]
		default:
			return
		}
		b.s[b.head] = nil
		b.head++
		b.base++
	}
	// The window is empty: start again at the array's beginning, or let a
	// big array go.
	b.head = 0
	if cap(b.s) > bodiesKeepMax {
		b.s = nil
	} else {
		b.s = b.s[:0]
	}
}

func (b *bodyStore) each(fn func(id uint64, m *StoredMsg)) {
	for id, m := range b.far {
		fn(id, m)
	}
	for i, m := range b.s[b.head:] {
		if m != nil {
			fn(b.base+uint64(i), m)
		}
	}
}

func (b *bodyStore) len() int { return b.live }
