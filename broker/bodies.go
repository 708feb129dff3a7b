package broker

// bodyStore maps a queue's message ids (dense, increasing) to bodies.
// Recent ids live in a slice indexed by id-base: put, get and del are
// index operations, not hashing. A message held for long (an unacked one
// at the head while thousands behind it are acked) would pin the slice, so
// once the slice spans more than twice the live count, pinned heads move to
// a small map: memory stays proportional to the messages held.
type bodyStore struct {
	base uint64       // id of s[0]
	s    []*StoredMsg // nil: gone
	live int
	far  map[uint64]*StoredMsg
}

func (b *bodyStore) put(id uint64, m *StoredMsg) {
	if len(b.s) == 0 && b.live == len(b.far) {
		b.base = id
	}
	if id != b.base+uint64(len(b.s)) {
		panic("netio: BUG: message ids must be dense and increasing")
	}
	b.s = append(b.s, m)
	b.live++
}

func (b *bodyStore) get(id uint64) *StoredMsg {
	if id < b.base {
		return b.far[id]
	}
	if i := id - b.base; i < uint64(len(b.s)) {
		return b.s[i]
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
	} else if i := id - b.base; i < uint64(len(b.s)) {
		m = b.s[i]
		b.s[i] = nil
	}
	if m == nil {
		return nil
	}
	b.live--
	b.trim()
	return m
}

func (b *bodyStore) trim() {
	for len(b.s) > 0 {
		switch {
		case b.s[0] == nil:
		case len(b.s) > 2*b.live+1024:
			if b.far == nil {
				b.far = map[uint64]*StoredMsg{}
			}
			b.far[b.base] = b.s[0]
		default:
			return
		}
		b.s[0] = nil
		b.s = b.s[1:]
		b.base++
	}
}

func (b *bodyStore) each(fn func(id uint64, m *StoredMsg)) {
	for id, m := range b.far {
		fn(id, m)
	}
	for i, m := range b.s {
		if m != nil {
			fn(b.base+uint64(i), m)
		}
	}
}

func (b *bodyStore) len() int { return b.live }
