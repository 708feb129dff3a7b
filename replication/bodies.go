package replication

import (
	"errors"
	"fmt"

	"github.com/warren-mq/warren/queue"
)

// A durable queue keeps its message bodies in its log only (design §2.2):
// message id index<<16 | slot names the entry and the slot, counted
// across the entry's Enqueue commands. Body finds one: from the storage's
// tail cache when the entry is still in memory (a consumer that keeps up
// is served from there), else through a view of the segment file, one per
// entry however many of its messages are read, held until ReleaseBodies.

// ErrNoBody: the message's entry is not stored (compacted away: the queue
// no longer holds the message) or its Enqueue carried no bodies.
var ErrNoBody = errors.New("replication: no body stored for message")

type bodyCache struct {
	entries  map[uint64][][]byte // entry index → its bodies, in slot order (views)
	releases []func()
	free     [][][]byte
	dec      EntryDecoder
}

// Body returns the body of message id, a view valid until the next
// ReleaseBodies (call it once the bytes are copied out: after the round's
// deliveries are written). Entries read from segment stay mapped until
// then, even if a compaction deletes their file meanwhile.
func (g *Group) Body(id uint64) ([]byte, error) {
	idx, slot := id>>16, int(id&0xFFFF)
	c := &g.bodies
	bodies, ok := c.entries[idx]
	if !ok {
		var err error
		if bodies, err = g.loadBodies(idx); err != nil {
			return nil, err
		}
	}
	if slot >= len(bodies) || bodies[slot] == nil {
		return nil, fmt.Errorf("%w %#x: entry %d holds %d bodies", ErrNoBody, id, idx, len(bodies))
	}
	return bodies[slot], nil
}

// loadBodies finds entry idx (tail cache, else segment) and indexes its
// bodies.
func (g *Group) loadBodies(idx uint64) ([][]byte, error) {
	c := &g.bodies
	var data []byte
	if t := g.st.tail; len(t) > 0 && idx >= t[0].Index && idx <= t[len(t)-1].Index {
		data = t[idx-t[0].Index].Data
	} else {
		es, release, err := g.w.log.EntriesView(g.id, idx, idx+1)
		if err != nil {
			return nil, fmt.Errorf("%w %#x (entry %d): %w", ErrNoBody, idx<<16, idx, err)
		}
		c.releases = append(c.releases, release)
		data = es[0].Data
	}
	var bodies [][]byte
	if n := len(c.free); n > 0 {
		bodies, c.free = c.free[n-1][:0], c.free[:n-1]
	}
	err := c.dec.Each(data, func(_ int, cmd queue.Command) error {
		if e, ok := cmd.(*queue.Enqueue); ok {
			if e.Bodies == nil {
				for range e.Msgs {
					bodies = append(bodies, nil)
				}
			} else {
				bodies = append(bodies, e.Bodies...)
			}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("replication: group %d: entry %d: %w", g.id, idx, err)
	}
	if c.entries == nil {
		c.entries = map[uint64][][]byte{}
	}
	c.entries[idx] = bodies
	return bodies, nil
}

// ReleaseBodies ends the views Body handed out since the last call.
func (g *Group) ReleaseBodies() {
	c := &g.bodies
	for _, r := range c.releases {
		r()
	}
	clear(c.releases)
	c.releases = c.releases[:0]
	for k, b := range c.entries {
		clear(b)
		c.free = append(c.free, b)
		delete(c.entries, k)
	}
	if len(g.spent) > 0 {
		g.recycle()
	}
}
