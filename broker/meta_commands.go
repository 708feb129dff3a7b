package broker

import (
	"github.com/warren-mq/warren/queue"
	"github.com/warren-mq/warren/wire"
)

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
