package broker

import (
	"encoding/binary"
	"slices"
	"strconv"

	"github.com/warren-mq/warren/wire"
)

// fwdPurge is a purge forwarded to a queue's leader.
type fwdPurge struct {
	q    *Queue
	sink Sink
	req  uint64
	at   int64  // ms: when it came, then when it was sent
	to   uint64 // the node it was sent to (0: none yet: it waits for a leader)

	waits     bool // counted in fwdConsume.waiting
	redirects int  // "not the leader" answers followed
	// del: a delete with if-unused (delIfUnused) or if-empty
	// (delIfEmpty), forwarded as a purge is (0: a purge)
	del byte
	// conn: the connection that asked for the delete (0: none), whose
	// control run's end waits for a deletion done here (deleteHere)
	conn uint64
}

func (w *fwdPurge) what() string {
	if w.del != 0 {
		return "delete"
	}
	return "purge"
}

// A forwarded delete's conditions ('W'), and delPlain, set on every one
// (a home of an earlier version reads a delete with neither condition
// alike).
const (
	delIfUnused = 1
	delIfEmpty  = 2
	delPlain    = 4
)

// fwdPurge forwards a purge of q to its leader; with none known it
// waits for one.
func (s *shard) fwdPurge(q *Queue, k Sink, req uint64) {
	if q.home != 0 && q.exclusive != 0 {
		code, reason := homeRefusal(q)
		k.Answer(req, Result{Code: code, Reason: reason})
		return
	}
	s.fwdPurgeOrDelete(q, k, req, 0, 0)
}

// fwdDelete forwards a delete of q to its leader or home, which checks
// if-unused and if-empty and answers the count of messages deleted (this
// node holds no copy of q): as a purge is forwarded, answered the same
// way. One without conditions that no leader answers (none known, or
// none answering within ForwardTimeout: a dead home) is done here
// instead, its count unknown (0), for conn (the connection that asked, 0:
// none), whose control run's end waits for it as for a local delete.
func (s *shard) fwdDelete(q *Queue, k Sink, req uint64, ifUnused, ifEmpty bool, conn uint64) {
	del := byte(delPlain)
	if ifUnused {
		del |= delIfUnused
	}
	if ifEmpty {
		del |= delIfEmpty
	}
	s.fwdPurgeOrDelete(q, k, req, del, conn)
}

// deleteHere ends forwarded delete id that no leader answered: done
// here when it has no conditions (true), else left to the caller.
func (s *shard) deleteHere(id uint64) bool {
	w := s.fc.purges[id]
	if w.del != delPlain {
		return false
	}
	s.endPurge(id, s.deleteIf(w.q, false, false, "queue deleted", w.conn))
	return true
}

func (s *shard) fwdPurgeOrDelete(q *Queue, k Sink, req uint64, del byte, conn uint64) {
	lead := s.knownLeader(q)
	if lead == 0 && del == delPlain {
		k.Answer(req, s.deleteIf(q, false, false, "queue deleted", conn))
		return
	}
	if lead == 0 {
		if code, reason, ok := s.mayWait(q); !ok {
			k.Answer(req, Result{Code: code, Reason: reason})
			return
		}
	}
	fc := &s.fc
	fc.purgeSeq++
	id := uint64(s.idx)<<56 | fc.purgeSeq&(1<<56-1)
	if fc.purges == nil {
		fc.purges = map[uint64]*fwdPurge{}
	}
	fc.purges[id] = &fwdPurge{q: q, sink: k, req: req, at: s.now, del: del, conn: conn}
	if lead == 0 {
		s.purgeWaits(fc.purges[id], true)
		return
	}
	s.sendPurge(id, lead)
}

// purgeWaits marks w as waiting for a leader to be known, or not.
func (s *shard) purgeWaits(w *fwdPurge, waits bool) {
	switch {
	case waits && !w.waits:
		s.countWait(w.q, 1)
	case !waits && w.waits:
		s.countWait(w.q, -1)
	}
	w.waits = waits
}

// sendPurge sends waiting purge id to node lead.
func (s *shard) sendPurge(id, lead uint64) {
	w := s.fc.purges[id]
	s.purgeWaits(w, false)
	p := append(make([]byte, 0, 19), 'c', 'U')
	if w.del != 0 {
		p[1] = 'W'
	}
	p = binary.LittleEndian.AppendUint64(p, id)
	p = binary.LittleEndian.AppendUint64(p, uint64(w.q.id))
	if w.del != 0 {
		p = append(p, w.del)
	}
	if !s.b.sendFwd(lead, p) {
		s.endPurge(id, Result{Code: wire.InternalError, Reason: "the " + w.what() + " could not be sent to the queue's leader (node " + strconv.FormatUint(lead, 10) + "): retry it"})
		return
	}
	w.to, w.at = lead, s.now
}

// sendWaitingPurges sends q's purges that wait for a leader to lead.
func (s *shard) sendWaitingPurges(q *Queue, lead uint64) {
	for _, id := range sortedPurges(s.fc.purges) {
		if p := s.fc.purges[id]; p.q == q && p.to == 0 {
			s.sendPurge(id, lead)
		}
	}
}

// purgeMoved follows a "not the leader" answer to purge id from node
// from: sent to the leader it names, or, with none named, held until one
// is known (as a purge that came with none known); after maxRedirects the
// client is told.
func (s *shard) purgeMoved(from, id, lead uint64) {
	w := s.fc.purges[id]
	if w == nil || w.to != from {
		return // answered, timed out, or sent elsewhere since
	}
	if w.redirects++; w.redirects > maxRedirects {
		code, reason := w.q.notHere()
		s.endPurge(id, Result{Code: code, Reason: reason + "; the nodes asked did not lead it"})
		return
	}
	w.q.learnLeader(lead)
	if lead != 0 && lead != from {
		s.sendPurge(id, lead)
		return
	}
	w.to, w.at = 0, s.now
	s.purgeWaits(w, true)
}

// endPurge answers purge id and forgets it.
func (s *shard) endPurge(id uint64, r Result) {
	w := s.fc.purges[id]
	delete(s.fc.purges, id)
	s.purgeWaits(w, false)
	w.sink.Answer(w.req, r)
}

func sortedPurges(m map[uint64]*fwdPurge) []uint64 {
	out := make([]uint64, 0, len(m))
	for id := range m {
		out = append(out, id)
	}
	slices.Sort(out)
	return out
}
