package broker

import (
	"time"

	"github.com/warren-mq/warren/queue"
	"github.com/warren-mq/warren/wire"
)

// DLDrop says why a dead letter went nowhere.
type DLDrop uint8

const (
	dlNoExchange    DLDrop = iota // the dead-letter exchange does not exist
	dlBadProperties               // its stored properties do not parse (a bug if it happens)
	dlTooLarge                    // its death history would not fit the property block (65,535 bytes, 255 records, names of 255 bytes)
	dlUnroutable                  // the exchange routed it to no queue
	dlCycle                       // every target would close a dead-letter cycle (queue.DeadLetterCycle)
	dlTargetRefused               // the target queue was deleted meanwhile or refused it (reject-publish)
	NumDLDrops
)

var dlDropNames = [NumDLDrops]string{"no_exchange", "bad_properties", "too_large", "unroutable", "cycle", "target_refused"}

func (r DLDrop) String() string { return dlDropNames[r] }

// dropDeadLetter counts a dead letter that went nowhere, per source queue
// (if known) and broker-wide by reason, and logs it (at most one line per
// reason per 10 s, with the count of those left out).
func (s *shard) dropDeadLetter(q *Queue, target string, r DLDrop) {
	// Logged before counted: whoever sees the count finds the line.
	if ok, n := s.b.dlDropLog[r].Allow(time.Now()); ok {
		if q != nil { // target: its dead-letter exchange, in its vhost
			s.b.log.Warn("dead letter dropped", queueLog(q.name), "target", target, "reason", r.String(), "suppressed_since_last", n)
		} else { // target: the queue that refused it
			s.b.log.Warn("dead letter dropped", "vhost", VhostOf(target), "target", LocalName(target), "reason", r.String(), "suppressed_since_last", n)
		}
	}
	if f := s.b.cfg.DeadLetterDropped; f != nil {
		f(r)
	}
	if q != nil {
		q.deadLetterDropped.Add(1)
	}
}

// deadLetter republishes msg to the queue's dead-letter exchange with its
// death history extended. Messages that would loop without a rejection
// in the cycle are dropped (queue.DeadLetterCycle). A dead letter that
// goes nowhere is counted and logged as dropped, never as dead-lettered.
// The death's time is s.now, the time stamped on the work being applied,
// never a clock reading: a replica applying the same commands must record
// the same history.
func (s *shard) deadLetter(q *Queue, msg *StoredMsg, reason wire.DeathReason) {
	s.deadLetterTo(q, msg, reason, s.now, nil)
}

// deadLetterTo is deadLetter with the death's time given (at) and, for a
// held dead letter, its wait: each target it is sent to takes a reference
// and tells it once it has the dead letter.
func (s *shard) deadLetterTo(q *Queue, msg *StoredMsg, reason wire.DeathReason, at int64, dl *dlWait) {
	dlx := q.args.DeadLetterExchange // the client's name, in the queue's vhost
	dlxName := QualifyName(VhostOf(q.name), dlx)
	view := s.b.topo.view.Load()
	if !view.Table.HasExchange(dlxName) {
		s.dropDeadLetter(q, dlx, dlNoExchange)
		return
	}
	var props wire.Properties
	if err := wire.ParseProperties(msg.Props(), &props); err != nil {
		s.dropDeadLetter(q, dlx, dlBadProperties)
		return
	}
	var deaths []wire.Death
	oldDeathsLen := 0
	if props.Has(wire.PropDeaths) {
		deaths, _ = wire.DecodeDeaths(props.Deaths)
		oldDeathsLen = 3 + len(props.Deaths)
	}
	deaths = queue.RecordDeath(deaths, LocalName(q.name), reason, at, string(msg.Exchange()), []string{string(msg.RoutingKey())})
	// A death record holds names as short strings: a routing key over 255
	// bytes is one an older version's admin API let through (PublishOne
	// refuses it now), in a log this node must still recover from.
	if len(deaths) > 255 || len(msg.RoutingKey()) > wire.MaxNameLen || len(msg.Exchange()) > wire.MaxNameLen {
		s.dropDeadLetter(q, dlx, dlTooLarge)
		return
	}
	rk := msg.RoutingKey()
	if q.args.DeadLetterRoutingKey != "" {
		rk = []byte(q.args.DeadLetterRoutingKey)
	}
	props.Deaths = wire.AppendDeaths(nil, deaths)
	// The block is canonical (ParseProperties checked it), so its new size
	// is exact: the old deaths and expiration entries out, the new deaths in.
	newLen := len(msg.Props()) - oldDeathsLen + 3 + len(props.Deaths)
	if props.Has(wire.PropExpiration) {
		newLen -= 3 + 4
	}
	if newLen > wire.MaxPropertiesLen {
		s.dropDeadLetter(q, dlx, dlTooLarge)
		return
	}
	props.Set(wire.PropDeaths)
	// A dead letter never expires again by its old per-message TTL.
	props.Present &^= 1 << wire.PropExpiration
	newProps := wire.AppendProperties(nil, &props)[2:]
	// A dead letter gets an arena of its own (dead-letter queues keep
	// messages for long; sharing the body would pin the batch it came in).
	dm := NewStoredMsg([]byte(dlx), rk, newProps, msg.Body(), msg.Flags, msg.Priority)
	targets, _ := view.Table.Route(nil, dlxName, dm.RoutingKey(), props.Headers)
	sent, cycles := 0, 0
	var tqs []*Queue
	for _, ref := range targets {
		tq := view.Queue(ref)
		if tq == nil {
			continue // deleted since the view was published
		}
		// The history includes this death: a rejection just now means a
		// client decided, so the loop is not a cycle.
		if queue.DeadLetterCycle(deaths, LocalName(tq.name)) {
			cycles++
			continue
		}
		tqs = append(tqs, tq)
	}
	if len(tqs) > 0 {
		dm.Arena.Cost = int64(cap(dm.Arena.Buf)) + StoredMsgOverhead + int64(len(tqs))*PlacementOverhead
		dm.Arena.Refs.Store(int64(len(tqs)))
		s.bytesDelta += dm.Arena.Cost
	}
	for _, tq := range tqs {
		sent++
		meta := queue.Message{Size: uint32(len(dm.Body())), Priority: dm.Priority}
		item := []EnqItem{{Q: tq, Msg: dm, Meta: meta}}
		// Always through the inbox, even to this shard: we are inside
		// handle() for q, and q itself may be the target.
		if dl != nil {
			dl.n.Add(1)
		}
		tq.shard.submit(Command{Kind: CmdPublish, Items: item, dl: dl})
	}
	switch {
	case sent > 0:
		q.deadLettered.Add(1)
	case cycles > 0:
		s.dropDeadLetter(q, dlx, dlCycle)
	default:
		s.dropDeadLetter(q, dlx, dlUnroutable)
	}
}
