package queue

import (
	"errors"
	"math"
	"math/bits"
	"slices"

	"github.com/warren-mq/warren/wire"
)

// DefaultStarvationLimit is how many messages in a row the highest waiting
// priority level may take while a lower level waits, before a lower level
// gets one (weighted anti-starvation). See Machine.
const DefaultStarvationLimit = 8

// Config is a queue's behaviour, fixed at declare time.
type Config struct {
	MaxPriority     uint8 // levels 0..MaxPriority
	StrictPriority  bool  // no anti-starvation
	StarvationLimit int   // 0: DefaultStarvationLimit
	MaxLength       int64 // ready messages; 0: no limit
	MaxLengthBytes  int64 // ready body bytes; 0: no limit
	Overflow        wire.Overflow
	MessageTTLMs    int64 // 0: none
	DeadLetter      bool  // a dead-letter exchange is set (else dead messages are dropped)
	DeliveryLimit   uint32
	RetryInitialMs  int64
	// RetryMultiplierMilli is the retry multiplier in thousandths: 1000
	// (×1, a constant wait) to 1_000_000 (×1000); New raises a smaller
	// value to 1000 and lowers a larger one to 1_000_000. Integer, so the
	// wait is the same on every replica (see Machine.backoff).
	RetryMultiplierMilli uint32
	RetryMaxMs           int64
	ConsumerTimeout      int64 // ms; 0: none
	SingleActive         bool
	AutoDelete           bool  // delete when the last consumer leaves
	ExpiresMs            int64 // delete when unused this long; 0: never
	DedupWindowMs        int64 // drop a message whose DedupKey was seen this recently; 0: off
	// HoldDeadLetters: a dead letter stays held (HeldDeadLetters, not
	// deliverable) after its DeadLetter effect, its body kept, until a
	// SettleDeadLetter says its targets have it (at-least-once
	// dead-lettering: a durable queue sets it). Off: the DeadLetter
	// effect frees it at once.
	HoldDeadLetters bool
}

// ConfigFromArgs maps declared queue arguments to a Config.
func ConfigFromArgs(a wire.QueueArgs, autoDelete bool) Config {
	return Config{
		MaxPriority: a.MaxPriority, StrictPriority: a.StrictPriority,
		MaxLength: a.MaxLength, MaxLengthBytes: a.MaxLengthBytes, Overflow: a.Overflow,
		MessageTTLMs: a.MessageTTL.Milliseconds(), DeadLetter: a.DeadLetterExchange != "",
		DeliveryLimit: a.DeliveryLimit, RetryInitialMs: a.RetryInitial.Milliseconds(),
		RetryMultiplierMilli: MultiplierMilli(a.RetryMultiplier), RetryMaxMs: a.RetryMax.Milliseconds(),
		ConsumerTimeout: a.ConsumerTimeout.Milliseconds(), SingleActive: a.SingleActiveConsumer,
		AutoDelete: autoDelete, ExpiresMs: a.Expires.Milliseconds(),
		DedupWindowMs: a.DedupWindow.Milliseconds(),
	}
}

// MultiplierMilli converts a retry-multiplier as declared (a number from 1
// to 1000) to the thousandths the machine computes with: the nearest
// thousandth, halves away from zero (math.Round(x × 1000) on the binary64
// value: 1.0004 → 1000, 1.0006 → 1001, 2.3 → 2300). The one conversion
// from floating point, done once when the queue is declared; a value out
// of range (or NaN) is clamped to it, as the argument check already
// refused it.
func MultiplierMilli(x float64) uint32 {
	switch {
	case !(x >= 1): // NaN too
		return 1000
	case x >= 1000:
		return maxMultiplierMilli
	}
	return uint32(math.Round(x * 1000))
}

// Message is what Enqueue needs to know of a message: never its body,
// which the caller keeps (in memory, or in the log at index ID).
type Message struct {
	ID            uint64 // unique and increasing per queue (a raft index, or a counter)
	Size          uint32 // body bytes, for max-length-bytes and prefetch bytes
	Priority      uint8
	ExpirationMs  uint32 // per-message TTL; used when HasExpiration
	HasExpiration bool
	// DedupKey is a hash of the message id (0: none); with a dedup window,
	// a key seen within the window makes the message a Duplicate.
	DedupKey uint64
}

// entry is the fixed-size record of one message the queue holds: 32 bytes,
// no pointers, so a million ready messages cost 32 MB and no GC scanning.
type entry struct {
	id         uint64
	expireAt   int64 // ms; 0: never
	size       uint32
	deliveries uint32 // delivery_count
	failed     uint32 // failed_count
	prio       uint8
}

// ConsumerID names a consumer; the caller assigns them.
type ConsumerID uint64

// OwnerID names what a consumer belongs to (a connection, or channel), for
// Down.
type OwnerID uint64

// ConsumerSpec describes a new consumer.
type ConsumerSpec struct {
	ID       ConsumerID
	Owner    OwnerID
	Prefetch uint32 // 0: unlimited
	// PrefetchBytes stops deliveries once the consumer's unacked body bytes
	// reach it (0: unlimited); the last delivery may cross it, and a
	// consumer with nothing outstanding always gets one message.
	PrefetchBytes uint32
	Priority      int16
	AutoAck       bool
	Exclusive     bool
	// TimeoutMs is this consumer's ack timeout (SUBSCRIBE argument
	// consumer-timeout-ms); 0: the queue's ConsumerTimeout.
	TimeoutMs int64
	// Get marks a one-shot consumer standing for a get (AMQP basic.get):
	// it is not a consumer for auto-delete (RabbitMQ deletes an
	// auto-delete queue when its last consumer leaves, and a get is none).
	Get bool
}

type outstanding struct {
	tag      uint64
	deadline int64 // ms; 0: none
	// floor is the deadline given at delivery. Leases only grow (extend
	// never shortens one), and floors grow with tags, so the first live
	// floor bounds every deadline from below: the next wake-up needs no
	// scan.
	floor   int64
	e       entry
	settled bool // a tombstone until the head passes it
}

type consumer struct {
	ConsumerSpec
	seq       uint64 // arrival order, for stable ordering among equals
	cancelled bool   // no more deliveries; kept while it has outstanding ones
	out       []outstanding
	head      int    // first live index in out
	live      int    // unsettled deliveries
	liveBytes uint64 // their body bytes
}

func (c *consumer) hasCredit() bool {
	if c.cancelled {
		return false
	}
	if c.AutoAck {
		return true
	}
	return (c.Prefetch == 0 || uint32(c.live) < c.Prefetch) &&
		(c.PrefetchBytes == 0 || c.live == 0 || c.liveBytes < uint64(c.PrefetchBytes))
}

// EffectKind says what an Effect asks the caller to do.
type EffectKind uint8

const (
	// Deliver message Msg to Consumer under queue-local tag Tag.
	Deliver EffectKind = iota + 1
	// Remove: message Msg is settled for good (acked, auto-acked, purged);
	// free its body.
	Remove
	// DeadLetter: publish Msg to the dead-letter exchange with a death
	// record for Reason, then free it (with Config.HoldDeadLetters: keep
	// it until a SettleDeadLetter of it, whose Remove frees it).
	DeadLetter
	// Drop: Msg died for Reason but there is no dead-letter exchange; free it.
	Drop
	// RejectPublish: nack the publisher of Msg with queue_full; the queue
	// never took it. With reject-publish-dlx a DeadLetter for it follows.
	RejectPublish
	// LeaseExpired: Consumer held Tag past its ack timeout; it was taken
	// back. Tell the consumer.
	LeaseExpired
	// Timer: call Tick at At (ms) or earlier. At most one per batch of
	// effects, always the last.
	Timer
	// DeleteQueue: the queue auto-deleted (last consumer left) or expired.
	DeleteQueue
	// Duplicate: Msg repeats a message id seen within the dedup window. It
	// was not enqueued; confirm it to the publisher (ack) and free it.
	Duplicate
)

var effectNames = [...]string{"", "deliver", "remove", "dead-letter", "drop", "reject-publish", "lease-expired", "timer", "delete-queue", "duplicate"}

func (k EffectKind) String() string { return effectNames[k] }

// Effect is one thing the caller must do after a command. Which fields are
// set depends on Kind.
type Effect struct {
	Kind          EffectKind
	Consumer      ConsumerID
	Tag           uint64
	Msg           uint64
	DeliveryCount uint32
	FailedCount   uint32
	Reason        wire.DeathReason
	At            int64
}

// Errors returned for commands a client got wrong. They carry the protocol
// code to answer with.
var (
	ErrUnknownConsumer = &wire.Error{Code: wire.NotFound, Reason: "queue: no such consumer"}
	ErrConsumerExists  = &wire.Error{Code: wire.PreconditionFailed, Reason: "queue: consumer id in use"}
	ErrExclusive       = &wire.Error{Code: wire.ResourceLocked, Reason: "queue: has an exclusive consumer"}
	ErrNotExclusive    = &wire.Error{Code: wire.ResourceLocked, Reason: "queue: has consumers; cannot be exclusive"}
	ErrUnknownTag      = &wire.Error{Code: wire.UnknownDeliveryTag, Reason: "queue: delivery tag not outstanding"}
	ErrSettleOp        = errors.New("queue: unknown settle op")
)

// Machine is one queue's state machine. It is deterministic: its state and
// effects depend only on the commands applied and the times passed in (ms,
// stamped by the leader). It does no I/O, starts no goroutines, reads no
// clock and draws no random numbers, so every replica computes the same.
//
// Dispatch picks the highest non-empty priority level (the top), with a
// valve against monopoly (weighted anti-starvation, StarvationLimit K): it
// counts a run of consecutive dispatches from the top while a lower level
// waits. The run starts over when the top goes below the lowest level it
// counted from (those levels ran dry), after each valve dispatch, and when
// no lower level waits; a higher level arriving continues it (were the
// count restarted on every level change, two high levels alternating could
// starve a third forever). When the run reaches K and a lower level waits,
// the next dispatch goes to a lower level instead: the next non-empty one
// below the previous valve's level, wrapping to just below the top.
//
// So a backlog holding at most K messages per level drains strictly by
// priority, and one level streaming alone above a waiting one gets K of
// every K+1 dispatches. Bound, whatever is published meanwhile: while level
// L holds messages, it is dispatched from within P·(K·(P−L+1)+1)
// dispatches, P = MaxPriority (with K = 8 and P = 9: 729 for level 0).
// Between two valve dispatches there are at most K·(P−L+1) others (the
// run restarts only when its floor level runs dry, at most once per level
// above L), and the valve's cursor moves strictly down each time until it
// wraps, reaching L within P valve dispatches.
//
// Consumers are served highest consumer priority first, and round-robin
// among equals.
//
// Every command returns the effects it caused, in order. The slice is owned
// by the machine and valid until the next command.
type Machine struct {
	cfg Config

	levels    []ring
	nonEmpty  [4]uint64 // bit l set ⇔ levels[l] has entries (dead ones included)
	runFloor  int       // lowest level the valve's current run counted from (len(levels): none)
	runCount  int       // dispatches in the run while a lower level waited
	lastLevel int       // level of the last dispatch (-1: none)
	cursor    int       // last lower level served by the valve

	readyCount int64
	readyBytes int64

	consumers []*consumer // sorted by priority desc, then arrival
	byID      map[ConsumerID]*consumer
	// unacked is Σ live over consumers, active the consumers not
	// cancelled: counters kept on every change (checkInvariants recounts
	// them), since the caller reads both after every command; gets the
	// active consumers standing for a get (ConsumerSpec.Get).
	unacked   int
	active    int
	gets      int
	groupEnds []int // end index in consumers of each equal-priority run
	rr        int
	arrivals  uint64
	// cancelledAny: some consumer is cancelled but may still be listed.
	cancelledAny bool
	// ownTimeouts: some listed consumer has its own ack timeout (derived
	// from consumers by regroup; not part of the snapshot).
	ownTimeouts bool
	nextTag     uint64

	parked   timeHeap            // retry backoff: ready at .at
	ttlWatch timeHeap            // ready messages with an expiry
	ttlReady map[uint64]struct{} // ids of ready messages in ttlWatch
	dead     map[uint64]struct{} // expired while in a ring; skipped on pop

	lastUsed int64
	deleted  bool

	dedupSeen  map[uint64]int64 // key → when first seen
	dedupOrder []dedupMark      // keys in the order seen, for expiry
	dedupHead  int

	// held are the dead letters kept until their targets have them
	// (Config.HoldDeadLetters), by id; now is the time of the command
	// being applied (a held dead letter's death time).
	held      map[uint64]heldDeadLetter
	heldBytes int64
	now       int64

	effects []Effect
	scratch []entry

	Stats Stats
}

type dedupMark struct {
	key uint64
	at  int64
}

// duplicate reports whether key was seen within the window, and records it
// if not. Keys leave the window in the order they entered it.
func (m *Machine) duplicate(now int64, key uint64) bool {
	if m.cfg.DedupWindowMs <= 0 || key == 0 {
		return false
	}
	for m.dedupHead < len(m.dedupOrder) && now-m.dedupOrder[m.dedupHead].at >= m.cfg.DedupWindowMs {
		delete(m.dedupSeen, m.dedupOrder[m.dedupHead].key)
		m.dedupHead++
	}
	if m.dedupHead > 1024 && m.dedupHead > len(m.dedupOrder)/2 {
		n := copy(m.dedupOrder, m.dedupOrder[m.dedupHead:])
		m.dedupOrder, m.dedupHead = m.dedupOrder[:n], 0
	}
	if _, seen := m.dedupSeen[key]; seen {
		return true
	}
	m.dedupSeen[key] = now
	m.dedupOrder = append(m.dedupOrder, dedupMark{key: key, at: now})
	return false
}

// Stats are monotonic counters, for metrics.
type Stats struct {
	Enqueued, Delivered, Redelivered, Acked, Requeued, DeadLettered, Dropped, Rejected, Expired, Duplicates uint64
}

// New returns an empty queue.
func New(cfg Config, now int64) *Machine {
	if cfg.StarvationLimit <= 0 {
		cfg.StarvationLimit = DefaultStarvationLimit
	}
	cfg.RetryMultiplierMilli = min(max(cfg.RetryMultiplierMilli, 1000), maxMultiplierMilli)
	return &Machine{
		cfg:       cfg,
		levels:    make([]ring, int(cfg.MaxPriority)+1),
		runFloor:  int(cfg.MaxPriority) + 1,
		lastLevel: -1,
		ttlReady:  map[uint64]struct{}{},
		dead:      map[uint64]struct{}{},
		dedupSeen: map[uint64]int64{},
		byID:      map[ConsumerID]*consumer{},
		lastUsed:  now,
	}
}

// Ready is the number of messages waiting for a consumer (parked retries
// not included).
func (m *Machine) Ready() int64 { return m.readyCount }

// ReadyBytes is the body bytes of the ready messages.
func (m *Machine) ReadyBytes() int64 { return m.readyBytes }

// Parked is the number of messages waiting out a retry backoff.
func (m *Machine) Parked() int { return len(m.parked) }

// Unacked is the number of deliveries out with consumers. O(1).
func (m *Machine) Unacked() int { return m.unacked }

// Consumers is the number of active (not cancelled) consumers, those
// standing for a get not counted: a get is no consumer to a client (AMQP
// queue.declare-ok's consumer count, queue.delete's if-unused), though
// the one-shot consumer of a get on a replicated queue stays active until
// its cancel is committed, after the client has its message. O(1).
func (m *Machine) Consumers() int { return m.active - m.gets }

// activeConsumers is the number of active consumers, gets included: what
// the machine's own decisions (an exclusive subscribe, expiry) count.
func (m *Machine) activeConsumers() int { return m.active }

// cancel marks c cancelled (once).
func (m *Machine) cancel(c *consumer) {
	if !c.cancelled {
		c.cancelled = true
		m.active--
		if c.Get {
			m.gets--
		}
	}
}

func (m *Machine) begin(now int64) { m.effects = m.effects[:0]; m.now = now }

func (m *Machine) emit(e Effect) { m.effects = append(m.effects, e) }

// finish dispatches what it can and appends the next timer.
func (m *Machine) finish(now int64) []Effect {
	m.reap()
	m.dispatch(now)
	if at, ok := m.nextWake(now); ok {
		m.emit(Effect{Kind: Timer, At: at})
	}
	return m.effects
}

// reap removes cancelled consumers that hold nothing any more.
func (m *Machine) reap() {
	if !m.cancelledAny {
		return
	}
	m.cancelledAny = false
	m.consumers = slices.DeleteFunc(m.consumers, func(c *consumer) bool {
		if c.cancelled && c.live > 0 {
			m.cancelledAny = true // still draining
		}
		if c.cancelled && c.live == 0 {
			delete(m.byID, c.ID)
			return true
		}
		return false
	})
	m.regroup()
}

// regroup recomputes the equal-priority runs of consumers; called whenever
// the list changes (rare), so dispatch finds a group's bounds in O(1).
func (m *Machine) regroup() {
	m.groupEnds = m.groupEnds[:0]
	m.ownTimeouts = false
	for i, c := range m.consumers {
		m.ownTimeouts = m.ownTimeouts || c.TimeoutMs > 0
		if i+1 == len(m.consumers) || m.consumers[i+1].Priority != c.Priority {
			m.groupEnds = append(m.groupEnds, i+1)
		}
	}
}

// ---- enqueue ----

// Enqueue adds a batch of messages. Each is either taken (and may cause
// drop-head dead-letters) or refused with a RejectPublish effect. Length
// limits are enforced here, on publish: a message a consumer hands back is
// always taken back (the queue already owns it), so a queue may exceed its
// limit by at most its unacked count until the next publish trims it.
func (m *Machine) Enqueue(now int64, msgs []Message) []Effect {
	m.begin(now)
	m.lastUsed = now
	for i := range msgs {
		msg := &msgs[i]
		if m.duplicate(now, msg.DedupKey) {
			m.Stats.Duplicates++
			m.emit(Effect{Kind: Duplicate, Msg: msg.ID})
			continue
		}
		e := entry{id: msg.ID, size: msg.Size, prio: min(msg.Priority, m.cfg.MaxPriority)}
		ttl := m.cfg.MessageTTLMs
		if msg.HasExpiration && (ttl == 0 || int64(msg.ExpirationMs) < ttl) {
			ttl = int64(msg.ExpirationMs)
		}
		if msg.HasExpiration || m.cfg.MessageTTLMs > 0 {
			e.expireAt = now + ttl
			if ttl == 0 {
				e.expireAt = now // expires at once: never delivered
			}
		}
		if m.full(e.size) {
			switch m.cfg.Overflow {
			case wire.RejectPublish, wire.RejectPublishDLX:
				m.emit(Effect{Kind: RejectPublish, Msg: e.id})
				m.Stats.Rejected++
				if m.cfg.Overflow == wire.RejectPublishDLX {
					m.kill(e, wire.ReasonMaxLen)
				}
				continue
			default: // drop-head, dead-letter (drop-head with a dead-letter exchange)
				for m.full(e.size) && m.readyCount > 0 {
					m.kill(m.popLowest(), wire.ReasonMaxLen)
				}
				if m.full(e.size) { // larger than the whole byte limit
					m.kill(e, wire.ReasonMaxLen)
					continue
				}
			}
		}
		m.Stats.Enqueued++
		m.pushReady(e, false)
	}
	return m.finish(now)
}

func (m *Machine) full(size uint32) bool {
	return (m.cfg.MaxLength > 0 && m.readyCount+1 > m.cfg.MaxLength) ||
		(m.cfg.MaxLengthBytes > 0 && m.readyBytes+int64(size) > m.cfg.MaxLengthBytes)
}

// pushReady puts e in its level: at the tail for new messages, at the head
// for returned ones.
func (m *Machine) pushReady(e entry, front bool) {
	l := int(e.prio)
	if front {
		m.levels[l].pushFront(e)
	} else {
		m.levels[l].pushBack(e)
	}
	m.nonEmpty[l>>6] |= 1 << (l & 63)
	m.readyCount++
	m.readyBytes += int64(e.size)
	if e.expireAt != 0 {
		m.ttlWatch.push(timed{at: e.expireAt, e: e})
		m.ttlReady[e.id] = struct{}{}
	}
}

// popLevel removes the live head of level l, skipping entries that expired
// in place. The level must hold a live entry.
func (m *Machine) popLevel(l int) entry {
	r := &m.levels[l]
	for {
		e := r.popFront()
		if r.len() == 0 {
			m.nonEmpty[l>>6] &^= 1 << (l & 63)
		}
		if len(m.dead) > 0 {
			if _, gone := m.dead[e.id]; gone {
				delete(m.dead, e.id)
				continue
			}
		}
		m.readyCount--
		m.readyBytes -= int64(e.size)
		if e.expireAt != 0 {
			delete(m.ttlReady, e.id)
		}
		return e
	}
}

// liveLevel reports whether level l holds a live (not expired-in-place)
// entry, dropping dead heads as it looks.
func (m *Machine) liveLevel(l int) bool {
	r := &m.levels[l]
	for r.len() > 0 {
		if len(m.dead) == 0 {
			return true
		}
		if _, gone := m.dead[r.front().id]; !gone {
			return true
		}
		delete(m.dead, r.front().id)
		r.popFront()
	}
	m.nonEmpty[l>>6] &^= 1 << (l & 63)
	return false
}

// highestBelow returns the highest level < limit with entries, or -1.
func (m *Machine) highestBelow(limit int) int {
	for limit > 0 {
		w := (limit - 1) >> 6
		mask := m.nonEmpty[w]
		if b := (limit-1)&63 + 1; b < 64 {
			mask &= 1<<b - 1
		}
		if mask != 0 {
			return w<<6 + bits.Len64(mask) - 1
		}
		limit = w << 6
	}
	return -1
}

// liveBelow is highestBelow over live levels.
func (m *Machine) liveBelow(limit int) int {
	for {
		l := m.highestBelow(limit)
		if l < 0 || m.liveLevel(l) {
			return l
		}
	}
}

// popLowest removes the head of the lowest live level (drop-head overflow).
func (m *Machine) popLowest() entry {
	for l := range m.levels {
		if m.liveLevel(l) {
			return m.popLevel(l)
		}
	}
	panic("queue: BUG: popLowest with no ready message")
}

// pickLevel chooses the level of the next dispatch (see Machine). O(1) in
// the number of messages; a bitmap scan over the levels.
func (m *Machine) pickLevel() int {
	l := m.chooseLevel()
	m.lastLevel = l
	return l
}

func (m *Machine) chooseLevel() int {
	top := m.liveBelow(len(m.levels))
	if top < 0 {
		return -1
	}
	if m.cfg.StrictPriority {
		return top
	}
	if top < m.runFloor {
		// The levels the run counted from ran dry: a new run starts, so a
		// backlog drains level by level in strict order.
		m.runFloor, m.runCount = top, 0
	}
	lower := m.liveBelow(top)
	if lower < 0 {
		m.runFloor, m.runCount = top, 0 // nobody waits below: nothing to count
		return top
	}
	if m.runCount < m.cfg.StarvationLimit {
		m.runCount++
		return top
	}
	// The valve: K in a row from the top while a lower level waited. The
	// next lower level below the cursor gets this one, wrapping.
	m.runFloor, m.runCount = top, 0
	// Rotate below the level the run last dispatched from (or the top):
	// when that level has just run dry, the top itself takes its turn in
	// the rotation, else the run's count would pass on to it.
	h := max(top, m.lastLevel)
	if m.cursor >= h || m.cursor <= 0 {
		m.cursor = h
	}
	l := m.liveBelow(m.cursor)
	if l < 0 {
		l = lower
	}
	m.cursor = l
	return l
}

// ---- dispatch ----

func (m *Machine) pickConsumer() *consumer {
	cs := m.consumers
	if m.cfg.SingleActive {
		// The active consumer is the first (highest priority, oldest)
		// that is not cancelled; the others wait their turn.
		for _, c := range cs {
			if !c.cancelled {
				if c.hasCredit() {
					return c
				}
				return nil
			}
		}
		return nil
	}
	gi := 0
	for _, gj := range m.groupEnds {
		n := gj - gi
		for k := 0; k < n; k++ {
			i := (m.rr + k) % n
			if c := cs[gi+i]; c.hasCredit() {
				m.rr = i + 1
				return c
			}
		}
		gi = gj
	}
	return nil
}

func (m *Machine) dispatch(now int64) {
	for m.readyCount > 0 {
		c := m.pickConsumer()
		if c == nil {
			return
		}
		l := m.pickLevel()
		if l < 0 {
			return
		}
		e := m.popLevel(l)
		if e.expireAt != 0 && e.expireAt <= now {
			m.Stats.Expired++
			m.kill(e, wire.ReasonExpired)
			continue
		}
		m.deliver(now, c, e)
	}
}

func (m *Machine) deliver(now int64, c *consumer, e entry) {
	e.deliveries++
	m.nextTag++
	m.Stats.Delivered++
	if e.deliveries > 1 {
		m.Stats.Redelivered++
	}
	m.lastUsed = now
	m.emit(Effect{Kind: Deliver, Consumer: c.ID, Tag: m.nextTag, Msg: e.id, DeliveryCount: e.deliveries, FailedCount: e.failed})
	if c.AutoAck {
		m.Stats.Acked++
		m.emit(Effect{Kind: Remove, Msg: e.id})
		return
	}
	o := outstanding{tag: m.nextTag, e: e}
	if t := m.leaseMs(c); t > 0 {
		o.deadline = now + t
		o.floor = o.deadline
	}
	c.out = append(c.out, o)
	c.live++
	m.unacked++
	c.liveBytes += uint64(e.size)
}

// leaseMs is c's ack timeout: its own, else the queue's (0: none).
func (m *Machine) leaseMs(c *consumer) int64 {
	if c.TimeoutMs > 0 {
		return c.TimeoutMs
	}
	return m.cfg.ConsumerTimeout
}

// leases reports whether any delivery can have a deadline, so Tick and
// nextWake look at consumers' leases only then.
func (m *Machine) leases() bool { return m.cfg.ConsumerTimeout > 0 || m.ownTimeouts }

// kill dead-letters e (or drops it when the queue has no dead-letter
// exchange).
func (m *Machine) kill(e entry, reason wire.DeathReason) {
	if m.cfg.DeadLetter {
		m.Stats.DeadLettered++
		m.emit(Effect{Kind: DeadLetter, Msg: e.id, Reason: reason})
		if m.cfg.HoldDeadLetters {
			if m.held == nil {
				m.held = map[uint64]heldDeadLetter{}
			}
			m.held[e.id] = heldDeadLetter{at: m.now, size: e.size, reason: reason}
			m.heldBytes += int64(e.size)
		}
	} else {
		m.Stats.Dropped++
		m.emit(Effect{Kind: Drop, Msg: e.id, Reason: reason})
	}
}

// PeekedMessage is a ready message as Peek reports it.
type PeekedMessage struct {
	ID            uint64
	Priority      uint8
	DeliveryCount uint32
	FailedCount   uint32
	ExpireAtMs    int64
}

// Peek reports up to n ready messages in the order they would be
// dispatched under strict priority (highest level first, FIFO within a
// level), without changing anything: no delivery is counted. For
// operators' inspection.
func (m *Machine) Peek(n int) []PeekedMessage {
	var out []PeekedMessage
	for l := len(m.levels) - 1; l >= 0 && len(out) < n; l-- {
		r := &m.levels[l]
		for i := 0; i < r.len() && len(out) < n; i++ {
			e := r.at(i)
			if _, gone := m.dead[e.id]; gone {
				continue
			}
			out = append(out, PeekedMessage{ID: e.id, Priority: e.prio, DeliveryCount: e.deliveries, FailedCount: e.failed, ExpireAtMs: e.expireAt})
		}
	}
	return out
}

// HasConsumer reports whether the queue still tracks a consumer (an active
// one, or a cancelled one with deliveries outstanding).
func (m *Machine) HasConsumer(id ConsumerID) bool { return m.byID[id] != nil }
