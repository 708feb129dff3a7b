package broker

import (
	"errors"
	"strconv"

	"github.com/warren-mq/warren/queue"
	"github.com/warren-mq/warren/wire"
)

// CmdKind names a shard command.
type CmdKind uint8

const (
	CmdPublish   CmdKind = iota + 1 // Items (grouped by queue), Batch (nil: a dead letter)
	CmdSettle                       // Settles
	CmdSubscribe                    // Queue, Sink, Spec, Req
	CmdCancel                       // Queue, Consumer, Requeue
	CmdDown                         // Owner: a connection closed
	CmdCreate                       // Queue: a declared queue gets its machine
	CmdDelete                       // Queue, IfUnused, IfEmpty, Reason; answered to Sink under Req
	CmdPurge                        // Queue; answered to Sink under Req
	CmdPeek                         // Queue, N; answered to Sink under Req
	CmdBarrier                      // answered to Sink under Req once everything before it is done
	CmdTick                         // Queue: its time-driven work due by the command's time (TTL expiry, retries, leases, queue expiry)
	// CmdReleaseEnded: a publisher's channel ended (PublishBatch.Ended
	// set): every shard confirms the parts of its batches that queues
	// over their soft limit hold back. To every shard, no queue.
	CmdReleaseEnded

	// cmdFire is a shard's timer firing, for a broker with ManualTicks
	// (FireTimers): the shard makes a CmdTick of each due queue. Not a
	// command of the record: the CmdTicks it makes are.
	cmdFire CmdKind = 255
	// cmdPost runs post on the shard: a durable queue's worker handing
	// back a completed log write (replication.WorkerConfig.Post). Not a
	// command of the record.
	cmdPost CmdKind = 254
	// cmdDLDone: every target of held dead letter dl has it (or refused
	// it): its source queue settles it (deadletter.go). Not a command of
	// the record.
	cmdDLDone CmdKind = 253
	// cmdDrop: a cluster applied a queue's deletion (cluster.go); the
	// shard drops its copy if it has not already. Not a command of the
	// record.
	cmdDrop CmdKind = 252
)

// Command is one unit of work for a shard, as a value: no closure, nothing
// of a connection but the Sink its answers and effects go to. Loops build
// one per batch per shard (a publish part, a run of settlements); Submit
// copies it into the shard's inbox, so submitting allocates nothing.
//
// Each command of a queue is applied as the queue command of the same name
// (queue.Enqueue, Settle, Subscribe, Cancel, Down, Purge, Tick) through
// queue.Machine.Apply, stamped with the shard's time when it is applied.
// Timers are commands too: when a shard's timer fires, the shard applies a
// CmdTick for each queue whose Timer effect is due, through the same path
// (Config.OnApply sees them), so a replay of the recorded commands, at
// their recorded times, reproduces what the timers did.
type Command struct {
	Kind  CmdKind
	Queue *Queue
	// Sink receives the answer to a request (Answer, Subscribed), under
	// Req, the sink's own reference for it.
	Sink Sink
	Req  uint64

	Items   []EnqItem     // CmdPublish: one message bound for one queue each
	Batch   *PublishBatch // CmdPublish: the publish batch the items belong to
	Settles []SettleItem  // CmdSettle

	Spec     queue.ConsumerSpec // CmdSubscribe
	Consumer queue.ConsumerID   // CmdCancel
	Requeue  bool               // CmdCancel
	// Owner: CmdDown: the connection's id. CmdDelete: the connection
	// that asks (0: none), whose control run's end (EndControlRun) waits
	// for its answer, then for the deletion to be durable (one node) or
	// applied (a cluster).
	Owner uint64

	IfUnused, IfEmpty bool   // CmdDelete
	Reason            string // CmdDelete: what its consumers are told
	N                 int    // CmdPeek: at most this many messages

	post func() // cmdPost
	// dl: CmdPublish of a held dead letter (its target tells dl once it
	// has it), cmdDLDone.
	dl *dlWait
}

// Result is a shard's answer to a request command.
type Result struct {
	Code   wire.Code // wire.OK, or why it failed (Reason)
	Reason string
	N      int64     // CmdDelete, CmdPurge: the messages removed
	Msgs   []Message // CmdPeek: copies of the ready messages
}

// Err is the result as an error (nil for wire.OK).
func (r Result) Err() error {
	if r.Code == wire.OK {
		return nil
	}
	return &wire.Error{Code: r.Code, Reason: r.Reason}
}

// apply runs one command on the shard.
func (s *shard) apply(c *Command) {
	switch c.Kind {
	case CmdPublish:
		s.enqueue(c.Items, c.Batch, c.dl)
	case CmdSettle:
		s.settle(c.Settles)
	case CmdSubscribe:
		s.subscribe(c.Queue, c.Sink, c.Spec, uint32(c.Req))
	case CmdCancel:
		s.cancel(c.Queue, c.Consumer, c.Requeue)
	case CmdDown:
		s.down(c.Owner)
	case CmdCreate:
		s.createQueue(c.Queue)
	case CmdDelete:
		if q := c.Queue; q.remote && !q.gone && s.b.cfg.Durable != nil && s.b.cfg.Durable.Forward != nil {
			// Done where it is: its conditions checked there, and the
			// count of messages it held answered from there.
			s.fwdDelete(q, c.Sink, c.Req, c.IfUnused, c.IfEmpty, c.Owner)
			return
		}
		c.Sink.Answer(c.Req, s.deleteIf(c.Queue, c.IfUnused, c.IfEmpty, c.Reason, c.Owner))
	case CmdPurge:
		if q := c.Queue; q.ledElsewhere() {
			s.fwdPurge(q, c.Sink, c.Req)
			return
		}
		if q := c.Queue; q.grp != nil && !q.gone {
			// Answered at apply.
			q.purges = append(q.purges, pendingReq{sink: c.Sink, req: c.Req})
			if _, err := q.grp.Add(&queue.Purge{NowMs: s.now}); err != nil {
				q.purges = q.purges[:len(q.purges)-1]
				c.Sink.Answer(c.Req, Result{Code: wire.InternalError, Reason: err.Error()})
			}
			return
		}
		c.Sink.Answer(c.Req, s.purge(c.Queue))
	case CmdPeek:
		c.Sink.Answer(c.Req, s.peek(c.Queue, c.N))
	case CmdTick:
		s.tickQueue(c.Queue)
	case CmdReleaseEnded:
		s.releaseEnded()
	case cmdFire:
		s.tick()
	case cmdPost:
		c.post()
	case cmdDLDone:
		s.dlDone(c.dl)
	case cmdDrop:
		if c.Queue.m != nil || c.Queue.remote {
			s.deleteQueue(c.Queue, "queue deleted")
		}
	case CmdBarrier:
		if s.fwdBarrier(c) {
			return // answered once a get forwarded for the queue is
		}
		if c.Queue != nil && c.Queue.remote && s.fwdStatusAsk(c) {
			return // answered once its leader or home sent its counts (forward_status.go)
		}
		if q := c.Queue; q != nil && q.grp != nil && !q.gone && q.grp.Err() == nil {
			if seq := q.grp.LastSeq(); seq > q.applSeq {
				// A durable queue: answered once what was added to
				// its log before it is applied (answerBarriers).
				if len(q.barriers) == 0 {
					s.barrierQs = append(s.barrierQs, q)
				}
				q.barriers = append(q.barriers, pendingBarrier{seq: seq, sink: c.Sink, req: c.Req})
				return
			}
		}
		// The effects of everything before it reach their sinks first.
		s.flushEffects()
		c.Sink.Answer(c.Req, Result{})
	default:
		panic("netio: BUG: unknown shard command")
	}
}

// reasonOf is the text of an error for a reply: a protocol error's reason
// alone, since its code travels in the reply's own field.
func reasonOf(err error) string {
	var we *wire.Error
	if errors.As(err, &we) {
		return we.Reason
	}
	return err.Error()
}

func noQueue(q *Queue) Result {
	if !q.gone && q.m == nil {
		if e := q.replicaErr.Load(); e != nil {
			// Its data here is damaged: refused, saying so.
			return Result{Code: wire.PreconditionFailed, Reason: *e}
		}
	}
	return Result{Code: wire.NotFound, Reason: "no queue " + strconv.Quote(q.name)}
}

// deleteIf deletes a queue unless a condition refuses it; conn asked for
// it (0: none, or not on this node).
func (s *shard) deleteIf(q *Queue, ifUnused, ifEmpty bool, reason string, conn uint64) Result {
	switch {
	case q.remote && !q.gone && (ifUnused || ifEmpty):
		code, reason := q.notHere()
		return Result{Code: code, Reason: reason + "; if-unused and if-empty are checked there"}
	case q.remote && !q.gone:
	case !q.gone && q.m == nil && q.replicaErr.Load() != nil && !ifUnused && !ifEmpty:
		// Refused here for damaged data: it can still be deleted (its
		// damaged copy goes at the next start).
	case q.gone || q.m == nil:
		return noQueue(q)
	case ifUnused && q.m.Consumers() > 0:
		return Result{Code: wire.PreconditionFailed, Reason: "queue " + strconv.Quote(q.name) + " has consumers"}
	case ifEmpty && q.m.Ready()+int64(q.m.Unacked())+int64(q.m.Parked()) > 0:
		return Result{Code: wire.PreconditionFailed, Reason: "queue " + strconv.Quote(q.name) + " is not empty"}
	}
	n := int64(0)
	if s.b.topo.removeQueue(q, conn) {
		n = s.deleteQueue(q, reason)
	}
	return Result{N: n}
}

// purge removes a queue's ready messages (queue.Purge: one Remove effect
// per message removed).
func (s *shard) purge(q *Queue) Result {
	if q.gone || q.m == nil {
		return noQueue(q)
	}
	effs, _ := q.m.Apply(&queue.Purge{NowMs: s.now})
	n := int64(0)
	for _, e := range effs {
		if e.Kind == queue.Remove {
			n++
		}
	}
	s.handle(q, effs)
	return Result{N: n}
}

// MaxPeekBytes bounds the bodies one peek copies (PeekQueue): it stops
// at the first message that would take them past it, but always returns
// one. The copy is made on the queue's shard and answered whole (the admin
// API's /get): 10,000 messages of 4 MiB were 40 GB, every other queue of
// the shard waiting meanwhile.
const MaxPeekBytes = 16 << 20

// peek copies up to n ready messages in dispatch order without taking
// them, their bodies at most MaxPeekBytes together (at least one).
func (s *shard) peek(q *Queue, n int) Result {
	if !q.gone && q.remote {
		code, reason := q.notHere()
		return Result{Code: code, Reason: reason}
	}
	if q.gone || q.m == nil {
		return noQueue(q)
	}
	if g := q.grp; g != nil && g.Installing() {
		// The machine is the one from before the leader's snapshot, whose
		// install may have compacted the log its bodies are read from.
		lead := "retry shortly"
		if l := q.lead.Load(); l != 0 && l != s.nodeID() {
			lead = "retry shortly, or peek on node " + strconv.FormatUint(l, 10) + ", which leads it"
		}
		return Result{Code: wire.PreconditionFailed, Reason: "queue " + strconv.Quote(LocalName(q.name)) + ": this node's replica is installing a snapshot from its leader; " + lead}
	}
	var out []Message
	bytes := 0
	for _, p := range q.m.Peek(n) {
		m := s.msgOf(q, p.ID)
		if m == nil {
			continue
		}
		if bytes += len(m.Body()); bytes > MaxPeekBytes && len(out) > 0 {
			break
		}
		props, _ := wire.DecodeProps(m.Props())
		out = append(out, Message{ID: p.ID, Exchange: string(m.Exchange()), RoutingKey: string(m.RoutingKey()), Priority: m.Priority,
			Persistent: m.Flags&wire.Persistent != 0, DeliveryCount: p.DeliveryCount, FailedCount: p.FailedCount,
			Properties: props, Body: append([]byte(nil), m.Body()...)})
	}
	return Result{Msgs: out}
}

// waitSink takes the answer to one request for a caller that waits for it
// (the operator API, shutdown); it ignores every other effect.
type waitSink chan Result

func (w waitSink) Answer(_ uint64, r Result) {
	select {
	case w <- r:
	default:
	}
}
func (waitSink) Deliver([]Delivery)                                     {}
func (waitSink) Confirm(*PublishBatch)                                  {}
func (waitSink) Subscribed(queue.ConsumerID, uint32, wire.Code, string) {}
func (waitSink) Cancelled(queue.ConsumerID, wire.Code, string)          {}
func (waitSink) LeaseExpired(queue.ConsumerID, uint64)                  {}
func (waitSink) ConsumerGone(queue.ConsumerID)                          {}
