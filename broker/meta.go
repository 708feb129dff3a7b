package broker

import (
	"slices"
	"strconv"
	"strings"

	"github.com/warren-mq/warren/queue"
	"github.com/warren-mq/warren/wire"
)

// The metadata state machine is in several files: this one has its
// state, Apply and the readers; meta_commands.go the commands, results
// and effects it takes and gives (as data), meta_declare.go exchanges and
// queues declared and deleted, meta_bindings.go bindings and their
// indexes, meta_limits.go its limits, meta_users.go users and
// permissions, meta_vhosts.go vhosts, meta_codec.go the encoding of its
// commands and snapshots; placement.go, moves.go and homed.go where
// queues live in a cluster.

// Meta is the metadata state machine: exchanges, queues and bindings, and
// who declared each. It is pure and deterministic: Apply reads nothing but
// its state and the command (time, the requester, its rights and any
// generated name are in the command), holds no lock, starts nothing and
// points at no runtime object. The same commands from the same snapshot
// give the same results, effects and snapshot bytes on every replica.
//
// Every operation costs what it touches: exchanges and queues are found by
// name, bindings by their key (source, destination, kind, routing key,
// encoded arguments), and the bindings of an exchange or a queue through
// indexes by source and by destination.
//
// Meta is owned by one writer (the runtime's mutex; later the metadata
// raft group's apply loop).
type Meta struct {
	shards    int                 // queues are placed on xxhash(name) % shards
	limits    MetaLimits          // configuration, not state: not in snapshots
	nextID    uint64              // the next queue id to try: 1..2^32-1, wrapping
	ids       map[uint64]struct{} // queue ids in use
	exchanges map[string]*metaExchange
	queues    map[string]*metaQueue
	bindings  map[string]*metaBinding
	bySource  map[string]*bindSet // exchange → its bindings
	byQueue   map[string]*bindSet // destination queue → its bindings
	byExDest  map[string]*bindSet // destination exchange → its bindings
	// exclusive counts the exclusive queues each connection owns (derived
	// from queues: not in snapshots, rebuilt by Restore).
	exclusive map[uint64]int
	// users are the broker's accounts (issue 15): a password is only ever
	// here as the salted hash the runtime made before the command.
	users map[string]*MetaUser
	// perms are the users' permissions, by permKey(vhost, user).
	perms map[string]*MetaPermission
	// vhosts are the virtual hosts (meta_vhosts.go); vqueues counts each
	// one's queues (derived: not in snapshots).
	vhosts  map[string]*MetaVhost
	vqueues map[string]int
	// nodes are the cluster's node ids (configuration, like shards: not in
	// snapshots; placement.go); replicaN and prefN count each node's
	// replicas and preferred leaderships (derived from queues).
	nodes    []uint64
	replicaN map[uint64]int
	prefN    map[uint64]int
	// homes counts the queues each home node incarnation holds (derived
	// from queues: not in snapshots; homed.go).
	homes map[homeKey]int
	// draining: nodes being decommissioned (moves.go), ascending: no
	// replica is placed on them, and every one they hold moves off.
	draining []uint64
}

type metaExchange struct {
	decl wire.ExchangeDeclare // Req 0, Passive false
	by   string               // the declaring user, "" for the broker and the operator
}

type metaQueue struct {
	id        uint64
	decl      wire.QueueDeclare // Req 0, Passive false, Name set; its arguments parse (checked at declare)
	exclusive uint64            // owning connection, 0 if not exclusive
	by        string
	replicas  []uint64 // the nodes holding it, sorted (placement.go); none for a queue that is not placed
	leader    uint64   // its preferred leader, one of its wanted replicas (want)
	// target: the replicas it is being moved to (moves.go), sorted; nil
	// when none is pending. origin: the voters its group started with
	// (a replica opening the group with no copy of its own starts there).
	target []uint64
	origin []uint64
	// rebuild: nodes whose copy is damaged, to be removed from the group
	// and added back fresh (moves.go), sorted
	rebuild []uint64
	// home: the one node holding a queue that is not placed (non-durable
	// or exclusive) in a cluster, the node whose client declared it, and
	// homeInc that node's incarnation then (homed.go); 0 on one node, for
	// a placed queue, and for one declared before homes existed (each
	// node keeps its own copy of those).
	home, homeInc uint64
}

type metaBinding struct {
	key string
	b   queue.Binding
	by  string
}

// NewMeta is an empty metadata state machine with the standard exchanges
// every AMQP user expects, placing queues on shards shards, with the
// default limits.
func NewMeta(shards int) *Meta { return NewMetaWithLimits(shards, MetaLimits{}) }

// NewMetaWithLimits is NewMeta with limits (zero fields: the defaults).
func NewMetaWithLimits(shards int, limits MetaLimits) *Meta {
	if shards < 1 {
		shards = 1
	}
	m := &Meta{shards: shards, limits: limits.withDefaults()}
	m.reset()
	for _, e := range []struct {
		name string
		kind wire.ExchangeKind
	}{{"amq.direct", wire.ExchangeDirect}, {"amq.topic", wire.ExchangeTopic}, {"amq.fanout", wire.ExchangeFanout}, {"amq.headers", wire.ExchangeHeaders}} {
		m.exchanges[e.name] = &metaExchange{decl: wire.ExchangeDeclare{Name: e.name, Kind: e.kind, Durable: true}}
	}
	return m
}

func (m *Meta) reset() {
	m.nextID = 1
	m.ids = map[uint64]struct{}{}
	m.exchanges = map[string]*metaExchange{}
	m.queues = map[string]*metaQueue{}
	m.bindings = map[string]*metaBinding{}
	m.bySource = map[string]*bindSet{}
	m.byQueue = map[string]*bindSet{}
	m.byExDest = map[string]*bindSet{}
	m.exclusive = map[uint64]int{}
	m.users = map[string]*MetaUser{}
	m.perms = map[string]*MetaPermission{}
	m.vhosts = map[string]*MetaVhost{DefaultVhost: {Name: DefaultVhost}}
	m.vqueues = map[string]int{}
	m.replicaN = map[uint64]int{}
	m.prefN = map[uint64]int{}
	m.homes = map[homeKey]int{}
}

// forgetExclusive uncounts a removed queue's owner, if it had one.
func (m *Meta) forgetExclusive(owner uint64) {
	if owner == 0 {
		return
	}
	if m.exclusive[owner]--; m.exclusive[owner] <= 0 {
		delete(m.exclusive, owner)
	}
}

// Apply applies one command: its result, and the effects the runtime must
// apply (none when it is refused or changes nothing, but for a warning).
func (m *Meta) Apply(c *MetaCommand) (MetaResult, []MetaEffect) {
	switch c.Op {
	case MetaDeclareExchange:
		return m.declareExchange(c)
	case MetaDeleteExchange:
		return m.deleteExchange(c)
	case MetaDeclareQueue:
		return m.declareQueue(c)
	case MetaDeleteQueue:
		return m.deleteQueue(c)
	case MetaBind:
		return m.bind(c)
	case MetaNodeUp:
		return m.nodeUp()
	case MetaPutUser:
		return m.putUser(c)
	case MetaDeleteUser:
		return m.deleteUser(c)
	case MetaSetPermission:
		return m.setPermission(c)
	case MetaClearPermission:
		return m.clearPermission(c)
	case MetaPutVhost:
		return m.putVhost(c)
	case MetaDeleteVhost:
		return m.deleteVhost(c)
	case MetaPlaceReplicas:
		return m.placeCommand(c)
	case MetaReplicasMoved:
		return m.replicasMoved(c)
	case MetaRebuildReplica, MetaRebuildDone:
		return m.rebuildReplica(c)
	case MetaDropHome:
		return m.dropHome(c)
	}
	return refuse(wire.InvalidArgument, "unknown metadata operation "+strconv.Itoa(int(c.Op))), nil
}

// allowed is the permission rule for acting on what another user declared
// (netio's Authorize for delete and unbind): the administrator may, and a
// user on what it declared itself.
func allowed(c *MetaCommand, declaredBy, act, what string) (MetaResult, bool) {
	if c.Admin || (declaredBy != "" && declaredBy == c.User) {
		return MetaResult{}, true
	}
	return refuse(wire.AccessRefused, "user "+strconv.Quote(c.User)+" may not "+act+" "+what+": it needs the administrator tag or being the user who declared it"), false
}

// Queue is the queue of that name.
func (m *Meta) Queue(name string) (MetaQueue, bool) {
	q, ok := m.queues[name]
	if !ok {
		return MetaQueue{}, false
	}
	return q.parsed(), true
}

// HasQueue says whether a queue of that name exists.
func (m *Meta) HasQueue(name string) bool { _, ok := m.queues[name]; return ok }

// Exchange is the declaration of the exchange of that name.
func (m *Meta) Exchange(name string) (wire.ExchangeDeclare, bool) {
	e, ok := m.exchanges[name]
	if !ok {
		return wire.ExchangeDeclare{}, false
	}
	return e.decl, true
}

// NextID is the id the next queue declared tries first: every id
// allocated so far is below it (until ids wrap at 2^32).
func (m *Meta) NextID() uint64 { return m.nextID }

// NumQueues, NumExchanges and NumBindings count what is declared.
func (m *Meta) NumQueues() int { return len(m.queues) }

// NumExchanges: see NumQueues.
func (m *Meta) NumExchanges() int { return len(m.exchanges) }

// NumBindings: see NumQueues.
func (m *Meta) NumBindings() int { return len(m.bindings) }

// Exchanges lists the exchanges' declarations, by name.
func (m *Meta) Exchanges() []wire.ExchangeDeclare {
	out := make([]wire.ExchangeDeclare, 0, len(m.exchanges))
	for _, e := range m.exchanges {
		out = append(out, e.decl)
	}
	slices.SortFunc(out, func(a, b wire.ExchangeDeclare) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// Queues lists the queues, by name.
func (m *Meta) Queues() []MetaQueue {
	out := make([]MetaQueue, 0, len(m.queues))
	for _, q := range m.queues {
		out = append(out, q.parsed())
	}
	slices.SortFunc(out, func(a, b MetaQueue) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// Bindings lists the bindings in the order of their keys (source,
// destination, routing key, arguments).
func (m *Meta) Bindings() []queue.Binding {
	bs := m.sortedBindings()
	out := make([]queue.Binding, len(bs))
	for i, b := range bs {
		out[i] = b.b
	}
	return out
}

func (m *Meta) sortedBindings() []*metaBinding {
	out := make([]*metaBinding, 0, len(m.bindings))
	for _, b := range m.bindings {
		out = append(out, b)
	}
	slices.SortFunc(out, func(a, b *metaBinding) int {
		if c := strings.Compare(a.b.Source, b.b.Source); c != 0 {
			return c
		}
		if c := strings.Compare(a.b.Destination, b.b.Destination); c != 0 {
			return c
		}
		return strings.Compare(a.key, b.key)
	})
	return out
}

// QueueID is the id of the queue of that name.
func (m *Meta) QueueID(name string) (uint64, bool) {
	if q, ok := m.queues[name]; ok {
		return q.id, true
	}
	return 0, false
}
