package loadtest

import (
	"sync"
	"sync/atomic"

	"github.com/HdrHistogram/hdrhistogram-go"
)

// Per message and producer, one uint32 of state: the low byte counts
// receptions (saturating), the top bits record the confirm.
const (
	stAcked   = 1 << 30
	stNacked  = 1 << 31
	recvMask  = 0xff
	chunkBits = 16
	chunkLen  = 1 << chunkBits
	maxChunks = 1 << 15 // 2^31 messages per producer
)

type chunk [chunkLen]uint32

// states is a lock-free, lazily grown array of per-message state.
type states struct {
	chunks [maxChunks]atomic.Pointer[chunk]
}

func (s *states) slot(seq uint64) *uint32 {
	i := seq - 1
	ci := i >> chunkBits
	if ci >= maxChunks {
		panic("loadtest: more than 2^31 messages from one producer")
	}
	c := s.chunks[ci].Load()
	if c == nil {
		c = new(chunk)
		if !s.chunks[ci].CompareAndSwap(nil, c) {
			c = s.chunks[ci].Load()
		}
	}
	return &c[i&(chunkLen-1)]
}

func (s *states) or(seq uint64, bits uint32) {
	p := s.slot(seq)
	for {
		old := atomic.LoadUint32(p)
		if atomic.CompareAndSwapUint32(p, old, old|bits) {
			return
		}
	}
}

// received adds one reception and returns the count before it.
func (s *states) received(seq uint64) uint32 {
	p := s.slot(seq)
	for {
		old := atomic.LoadUint32(p)
		n := old & recvMask
		nw := old
		if n < recvMask {
			nw = old + 1
		}
		if atomic.CompareAndSwapUint32(p, old, nw) {
			return n
		}
	}
}

func (s *states) get(seq uint64) uint32 { return atomic.LoadUint32(s.slot(seq)) }

// recorder is a latency histogram (microseconds) plus an interval copy for
// the live progress line.
type recorder struct {
	mu       sync.Mutex
	total    *hdrhistogram.Histogram
	interval *hdrhistogram.Histogram
	active   bool                    // false during warmup: nothing is recorded
	spare    *hdrhistogram.Histogram // progress goroutine: the next interval
}

func newRecorder() *recorder {
	return &recorder{total: newHist(), interval: newHist()}
}

func newHist() *hdrhistogram.Histogram { return hdrhistogram.New(1, 120_000_000, 3) }

func (r *recorder) record(us int64) {
	if us < 1 {
		us = 1
	}
	r.mu.Lock()
	if r.active {
		_ = r.total.RecordValue(us)
	}
	_ = r.interval.RecordValue(us)
	r.mu.Unlock()
}

// mergeInterval adds the interval histogram to acc and starts a new
// interval. It swaps in a spare histogram under the lock (the recording
// side waits for a pointer swap, not a merge) and clears the old one
// outside it; only the progress goroutine calls it, and it owns spare.
func (r *recorder) mergeInterval(acc *hdrhistogram.Histogram) {
	if r.spare == nil {
		r.spare = newHist()
	}
	r.mu.Lock()
	r.interval, r.spare = r.spare, r.interval
	r.mu.Unlock()
	acc.Merge(r.spare)
	r.spare.Reset()
}

// tracker accounts for every message of a run.
type tracker struct {
	copies   int
	prod     []*producerState
	consumed atomic.Int64
	// own counts what was consumed of this run's producers (ids from
	// base): a ledger run also consumes what earlier runs left in its
	// queues, which must not end its drain early.
	own     atomic.Int64
	base    int
	dups    atomic.Int64
	reorder atomic.Int64
	confirm []*recorder // per producer
	e2e     []*recorder // per consumer
	dropNth int64       // tests: consumers pretend to lose every dropNth message
	// The progress goroutine's accumulators for an interval's confirm and
	// publish→deliver latency.
	confirmIv, e2eIv *hdrhistogram.Histogram
}

type producerState struct {
	st        states
	published atomic.Uint64 // highest sequence number sent
	acked     atomic.Int64
	nacked    atomic.Int64
	sentNs    []atomic.Int64 // ring, by seq, for confirm latency
}

func newTracker(producers, consumers, copies, window int) *tracker {
	t := &tracker{copies: copies, confirmIv: newHist(), e2eIv: newHist()}
	for i := 0; i < producers; i++ {
		t.prod = append(t.prod, &producerState{sentNs: make([]atomic.Int64, 2*window+1)})
		t.confirm = append(t.confirm, newRecorder())
	}
	for i := 0; i < consumers; i++ {
		t.e2e = append(t.e2e, newRecorder())
	}
	return t
}

func (t *tracker) setActive(on bool) {
	for _, r := range append(append([]*recorder{}, t.confirm...), t.e2e...) {
		r.mu.Lock()
		r.active = on
		r.mu.Unlock()
	}
}

func (p *producerState) sent(seq uint64, ns int64) {
	p.sentNs[seq%uint64(len(p.sentNs))].Store(ns)
	p.published.Store(seq)
}

// confirmed records a confirm range.
func (t *tracker) confirmed(producer int, first, last uint64, ok bool, nowNs int64) {
	p := t.prod[producer]
	bit := uint32(stAcked)
	if !ok {
		bit = stNacked
	}
	for s := first; s <= last; s++ {
		p.st.or(s, bit)
		if ok {
			t.confirm[producer].record((nowNs - p.sentNs[s%uint64(len(p.sentNs))].Load()) / 1000)
		}
	}
	n := int64(last - first + 1)
	if ok {
		p.acked.Add(n)
	} else {
		p.nacked.Add(n)
	}
}

// consumedMsg accounts for one received message and reports whether the
// consumer should "lose" it (test hook).
func (t *tracker) consumedMsg(consumer int, body []byte, nowNs int64, last []uint64) {
	pid, seq, sent, ok := readHeader(body)
	if !ok || int(pid) >= len(t.prod) || seq == 0 {
		return
	}
	n := t.consumed.Add(1)
	if int(pid) >= t.base {
		t.own.Add(1)
	}
	if t.dropNth > 0 && n%t.dropNth == 0 {
		return // injected loss: the message was received but is not counted
	}
	if prev := t.prod[pid].st.received(seq); int(prev) >= t.copies {
		t.dups.Add(1)
	}
	if seq < last[pid] {
		t.reorder.Add(1)
	}
	last[pid] = seq
	t.e2e[consumer].record((nowNs - sent) / 1000)
}

// Totals over all producers.
func (t *tracker) totals() (published, acked, nacked int64) {
	for _, p := range t.prod {
		published += int64(p.published.Load())
		acked += p.acked.Load()
		nacked += p.nacked.Load()
	}
	return
}

// lost counts acked messages received fewer times than they should be.
func (t *tracker) lost() (lost int64) {
	for _, p := range t.prod {
		for s := uint64(1); s <= p.published.Load(); s++ {
			v := p.st.get(s)
			if v&stAcked != 0 && int(v&recvMask) < t.copies {
				lost++
			}
		}
	}
	return lost
}

func merge(rs []*recorder) *hdrhistogram.Histogram {
	h := newHist()
	for _, r := range rs {
		r.mu.Lock()
		h.Merge(r.total)
		r.mu.Unlock()
	}
	return h
}
