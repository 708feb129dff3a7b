package queue

// ring is a FIFO of entries that can also push at the front (requeued
// messages go back to the head of their level). It grows by doubling and
// never shrinks below its high-water mark, so steady-state use allocates
// nothing.
type ring struct {
	buf  []entry // len is a power of two (or 0)
	head int
	n    int
}

func (r *ring) len() int { return r.n }

func (r *ring) grow() {
	size := len(r.buf) * 2
	if size == 0 {
		size = 16
	}
	nb := make([]entry, size)
	for i := 0; i < r.n; i++ {
		nb[i] = r.buf[(r.head+i)&(len(r.buf)-1)]
	}
	r.buf, r.head = nb, 0
}

func (r *ring) pushBack(e entry) {
	if r.n == len(r.buf) {
		r.grow()
	}
	r.buf[(r.head+r.n)&(len(r.buf)-1)] = e
	r.n++
}

func (r *ring) pushFront(e entry) {
	if r.n == len(r.buf) {
		r.grow()
	}
	r.head = (r.head - 1) & (len(r.buf) - 1)
	r.buf[r.head] = e
	r.n++
}

func (r *ring) front() *entry {
	if r.n == 0 {
		panic("queue: BUG: front of an empty ring")
	}
	return &r.buf[r.head]
}

func (r *ring) popFront() entry {
	if r.n == 0 {
		panic("queue: BUG: pop from an empty ring")
	}
	e := r.buf[r.head]
	r.buf[r.head] = entry{}
	r.head = (r.head + 1) & (len(r.buf) - 1)
	r.n--
	return e
}

// at returns the i-th entry from the front (0 ≤ i < len).
func (r *ring) at(i int) *entry { return &r.buf[(r.head+i)&(len(r.buf)-1)] }
