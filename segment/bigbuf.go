package segment

import (
	"math/bits"
	"sync"
	"unsafe"
)

// Write buffers: the pending buffer's growth (growPending), the free list
// of small buffers a log keeps, and the size-classed pool of large ones
// shared by every log (LargeBuf, PutLargeBuf, for the owner's proposals).

// maxFreeBuf: write buffers up to this capacity are kept by their log for
// reuse; a larger one goes to bigBufs, which the GC empties when idle:
// kept for good, it would hold its peak size (the heap of a node with a
// deep durable backlog must not; TestDurableHeapPerMessage in broker
// counts every retained byte).
const maxFreeBuf = 1 << 20

// minBuf is a new write buffer's capacity.
const minBuf = 256 << 10

// growPending makes room in the pending buffer for an append of entries
// bytes (entry headers and the data copied) in n batches, and when it must grow,
// for a group commit as large as the last one: grown by append's
// doublings, a busy queue's commits of a few megabytes were copied at
// every step: a fifth of BenchmarkDurablePersistent1K's CPU.
func (l *Log) growPending(entries, n int) {
	// Record headers and padding: one entries record per maxEntriesRecord
	// bytes and a hard state record per batch, at most.
	need := entries + (entries/maxEntriesRecord+2*n+1)*(recordHeader+48+align)
	if cap(l.pending)-len(l.pending) >= need {
		return
	}
	want := max(len(l.pending)+need, l.lastWrite+l.lastWrite/4)
	nb := append(newBuf(want), l.pending...)
	l.releaseBuf(l.pending)
	l.pending = nb
}

// bigBufs holds large buffers by capacity class (class k holds buffers
// of bigClassSize(k) bytes), shared by the process: the logs' write
// buffers over maxFreeBuf and the replication worker's large proposals
// (LargeBuf). A busy queue's group commits of a few megabytes, each built
// in fresh memory, cost the zeroing and the page faults of that memory
// and the scavenger's madvise: a fifth of BenchmarkDurablePersistent1K's
// CPU. Reused, they cost neither; and a sync.Pool drops what was not used
// within two garbage collections, so an idle node keeps none (kept for
// good in freeBufs they held their peak size: the heap of a node with a
// deep durable backlog must not). The pool holds each buffer's first
// byte: its class gives its capacity, and a pointer needs no allocation.
var bigBufs [bigClasses]sync.Pool

// bigClasses: from bigMin to 512 MiB (an append is at most maxPending
// bytes of entries and their headers), four classes per doubling, so a
// buffer is at most a quarter larger than asked for (a proposal raft
// holds until applied is one).
const (
	bigMin     = 256 << 10
	bigClasses = 4*11 + 1
)

func bigClassSize(k int) int {
	e, m := k/4, k%4
	return (bigMin << e) / 4 * (4 + m)
}

// bigClass is the smallest class of at least n bytes.
func bigClass(n int) int {
	if n <= bigMin {
		return 0
	}
	e := bits.Len(uint((n-1)/bigMin)) - 1 // bigMin<<e < n <= bigMin<<(e+1)
	step := (bigMin << e) / 4
	return 4*e + (n-(bigMin<<e)+step-1)/step
}

// newBuf returns an empty buffer of at least n bytes: a pooled one when
// n is over maxFreeBuf.
func newBuf(n int) []byte {
	if n <= maxFreeBuf {
		return make([]byte, 0, n)
	}
	return poolBuf(n)
}

func poolBuf(n int) []byte {
	k := bigClass(n)
	if k >= bigClasses {
		return make([]byte, 0, n)
	}
	// Sizes asked for vary from one commit (or entry) to the next: a
	// buffer up to two classes larger (at most about half again) will do.
	for j := k; j < min(k+3, bigClasses); j++ {
		if p, ok := bigBufs[j].Get().(*byte); ok {
			return unsafe.Slice(p, bigClassSize(j))[:0]
		}
	}
	return make([]byte, 0, bigClassSize(k))
}

// putBig puts b in its class's pool, if its capacity is a class size.
func putBig(b []byte) bool {
	c := cap(b)
	if c < bigMin {
		return false
	}
	if k := bigClass(c); k < bigClasses && bigClassSize(k) == c {
		bigBufs[k].Put(unsafe.SliceData(b))
		return true
	}
	return false
}

// LargeBuf returns an empty buffer of at least n bytes, for a caller that
// builds large entries: over 256 KiB, from the pool of large buffers
// segment's own write buffers use (which the GC empties when idle); give
// it back with PutLargeBuf once nothing refers to its bytes.
func LargeBuf(n int) []byte {
	if n <= bigMin {
		return make([]byte, 0, n)
	}
	return poolBuf(n)
}

// PutLargeBuf gives back a buffer from LargeBuf: the caller, and everyone
// else, must hold no reference to its bytes. It reports whether b went
// to the pool (a buffer of another capacity, e.g. one grown since, is
// left to the GC).
func PutLargeBuf(b []byte) bool { return putBig(b) }

// releaseBuf takes back a write buffer no longer in use.
func (l *Log) releaseBuf(b []byte) {
	c := cap(b)
	if c <= maxFreeBuf {
		l.freeBufs = append(l.freeBufs, b[:0])
		return
	}
	putBig(b)
}
