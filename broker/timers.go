package broker

// timerHeap holds a shard's queues that are waiting for a Tick, ordered by
// the time of their latest Timer effect (Queue.wakeAt), ties by name so the
// order of a shard's Ticks is a function of its commands alone. When the
// shard's timer fires it pops the due queues only: the work is the queues
// that have work, not every queue the shard owns. Shard-owned.
type timerHeap []*Queue

func (h timerHeap) less(i, j int) bool {
	a, b := h[i], h[j]
	if a.wakeAt != b.wakeAt {
		return a.wakeAt < b.wakeAt
	}
	return a.name < b.name
}

func (h timerHeap) swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].timerIdx = i + 1
	h[j].timerIdx = j + 1
}

func (h timerHeap) up(i int) {
	for i > 0 {
		p := (i - 1) / 2
		if !h.less(i, p) {
			return
		}
		h.swap(i, p)
		i = p
	}
}

func (h timerHeap) down(i int) {
	for {
		l := 2*i + 1
		if l >= len(h) {
			return
		}
		m := l
		if r := l + 1; r < len(h) && h.less(r, l) {
			m = r
		}
		if !h.less(m, i) {
			return
		}
		h.swap(i, m)
		i = m
	}
}

// set records q's latest Timer effect: Tick it at atMs (it supersedes the
// earlier one, queue.Effect Timer).
func (h *timerHeap) set(q *Queue, atMs int64) {
	if q.gone {
		return
	}
	q.wakeAt = atMs
	if q.timerIdx == 0 {
		*h = append(*h, q)
		q.timerIdx = len(*h)
		h.up(len(*h) - 1)
		return
	}
	i := q.timerIdx - 1
	h.up(i)
	h.down(i)
}

// remove takes q out (deleted, or being ticked).
func (h *timerHeap) remove(q *Queue) {
	if q.timerIdx == 0 {
		return
	}
	i, last := q.timerIdx-1, len(*h)-1
	if i != last {
		h.swap(i, last)
	}
	(*h)[last] = nil
	*h = (*h)[:last]
	q.timerIdx, q.wakeAt = 0, 0
	if i != last {
		h.up(i)
		h.down(i)
	}
}

// next is the earliest wake time, 0 if no queue waits.
func (h timerHeap) next() int64 {
	if len(h) == 0 {
		return 0
	}
	return h[0].wakeAt
}

// popDue takes out every queue due at nowMs, earliest first, appending them
// to out.
func (h *timerHeap) popDue(nowMs int64, out []*Queue) []*Queue {
	for len(*h) > 0 && (*h)[0].wakeAt <= nowMs {
		q := (*h)[0]
		h.remove(q)
		out = append(out, q)
	}
	return out
}
