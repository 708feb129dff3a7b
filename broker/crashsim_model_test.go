package broker

import (
	"slices"
	"sort"
	"strings"
	"sync"

	"github.com/warren-mq/warren/queue"
	"github.com/warren-mq/warren/wire"
)

// simQueue is the simulation's record of a queue it declared.
type simQueue struct {
	name      string // the broker's name for it
	key       string // the simulation's: its name, then name~N for the N-th redeclare after a delete
	logged    bool   // durable and not exclusive: a raft group, survives a crash
	exclusive bool
	ttl       bool   // message-ttl: its messages expire
	dropsHead bool   // max-length with drop-head: it drops (dead-letters) its oldest
	dlimit    bool   // delivery-limit: a requeued message may be dead-lettered
	rejects   bool   // max-length with reject-publish: a dead letter may be refused
	dlx       string // the queue its dead letters go to ("": none)
	declared  bool   // its declare was answered (a logged one is on disk)
	deleting  bool   // a delete was submitted
	deleted   bool   // ... and answered (on disk)
	purgedAt  int    // the publish counter when a purge was last submitted (-1: never)
}

// simExchange is the simulation's record of an exchange it declared.
type simExchange struct {
	durable           bool
	declared          bool // answered (a durable one is on disk)
	deleting, deleted bool // a delete was submitted; answered
}

// simBind is what the simulation knows of a binding.
type simBind uint8

const (
	bindNone  simBind = iota // never made
	bindMade                 // its bind was answered, and no end of it was deleted since
	bindMaybe                // its bind was not answered, or an end's delete was submitted
)

// simMsg is one published message (bodies are unique).
type simMsg struct {
	seq        int
	persistent bool
	expires    bool     // a per-message TTL
	queues     []string // where it was routed
	batch      *PublishBatch
	idx        int
}

// simCopy names one copy of a message: its body, the queue it is in, and
// the queues it died in on the way there (dead letters), sorted.
type simCopy struct{ body, queue, path string }

type simCopyState struct {
	delivered bool // delivered before the crash
	ackSent   bool // an ack was submitted
	rejected  bool // a reject was submitted
	onDisk    bool // an ack or reject, and a barrier on its queue answered after it
}

type simDelivery struct {
	consumer queue.ConsumerID
	qtag     uint64
	body     string
	path     string
	count    uint32
}

type simConsumer struct {
	queue string
	owner uint64
	alive bool
}

// simSink is where the simulation's publishes, consumers and requests
// report.
type simSink struct {
	mu        sync.Mutex
	frozen    bool
	confirmed map[*PublishBatch]bool
	got       []simDelivery
	subs      map[queue.ConsumerID]wire.Code
	answers   map[uint64]Result
	changed   chan struct{}
}

func newSimSink() *simSink {
	return &simSink{confirmed: map[*PublishBatch]bool{}, subs: map[queue.ConsumerID]wire.Code{}, answers: map[uint64]Result{},
		changed: make(chan struct{}, 1)}
}

func (k *simSink) poke() {
	select {
	case k.changed <- struct{}{}:
	default:
	}
}

func (k *simSink) Deliver(ds []Delivery) {
	k.mu.Lock()
	if !k.frozen {
		for _, d := range ds {
			k.got = append(k.got, simDelivery{consumer: d.Consumer, qtag: d.QTag, body: string(d.Msg.Body()), path: deathPath(d.Msg.Props()), count: d.DeliveryCount})
		}
	}
	k.mu.Unlock()
	k.poke()
}

func (k *simSink) Confirm(b *PublishBatch) {
	k.mu.Lock()
	if !k.frozen {
		k.confirmed[b] = true
	}
	k.mu.Unlock()
	k.poke()
}

func (k *simSink) Subscribed(id queue.ConsumerID, _ uint32, code wire.Code, _ string) {
	k.mu.Lock()
	k.subs[id] = code
	k.mu.Unlock()
	k.poke()
}

func (k *simSink) Answer(req uint64, r Result) {
	k.mu.Lock()
	k.answers[req] = r
	k.mu.Unlock()
	k.poke()
}
func (*simSink) Cancelled(queue.ConsumerID, wire.Code, string) {}
func (*simSink) LeaseExpired(queue.ConsumerID, uint64)         {}
func (*simSink) ConsumerGone(queue.ConsumerID)                 {}

// deathPath is the sorted set of queues a message's death history names.
func deathPath(props []byte) string {
	var p wire.Properties
	if err := wire.ParseProperties(props, &p); err != nil || !p.Has(wire.PropDeaths) {
		return ""
	}
	ds, err := wire.DecodeDeaths(p.Deaths)
	if err != nil {
		return "?"
	}
	var qs []string
	for _, d := range ds {
		qs = append(qs, d.Queue)
	}
	sort.Strings(qs)
	return strings.Join(slices.Compact(qs), ",")
}

func addToPath(path, q string) string {
	qs := []string{q}
	if path != "" {
		qs = append(qs, strings.Split(path, ",")...)
	}
	sort.Strings(qs)
	return strings.Join(slices.Compact(qs), ",")
}
