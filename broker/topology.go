package broker

import (
	"crypto/rand"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"github.com/warren-mq/warren/internal/ratelog"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode"
	"unicode/utf8"
	"unsafe"

	"github.com/warren-mq/warren/queue"
	"github.com/warren-mq/warren/replication"
	"github.com/warren-mq/warren/wire"
)

// Queue is a declared queue. The fields above the line are fixed at
// declare time; the atomics are published by the owning shard for replies
// and metrics; the rest belongs to the shard goroutine.
type Queue struct {
	name       string
	id         queue.QueueRef // Meta's id: what routes name it by
	shard      *shard
	shardIdx   int               // index of shard in Server.shards
	decl       wire.QueueDeclare // as declared, for equivalence checks
	args       wire.QueueArgs
	exclusive  uint64 // owning connection id, 0 if not exclusive
	declaredBy string // the declaring user, "" for the admin API (Authorize)
	autoDelete bool
	replicas   []uint64 // the nodes holding it (placement.go), sorted; shard-owned once created (reconcile.go)
	prefLeader uint64   // the replica preferred to lead it (shard-owned, as replicas)
	home       uint64   // the node it lives on (a queue that is not placed, in a cluster; homed.go), 0: none
	homeInc    uint64   // that node's incarnation when it was declared (homed.go)

	ready, unacked, consumers atomic.Int64
	published, delivered      atomic.Uint64
	acked, redelivered        atomic.Uint64
	deadLettered              atomic.Uint64 // sent on to at least one queue
	deadLetterDropped         atomic.Uint64 // went nowhere (shard.dropDeadLetter)
	dlHeld                    atomic.Int64  // held until their targets have them (deadletter.go)
	deleted                   atomic.Bool

	// shard-owned
	m      *queue.Machine
	bodies bodyStore
	nextID uint64
	cons   map[queue.ConsumerID]consumer
	wakeAt int64           // next Timer, 0 for none
	held   []*PublishBatch // confirms held back while the queue is over its soft limit
	gone   bool            // deleted: commands for it are dropped

	// shard-owned, a durable queue's (durable.go): its raft group, the
	// last log index before this incarnation, and what waits for an apply
	grp      *replication.Group
	replayTo uint64
	pend     []pendingPart // FIFO from pendHead
	pendHead int
	subs     map[queue.ConsumerID]pendingReq
	purges   []pendingReq
	barriers []pendingBarrier // FIFO, by seq
	applSeq  uint64           // the proposal seq of the last entry of this incarnation applied
	viewing  bool
	openSeq  uint64 // the proposal seq of the commands added at open
	opened   bool   // they are applied: the queue has recovered
	// Held dead letters (deadletter.go): whether what is applied is a
	// replay of the log found at open, whether the held ones were sent
	// again after it, and the ids sent and not yet settled.
	replaying bool
	caughtUp  bool
	dlResent  bool
	dlFlight  map[uint64]struct{}
	// shard-owned, on its home: what each origin forwarded (homed.go)
	homeEnq map[uint64]homeEnqueuer
	// shard-owned, the shard's indexes (timers.go, down.go)
	timerIdx int // 1 + its index in its shard's timerHeap, 0 if not in it
	replicatedState
}

// StoredMsg is one message held by a queue: where its exchange, routing
// key, properties and body lie in its arena's buffer (the publish batch's
// one allocation, shared by every queue the message was routed to), and
// its flags. Its only pointer is the arena: the per-message records of a
// batch (a slice of them, often thousands long) cost the collector one
// pointer each to mark, and writing one costs one write barrier, where
// four slices and the arena cost five.
type StoredMsg struct {
	Arena                    *Arena
	exchange, key, props, bd span
	Flags                    wire.MessageFlags
	Priority                 uint8
}

// span is where a message's part lies in its arena's buffer.
type span struct{ off, n uint32 }

func (a *Arena) bytes(s span) []byte { return a.Buf[s.off : s.off+s.n : s.off+s.n] }

// Exchange, RoutingKey, Props and Body are the message's parts, views of
// its arena (capped: appending to one copies it).
func (m *StoredMsg) Exchange() []byte   { return m.Arena.bytes(m.exchange) }
func (m *StoredMsg) RoutingKey() []byte { return m.Arena.bytes(m.key) }
func (m *StoredMsg) Props() []byte      { return m.Arena.bytes(m.props) }
func (m *StoredMsg) Body() []byte       { return m.Arena.bytes(m.bd) }

// Msg is the stored message whose parts are the given views of a.Buf
// (an empty one may be any empty slice). A part outside a.Buf is a bug
// and panics.
func (a *Arena) Msg(exchange, key, props, body []byte, flags wire.MessageFlags, priority uint8) StoredMsg {
	return StoredMsg{Arena: a, exchange: a.spanOf(exchange), key: a.spanOf(key), props: a.spanOf(props), bd: a.spanOf(body),
		Flags: flags, Priority: priority}
}

func (a *Arena) spanOf(p []byte) span {
	if len(p) == 0 {
		return span{}
	}
	off := uintptr(unsafe.Pointer(unsafe.SliceData(p))) - uintptr(unsafe.Pointer(unsafe.SliceData(a.Buf)))
	if off > uintptr(len(a.Buf)) || uintptr(len(p)) > uintptr(len(a.Buf))-off {
		panic("broker: BUG: a message's part is not in its arena")
	}
	return span{uint32(off), uint32(len(p))}
}

// NewStoredMsg copies a message's parts into an arena of its own (a dead
// letter, a replayed message, a test's).
func NewStoredMsg(exchange, key, props, body []byte, flags wire.MessageFlags, priority uint8) *StoredMsg {
	buf := make([]byte, 0, len(exchange)+len(key)+len(props)+len(body))
	buf = append(append(append(append(buf, exchange...), key...), props...), body...)
	a := &Arena{Buf: buf}
	i, j, k := len(exchange), len(exchange)+len(key), len(exchange)+len(key)+len(props)
	m := a.Msg(buf[:i], buf[i:j], buf[j:k], buf[k:], flags, priority)
	return &m
}

// Arena is what one publish batch allocated for the messages queues keep:
// the bytes of every message (Buf) and the slice of StoredMsg. Any message
// of the batch that a queue still holds keeps all of it alive, so the
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
	Buf  []byte       // the messages' bytes; never changed once messages view it
}

// The heap a stored message costs beyond its bytes, counted with them.
// Measured with TestMeasureMessageOverhead (WARREN_MEASURE=1 go test
// -run TestMeasureMessageOverhead -v ./netio, Go 1.26, amd64): 200,000
// empty-body messages with a 1-byte routing key grew the live heap
// (after runtime.GC) by 115 bytes each into one queue and 167 into two
// (fanout), in batches of 100; 115 in batches of 1. Of that, 10 bytes per
// message are its lengths and flags in the arena, which the arena's
// capacity counts. The constants add up to 120 and 176.
const (
	// StoredMsgOverhead: a message's StoredMsg in its batch's slice
	// (its arena and four spans: 48 bytes) and its share of the batch's
	// arena and slices.
	StoredMsgOverhead = 64
	// PlacementOverhead: each queue holding a message: its slot in the
	// queue's bodyStore and its entry in the machine's ready ring and
	// index (the second queue in the measurement cost 52 bytes).
	PlacementOverhead = 56
)

// RouteView is what the event loops route against: swapped atomically on
// every topology change, never mutated. Route results are queue refs
// (Meta's queue ids); Queue resolves one without a lock.
type RouteView struct {
	Table *queue.Table
	slots *queueSlots
}

// Queue is the queue a route result names, nil if it has been deleted
// since (its shard would drop the work anyway).
func (v *RouteView) Queue(ref queue.QueueRef) *Queue { return v.slots.get(ref) }

// queueSlots resolves a queue ref to its *Queue for readers without a
// lock: chunks of 1,024 slots behind a directory behind an atomic pointer.
// Only the topology (under its mutex) writes: a new queue fills a slot, a
// deleted one empties it, and a chunk no queue uses any more is dropped
// (but the one a queue was last put in, which the next ids fill). Memory
// follows the live queues: a chunk per 1,024 consecutive ids with a live
// queue among them, and the directory, 8 bytes per chunk of ids handed out
// (at most 32 MiB once Meta's counter has gone round all 2^32 ids).
// Nothing is copied per queue: the directory is copied (pointers only)
// when it doubles.
type queueSlots struct {
	dir atomic.Pointer[slotDir]
	// writer's (mu)
	live []int32 // per chunk: slots filled
	cur  int     // the chunk a queue was last put in
}

type slotDir struct {
	chunks []atomic.Pointer[slotChunk]
}

const slotBits = 10

type slotChunk [1 << slotBits]atomic.Pointer[Queue]

func (s *queueSlots) get(ref queue.QueueRef) *Queue {
	d := s.dir.Load()
	i := int(ref >> slotBits)
	if d == nil || i >= len(d.chunks) {
		return nil
	}
	c := d.chunks[i].Load()
	if c == nil {
		return nil
	}
	return c[ref&(1<<slotBits-1)].Load()
}

// set fills or (q nil) empties a slot; the writer's mutex held.
func (s *queueSlots) set(ref queue.QueueRef, q *Queue) {
	i, j := int(ref>>slotBits), ref&(1<<slotBits-1)
	d := s.dir.Load()
	if q == nil {
		if d == nil || i >= len(d.chunks) {
			return
		}
		c := d.chunks[i].Load()
		if c == nil || c[j].Load() == nil {
			return
		}
		c[j].Store(nil)
		if s.live[i]--; s.live[i] == 0 && i != s.cur {
			d.chunks[i].Store(nil)
		}
		return
	}
	if d == nil || i >= len(d.chunks) {
		// Readers hold the old directory: a copy twice as long (or long
		// enough) takes its chunks.
		n := 0
		if d != nil {
			n = len(d.chunks)
		}
		nd := &slotDir{chunks: make([]atomic.Pointer[slotChunk], max(i+1, 2*n))}
		for k := 0; k < n; k++ {
			nd.chunks[k].Store(d.chunks[k].Load())
		}
		s.live = append(s.live, make([]int32, len(nd.chunks)-len(s.live))...)
		s.dir.Store(nd)
		d = nd
	}
	c := d.chunks[i].Load()
	if c == nil {
		c = new(slotChunk)
		d.chunks[i].Store(c)
	}
	if c[j].Load() == nil {
		s.live[i]++
	}
	c[j].Store(q)
	if prev := s.cur; prev != i {
		s.cur = i
		if prev < len(s.live) && s.live[prev] == 0 {
			d.chunks[prev].Store(nil)
		}
	}
}

// topology is the runtime around the metadata state machine: a request
// becomes a MetaCommand, applied to meta under mu; its effects create and
// remove queues on their shards and change the routing (queue.Routes),
// whose new Table is published in a new RouteView. Each costs what it
// touches. Routing reads the view only, without a lock.
type topology struct {
	mu     sync.Mutex
	meta   *Meta
	routes *queue.Routes
	slots  queueSlots
	queues map[uint64]*Queue // by Meta's id (mu)
	view   atomic.Pointer[RouteView]
	shards []*shard
	now    func() int64 // the broker's clock, stamped on each command
	// record, if set, sees each command as it is applied (mu held): the
	// deterministic-replay test records them.
	record func(c *MetaCommand, r MetaResult)
	// rebuilds counts routing-view publications, for tests.
	rebuilds atomic.Int64
	batching atomic.Int32 // control runs in progress (runControl)
	dirty    atomic.Bool  // a change is not in the view yet (mu to set)
	log      *slog.Logger
	// durableWarn rate-limits the "durable is not yet honoured" warning.
	durableWarn ratelog.Limiter
	// retired sums the counters of deleted queues, so the broker-wide
	// totals never go down (mu).
	retired queueTotals
	// mlog, if set (OpenMetaLog), logs every change (mu to add); mbuf is
	// its encoding scratch (mu).
	mlog atomic.Pointer[replication.MetaGroup]
	mbuf []byte
	// cl is set in a cluster (several voters, cluster.go): every change is
	// proposed and applied at commit.
	cl atomic.Pointer[metaCluster]
	// creating holds the queues a batch of effects created until the
	// view that routes to them (and through their dead-letter exchanges)
	// is published: their shards get their creates after it (mu).
	creating []*Queue
	// restoring: OpenMetaLog is installing the recovered topology, not yet
	// in the view; held dead letters wait for it (deadletter.go).
	restoring atomic.Bool
	// onUsers, if set (Broker.OnUsers), is told of every change to the
	// users (mu held).
	onUsers func(users []MetaUser, perms []MetaPermission, removed []string)
	// onVhosts, if set (Broker.OnVhosts), is told of every change to the
	// vhosts (mu held).
	onVhosts []func(vhosts []MetaVhost, removed []string)
}

// queueTotals are broker-wide sums of per-queue counters.
type queueTotals struct {
	published, delivered, acked uint64
}

func newTopology(shards []*shard, limits MetaLimits) *topology {
	t := &topology{meta: NewMetaWithLimits(len(shards), limits), routes: queue.NewRoutes(), queues: map[uint64]*Queue{}, shards: shards, now: func() int64 { return time.Now().UnixMilli() },
		log: slog.New(slog.DiscardHandler), durableWarn: ratelog.Limiter{Every: time.Minute}}
	for _, d := range t.meta.Exchanges() {
		t.routes.AddExchange(exchangeOf(&d))
	}
	t.publishLocked()
	return t
}

// applyLocked applies one command to the metadata state machine and its
// effects to the runtime (mu held).
func (t *topology) applyLocked(c *MetaCommand) MetaResult {
	r, effs := t.meta.Apply(c)
	t.logLocked(c, effs)
	if t.record != nil {
		t.record(c, r)
	}
	t.ApplyMetaEffects(effs)
	return r
}

// ApplyMetaEffects applies the metadata state machine's effects (mu held):
// it is the MetaEffectSink of the broker.
func (t *topology) ApplyMetaEffects(effs []MetaEffect) {
	changed, users, vhosts := false, false, false
	for i := range effs {
		e := &effs[i]
		switch e.Kind {
		case EffExchangeCreated:
			t.routes.AddExchange(e.Exchange)
		case EffExchangeRemoved:
			t.routes.DeleteExchange(e.Exchange.Name)
		case EffQueueCreated:
			t.createQueueLocked(e)
		case EffQueueRemoved:
			t.dropQueueLocked(e.Queue.ID)
		case EffQueueReplicas:
			t.replicasChangedLocked(&e.Queue)
			continue
		case EffBindingAdded:
			t.routes.Bind(e.Binding)
		case EffBindingRemoved:
			t.routes.Unbind(e.Binding)
		case EffDurableAccepted:
			t.warnDurable(e.What, e.Name)
			continue
		case EffUserPut, EffUserRemoved, EffPermissionsChanged:
			users = true
			continue
		case EffVhostPut, EffVhostRemoved:
			vhosts = true
			continue
		}
		changed = true
	}
	if changed {
		t.changedLocked()
	}
	if users {
		t.usersChangedLocked(effs)
	}
	if vhosts {
		t.vhostsChangedLocked(effs)
	}
	// A queue's shard opens it only once the routes of the whole batch
	// are published (a control run publishes them at its end, but a queue
	// it declares holds nothing before then). A durable queue recovering
	// its log dead-letters what it replays, and expires what is due,
	// through the view: an earlier view lacks the recovered dead-letter
	// exchanges and bindings, and those dead letters were dropped.
	for i, q := range t.creating {
		q.shard.submit(Command{Kind: CmdCreate, Queue: q})
		t.creating[i] = nil
	}
	t.creating = t.creating[:0]
}

func (t *topology) createQueueLocked(e *MetaEffect) {
	mq := &e.Queue
	q := &Queue{name: mq.Name, id: queue.QueueRef(mq.ID), decl: mq.Decl, args: mq.Args, exclusive: mq.Exclusive,
		declaredBy: mq.DeclaredBy, autoDelete: mq.Decl.AutoDelete, replicas: mq.Replicas, prefLeader: mq.Leader}
	q.target, q.origin, q.rebuild = mq.Target, mq.Origin, mq.Rebuild
	q.shownReplicas.Store(&mq.Replicas)
	q.shardIdx = e.Shard % len(t.shards)
	q.shard = t.shards[q.shardIdx]
	q.inCluster = len(mq.Replicas) > 0 && q.shard.clustered()
	if q.shard.clustered() {
		q.home, q.homeInc = mq.Home, mq.HomeInc
	}
	t.queues[mq.ID] = q
	t.slots.set(q.id, q)
	t.routes.AddQueue(q.name, q.id)
	t.creating = append(t.creating, q) // submitted by ApplyMetaEffects
}

func (t *topology) dropQueueLocked(id uint64) {
	q := t.queues[id]
	if q == nil {
		return
	}
	delete(t.queues, id)
	t.slots.set(q.id, nil)
	t.routes.DeleteQueue(q.name)
	t.retired.published += q.published.Load()
	t.retired.delivered += q.delivered.Load()
	t.retired.acked += q.acked.Load()
	q.deleted.Store(true)
	if t.cl.Load() != nil {
		// In a cluster the deletion may come from another node: the
		// shard drops its copy (a no-op where the shard asked for it).
		q.shard.submit(Command{Kind: cmdDrop, Queue: q})
	}
}

// changedLocked publishes the new routing view, or, while control runs are
// being handled off the loops (batching > 0), only marks it stale: a run
// publishes it once, before any of its replies leave (runControl), and any
// other caller publishes it before it answers (publishIfDirty), so nobody
// is told of a change the view does not have. A publication costs what
// changed since the last (queue.Routes.Table).
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
	t.view.Store(&RouteView{Table: t.routes.Table(), slots: &t.slots})
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

func normArgs(t wire.Table) wire.Table {
	if len(t) == 0 {
		return nil
	}
	return t
}

// declareExchange creates an exchange or checks an existing one; user is
// the declaring user ("" for the admin API).
func (t *topology) declareExchange(d *wire.ExchangeDeclare, user string) error {
	// Checked here, before the metadata log, not by the metadata machine:
	// a declare it accepted before this check replays as it was. The one
	// key there is (the machine refuses any other) is looked for, in one
	// pass: a table of many keys costs no more than its length.
	seen := false
	for i := range d.Args {
		if d.Args[i].Key == "hash-header" {
			if seen {
				return reqErr(wire.InvalidArgument, "exchange argument %q given twice", d.Args[i].Key)
			}
			seen = true
			if n := len(d.Args[i].Value.Bytes); n > wire.MaxNameLen {
				return reqErr(wire.InvalidArgument, "exchange argument \"hash-header\" of %d bytes: a header name is at most %d bytes", n, wire.MaxNameLen)
			}
		}
	}
	if err := storableArgs("exchange arguments", d.Args); err != nil {
		return err
	}
	if cl := t.cl.Load(); cl != nil {
		return t.clusterChange(cl, &MetaCommand{Op: MetaDeclareExchange, User: user, Exchange: *d}).Err()
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.applyLocked(&MetaCommand{Op: MetaDeclareExchange, NowMs: t.now(), User: user, Exchange: *d}).Err()
}

// warnDurable says, at most once a minute, that durability is not built
// yet: a durable declare is accepted and kept in memory only.
func (t *topology) warnDurable(kind, name string) {
	if t.mlog.Load() != nil {
		// The metadata log keeps the declaration; a durable queue's
		// messages are in its own log with Config.Durable.
		if kind == "queue" && t.shards[0].b.cfg.Durable == nil {
			if ok, n := t.durableWarn.Allow(time.Now()); ok {
				t.log.Warn("durable queue: its declaration and bindings survive a restart, its messages are not yet honoured (in memory only; a restart loses them)",
					"name", name, "suppressed_since_last", n)
			}
		}
		return
	}
	if ok, n := t.durableWarn.Allow(time.Now()); ok {
		t.log.Warn("durable is accepted but not yet honoured: every exchange, queue and message is in memory and a restart loses it",
			"declared", kind, "name", name, "suppressed_since_last", n)
	}
}

// Requester is who asks for a topology change, as data: the user (""
// for the operator API), whether it may act on what others declared (the
// administrator tag, or the operator API), and its connection (0 for the
// operator API).
type Requester struct {
	User  string
	Admin bool
	Conn  uint64
}

// deleteExchange deletes an exchange if the requester may delete one
// declared by whoever declared it.
func (t *topology) deleteExchange(d *wire.ExchangeDelete, who Requester) error {
	if cl := t.cl.Load(); cl != nil {
		return t.clusterChange(cl, &MetaCommand{Op: MetaDeleteExchange, User: who.User, Admin: who.Admin, Conn: who.Conn, Delete: *d}).Err()
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.applyLocked(&MetaCommand{Op: MetaDeleteExchange, NowMs: t.now(), User: who.User, Admin: who.Admin, Conn: who.Conn, Delete: *d}).Err()
}

// declareQueue creates a queue (on the shard its name hashes to) or checks
// an existing one. owner is the declaring connection, user its user (""
// for the admin API). An empty name gets a generated one, chosen here and
// carried in the command, so a log of commands replays it.
func (t *topology) declareQueue(d *wire.QueueDeclare, owner uint64, user string) (*Queue, error) {
	if err := storableArgs("queue arguments", d.Args); err != nil {
		return nil, err
	}
	if cl := t.cl.Load(); cl != nil {
		return t.clusterDeclareQueue(cl, d, owner, user)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	c := MetaCommand{Op: MetaDeclareQueue, NowMs: t.now(), User: user, Conn: owner, Queue: *d}
	if prefix := d.Name; LocalName(prefix) == "" && !d.Passive {
		if _, err := wire.ParseQueueArgs(d.Args); err != nil {
			return nil, err // refused before a name is drawn, as ever
		}
		for c.Queue.Name == prefix || t.meta.HasQueue(c.Queue.Name) {
			c.Queue.Name = prefix + generatedQueueName() // in the vhost of the prefix
		}
		c.Generated = true
	}
	r := t.applyLocked(&c)
	if err := r.Err(); err != nil {
		return nil, err
	}
	return t.queues[r.QueueID], nil
}

// removeQueue unlists a queue and its bindings; the caller (its shard)
// tells the shard. conn is the connection that asked (0: none), whose
// control run's end waits for the deletion in a cluster.
func (t *topology) removeQueue(q *Queue, conn uint64) bool {
	if cl := t.cl.Load(); cl != nil {
		return t.clusterRemove(cl, q, conn)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.queues[uint64(q.id)] != q {
		return false
	}
	return t.applyLocked(&MetaCommand{Op: MetaDeleteQueue, NowMs: t.now(), Queue: wire.QueueDeclare{Name: q.name}, QueueID: uint64(q.id)}).Removed
}

func (t *topology) lookupQueue(name string) *Queue {
	if t.dirty.Load() {
		// A control run declared it and has not published the view yet.
		t.mu.Lock()
		defer t.mu.Unlock()
		if id, ok := t.meta.QueueID(name); ok {
			return t.queues[id]
		}
		return nil
	}
	if ref, ok := t.view.Load().Table.Queue(name); ok {
		return t.slots.get(ref)
	}
	return nil
}

// bind adds or removes a binding; who may remove one declared by another
// if it is an administrator.
// MaxBindingArgsLen bounds a new binding's arguments, encoded (a headers
// exchange's match table): with max_bindings, what bindings can make the
// metadata hold. Checked before the metadata log, as declareExchange's.
const MaxBindingArgsLen = 65535

func (t *topology) bind(b *wire.Bind, who Requester) error {
	depth := wire.MaxTableDepth
	if b.Unbind {
		// An unbind is logged as a bind is, so its arguments must read
		// back too; but a binding recovered from a log written before
		// storableArgs may nest as deep as that log's decoder reads, and
		// removing it must stay possible.
		depth = legacyMetaTableDepth
	}
	if err := storableArgsNested("binding arguments", b.Args, depth); err != nil {
		return err
	}
	if !b.Unbind { // an unbind of what exists is never refused
		if n := len(b.RoutingKey); n > wire.MaxNameLen {
			return reqErr(wire.InvalidArgument, "binding key of %d bytes: at most %d (a routing key is at most %d bytes, so a longer one matches nothing)", n, wire.MaxNameLen, wire.MaxNameLen)
		}
		if len(b.Args) > 0 {
			if n := len(wire.AppendTable(nil, b.Args)) - 4; n > MaxBindingArgsLen {
				return reqErr(wire.InvalidArgument, "binding arguments of %d bytes (encoded): at most %d", n, MaxBindingArgsLen)
			}
		}
	}
	if cl := t.cl.Load(); cl != nil {
		return t.clusterChange(cl, &MetaCommand{Op: MetaBind, User: who.User, Admin: who.Admin, Conn: who.Conn, Bind: *b}).Err()
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.applyLocked(&MetaCommand{Op: MetaBind, NowMs: t.now(), User: who.User, Admin: who.Admin, Conn: who.Conn, Bind: *b}).Err()
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
	qs, _ := t.snapshotWithRetired()
	return qs
}

// storableArgs refuses arguments the metadata log could not read back
// (wire.CheckTable): a table nested deeper than wire.MaxTableDepth (the
// native front cannot send one, the AMQP front's field tables may nest
// to 16), or with a key longer than 255 bytes, which the encoding cannot
// hold (the admin API's JSON arguments may have one; encoding it
// panicked). Checked before the command is logged or
// proposed: a cluster's log holds a command before its machine sees it,
// and an entry that does not decode stops every node's recovery.
func storableArgs(what string, args wire.Table) error {
	return storableArgsNested(what, args, wire.MaxTableDepth)
}

// storableArgsNested is storableArgs with nesting to depth levels (an
// unbind's: as deep as the metadata decoder reads).
func storableArgsNested(what string, args wire.Table, depth int) error {
	err := wire.CheckTableNested(args, depth)
	if err == nil {
		return nil
	}
	if we := (*wire.Error)(nil); errors.As(err, &we) && we.Code == wire.InvalidArgument {
		return reqErr(wire.InvalidArgument, "%s: %s", what, we.Reason)
	}
	return reqErr(wire.InvalidArgument, "%s nest tables or arrays more than %d levels deep", what, depth)
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
