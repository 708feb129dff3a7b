package replication

import (
	"cmp"
	"slices"
	"sort"

	"github.com/warren-mq/warren/queue"
)

// liveIndex is the set of a queue's log entries that still hold at least
// one message (design/replication.md §2.3): what Compact must keep below a
// snapshot. Entries are added in index order as they are applied; a
// message's release (Remove, DeadLetter, Drop, Duplicate, RejectPublish)
// decrements its entry's count, found from the message id
// (index = id>>16): at the head in O(1), else by binary search. A dead
// entry's bytes count in deadBytes (what a snapshot would let Compact
// reclaim). Dead entries behind the head stay as holes until they
// outnumber the live ones (and 1024), then the slice is rewritten live
// only: amortised O(1) per release, 16 bytes per live entry, no pointers.
//
// It is never persisted: after a restore it is rebuilt from the machine
// (fromMessages), so it cannot disagree with the state it describes. The
// size of a rebuilt entry is the sum of its live messages' sizes (the
// entry's own size is not known then); sizes only steer the snapshot
// policy.
type liveIndex struct {
	es        []liveEntry
	head      int    // es[:head] are dead
	holes     int    // dead entries in es[head:]
	nlive     int    // live entries
	deadBytes uint64 // bytes of entries that died (or were never live)
}

type liveEntry struct {
	idx  uint64
	live uint32 // messages still held
	size uint32 // the entry's bytes
}

// add records entry idx holding msgs messages (msgs > 0; idx above every
// entry added before), or, for an entry holding none, counts it dead.
func (l *liveIndex) add(idx uint64, msgs, size uint32) {
	if msgs == 0 {
		l.deadBytes += uint64(size)
		return
	}
	l.es = append(l.es, liveEntry{idx: idx, live: msgs, size: size})
	l.nlive++
}

// find returns the position of idx in es[head:], or -1.
func (l *liveIndex) find(idx uint64) int {
	if l.head < len(l.es) && l.es[l.head].idx == idx {
		return l.head
	}
	rest := l.es[l.head:]
	i := sort.Search(len(rest), func(i int) bool { return rest[i].idx >= idx })
	if i < len(rest) && rest[i].idx == idx {
		return l.head + i
	}
	return -1
}

// release drops one message of the entry message id msgID belongs to. It
// reports false when that entry holds no message (a caller's bug).
func (l *liveIndex) release(msgID uint64) bool {
	p := l.find(msgID >> 16)
	if p < 0 || l.es[p].live == 0 {
		return false
	}
	e := &l.es[p]
	e.live--
	if e.live > 0 {
		return true
	}
	l.deadBytes += uint64(e.size)
	l.nlive--
	if p != l.head {
		l.holes++
	} else {
		l.head++
		for l.head < len(l.es) && l.es[l.head].live == 0 {
			l.head++
			l.holes--
		}
	}
	switch {
	case l.holes > 1024 && l.holes > l.nlive:
		n := 0
		for _, e := range l.es[l.head:] {
			if e.live > 0 {
				l.es[n] = e
				n++
			}
		}
		l.es, l.head, l.holes = l.es[:n], 0, 0
	case l.head > 1024 && l.head > len(l.es)/2:
		n := copy(l.es, l.es[l.head:])
		l.es, l.head = l.es[:n], 0
	}
	return true
}

// appendLive appends the indexes of the live entries at or below upTo, in
// ascending order (what segment's Compact takes), and returns dst.
func (l *liveIndex) appendLive(dst []uint64, upTo uint64) []uint64 {
	for _, e := range l.es[l.head:] {
		if e.idx > upTo {
			break
		}
		if e.live > 0 {
			dst = append(dst, e.idx)
		}
	}
	return dst
}

// entries is the number of live entries.
func (l *liveIndex) entries() int { return l.nlive }

// rebuild replaces the set with the entries holding the messages m holds
// (queue.Machine.EachMessage). deadBytes starts over at 0. O(n log n) in
// the messages held; run once per restore.
func (l *liveIndex) rebuild(m *queue.Machine) {
	type msg struct {
		idx  uint64
		size uint32
	}
	var ms []msg
	m.EachMessage(func(id uint64, size uint32) { ms = append(ms, msg{id >> 16, size}) })
	slices.SortFunc(ms, func(a, b msg) int { return cmp.Compare(a.idx, b.idx) })
	*l = liveIndex{es: l.es[:0]}
	for _, x := range ms {
		if n := len(l.es); n > 0 && l.es[n-1].idx == x.idx {
			l.es[n-1].live++
			l.es[n-1].size = satAdd(l.es[n-1].size, x.size)
			continue
		}
		l.es = append(l.es, liveEntry{idx: x.idx, live: 1, size: x.size})
		l.nlive++
	}
}

func satAdd(a, b uint32) uint32 {
	if a+b < a {
		return ^uint32(0)
	}
	return a + b
}
