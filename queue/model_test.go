package queue

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/warren-mq/warren/wire"
)

// model is a naive reference queue: plain slices and linear scans, no
// rings, bitmaps, heaps, tombstones or binary search. It implements the
// same rules as Machine (for the untimed features) the obvious way, and
// TestAgainstModel requires the two to agree on every effect.
type model struct {
	cfg       Config
	ready     [][]entry // per level, head first
	runFloor  int
	runCount  int
	lastLevel int
	cursor    int
	waited    []int        // dispatches since each level was last served (checkBound)
	boundErr  string       // the first breach of the valve's bound
	consumers []*mConsumer // priority desc, arrival asc
	rr        int
	arrivals  uint64
	nextTag   uint64
	effects   []Effect
}

type mOut struct {
	tag uint64
	e   entry
}

type mConsumer struct {
	spec      ConsumerSpec
	seq       uint64
	cancelled bool
	out       []mOut // unsettled, in tag order
}

func newModel(cfg Config) *model {
	if cfg.StarvationLimit <= 0 {
		cfg.StarvationLimit = DefaultStarvationLimit
	}
	return &model{cfg: cfg, ready: make([][]entry, int(cfg.MaxPriority)+1), runFloor: int(cfg.MaxPriority) + 1, lastLevel: -1,
		waited: make([]int, int(cfg.MaxPriority)+1)}
}

func (m *model) count() (n int64, bytes int64) {
	for _, l := range m.ready {
		for _, e := range l {
			n++
			bytes += int64(e.size)
		}
	}
	return
}

func (m *model) full(size uint32) bool {
	n, b := m.count()
	return (m.cfg.MaxLength > 0 && n+1 > m.cfg.MaxLength) || (m.cfg.MaxLengthBytes > 0 && b+int64(size) > m.cfg.MaxLengthBytes)
}

func (m *model) kill(e entry, reason wire.DeathReason) {
	k := Drop
	if m.cfg.DeadLetter {
		k = DeadLetter
	}
	m.effects = append(m.effects, Effect{Kind: k, Msg: e.id, Reason: reason})
}

func (m *model) enqueue(msgs []Message) []Effect {
	m.effects = nil
	for _, msg := range msgs {
		e := entry{id: msg.ID, size: msg.Size, prio: min(msg.Priority, m.cfg.MaxPriority)}
		if m.full(e.size) {
			if m.cfg.Overflow != wire.DropHead && m.cfg.Overflow != wire.OverflowDeadLetter {
				m.effects = append(m.effects, Effect{Kind: RejectPublish, Msg: e.id})
				if m.cfg.Overflow == wire.RejectPublishDLX {
					m.kill(e, wire.ReasonMaxLen)
				}
				continue
			}
			for m.full(e.size) {
				n, _ := m.count()
				if n == 0 {
					break
				}
				for l := range m.ready {
					if len(m.ready[l]) > 0 {
						m.kill(m.ready[l][0], wire.ReasonMaxLen)
						m.ready[l] = m.ready[l][1:]
						if len(m.ready[l]) == 0 {
							m.waited[l] = 0
						}
						break
					}
				}
			}
			if m.full(e.size) {
				m.kill(e, wire.ReasonMaxLen)
				continue
			}
		}
		m.ready[e.prio] = append(m.ready[e.prio], e)
	}
	m.dispatch()
	return m.effects
}

func (m *model) highestBelow(limit int) int {
	for l := limit - 1; l >= 0; l-- {
		if len(m.ready[l]) > 0 {
			return l
		}
	}
	return -1
}

func (m *model) pickLevel() int {
	l := m.chooseLevel()
	m.lastLevel = l
	return l
}

func (m *model) chooseLevel() int {
	top := m.highestBelow(len(m.ready))
	if top < 0 || m.cfg.StrictPriority {
		return top
	}
	// The run: consecutive dispatches from the top since it last went
	// below the run's floor (the levels it counted from ran dry).
	if top < m.runFloor {
		m.runFloor, m.runCount = top, 0
	}
	lower := m.highestBelow(top)
	if lower < 0 {
		m.runFloor, m.runCount = top, 0
		return top
	}
	if m.runCount < m.cfg.StarvationLimit {
		m.runCount++
		return top
	}
	m.runFloor, m.runCount = top, 0
	// Rotate below the level the run last dispatched from (or the top):
	// when that level has just run dry, the top itself takes its turn in
	// the rotation, else the run's count would pass on to it.
	h := max(top, m.lastLevel)
	if m.cursor >= h || m.cursor <= 0 {
		m.cursor = h
	}
	l := m.highestBelow(m.cursor)
	if l < 0 {
		l = lower
	}
	m.cursor = l
	return l
}

func (c *mConsumer) credit() bool {
	return !c.cancelled && (c.spec.AutoAck || c.spec.Prefetch == 0 || uint32(len(c.out)) < c.spec.Prefetch)
}

func (m *model) pickConsumer() *mConsumer {
	if m.cfg.SingleActive {
		for _, c := range m.consumers {
			if !c.cancelled {
				if c.credit() {
					return c
				}
				return nil
			}
		}
		return nil
	}
	// Group by priority; round-robin within the first group with credit.
	for gi := 0; gi < len(m.consumers); {
		var group []*mConsumer
		for gj := gi; gj < len(m.consumers) && m.consumers[gj].spec.Priority == m.consumers[gi].spec.Priority; gj++ {
			group = append(group, m.consumers[gj])
		}
		for k := range group {
			i := (m.rr + k) % len(group)
			if group[i].credit() {
				m.rr = i + 1
				return group[i]
			}
		}
		gi += len(group)
	}
	return nil
}

// checkBound counts, for every level that holds messages, the dispatches
// since it was last dispatched from, and records a breach of the
// documented bound (valveBound) in m.boundErr.
func (m *model) checkBound(served int) {
	for l := range m.ready {
		switch {
		case l == served || len(m.ready[l]) == 0:
			m.waited[l] = 0
		default:
			m.waited[l]++
			if b := valveBound(m.cfg.StarvationLimit, len(m.ready)-1, l); !m.cfg.StrictPriority && m.waited[l] > b && m.boundErr == "" {
				m.boundErr = fmt.Sprintf("level %d passed over %d times, bound %d", l, m.waited[l], b)
			}
		}
	}
}

func (m *model) dispatch() {
	for {
		n, _ := m.count()
		if n == 0 {
			return
		}
		c := m.pickConsumer()
		if c == nil {
			return
		}
		l := m.pickLevel()
		e := m.ready[l][0]
		m.ready[l] = m.ready[l][1:]
		m.checkBound(l)
		e.deliveries++
		m.nextTag++
		m.effects = append(m.effects, Effect{Kind: Deliver, Consumer: c.spec.ID, Tag: m.nextTag, Msg: e.id, DeliveryCount: e.deliveries, FailedCount: e.failed})
		if c.spec.AutoAck {
			m.effects = append(m.effects, Effect{Kind: Remove, Msg: e.id})
			continue
		}
		c.out = append(c.out, mOut{tag: m.nextTag, e: e})
	}
}

func (m *model) requeue(es []entry) {
	for i := len(es) - 1; i >= 0; i-- {
		e := es[i]
		e.failed++
		if m.cfg.DeliveryLimit > 0 && e.deliveries > m.cfg.DeliveryLimit { // delivered more than the limit
			m.kill(e, wire.ReasonDeliveryLimit)
			continue
		}
		m.ready[e.prio] = append([]entry{e}, m.ready[e.prio]...)
	}
}

func (m *model) find(id ConsumerID) *mConsumer {
	for _, c := range m.consumers {
		if c.spec.ID == id {
			return c
		}
	}
	return nil
}

func (m *model) reap() {
	m.consumers = slices.DeleteFunc(m.consumers, func(c *mConsumer) bool { return c.cancelled && len(c.out) == 0 })
}

func (m *model) subscribe(spec ConsumerSpec) ([]Effect, bool) {
	m.effects = nil
	active := 0
	for _, c := range m.consumers {
		if c.spec.ID == spec.ID || (c.spec.Exclusive && !c.cancelled) {
			return nil, false
		}
		if !c.cancelled {
			active++
		}
	}
	if spec.Exclusive && active > 0 {
		return nil, false
	}
	m.arrivals++
	c := &mConsumer{spec: spec, seq: m.arrivals}
	i := 0
	for i < len(m.consumers) && (m.consumers[i].spec.Priority > spec.Priority ||
		(m.consumers[i].spec.Priority == spec.Priority && m.consumers[i].seq < c.seq)) {
		i++
	}
	m.consumers = slices.Insert(m.consumers, i, c)
	m.reap()
	m.dispatch()
	return m.effects, true
}

func (m *model) returnAll(c *mConsumer) {
	var es []entry
	for _, o := range c.out {
		es = append(es, o.e)
	}
	c.out = nil
	m.requeue(es)
}

func (m *model) cancel(id ConsumerID, requeue bool) ([]Effect, bool) {
	m.effects = nil
	c := m.find(id)
	if c == nil || (c.cancelled && !requeue) {
		return nil, false
	}
	c.cancelled = true
	if requeue {
		m.returnAll(c)
	}
	m.reap()
	m.dispatch()
	return m.effects, true
}

func (m *model) down(owner OwnerID) []Effect {
	m.effects = nil
	for _, c := range slices.Clone(m.consumers) {
		if c.spec.Owner == owner {
			c.cancelled = true
			m.returnAll(c)
		}
	}
	m.reap()
	m.dispatch()
	return m.effects
}

func (m *model) settle(id ConsumerID, op wire.SettleOp, first, last uint64) ([]Effect, bool) {
	m.effects = nil
	c := m.find(id)
	if c == nil {
		return nil, false
	}
	var keep []mOut
	var back []entry
	matched := 0
	for _, o := range c.out {
		if o.tag < first || o.tag > last {
			keep = append(keep, o)
			continue
		}
		matched++
		switch op {
		case wire.SettleAck:
			m.effects = append(m.effects, Effect{Kind: Remove, Msg: o.e.id})
		case wire.SettleRequeue:
			back = append(back, o.e)
		case wire.SettleReject:
			o.e.failed++
			m.kill(o.e, wire.ReasonRejected)
		}
	}
	if matched == 0 {
		return nil, false
	}
	c.out = keep
	m.requeue(back)
	m.reap()
	m.dispatch()
	return m.effects, true
}

// TestAgainstModel drives Machine and model with the same random commands
// (untimed features: priorities, consumers, prefetch, settlement, cancel,
// down, delivery limit, overflow) and requires identical effects.
func TestAgainstModel(t *testing.T) {
	for seed := uint64(0); seed < 500; seed++ {
		r := rand.New(rand.NewPCG(seed, 42))
		cfg := Config{
			MaxPriority:     uint8(r.IntN(5)),
			StrictPriority:  r.IntN(3) == 0,
			StarvationLimit: 1 + r.IntN(3),
			DeadLetter:      r.IntN(2) == 0,
			SingleActive:    r.IntN(6) == 0,
		}
		if r.IntN(2) == 0 {
			cfg.MaxLength = int64(1 + r.IntN(15))
			cfg.Overflow = wire.Overflow(r.IntN(4))
		}
		if r.IntN(3) == 0 {
			cfg.MaxLengthBytes = int64(50 + r.IntN(500))
		}
		if r.IntN(2) == 0 {
			cfg.DeliveryLimit = uint32(1 + r.IntN(3))
		}
		real, ref := New(cfg, 0), newModel(cfg)
		tags := map[ConsumerID][]uint64{}
		var id uint64
		for step := 0; step < 300; step++ {
			var got, want []Effect
			var gotOK, wantOK bool
			c := ConsumerID(1 + r.IntN(4))
			switch op := r.IntN(10); {
			case op < 3:
				var msgs []Message
				for i := r.IntN(6); i >= 0; i-- {
					id++
					msgs = append(msgs, Message{ID: id, Size: uint32(r.IntN(60)), Priority: uint8(r.IntN(7))})
				}
				got, gotOK = real.Enqueue(0, msgs), true
				want, wantOK = ref.enqueue(msgs), true
			case op == 3:
				spec := ConsumerSpec{ID: c, Owner: OwnerID(c % 2), Prefetch: uint32(r.IntN(4)), Priority: int16(r.IntN(3)), AutoAck: r.IntN(8) == 0, Exclusive: r.IntN(10) == 0}
				var err error
				got, err = real.Subscribe(0, spec)
				gotOK = err == nil
				want, wantOK = ref.subscribe(spec)
			case op == 4:
				rq := r.IntN(2) == 0
				var err error
				got, err = real.Cancel(0, c, rq)
				gotOK = err == nil
				want, wantOK = ref.cancel(c, rq)
			case op == 5:
				owner := OwnerID(r.IntN(2))
				got, gotOK = real.Down(0, owner), true
				want, wantOK = ref.down(owner), true
			default:
				ts := tags[c]
				if len(ts) == 0 {
					continue
				}
				last := ts[r.IntN(len(ts))]
				first := last
				switch r.IntN(3) {
				case 0:
					first = 0
				case 1:
					first = ts[r.IntN(len(ts))]
					if first > last {
						first, last = last, first
					}
				}
				op := wire.SettleOp(1 + r.IntN(3))
				var err error
				got, err = real.Settle(0, c, op, first, last, 0)
				gotOK = err == nil
				f := first
				if f == 0 {
					f = 1
				}
				want, wantOK = ref.settle(c, op, f, last)
			}
			if gotOK != wantOK {
				t.Fatalf("seed %d step %d: accepted=%v, model says %v", seed, step, gotOK, wantOK)
			}
			got = slices.DeleteFunc(slices.Clone(got), func(e Effect) bool { return e.Kind == Timer })
			if ref.boundErr != "" {
				t.Fatalf("seed %d step %d: %s", seed, step, ref.boundErr)
			}
			if !slices.Equal(got, want) {
				t.Fatalf("seed %d step %d: effects differ\n got %+v\nwant %+v", seed, step, got, want)
			}
			for _, e := range got {
				if e.Kind == Deliver {
					tags[e.Consumer] = append(tags[e.Consumer], e.Tag)
				}
			}
		}
	}
}
