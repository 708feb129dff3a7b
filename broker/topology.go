package broker

import (
	"crypto/rand"
	"encoding/base64"
	"encoding/binary"
	"fmt"
	"github.com/warren-mq/warren/internal/ratelog"
	"log/slog"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/cespare/xxhash/v2"
	"github.com/warren-mq/warren/queue"
	"github.com/warren-mq/warren/wire"
)

// Queue is a declared queue. The fields above the line are fixed at
// declare time; the atomics are published by the owning shard for replies
// and metrics; the rest belongs to the shard goroutine.
type Queue struct {
	name       string
	shard      *shard
	shardIdx   int               // index of shard in Server.shards
	decl       wire.QueueDeclare // as declared, for equivalence checks
	args       wire.QueueArgs
	exclusive  uint64 // owning connection id, 0 if not exclusive
	declaredBy string // the declaring user, "" for the admin API (Authorize)
	autoDelete bool

	ready, unacked, consumers atomic.Int64
	published, delivered      atomic.Uint64
	acked, redelivered        atomic.Uint64
	deadLettered              atomic.Uint64 // sent on to at least one queue
	deadLetterDropped         atomic.Uint64 // went nowhere (shard.dropDeadLetter)
	deleted                   atomic.Bool

	// shard-owned
	m      *queue.Machine
	bodies bodyStore
	nextID uint64
	cons   map[queue.ConsumerID]consumer
	wakeAt int64           // next Timer, 0 for none
	held   []*PublishBatch // confirms held back while the queue is over its soft limit
	gone   bool            // deleted: commands for it are dropped

	// shard-owned, the shard's indexes (timers.go, down.go)
	timerIdx int // 1 + its index in its shard's timerHeap, 0 if not in it
}

// StoredMsg is one message held by a queue. Its slices point into the arena
// of the publish batch it came in (one allocation per batch), shared by every
// queue the message was routed to.
type StoredMsg struct {
	Exchange   []byte
	RoutingKey []byte
	Props      []byte
	Body       []byte
	Arena      *Arena
	Flags      wire.MessageFlags
	Priority   uint8
}

// Arena is what one publish batch allocated for the messages queues keep:
// the bytes of every message and the slice of StoredMsg. Any message of
// the batch that a queue still holds keeps all of it alive, so the
// stored-bytes gauge (what the memory watermark is compared with) counts
// an arena by reference: its whole cost from the moment the loop routes
// the batch until the last queue lets go of the last of its messages.
// Copying the survivors of a mostly-settled arena would free more, but
// needs a pass over every queue's messages to find them and a second copy
// of each; counting by reference keeps the gauge equal to what the heap
// holds at the price of one atomic decrement per message a queue frees.
type Arena struct {
	Refs atomic.Int64 // placements (message × queue) still held
	Cost int64        // counted in Server.storedBytes while refs > 0
}

// The heap a stored message costs beyond its bytes, counted with them.
// Measured with TestMeasureMessageOverhead (WARREN_MEASURE=1 go test
// -run TestMeasureMessageOverhead -v ./netio, Go 1.26, amd64): 200,000
// empty-body messages with a 1-byte routing key grew the live heap
// (after runtime.GC) by 175 bytes each into one queue and 226 into two
// (fanout), in batches of 100; 168 in batches of 1. The constants add up
// to 176 and 232.
const (
	// StoredMsgOverhead: a message's StoredMsg in its batch's slice
	// (4 slice headers, its arena, flags: 112 bytes) and its share of the
	// batch's arena and slice headers.
	StoredMsgOverhead = 120
	// PlacementOverhead: each queue holding a message: its slot in the
	// queue's bodyStore and its entry in the machine's ready ring and
	// index (the second queue in the measurement cost 51 bytes).
	PlacementOverhead = 56
)

// RouteView is what the event loops route against: swapped atomically on
// every topology change, never mutated.
type RouteView struct {
	Table  *queue.CompiledTable
	Queues map[string]*Queue
}

// topology holds exchanges, queues and bindings. Writes (declare, delete,
// bind) take mu and publish a new RouteView; routing reads the view only.
type topology struct {
	mu     sync.Mutex
	top    *queue.Topology
	exDecl map[string]wire.ExchangeDeclare
	// exBy and bindBy record who declared each exchange and binding (for
	// Authorize): the user, "" for the broker's and the admin API's.
	exBy   map[string]string
	bindBy map[string]string
	queues map[string]*Queue
	view   atomic.Pointer[RouteView]
	shards []*shard
	// rebuilds counts routing-view rebuilds (publishLocked), for tests.
	rebuilds atomic.Int64
	batching atomic.Int32 // control runs in progress (runControl)
	dirty    atomic.Bool  // a change is not in the view yet (mu to set)
	log      *slog.Logger
	// durableWarn rate-limits the "durable is not yet honoured" warning.
	durableWarn ratelog.Limiter
	// retired sums the counters of deleted queues, so the broker-wide
	// totals never go down (mu).
	retired queueTotals
}

// queueTotals are broker-wide sums of per-queue counters.
type queueTotals struct {
	published, delivered, acked uint64
}

func newTopology(shards []*shard) *topology {
	t := &topology{top: queue.NewTopology(), exDecl: map[string]wire.ExchangeDeclare{}, queues: map[string]*Queue{}, shards: shards,
		exBy: map[string]string{}, bindBy: map[string]string{},
		log: slog.New(slog.DiscardHandler), durableWarn: ratelog.Limiter{Every: time.Minute}}
	// The standard exchanges every AMQP user expects.
	for _, e := range []struct {
		name string
		kind wire.ExchangeKind
	}{{"amq.direct", wire.ExchangeDirect}, {"amq.topic", wire.ExchangeTopic}, {"amq.fanout", wire.ExchangeFanout}, {"amq.headers", wire.ExchangeHeaders}} {
		d := wire.ExchangeDeclare{Name: e.name, Kind: e.kind, Durable: true}
		t.exDecl[e.name] = d
		t.top.Exchanges[e.name] = queue.Exchange{Name: e.name, Kind: e.kind}
	}
	t.publishLocked()
	return t
}

// changedLocked publishes the new routing view, or, while control runs are
// being handled off the loops (batching > 0), only marks it stale: a run
// publishes it once, before any of its replies leave (runControl), and any
// other caller publishes it before it answers (publishIfDirty), so nobody
// is told of a change the view does not have. Rebuilding the view costs
// O(topology); per request, a storm of declares would be quadratic.
func (t *topology) changedLocked() {
	if t.batching.Load() > 0 {
		t.dirty.Store(true)
		return
	}
	t.publishLocked()
}

// publishIfDirty publishes the routing view if a change is pending.
func (t *topology) publishIfDirty() {
	if !t.dirty.Load() {
		return
	}
	t.mu.Lock()
	if t.dirty.Load() {
		t.publishLocked()
	}
	t.mu.Unlock()
}

func (t *topology) publishLocked() {
	t.dirty.Store(false)
	t.rebuilds.Add(1)
	qs := make(map[string]*Queue, len(t.queues))
	for k, v := range t.queues {
		qs[k] = v
	}
	t.view.Store(&RouteView{Table: t.top.Compile(), Queues: qs})
}

func reqErr(code wire.Code, format string, args ...any) error {
	return &wire.Error{Code: code, Reason: fmt.Sprintf(format, args...)}
}

// validName checks an exchange or queue name (spec §2): at most 255 bytes
// of valid UTF-8 without control characters, so names stay printable in
// logs, the admin API and /metrics labels.
func validName(name string) error {
	if len(name) > wire.MaxNameLen {
		return reqErr(wire.InvalidArgument, "name longer than 255 bytes")
	}
	for i, r := range name {
		if r == utf8.RuneError && !strings.HasPrefix(name[i:], "\uFFFD") {
			if _, size := utf8.DecodeRuneInString(name[i:]); size <= 1 {
				return reqErr(wire.InvalidArgument, "name %q is not valid UTF-8 (byte %d): names must be UTF-8 text", name, i)
			}
		}
		if unicode.IsControl(r) {
			return reqErr(wire.InvalidArgument, "name %q has a control character (U+%04X at byte %d): names must be printable text", name, r, i)
		}
	}
	return nil
}

// reservedPrefix names belong to the broker: the standard exchanges and
// generated queue names. Clients may not create them (RabbitMQ's rule),
// so a client cannot squat a name the broker will hand to someone else.
const reservedPrefix = "amq."

// generatedQueueName is a server-chosen queue name with 128 random bits,
// which no client can predict.
func generatedQueueName() string {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic("netio: no randomness for a queue name: " + err.Error())
	}
	return reservedPrefix + "gen-" + base64.RawURLEncoding.EncodeToString(b[:])
}

// declareExchange creates an exchange or checks an existing one; user is
// the declaring user ("" for the admin API).
func (t *topology) declareExchange(d *wire.ExchangeDeclare, user string) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if d.Name == "" {
		return reqErr(wire.NotAllowed, "the default exchange cannot be declared")
	}
	old, exists := t.exDecl[d.Name]
	if d.Passive {
		if !exists {
			return reqErr(wire.NotFound, "no exchange %q", d.Name)
		}
		return nil
	}
	if err := validName(d.Name); err != nil {
		return err
	}
	if err := validName(d.Alternate); err != nil {
		return err
	}
	if !exists && strings.HasPrefix(d.Name, reservedPrefix) {
		return reqErr(wire.AccessRefused, "exchange name %q: the prefix amq. is reserved for the broker; choose another name", d.Name)
	}
	if d.Durable {
		t.warnDurable("exchange", d.Name)
	}
	if exists {
		o, n := old, *d
		o.Req, n.Req = 0, 0
		if !reflect.DeepEqual(normArgs(o.Args), normArgs(n.Args)) || o.Kind != n.Kind || o.Durable != n.Durable ||
			o.AutoDelete != n.AutoDelete || o.Internal != n.Internal || o.Alternate != n.Alternate {
			return reqErr(wire.PreconditionFailed, "exchange %q exists with other settings: %s (declare it with the same settings, or delete it first)", d.Name, exchangeDiff(&old, d))
		}
		return nil
	}
	for _, a := range d.Args {
		if a.Key != "hash-header" || d.Kind != wire.ExchangeConsistentHash || a.Value.Kind != wire.KindString {
			return reqErr(wire.InvalidArgument, "exchange argument %q not supported here", a.Key)
		}
	}
	t.exDecl[d.Name] = *d
	t.exBy[d.Name] = user
	t.top.Exchanges[d.Name] = queue.Exchange{Name: d.Name, Kind: d.Kind, Alternate: d.Alternate, Internal: d.Internal, Args: d.Args}
	t.changedLocked()
	return nil
}

// warnDurable says, at most once a minute, that durability is not built
// yet: a durable declare is accepted and kept in memory only.
func (t *topology) warnDurable(kind, name string) {
	if ok, n := t.durableWarn.Allow(time.Now()); ok {
		t.log.Warn("durable is accepted but not yet honoured: every exchange, queue and message is in memory and a restart loses it",
			"declared", kind, "name", name, "suppressed_since_last", n)
	}
}

func normArgs(t wire.Table) wire.Table {
	if len(t) == 0 {
		return nil
	}
	return t
}

// deleteExchange deletes an exchange if allow (nil: always) lets the
// deletion of one declared by the given user.
func (t *topology) deleteExchange(d *wire.ExchangeDelete, allow func(declaredBy, what string) error) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if d.Name == "" || (len(d.Name) > 4 && d.Name[:4] == "amq.") {
		return reqErr(wire.NotAllowed, "exchange %q cannot be deleted", d.Name)
	}
	if _, ok := t.exDecl[d.Name]; !ok {
		return reqErr(wire.NotFound, "no exchange %q", d.Name)
	}
	if allow != nil {
		if err := allow(t.exBy[d.Name], "exchange "+strconv.Quote(d.Name)); err != nil {
			return err
		}
	}
	used := false
	for _, b := range t.top.Bindings {
		if b.Source == d.Name {
			used = true
		}
	}
	if d.IfUnused && used {
		return reqErr(wire.PreconditionFailed, "exchange %q has bindings", d.Name)
	}
	delete(t.exDecl, d.Name)
	delete(t.exBy, d.Name)
	delete(t.top.Exchanges, d.Name)
	t.removeBindingsLocked(func(b queue.Binding) bool {
		return b.Source == d.Name || (b.ToExchange && b.Destination == d.Name)
	})
	t.publishLocked()
	return nil
}

func (t *topology) removeBindingsLocked(drop func(queue.Binding) bool) {
	kept := t.top.Bindings[:0]
	for _, b := range t.top.Bindings {
		if !drop(b) {
			kept = append(kept, b)
		} else {
			delete(t.bindBy, bindKey(b))
		}
	}
	t.top.Bindings = kept
}

// declareQueue creates a queue (on the shard its name hashes to) or checks
// an existing one. owner is the declaring connection, user its user (""
// for the admin API).
func (t *topology) declareQueue(d *wire.QueueDeclare, owner uint64, user string) (*Queue, error) {
	args, err := wire.ParseQueueArgs(d.Args)
	if err != nil {
		return nil, err
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	name := d.Name
	if name == "" {
		if d.Passive {
			return nil, reqErr(wire.InvalidArgument, "passive declare needs a name")
		}
		for name == "" || t.queues[name] != nil {
			name = generatedQueueName()
		}
	} else if err := validName(name); err != nil {
		return nil, err
	} else if !d.Passive && strings.HasPrefix(name, reservedPrefix) {
		return nil, reqErr(wire.AccessRefused, "queue name %q: the prefix amq. is reserved for the broker; declare with an empty name to get a generated one", name)
	}
	if err := validName(args.DeadLetterExchange); err != nil {
		return nil, err
	}
	if d.Durable && !d.Passive {
		t.warnDurable("queue", name)
	}
	if q, ok := t.queues[name]; ok {
		if q.exclusive != 0 && q.exclusive != owner {
			return nil, reqErr(wire.ResourceLocked, "queue %q is exclusive to another connection", name)
		}
		if d.Passive {
			return q, nil
		}
		o, n := q.decl, *d
		o.Req, n.Req, o.Name, n.Name = 0, 0, "", ""
		if !reflect.DeepEqual(normArgs(o.Args), normArgs(n.Args)) || o.Durable != n.Durable || o.Exclusive != n.Exclusive || o.AutoDelete != n.AutoDelete {
			return nil, reqErr(wire.PreconditionFailed, "queue %q exists with other settings: %s (declare it with the same settings, or delete it first)", name, queueDiff(&q.decl, d))
		}
		return q, nil
	}
	if d.Passive {
		return nil, reqErr(wire.NotFound, "no queue %q", name)
	}
	// A dead-letter exchange that does not exist yet is allowed, as in
	// AMQP: it may be declared later; dead letters are dropped until then.
	q := &Queue{name: name, decl: *d, args: args, autoDelete: d.AutoDelete, declaredBy: user}
	q.decl.Name = name
	if d.Exclusive {
		q.exclusive = owner
	}
	q.shardIdx = int(xxhash.Sum64String(name) % uint64(len(t.shards)))
	q.shard = t.shards[q.shardIdx]
	t.queues[name] = q
	t.top.Queues[name] = struct{}{}
	t.changedLocked()
	q.shard.submit(Command{Kind: CmdCreate, Queue: q})
	return q, nil
}

// removeQueue unlists a queue and its bindings; the caller tells the shard.
func (t *topology) removeQueue(q *Queue) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.queues[q.name] != q {
		return false
	}
	delete(t.queues, q.name)
	delete(t.top.Queues, q.name)
	t.retired.published += q.published.Load()
	t.retired.delivered += q.delivered.Load()
	t.retired.acked += q.acked.Load()
	t.removeBindingsLocked(func(b queue.Binding) bool { return !b.ToExchange && b.Destination == q.name })
	q.deleted.Store(true)
	t.publishLocked()
	return true
}

func (t *topology) lookupQueue(name string) *Queue {
	if t.dirty.Load() {
		// A control run declared it and has not published the view yet.
		t.mu.Lock()
		defer t.mu.Unlock()
		return t.queues[name]
	}
	return t.view.Load().Queues[name]
}

// bind adds or removes a binding; user is the binding user ("" for the
// admin API) and allow (nil: always) decides whether they may remove one
// declared by another.
func (t *topology) bind(b *wire.Bind, user string, allow func(declaredBy, what string) error) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if _, ok := t.exDecl[b.Source]; !ok {
		if b.Source == "" {
			return reqErr(wire.NotAllowed, "the default exchange cannot be bound")
		}
		return reqErr(wire.NotFound, "no exchange %q", b.Source)
	}
	if b.ToExchange {
		if _, ok := t.exDecl[b.Destination]; !ok {
			return reqErr(wire.NotFound, "no exchange %q", b.Destination)
		}
	} else if _, ok := t.queues[b.Destination]; !ok {
		return reqErr(wire.NotFound, "no queue %q", b.Destination)
	}
	if !b.Unbind && t.exDecl[b.Source].Kind == wire.ExchangeHeaders {
		if err := checkXMatch(b.Args); err != nil {
			return err
		}
	}
	nb := queue.Binding{Source: b.Source, Destination: b.Destination, ToExchange: b.ToExchange, Key: b.RoutingKey, Args: normArgs(b.Args)}
	idx := -1
	for i, x := range t.top.Bindings {
		if x.Source == nb.Source && x.Destination == nb.Destination && x.ToExchange == nb.ToExchange && x.Key == nb.Key && reflect.DeepEqual(x.Args, nb.Args) {
			idx = i
		}
	}
	if b.Unbind {
		if idx < 0 {
			return reqErr(wire.NotFound, "no such binding")
		}
		key := bindKey(nb)
		if allow != nil {
			if err := allow(t.bindBy[key], "the binding from "+strconv.Quote(nb.Source)+" to "+strconv.Quote(nb.Destination)); err != nil {
				return err
			}
		}
		delete(t.bindBy, key)
		t.top.Bindings = append(t.top.Bindings[:idx], t.top.Bindings[idx+1:]...)
	} else if idx < 0 {
		t.top.Bindings = append(t.top.Bindings, nb)
		t.bindBy[bindKey(nb)] = user
	}
	t.changedLocked()
	return nil
}

// checkXMatch refuses a headers binding whose x-match is not "all" or
// "any" (spec §7.1): a misspelling would otherwise silently mean "all".
func checkXMatch(args wire.Table) error {
	for _, f := range args {
		if f.Key != "x-match" {
			continue
		}
		if v := string(f.Value.Bytes); f.Value.Kind != wire.KindString || (v != "all" && v != "any") {
			return reqErr(wire.InvalidArgument, "binding argument x-match: want the string \"all\" or \"any\", got %s", describeValue(f.Value))
		}
	}
	return nil
}

// describeValue prints a table value for an error message.
func describeValue(v wire.Value) string {
	if v.Kind == wire.KindString {
		return strconv.Quote(string(v.Bytes))
	}
	return "a value of kind " + v.Kind.String()
}

// bindKey identifies a binding as UNBIND does: source, destination, kind,
// routing key and encoded arguments, each length-prefixed (a routing key
// may hold any byte, so no separator could keep two bindings apart).
func bindKey(b queue.Binding) string {
	k := make([]byte, 0, 16+len(b.Source)+len(b.Destination)+len(b.Key))
	if b.ToExchange {
		k = append(k, 'x')
	} else {
		k = append(k, 'q')
	}
	for _, s := range [...]string{b.Source, b.Destination, b.Key} {
		k = binary.AppendUvarint(k, uint64(len(s)))
		k = append(k, s...)
	}
	if len(b.Args) > 0 {
		k = wire.AppendTable(k, b.Args)
	}
	return string(k)
}

// snapshotWithRetired lists the declared queues and the totals of the
// deleted ones, consistently: a queue is in one or the other.
func (t *topology) snapshotWithRetired() ([]*Queue, queueTotals) {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make([]*Queue, 0, len(t.queues))
	for _, q := range t.queues {
		out = append(out, q)
	}
	return out, t.retired
}

// snapshotQueues lists the declared queues.
func (t *topology) snapshotQueues() []*Queue {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make([]*Queue, 0, len(t.queues))
	for _, q := range t.queues {
		out = append(out, q)
	}
	return out
}
