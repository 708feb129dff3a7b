package broker

import (
	"bytes"
	"math"
	"slices"
	"strconv"
	"strings"

	"github.com/cespare/xxhash/v2"
	"github.com/warren-mq/warren/queue"
	"github.com/warren-mq/warren/wire"
)

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

// MetaUser is a broker user as the metadata state machine keeps it.
// PasswordHash is a bcrypt hash (salted: the runtime draws the salt and
// hashes before the command, so Apply stays pure); the password itself is
// never in a command, the log or a snapshot.
type MetaUser struct {
	Name         string
	PasswordHash string
	Tags         []string
}

// bindSet is the bindings of one exchange or queue: a short list (most
// queues have one or two), a map by key once it grows, so removing one
// costs O(1) however many there are.
type bindSet struct {
	list []*metaBinding
	m    map[string]*metaBinding
}

const bindSetListMax = 8

func (s *bindSet) add(b *metaBinding) {
	if s.m == nil && len(s.list) < bindSetListMax {
		s.list = append(s.list, b)
		return
	}
	if s.m == nil {
		s.m = make(map[string]*metaBinding, 2*bindSetListMax)
		for _, x := range s.list {
			s.m[x.key] = x
		}
		s.list = nil
	}
	s.m[b.key] = b
}

func (s *bindSet) remove(key string) {
	if s.m != nil {
		delete(s.m, key)
		return
	}
	for i, x := range s.list {
		if x.key == key {
			last := len(s.list) - 1
			s.list[i], s.list[last] = s.list[last], nil
			s.list = s.list[:last]
			return
		}
	}
}

func (s *bindSet) len() int { return len(s.list) + len(s.m) }

// all copies the set (its members are unlinked while it is walked).
func (s *bindSet) all() []*metaBinding {
	out := append([]*metaBinding(nil), s.list...)
	for _, b := range s.m {
		out = append(out, b)
	}
	return out
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

// MetaOp is what a MetaCommand asks.
type MetaOp uint8

// The metadata operations. The numbers are part of the command encoding.
const (
	MetaDeclareExchange MetaOp = 1
	MetaDeleteExchange  MetaOp = 2
	MetaDeclareQueue    MetaOp = 3
	MetaDeleteQueue     MetaOp = 4
	MetaBind            MetaOp = 5 // Bind.Unbind removes the binding
	// MetaNodeUp: the node (re)started (design §4's NodeUp, on one node):
	// every non-durable exchange, every non-durable or exclusive queue
	// and every binding to or from one of them is dropped. Logged once
	// per start, after recovery, so a replay drops them at the same point.
	MetaNodeUp MetaOp = 6
	// MetaPutUser creates or replaces the user Account (its hash and
	// tags); with IfAbsent it only creates (the config file's bootstrap
	// users: run-time changes win afterwards).
	MetaPutUser MetaOp = 7
	// MetaDeleteUser removes the user Account.Name (and its permissions).
	MetaDeleteUser MetaOp = 8
	// MetaSetPermission sets Permission (its user must exist);
	// MetaClearPermission removes Permission.Vhost's for Permission.User.
	MetaSetPermission   MetaOp = 9
	MetaClearPermission MetaOp = 10
	// MetaPutVhost creates the vhost Vhost or sets its limits (IfAbsent:
	// creates only); MetaDeleteVhost removes Vhost.Name and everything in it.
	MetaPutVhost    MetaOp = 11
	MetaDeleteVhost MetaOp = 12
	// MetaPlaceReplicas re-places the replicas of every placed queue
	// against the cluster's nodes as this entry finds them (moves.go):
	// replicas on nodes no longer members (or draining) are replaced, and
	// replicas move from the most loaded nodes to the least. It sets
	// targets only. Replicas: nodes to drain from now on (decommission).
	MetaPlaceReplicas MetaOp = 13
	// MetaReplicasMoved: queue QueueID (Queue.Name)'s group now has
	// Replicas as its voters, its target (moves.go).
	MetaReplicasMoved MetaOp = 14
	// MetaRebuildReplica: node Replicas[0]'s copy of queue QueueID
	// (Queue.Name) is damaged: the group's leader removes it from the
	// group, then reports MetaRebuildDone, and adds it back as a new
	// replica (moves.go).
	MetaRebuildReplica MetaOp = 15
	MetaRebuildDone    MetaOp = 16
	// MetaDropHome: the queues whose home is node Home are gone with it
	// (homed.go): with HomeUpTo those of incarnations up to HomeInc (the
	// node is down; the node's own drop as it restarts), without it and
	// HomeInc 0 those of every one (the node was removed). The node
	// proposes it as it restarts, the metadata leader for a node removed
	// from the cluster or silent for homeDownMs. The legacy form, HomeInc
	// without HomeUpTo (b09a9d2..4334fcd), drops every incarnation's but
	// HomeInc's, as it did when written (dropHome).
	MetaDropHome MetaOp = 17
)

// MetaCommand is one request to the metadata state machine, as data: it
// could be written to a log and replayed. NowMs, the requester and its
// rights, and every name the runtime generated are fixed before it is
// applied.
type MetaCommand struct {
	Op    MetaOp
	NowMs int64 // when the runtime stamped it (not read by today's rules; kept for the log)
	// User is the requesting user ("" for the operator API); Admin says it
	// may act on entities others declared (the administrator tag, or the
	// operator API); Conn is its connection (the owner of an exclusive
	// queue; 0 for the operator API).
	User  string
	Admin bool
	Conn  uint64

	Exchange wire.ExchangeDeclare // MetaDeclareExchange (Req ignored)
	Delete   wire.ExchangeDelete  // MetaDeleteExchange (Req ignored)
	Queue    wire.QueueDeclare    // MetaDeclareQueue (Req ignored)
	// Generated: Queue.Name was chosen by the broker for a declare with an
	// empty name (so it may carry the reserved prefix).
	Generated bool
	QueueID   uint64    // MetaDeleteQueue: the queue (Queue.Name its name)
	Bind      wire.Bind // MetaBind (Req ignored)
	// Account is the user of MetaPutUser (MetaDeleteUser: its Name);
	// IfAbsent makes MetaPutUser create only.
	Account  MetaUser
	IfAbsent bool
	// Permission: MetaSetPermission, MetaClearPermission (Vhost, User).
	Permission MetaPermission
	// Vhost: MetaPutVhost, MetaDeleteVhost (Name).
	Vhost MetaVhost
	// Replicas: MetaReplicasMoved's voters, sorted; MetaPlaceReplicas'
	// nodes to drain.
	Replicas []uint64
	// Home and HomeInc: MetaDeclareQueue's declaring node and its
	// incarnation, in a cluster (0 on one node); MetaDropHome's node and
	// (HomeUpTo) the last incarnation whose queues go (legacy, without
	// HomeUpTo: the one incarnation whose queues stay).
	Home, HomeInc uint64
	HomeUpTo      bool
}

// MetaResult is what a command answers: a refusal (Code not OK, with its
// reason) or the queue it declared or deleted.
type MetaResult struct {
	Code    wire.Code
	Reason  string
	QueueID uint64 // MetaDeclareQueue: the queue (new or existing)
	Name    string // MetaDeclareQueue: its name
	Removed bool   // MetaDeleteQueue: the queue was there and is gone
}

// Err is the refusal as an error, nil if the command was applied.
func (r MetaResult) Err() error {
	if r.Code == wire.OK {
		return nil
	}
	return &wire.Error{Code: r.Code, Reason: r.Reason}
}

func refuse(code wire.Code, reason string) MetaResult {
	return MetaResult{Code: code, Reason: reason}
}

func refuseErr(err error) MetaResult {
	if we, ok := err.(*wire.Error); ok {
		return MetaResult{Code: we.Code, Reason: we.Reason}
	}
	return MetaResult{Code: wire.InvalidArgument, Reason: err.Error()}
}

// MetaEffectKind is what a MetaEffect tells the runtime.
type MetaEffectKind uint8

// The effects of metadata commands.
const (
	// EffExchangeCreated: Exchange is new.
	EffExchangeCreated MetaEffectKind = iota + 1
	// EffExchangeRemoved: the exchange Name is gone, and every binding
	// from it or to it with it.
	EffExchangeRemoved
	// EffQueueCreated: Queue is new; put it on shard Shard.
	EffQueueCreated
	// EffQueueRemoved: the queue Queue.ID (Queue.Name) is gone, and every
	// binding to it with it.
	EffQueueRemoved
	// EffBindingAdded, EffBindingRemoved: Binding.
	EffBindingAdded
	EffBindingRemoved
	// EffDurableAccepted: a durable declare of Name (Queue.Name for a
	// queue) was accepted, which is not yet honoured (the runtime warns).
	EffDurableAccepted
	// EffUserPut: the user Name was created or changed; EffUserRemoved:
	// it is gone (the runtime closes its connections).
	EffUserPut
	EffUserRemoved
	// EffPermissionsChanged: a user's permissions changed (Name).
	EffPermissionsChanged
	// EffVhostPut: the vhost Name was created or its limits changed;
	// EffVhostRemoved: it is gone (the runtime closes its connections).
	EffVhostPut
	EffVhostRemoved
	// EffQueueReplicas: the placement of queue Queue.ID changed (its
	// Replicas, Target, Origin and Leader; moves.go).
	EffQueueReplicas
)

// MetaEffect is one change the runtime applies (routing, shards) after a
// command. Effects are values.
type MetaEffect struct {
	Kind     MetaEffectKind
	Exchange queue.Exchange // EffExchangeCreated; Name for EffExchangeRemoved
	Queue    MetaQueue      // EffQueueCreated, EffQueueRemoved (ID, Name)
	Shard    int            // EffQueueCreated
	Binding  queue.Binding  // EffBindingAdded, EffBindingRemoved
	What     string         // EffDurableAccepted: "exchange" or "queue"
	Name     string         // EffDurableAccepted; the user of EffUserPut, EffUserRemoved
}

// MetaQueue is a queue as the metadata state machine knows it.
type MetaQueue struct {
	ID         uint64
	Name       string
	Decl       wire.QueueDeclare // as declared (Req 0), for equivalence and inspection
	Args       wire.QueueArgs
	Exclusive  uint64 // owning connection, 0 if not exclusive
	DeclaredBy string
	// Replicas are the nodes holding the queue, sorted, and Leader the
	// one preferred to lead it (placement.go); none for a non-durable or
	// exclusive queue.
	Replicas []uint64
	Leader   uint64
	// Target: the replicas it is being moved to, nil when no move is
	// pending; Origin: the voters its group started with (moves.go).
	Target []uint64
	Origin []uint64
	// Rebuild: nodes whose copy is being rebuilt (moves.go).
	Rebuild []uint64
	// Home: the node holding a queue that is not placed, in a cluster,
	// and HomeInc its incarnation when it declared it (homed.go); 0 when
	// none.
	Home, HomeInc uint64
}

// MetaLimits bound how many queues, exchanges and bindings the broker
// holds, whoever declares them (clients, the operator API). They are
// configuration, the same on every replica, so a refusal at a limit is a
// result of Apply like any other: a declare or bind that would create one
// more than its limit allows is refused with resource_limit and changes
// nothing; redeclaring what exists is not refused, and deleting frees
// room. They gate creation only: a snapshot holding more is restored
// whole. A zero field takes its default (DefaultMetaLimits).
type MetaLimits struct {
	MaxQueues    int // queues, exclusive and generated ones included
	MaxExchanges int // exchanges, the four amq.* ones included
	MaxBindings  int // bindings, to queues and to exchanges
	// MaxExclusivePerConn: exclusive queues one connection may own.
	MaxExclusivePerConn int
	// MaxUsers: user accounts (the config file's included).
	MaxUsers int
	// MaxPermissions: permission entries (one per user per vhost).
	MaxPermissions int
}

// DefaultMetaLimits are generous for real topologies and for the
// 100,000-queue benchmark, and keep the metadata's memory bounded. The
// figures: a queue bound once costs about 2,500 bytes of live heap (its
// record, shard state, routing entry and one binding: BENCHMARKS.md,
// Topology, at 100,000); a further topic binding about 710 bytes and a
// direct exchange about 520 (measured in process: 100,000 bindings of
// one queue, 50,000 exchanges, heap after a GC). So the defaults hold at
// most about 2.5 GB of queues, 2.8 GB of bindings and 52 MB of exchanges.
//
// A connection may own 10,000 exclusive queues (about 25 MB): one client
// cannot fill max_queues alone with queues nobody else may use.
//
// 10,000 users (a few hundred bytes each) is far more accounts than a
// broker's applications need; a bcrypt hash is 60 bytes, tags bounded by
// maxUserTags.
var DefaultMetaLimits = MetaLimits{MaxQueues: 1_000_000, MaxExchanges: 100_000, MaxBindings: 4_000_000, MaxExclusivePerConn: 10_000, MaxUsers: 10_000, MaxPermissions: 100_000}

// noMetaLimits limits nothing (recovery replays what was made).
var noMetaLimits = MetaLimits{MaxQueues: math.MaxInt, MaxExchanges: math.MaxInt, MaxBindings: math.MaxInt, MaxExclusivePerConn: math.MaxInt, MaxUsers: math.MaxInt, MaxPermissions: math.MaxInt}

// withDefaults fills the zero (or negative) fields with the defaults.
func (l MetaLimits) withDefaults() MetaLimits {
	if l.MaxQueues <= 0 {
		l.MaxQueues = DefaultMetaLimits.MaxQueues
	}
	if l.MaxExchanges <= 0 {
		l.MaxExchanges = DefaultMetaLimits.MaxExchanges
	}
	if l.MaxBindings <= 0 {
		l.MaxBindings = DefaultMetaLimits.MaxBindings
	}
	if l.MaxExclusivePerConn <= 0 {
		l.MaxExclusivePerConn = DefaultMetaLimits.MaxExclusivePerConn
	}
	if l.MaxUsers <= 0 {
		l.MaxUsers = DefaultMetaLimits.MaxUsers
	}
	if l.MaxPermissions <= 0 {
		l.MaxPermissions = DefaultMetaLimits.MaxPermissions
	}
	return l
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

// Limits are the limits the machine enforces.
func (m *Meta) Limits() MetaLimits { return m.limits }

// limitReason is a refusal at a limit: what it is, how to raise it.
func limitReason(what string, n int, key, flag string) MetaResult {
	return refuse(wire.LimitReached, what+" limit reached: the broker holds "+strconv.Itoa(n)+" "+what+"s, its "+key+
		" (raise it with warrend --"+flag+" or \""+key+"\" in the config file, or delete "+what+"s)")
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

func (m *Meta) declareExchange(c *MetaCommand) (MetaResult, []MetaEffect) {
	d := &c.Exchange
	if LocalName(d.Name) == "" {
		return refuse(wire.NotAllowed, "the default exchange cannot be declared"), nil
	}
	old, exists := m.exchanges[d.Name]
	if d.Passive {
		if !exists {
			return refuse(wire.NotFound, "no exchange "+strconv.Quote(d.Name)), nil
		}
		return MetaResult{}, nil
	}
	if err := checkLocalName(d.Name); err != nil {
		return refuseErr(err), nil
	}
	if err := checkLocalName(d.Alternate); err != nil {
		return refuseErr(err), nil
	}
	if r, ok := m.checkVhostOf(d.Name); !ok {
		return r, nil
	}
	if d.Kind < wire.ExchangeDirect || d.Kind > wire.ExchangeConsistentHash {
		return refuse(wire.InvalidArgument, "unknown exchange type "+d.Kind.String()), nil
	}
	if !exists && strings.HasPrefix(LocalName(d.Name), reservedPrefix) {
		return refuse(wire.AccessRefused, "exchange name "+strconv.Quote(d.Name)+": the prefix amq. is reserved for the broker; choose another name"), nil
	}
	var effs []MetaEffect
	if d.Durable {
		effs = append(effs, MetaEffect{Kind: EffDurableAccepted, What: "exchange", Name: d.Name})
	}
	if exists {
		o := &old.decl
		if !sameArgs(o.Args, d.Args) || o.Kind != d.Kind || o.Durable != d.Durable ||
			o.AutoDelete != d.AutoDelete || o.Internal != d.Internal || o.Alternate != d.Alternate {
			return refuse(wire.PreconditionFailed, "exchange "+strconv.Quote(d.Name)+" exists with other settings: "+exchangeDiff(o, d)+" (declare it with the same settings, or delete it first)"), effs
		}
		return MetaResult{}, effs
	}
	for _, a := range d.Args {
		if a.Key != "hash-header" || d.Kind != wire.ExchangeConsistentHash || a.Value.Kind != wire.KindString {
			return refuse(wire.InvalidArgument, "exchange argument "+strconv.Quote(a.Key)+" not supported here"), effs
		}
	}
	if len(m.exchanges) >= m.limits.MaxExchanges {
		return limitReason("exchange", len(m.exchanges), "max_exchanges", "max-exchanges"), nil
	}
	nd := *d
	nd.Req, nd.Passive, nd.Args = 0, false, normArgs(d.Args)
	m.exchanges[d.Name] = &metaExchange{decl: nd, by: c.User}
	return MetaResult{}, append(effs, MetaEffect{Kind: EffExchangeCreated, Exchange: exchangeOf(&nd)})
}

func exchangeOf(d *wire.ExchangeDeclare) queue.Exchange {
	return queue.Exchange{Name: d.Name, Kind: d.Kind, Alternate: d.Alternate, Internal: d.Internal, Args: d.Args}
}

// sameArgs compares two argument tables by their encoding (an absent
// table and an empty one are the same).
func sameArgs(a, b wire.Table) bool {
	if len(a) == 0 || len(b) == 0 {
		return len(a) == len(b)
	}
	return bytes.Equal(wire.AppendTable(nil, a), wire.AppendTable(nil, b))
}

func (m *Meta) deleteExchange(c *MetaCommand) (MetaResult, []MetaEffect) {
	d := &c.Delete
	if ln := LocalName(d.Name); ln == "" || (len(ln) > 4 && ln[:4] == "amq.") {
		return refuse(wire.NotAllowed, "exchange "+strconv.Quote(d.Name)+" cannot be deleted"), nil
	}
	ex, ok := m.exchanges[d.Name]
	if !ok {
		return refuse(wire.NotFound, "no exchange "+strconv.Quote(d.Name)), nil
	}
	if r, ok := allowed(c, ex.by, "delete", "exchange "+strconv.Quote(d.Name)); !ok {
		return r, nil
	}
	if d.IfUnused && m.bySource[d.Name] != nil {
		return refuse(wire.PreconditionFailed, "exchange "+strconv.Quote(d.Name)+" has bindings"), nil
	}
	delete(m.exchanges, d.Name)
	m.unlinkAll(m.bySource[d.Name])
	m.unlinkAll(m.byExDest[d.Name])
	return MetaResult{}, []MetaEffect{{Kind: EffExchangeRemoved, Exchange: queue.Exchange{Name: d.Name}}}
}

func (m *Meta) declareQueue(c *MetaCommand) (MetaResult, []MetaEffect) {
	d := &c.Queue
	args, err := wire.ParseQueueArgs(d.Args)
	if err != nil {
		return refuseErr(err), nil
	}
	name := d.Name
	switch {
	case c.Generated:
		if d.Passive || LocalName(name) == "" {
			return refuse(wire.InvalidArgument, "a generated queue name needs a name and an active declare"), nil
		}
		if _, taken := m.queues[name]; taken {
			return refuse(wire.InternalError, "generated queue name "+strconv.Quote(name)+" is in use; declare again"), nil
		}
	case LocalName(name) == "":
		if d.Passive {
			return refuse(wire.InvalidArgument, "passive declare needs a name"), nil
		}
		return refuse(wire.InvalidArgument, "queue declare without a name reached the metadata state machine: the broker picks a name first"), nil
	default:
		if err := checkLocalName(name); err != nil {
			return refuseErr(err), nil
		}
		if !d.Passive && strings.HasPrefix(LocalName(name), reservedPrefix) {
			return refuse(wire.AccessRefused, "queue name "+strconv.Quote(name)+": the prefix amq. is reserved for the broker; declare with an empty name to get a generated one"), nil
		}
	}
	if err := validName(args.DeadLetterExchange); err != nil {
		return refuseErr(err), nil
	}
	if r, ok := m.checkVhostOf(name); !ok {
		return r, nil
	}
	var effs []MetaEffect
	if d.Durable && !d.Passive {
		effs = append(effs, MetaEffect{Kind: EffDurableAccepted, What: "queue", Name: name})
	}
	if q, ok := m.queues[name]; ok && c.Home != 0 && q.home == c.Home && q.homeInc < c.HomeInc {
		// A queue of its home's earlier life, not dropped yet (homed.go):
		// it went with that life; a declare gets a new one, a passive one
		// is told it is not there. (Connection ids restart with the node:
		// an exclusive owner of that life is not this one.)
		if d.Passive {
			return refuse(wire.NotFound, "no queue "+strconv.Quote(name)+" (it went with its node's earlier life)"), effs
		}
		effs = append(effs, m.removeQueue(q))
	}
	if q, ok := m.queues[name]; ok {
		if q.exclusive != 0 && q.exclusive != c.Conn {
			return refuse(wire.ResourceLocked, "queue "+strconv.Quote(name)+" is exclusive to another connection"), effs
		}
		r := MetaResult{QueueID: q.id, Name: name}
		if d.Passive {
			return r, effs
		}
		o := &q.decl
		if !sameArgs(o.Args, d.Args) || o.Durable != d.Durable || o.Exclusive != d.Exclusive || o.AutoDelete != d.AutoDelete {
			return refuse(wire.PreconditionFailed, "queue "+strconv.Quote(name)+" exists with other settings: "+queueDiff(o, d)+" (declare it with the same settings, or delete it first)"), effs
		}
		return r, effs
	}
	if d.Passive {
		return refuse(wire.NotFound, "no queue "+strconv.Quote(name)), effs
	}
	if d.Exclusive && c.Conn != 0 && m.exclusive[c.Conn] >= m.limits.MaxExclusivePerConn {
		return refuse(wire.LimitReached, "exclusive queue limit reached: this connection owns "+strconv.Itoa(m.exclusive[c.Conn])+
			" exclusive queues, its max_exclusive_queues_per_connection (raise it with warrend --max-exclusive-queues-per-connection"+
			" or \"max_exclusive_queues_per_connection\" in the config file, or delete some)"), nil
	}
	if len(m.queues) >= m.limits.MaxQueues {
		return limitReason("queue", len(m.queues), "max_queues", "max-queues"), nil
	}
	if r, ok := m.vhostQueueLimit(name); !ok {
		return r, nil
	}
	if placed(d) {
		if r, ok := m.checkReplicas(name, args); !ok {
			return r, nil
		}
	}
	id, ok := m.takeID()
	if !ok {
		return refuse(wire.LimitReached, "every queue id is in use (2^32-1 queues); delete some"), effs
	}
	// A dead-letter exchange that does not exist yet is allowed, as in
	// AMQP: it may be declared later; dead letters are dropped until then.
	q := &metaQueue{id: id, decl: *d, by: c.User}
	q.decl.Req, q.decl.Passive, q.decl.Name, q.decl.Args = 0, false, name, normArgs(d.Args)
	if d.Exclusive && c.Conn != 0 {
		q.exclusive = c.Conn
		m.exclusive[c.Conn]++
	}
	if placed(d) {
		m.place(q, int(args.Replicas))
	} else if c.Home != 0 {
		q.home, q.homeInc = c.Home, c.HomeInc
		m.count(q, 1)
	}
	m.queues[name] = q
	m.countQueue(name, 1)
	return MetaResult{QueueID: q.id, Name: name}, append(effs, MetaEffect{Kind: EffQueueCreated, Queue: q.public(args), Shard: m.ShardOf(name)})
}

// takeID hands out the next queue id not in use. Ids are 32-bit (the
// routing table's refs) and never 0; after the last the counter wraps, so
// an id comes back only after 2^32-1 others were handed out (a routing
// view that old is long gone).
func (m *Meta) takeID() (uint64, bool) {
	if uint64(len(m.ids)) >= math.MaxUint32 {
		return 0, false
	}
	for {
		id := m.nextID
		m.nextID++
		if m.nextID > math.MaxUint32 {
			m.nextID = 1
		}
		if _, used := m.ids[id]; !used {
			m.ids[id] = struct{}{}
			return id, true
		}
	}
}

// ShardOf is the shard a queue of this name is placed on.
func (m *Meta) ShardOf(name string) int { return int(xxhash.Sum64String(name) % uint64(m.shards)) }

func (q *metaQueue) public(args wire.QueueArgs) MetaQueue {
	return MetaQueue{ID: q.id, Name: q.decl.Name, Decl: q.decl, Args: args, Exclusive: q.exclusive, DeclaredBy: q.by,
		Replicas: slices.Clone(q.replicas), Leader: q.leader, Target: slices.Clone(q.target), Origin: slices.Clone(q.origin), Rebuild: slices.Clone(q.rebuild),
		Home: q.home, HomeInc: q.homeInc}
}

// parsed is the queue with its arguments parsed (they parsed at declare).
func (q *metaQueue) parsed() MetaQueue {
	args, _ := wire.ParseQueueArgs(q.decl.Args)
	return q.public(args)
}

// deleteQueue removes a queue (its shard has checked if-unused and
// if-empty, the runtime the requester's rights): applied only if the queue
// of that name is still the one with that id.
func (m *Meta) deleteQueue(c *MetaCommand) (MetaResult, []MetaEffect) {
	q, ok := m.queues[c.Queue.Name]
	if !ok || q.id != c.QueueID {
		return refuse(wire.NotFound, "no queue "+strconv.Quote(c.Queue.Name)), nil
	}
	return MetaResult{Removed: true, QueueID: q.id, Name: c.Queue.Name}, []MetaEffect{m.removeQueue(q)}
}

// removeQueue removes queue q with its bindings (a delete, a node's
// restart, a home's drop) and is the effect that says so.
func (m *Meta) removeQueue(q *metaQueue) MetaEffect {
	name := q.decl.Name
	delete(m.queues, name)
	m.count(q, -1)
	m.countQueue(name, -1)
	delete(m.ids, q.id)
	m.forgetExclusive(q.exclusive)
	m.unlinkAll(m.byQueue[name])
	return MetaEffect{Kind: EffQueueRemoved, Queue: MetaQueue{ID: q.id, Name: name}}
}

// nodeUp drops what does not outlive a restart: non-durable exchanges,
// non-durable and exclusive queues (their owners' connections are gone),
// and the bindings touching any of them (they go with their ends).
func (m *Meta) nodeUp() (MetaResult, []MetaEffect) {
	var effs []MetaEffect
	for _, d := range m.Exchanges() {
		if d.Durable {
			continue
		}
		delete(m.exchanges, d.Name)
		m.unlinkAll(m.bySource[d.Name])
		m.unlinkAll(m.byExDest[d.Name])
		effs = append(effs, MetaEffect{Kind: EffExchangeRemoved, Exchange: queue.Exchange{Name: d.Name}})
	}
	for _, q := range m.Queues() {
		if q.Decl.Durable && q.Exclusive == 0 && !q.Decl.Exclusive {
			continue
		}
		effs = append(effs, m.removeQueue(m.queues[q.Name]))
	}
	return MetaResult{}, effs
}

func (m *Meta) bind(c *MetaCommand) (MetaResult, []MetaEffect) {
	b := &c.Bind
	src, ok := m.exchanges[b.Source]
	if !ok {
		if LocalName(b.Source) == "" {
			return refuse(wire.NotAllowed, "the default exchange cannot be bound"), nil
		}
		return refuse(wire.NotFound, "no exchange "+strconv.Quote(b.Source)), nil
	}
	if b.ToExchange {
		if _, ok := m.exchanges[b.Destination]; !ok {
			return refuse(wire.NotFound, "no exchange "+strconv.Quote(b.Destination)), nil
		}
	} else if _, ok := m.queues[b.Destination]; !ok {
		return refuse(wire.NotFound, "no queue "+strconv.Quote(b.Destination)), nil
	}
	if !b.Unbind && src.decl.Kind == wire.ExchangeHeaders {
		if err := checkXMatch(b.Args); err != nil {
			return refuseErr(err), nil
		}
	}
	nb := queue.Binding{Source: b.Source, Destination: b.Destination, ToExchange: b.ToExchange, Key: b.RoutingKey, Args: normArgs(b.Args)}
	key := bindKey(nb)
	old := m.bindings[key]
	if b.Unbind {
		if old == nil {
			return refuse(wire.NotFound, "no such binding"), nil
		}
		if r, ok := allowed(c, old.by, "unbind", "the binding from "+strconv.Quote(nb.Source)+" to "+strconv.Quote(nb.Destination)); !ok {
			return r, nil
		}
		m.unlink(old)
		return MetaResult{}, []MetaEffect{{Kind: EffBindingRemoved, Binding: old.b}}
	}
	if old != nil {
		return MetaResult{}, nil
	}
	if len(m.bindings) >= m.limits.MaxBindings {
		return limitReason("binding", len(m.bindings), "max_bindings", "max-bindings"), nil
	}
	m.link(&metaBinding{key: key, b: nb, by: c.User})
	return MetaResult{}, []MetaEffect{{Kind: EffBindingAdded, Binding: nb}}
}

func (m *Meta) destIndex(b *queue.Binding) map[string]*bindSet {
	if b.ToExchange {
		return m.byExDest
	}
	return m.byQueue
}

func addIndex(ix map[string]*bindSet, name string, b *metaBinding) {
	s := ix[name]
	if s == nil {
		s = &bindSet{}
		ix[name] = s
	}
	s.add(b)
}

func dropIndex(ix map[string]*bindSet, name, key string) {
	if s := ix[name]; s != nil {
		s.remove(key)
		if s.len() == 0 {
			delete(ix, name)
		}
	}
}

// unlinkAll unlinks every binding of a set (nil: none).
func (m *Meta) unlinkAll(s *bindSet) {
	if s == nil {
		return
	}
	for _, b := range s.all() {
		m.unlink(b)
	}
}

func (m *Meta) link(b *metaBinding) {
	m.bindings[b.key] = b
	addIndex(m.bySource, b.b.Source, b)
	addIndex(m.destIndex(&b.b), b.b.Destination, b)
}

func (m *Meta) unlink(b *metaBinding) {
	delete(m.bindings, b.key)
	dropIndex(m.bySource, b.b.Source, b.key)
	dropIndex(m.destIndex(&b.b), b.b.Destination, b.key)
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
