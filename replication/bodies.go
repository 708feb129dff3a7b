package replication

import (
	"errors"
	"fmt"
	"unsafe"

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
	entries  map[uint64][]byte // entry index → its data (a view), until ReleaseBodies
	releases []func()
	// The body offsets of the last entries read (index), kept across
	// ReleaseBodies: a consumer's deliveries from one entry come over many
	// batches (as its acks free its prefetch), and decoding the whole
	// entry again for each (a cache miss per message, to read each body's
	// length) was a tenth of warrend's CPU with one busy durable queue.
	index  [2]bodyIndex
	next   int // the slot of index to fill next
	builds int // indexes built (tests)
	dec    EntryDecoder
	// The entry Body read last, its data and index (a consumer's
	// deliveries come in runs from one entry: no map lookup each).
	cur     uint64
	curData []byte
	curIdx  *bodyIndex
}

// bodyIndex is where each message's body lies in an entry's data.
type bodyIndex struct {
	entry uint64
	n     int      // the length of the data it was built from (0: unused)
	offs  []uint32 // by slot: the offset of the body in the data, or noBody, emptyBody
}

const (
	noBody    = 1<<32 - 1 // an Enqueue without bodies
	emptyBody = 1<<32 - 2 // a body of 0 bytes
)

// Body returns the body of message id, a view valid until the next
// ReleaseBodies (call it once the bytes are copied out: after the round's
// deliveries are written). Entries read from segment stay mapped until
// then, even if a compaction deletes their file meanwhile.
func (g *Group) Body(id uint64) ([]byte, error) {
	idx, slot := id>>16, int(id&0xFFFF)
	c := &g.bodies
	data, bi := c.curData, c.curIdx
	if bi == nil || c.cur != idx {
		var ok bool
		if data, ok = c.entries[idx]; !ok {
			var err error
			if data, err = g.loadEntry(idx); err != nil {
				return nil, err
			}
		}
		var err error
		if bi, err = g.bodyIndex(idx, data); err != nil {
			return nil, err
		}
		c.cur, c.curData, c.curIdx = idx, data, bi
	}
	if slot >= len(bi.offs) || bi.offs[slot] == noBody {
		return nil, fmt.Errorf("%w %#x: entry %d holds %d bodies", ErrNoBody, id, idx, len(bi.offs))
	}
	off := bi.offs[slot]
	if off == emptyBody {
		return data[:0:0], nil
	}
	n := le.Uint32(data[off-4:])
	return data[off : off+n : off+n], nil
}

// loadEntry finds entry idx (tail cache, else segment) and keeps its data
// until ReleaseBodies.
func (g *Group) loadEntry(idx uint64) ([]byte, error) {
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
	if c.entries == nil {
		c.entries = map[uint64][]byte{}
	}
	c.entries[idx] = data
	return data, nil
}

// bodyIndex returns the index of entry idx, whose data is data: kept from
// an earlier call, or built (the entry decoded once).
func (g *Group) bodyIndex(idx uint64, data []byte) (*bodyIndex, error) {
	c := &g.bodies
	for i := range c.index {
		if bi := &c.index[i]; bi.entry == idx && bi.n == len(data) && bi.n > 0 {
			return bi, nil
		}
	}
	bi := &c.index[c.next]
	c.next = (c.next + 1) % len(c.index)
	offs := bi.offs[:0]
	*bi = bodyIndex{}
	base := uintptr(unsafe.Pointer(unsafe.SliceData(data)))
	err := c.dec.Each(data, func(_ int, cmd queue.Command) error {
		if e, ok := cmd.(*queue.Enqueue); ok {
			if e.Bodies == nil {
				for range e.Msgs {
					offs = append(offs, noBody)
				}
				return nil
			}
			for _, b := range e.Bodies {
				if len(b) == 0 {
					offs = append(offs, emptyBody)
				} else {
					offs = append(offs, uint32(uintptr(unsafe.Pointer(unsafe.SliceData(b)))-base))
				}
			}
		}
		return nil
	})
	c.dec.Release()
	if err != nil {
		return nil, fmt.Errorf("replication: group %d: entry %d: %w", g.id, idx, err)
	}
	*bi = bodyIndex{entry: idx, n: len(data), offs: offs}
	c.builds++
	return bi, nil
}

// ReleaseBodies ends the views Body handed out since the last call.
func (g *Group) ReleaseBodies() {
	c := &g.bodies
	for _, r := range c.releases {
		r()
	}
	clear(c.releases)
	c.releases = c.releases[:0]
	clear(c.entries)
	c.curData, c.curIdx = nil, nil
	if len(g.spent) > 0 {
		g.recycle()
	}
}
