package replication

import (
	"sync"
	"unsafe"

	"github.com/warren-mq/warren/segment"
)

// Proposal buffers. A solo group's entry over handMin bytes is proposed
// in the encoder's own buffer (no copy: Group.finish), and given back
// here once applied and no view of it is out (Group.spend, recycle);
// the group's next entry is built in one. Up to smallMax they are pooled
// here, by capacity class; larger ones in segment's pool of large
// buffers. A sync.Pool drops what was not used within two garbage
// collections, so an idle node keeps none.
const (
	// handMin: an entry this large or smaller is copied out of the
	// encoder (segment copies it into its write buffer anyway).
	handMin = 4 << 10
	// smallMin, smallMax: the classes pooled here, four per doubling
	// (a buffer is at most a quarter larger than asked for).
	smallMin     = 8 << 10
	smallMax     = 256 << 10
	smallClasses = 4*5 + 1
)

var smallBufs [smallClasses]sync.Pool

func smallClassSize(k int) int {
	e, m := k/4, k%4
	return (smallMin << e) / 4 * (4 + m)
}

// smallClass is the smallest class of at least n bytes (n ≤ smallMax).
func smallClass(n int) int {
	k := 0
	for smallClassSize(k) < n {
		k++
	}
	return k
}

// propBuf returns an empty buffer of at least n bytes for an entry.
func propBuf(n int) []byte {
	if n > smallMax {
		return segment.LargeBuf(n)
	}
	k := smallClass(n)
	// Entry sizes vary from round to round: a buffer up to two classes
	// larger will do.
	for j := k; j < min(k+3, smallClasses); j++ {
		if p, ok := smallBufs[j].Get().(*byte); ok {
			return unsafe.Slice(p, smallClassSize(j))[:0]
		}
	}
	return make([]byte, 0, smallClassSize(k))
}

// putPropBuf gives back a buffer nothing refers to any more; it reports
// whether it was kept (one of another capacity is left to the GC).
func putPropBuf(b []byte) bool {
	c := cap(b)
	if c > smallMax {
		return segment.PutLargeBuf(b)
	}
	if c < smallMin {
		return false
	}
	if k := smallClass(c); smallClassSize(k) == c {
		smallBufs[k].Put(unsafe.SliceData(b))
		return true
	}
	return false
}
