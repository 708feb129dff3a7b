package netio

import "github.com/warren-mq/warren/broker"

// groupByQueue returns items grouped by queue, as a shard's publish command
// takes them: the queues in the order they first appear, each queue's items
// in publish order. It is a stable counting sort, O(len(items)) moves into
// a new slice (or none, returning items itself, when they are grouped
// already), where a stable comparison sort of a batch spread over several
// queues cost O(n log² n) moves of the 56-byte items: a third of the
// broker's CPU with 16 queues (BENCHMARKS.md, the 1,000,000 msg/s
// validation). g is the caller's scratch, kept between calls.
func groupByQueue(items []broker.EnqItem, g *grouper) []broker.EnqItem {
	if len(items) < 2 {
		return items
	}
	g.reset()
	runs := 0
	var last *broker.Queue
	li := -1
	for i := range items {
		q := items[i].Q
		if q != last {
			runs++
			last, li = q, g.index(q)
		}
		g.counts[li]++
	}
	if runs == len(g.queues) {
		return items // every queue's items are one run already
	}
	off := 0
	for i, n := range g.counts {
		g.counts[i] = off
		off += n
	}
	out := make([]broker.EnqItem, len(items))
	last, li = nil, -1
	for i := range items {
		q := items[i].Q
		if q != last {
			last, li = q, g.index(q)
		}
		out[g.counts[li]] = items[i]
		g.counts[li]++
	}
	return out
}

// grouper is groupByQueue's scratch: the distinct queues seen, their
// counts, and past a few queues an index by queue.
type grouper struct {
	queues []*broker.Queue
	counts []int
	idx    map[*broker.Queue]int
}

// groupLinearMax: up to this many distinct queues a linear scan finds a
// queue's index faster than a map.
const groupLinearMax = 16

// groupKeepMax: a connection keeps its grouper's scratch between batches
// up to this many distinct queues.
const groupKeepMax = 1024

func (g *grouper) reset() {
	if len(g.queues) > groupKeepMax {
		*g = grouper{} // a batch over thousands of queues: not kept per connection
		return
	}
	if g.idx != nil {
		for _, q := range g.queues {
			delete(g.idx, q)
		}
	}
	clear(g.queues) // drop the pointers: the scratch outlives the batch
	g.queues, g.counts = g.queues[:0], g.counts[:0]
}

// index returns q's index among the distinct queues, adding it if new.
func (g *grouper) index(q *broker.Queue) int {
	if len(g.queues) <= groupLinearMax {
		for i, x := range g.queues {
			if x == q {
				return i
			}
		}
	} else if i, ok := g.idx[q]; ok {
		return i
	}
	i := len(g.queues)
	g.queues = append(g.queues, q)
	g.counts = append(g.counts, 0)
	if len(g.queues) > groupLinearMax {
		if g.idx == nil {
			g.idx = map[*broker.Queue]int{}
		}
		if len(g.queues) == groupLinearMax+1 {
			for j, x := range g.queues {
				g.idx[x] = j
			}
		} else {
			g.idx[q] = i
		}
	}
	return i
}
