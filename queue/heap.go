package queue

// timed is an entry waiting for a point in time: a parked retry (ready at
// at) or a TTL watch on a ready message (expires at at).
type timed struct {
	at int64
	e  entry
}

// timeHeap is a binary min-heap on at, with ties broken by message id so
// the order is deterministic. Typed (not container/heap) so pushes do not
// box values into interfaces and allocate.
type timeHeap []timed

func (h timeHeap) less(i, j int) bool {
	if h[i].at != h[j].at {
		return h[i].at < h[j].at
	}
	return h[i].e.id < h[j].e.id
}

func (h *timeHeap) push(t timed) {
	*h = append(*h, t)
	s := *h
	for i := len(s) - 1; i > 0; {
		p := (i - 1) / 2
		if !s.less(i, p) {
			break
		}
		s[i], s[p] = s[p], s[i]
		i = p
	}
}

func (h *timeHeap) pop() timed {
	s := *h
	top := s[0]
	last := len(s) - 1
	s[0] = s[last]
	s[last] = timed{}
	s = s[:last]
	for i := 0; ; {
		l, r, m := 2*i+1, 2*i+2, i
		if l < len(s) && s.less(l, m) {
			m = l
		}
		if r < len(s) && s.less(r, m) {
			m = r
		}
		if m == i {
			break
		}
		s[i], s[m] = s[m], s[i]
		i = m
	}
	*h = s
	return top
}

// peek returns the earliest time, or 0 and false when empty.
func (h timeHeap) peek() (int64, bool) {
	if len(h) == 0 {
		return 0, false
	}
	return h[0].at, true
}
