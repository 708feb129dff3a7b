package loadtest

import (
	"fmt"
	"sync/atomic"
	"time"
)

// History is the tracker's accounting for the fault harness
// (loadtest/jepsen): producers with fixed ids and sequence numbers from 1
// (across their reconnects), confirms, and consumptions, checked as
// Jepsen's RabbitMQ checker does (total-queue semantics): lost = confirmed
// and never consumed, invented = consumed and never published (or
// consumed with a body other than the one published), duplicates
// counted. It is safe for concurrent use.
type History struct {
	tr       *tracker
	invented atomic.Int64
	size     int
}

// NewHistory accounts for producers producers whose messages have size
// bytes (at least the tracking header).
func NewHistory(producers, size int) *History {
	return &History{tr: newTracker(producers, 1, 1, 1), size: max(size, headerSize+8)}
}

// Body is message seq of producer: the tracking header, then filler that
// depends on both, so a damaged body is told from the one sent.
func (h *History) Body(producer int, seq uint64) []byte {
	b := make([]byte, h.size)
	putHeader(b, uint32(producer), seq, time.Now().UnixNano())
	fill(b[headerSize:], producer, seq)
	return b
}

func fill(b []byte, producer int, seq uint64) {
	x := seq*0x9e3779b97f4a7c15 ^ uint64(producer+1)*0xbf58476d1ce4e5b9
	for i := range b {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		b[i] = byte(x)
	}
}

// Sent records that message seq of producer is about to be published
// (before the publish: a consumer may see it before the call returns).
func (h *History) Sent(producer int, seq uint64) {
	p := h.tr.prod[producer]
	if seq > p.published.Load() {
		p.published.Store(seq)
	}
}

// Confirmed records the broker's answer for seqs first..last of producer:
// ok is a confirm, !ok a nack. Messages whose connection was lost before
// an answer get neither.
func (h *History) Confirmed(producer int, first, last uint64, ok bool) {
	h.tr.confirmed(producer, first, last, ok, time.Now().UnixNano())
}

// Check reports whether a delivered body is one that was published,
// intact: if not, it counts it as invented. It returns the producer and
// sequence number when it is.
func (h *History) Check(body []byte) (producer int, seq uint64, ok bool) {
	pid, s, _, hok := readHeader(body)
	if !hok || int(pid) >= len(h.tr.prod) || s == 0 || s > h.tr.prod[pid].published.Load() || len(body) != h.size {
		h.invented.Add(1)
		return 0, 0, false
	}
	want := make([]byte, h.size-headerSize)
	fill(want, int(pid), s)
	if string(want) != string(body[headerSize:]) {
		h.invented.Add(1)
		return 0, 0, false
	}
	return int(pid), s, true
}

// Consumed records that a consumer took (acked) message seq of producer.
func (h *History) Consumed(producer int, seq uint64) {
	h.tr.consumed.Add(1)
	if prev := h.tr.prod[producer].st.received(seq); prev >= 1 {
		h.tr.dups.Add(1)
	}
}

// Lost counts the confirmed messages not consumed so far.
func (h *History) Lost() int64 { return h.tr.lost() }

// Counts is a History's result.
type Counts struct {
	Published  int64 // messages sent
	Confirmed  int64 // confirmed by the broker
	Nacked     int64
	Unknown    int64 // sent, neither confirmed nor nacked (the connection went away)
	Consumed   int64 // distinct messages consumed
	Deliveries int64 // consumptions counted, duplicates included
	Lost       int64 // confirmed, never consumed: must be 0
	Duplicated int64 // consumed more than once
	Invented   int64 // consumed, never published (or not as published): must be 0
	NackedSeen int64 // nacked, consumed all the same
	LostRanges []string
}

// Counts counts.
func (h *History) Counts() Counts {
	var c Counts
	for pi, p := range h.tr.prod {
		top := p.published.Load()
		c.Published += int64(top)
		for s := uint64(1); s <= top; s++ {
			v := p.st.get(s)
			switch {
			case v&stAcked != 0:
				c.Confirmed++
			case v&stNacked != 0:
				c.Nacked++
			default:
				c.Unknown++
			}
			if v&recvMask != 0 {
				c.Consumed++
			}
			if v&stAcked != 0 && v&recvMask == 0 {
				c.Lost++
			}
			if v&stNacked != 0 && v&stAcked == 0 && v&recvMask != 0 {
				c.NackedSeen++
			}
		}
		if r := formatRanges(top, func(s uint64) bool { v := p.st.get(s); return v&stAcked != 0 && v&recvMask == 0 }); r != "" {
			c.LostRanges = append(c.LostRanges, fmt.Sprintf("producer %d: %s", pi, r))
		}
	}
	c.Deliveries = h.tr.consumed.Load()
	c.Duplicated = h.tr.dups.Load()
	c.Invented = h.invented.Load()
	return c
}
