package broker

import (
	"encoding/binary"

	"github.com/warren-mq/warren/wire"
)

// ---- origin side: what leaders send ----

// fromLeader takes a leader's message about the links of this shard.
func (s *shard) fromLeader(from uint64, p []byte) {
	op := p[1]
	p = p[2:]
	if op == 'd' {
		s.linkDeliveries(p)
		return
	}
	if op == 'u' {
		if len(p) < 20 {
			return
		}
		id := binary.LittleEndian.Uint64(p)
		w := s.fc.purges[id]
		if w == nil {
			return // timed out already
		}
		delete(s.fc.purges, id)
		w.sink.Answer(w.req, Result{Code: wire.Code(binary.LittleEndian.Uint32(p[8:])), N: int64(binary.LittleEndian.Uint64(p[12:])), Reason: string(p[20:])})
		return
	}
	if op == 't' {
		s.statusAnswered(p)
		return
	}
	if op == 'v' {
		if len(p) >= 16 {
			s.purgeMoved(from, binary.LittleEndian.Uint64(p), binary.LittleEndian.Uint64(p[8:]))
		}
		return
	}
	if len(p) < 8 {
		return
	}
	ol := s.fc.byLink[binary.LittleEndian.Uint64(p)]
	if ol == nil {
		return // a link replaced or dropped
	}
	p = p[8:]
	ol.heard = s.now
	switch op {
	case 's':
		if len(p) < 13 {
			return
		}
		code := wire.Code(binary.LittleEndian.Uint32(p))
		lead := binary.LittleEndian.Uint64(p[4:])
		moved := p[12] != 0
		ol.q.learnLeader(lead)
		if code == wire.OK {
			ol.redirects = 0
			if !ol.told {
				ol.told = true
				ol.sink.Subscribed(ol.spec.ID, ol.req, wire.OK, "")
			}
			return
		}
		delete(s.fc.byLink, ol.link) // refused: nothing to drop there
		ol.link, ol.batch = 0, nil
		if moved {
			if ol.redirects++; ol.redirects <= maxRedirects && lead != from {
				s.relink(ol, lead) // 0: the tick retries
				return
			}
			if ol.told {
				return // the tick retries
			}
		}
		s.forgetForwarded(ol)
		reason := string(p[13:])
		if !ol.told {
			ol.sink.Subscribed(ol.spec.ID, ol.req, code, reason)
			return
		}
		ol.sink.Cancelled(ol.spec.ID, code, reason)
		ol.sink.ConsumerGone(ol.spec.ID)
	case 'x':
		if len(p) < 4 {
			return
		}
		s.forgetForwarded(ol)
		ol.sink.Cancelled(ol.spec.ID, wire.Code(binary.LittleEndian.Uint32(p)), string(p[4:]))
		ol.sink.ConsumerGone(ol.spec.ID)
	case 'm':
		lead := uint64(0)
		if len(p) >= 8 {
			lead = binary.LittleEndian.Uint64(p)
		}
		ol.q.learnLeader(lead)
		if lead == from {
			lead = 0
		}
		delete(s.fc.byLink, ol.link) // gone there
		ol.link, ol.batch = 0, nil
		s.relink(ol, lead)
	case 'g':
		delete(s.fc.byLink, ol.link)
		ol.link, ol.batch = 0, nil
		if ol.cancelled {
			s.linkEnded(ol)
		} else {
			s.relink(ol, ol.q.lead.Load())
		}
	case 'l':
		if len(p) >= 8 {
			ol.sink.LeaseExpired(ol.spec.ID, binary.LittleEndian.Uint64(p))
		}
	case 'e':
		ol.drained = true
		s.releaseGetBarriers(ol)
	case 'k':
		if len(p) < 9 {
			return
		}
		if p[0] == 0 || binary.LittleEndian.Uint64(p[1:]) != ol.recv {
			// Gone there, or a delivery lost on the way: the link
			// holds prefetch that will never be freed.
			s.relink(ol, ol.q.lead.Load())
		}
	}
}

// linkDeliveries hands the deliveries a leader sent to their clients.
// p is this shard's (a copy): the messages are views of it, valid while
// the batch's effects are flushed.
func (s *shard) linkDeliveries(p []byte) {
	if len(p) < 4 {
		return
	}
	n := int(binary.LittleEndian.Uint32(p))
	p = p[4:]
	if n > len(p)/36 {
		return // not a message of ours: no allocation on its word
	}
	msgs := make([]StoredMsg, n)
	ar := &Arena{Buf: p}
	for i := range n {
		if len(p) < 36 {
			return
		}
		link := binary.LittleEndian.Uint64(p)
		d := Delivery{QTag: binary.LittleEndian.Uint64(p[8:]), MsgID: binary.LittleEndian.Uint64(p[16:]),
			DeliveryCount: binary.LittleEndian.Uint32(p[24:]), FailedCount: binary.LittleEndian.Uint32(p[28:])}
		l := int(binary.LittleEndian.Uint32(p[32:]))
		p = p[36:]
		if l > len(p) || !parseLogMsg(ar, p[:l], &msgs[i]) {
			return
		}
		p = p[l:]
		ol := s.fc.byLink[link]
		if ol == nil || ol.cancelled && ol.link == 0 {
			continue // a link replaced: its leader requeues it
		}
		ol.recv++
		ol.heard = s.now
		d.Consumer, d.Msg = ol.spec.ID, &msgs[i]
		pb := ol.batch
		if pb == nil {
			pb = s.batchFor(ol.sink)
			ol.batch = pb
		}
		if len(pb.ds) == 0 {
			s.touched = append(s.touched, pb)
		}
		pb.ds = append(pb.ds, d)
	}
}
