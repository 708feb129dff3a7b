package broker

import (
	"encoding/binary"
	"slices"
)

// Status forwarding: a node with no copy of a queue (a replicated queue
// it holds no replica of, or a queue that lives on another node:
// homed.go) has no counts of its own. A CmdBarrier on such a queue (what
// a passive declare and a get are answered after) first asks the queue's
// leader or home for its counts and stores them in the queue's published
// counts (ready, unacked, consumers), so a passive declare on any node
// answers the queue's message and consumer counts. The barrier is
// answered when the counts come, or after statusWaitMs with the counts
// last fetched (no leader known, or none answering: at once, or then;
// at once too past maxStatusWaits barriers waiting on the shard).
//
//	origin → leader  'T' id u64 | queue u64
//	leader → origin  't' id u64 | ok u8 | ready u64 | unacked u64 | consumers u64
//
// The id names the origin shard as a purge's does (shard << 56).

// statusWaitMs bounds how long a barrier waits for a queue's counts.
const statusWaitMs = 1000

// maxStatusWaits bounds the barriers of a shard waiting for counts; past
// it a barrier is answered at once with the counts last fetched.
const maxStatusWaits = 1024

// fwdStatus is a barrier waiting for its queue's counts.
type fwdStatus struct {
	q    *Queue
	sink Sink
	req  uint64
	at   int64
}

// fwdStatusAsk asks q's leader or home for its counts before barrier c
// is answered; it reports whether it holds c until then.
func (s *shard) fwdStatusAsk(c *Command) bool {
	q := c.Queue
	if q == nil || !q.remote || q.gone || s.b.cfg.Durable == nil || len(s.fc.status) >= maxStatusWaits {
		return false
	}
	lead := s.knownLeader(q)
	if lead == 0 || lead == s.nodeID() {
		return false
	}
	fc := &s.fc
	fc.statusSeq++
	id := uint64(s.idx)<<56 | fc.statusSeq&(1<<56-1)
	p := append(make([]byte, 0, 18), 'c', 'T')
	p = binary.LittleEndian.AppendUint64(p, id)
	p = binary.LittleEndian.AppendUint64(p, uint64(q.id))
	if !s.b.sendFwd(lead, p) {
		return false
	}
	if fc.status == nil {
		fc.status = map[uint64]*fwdStatus{}
	}
	fc.status[id] = &fwdStatus{q: q, sink: c.Sink, req: c.Req, at: s.now}
	return true
}

// statusAnswer is the leader's answer to a status request: q's counts
// when this node serves it (here).
func statusAnswer(id uint64, q *Queue, here bool) []byte {
	p := append(make([]byte, 0, 35), 'c', 't')
	p = binary.LittleEndian.AppendUint64(p, id)
	if !here {
		return append(p, make([]byte, 25)...)
	}
	p = append(p, 1)
	p = binary.LittleEndian.AppendUint64(p, uint64(q.m.Ready()))
	p = binary.LittleEndian.AppendUint64(p, uint64(q.m.Unacked()))
	return binary.LittleEndian.AppendUint64(p, uint64(q.m.Consumers()))
}

// statusAnswered takes a leader's answer (p after 'c' 't').
func (s *shard) statusAnswered(p []byte) {
	if len(p) < 33 {
		return
	}
	id := binary.LittleEndian.Uint64(p)
	w := s.fc.status[id]
	if w == nil {
		return // answered at its timeout already
	}
	if p[8] == 1 {
		w.q.ready.Store(int64(binary.LittleEndian.Uint64(p[9:])))
		w.q.unacked.Store(int64(binary.LittleEndian.Uint64(p[17:])))
		w.q.consumers.Store(int64(binary.LittleEndian.Uint64(p[25:])))
	}
	s.endStatus(id)
}

// endStatus answers waiting barrier id (with what it has) and forgets it.
func (s *shard) endStatus(id uint64) {
	w := s.fc.status[id]
	delete(s.fc.status, id)
	s.flushEffects() // the effects of everything before it reach their sinks first
	w.sink.Answer(w.req, Result{})
}

// statusTick answers the barriers that waited statusWaitMs (q nil), or
// every one of queue q (deleted).
func (s *shard) statusTick(q *Queue) {
	if len(s.fc.status) == 0 {
		return
	}
	ids := make([]uint64, 0, len(s.fc.status))
	for id, w := range s.fc.status {
		if w.q == q || q == nil && s.now-w.at >= statusWaitMs {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	for _, id := range ids {
		s.endStatus(id)
	}
}
