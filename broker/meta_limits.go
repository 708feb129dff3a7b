package broker

import (
	"math"
	"strconv"

	"github.com/warren-mq/warren/wire"
)

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

// Limits are the limits the machine enforces.
func (m *Meta) Limits() MetaLimits { return m.limits }

// limitReason is a refusal at a limit: what it is, how to raise it.
func limitReason(what string, n int, key, flag string) MetaResult {
	return refuse(wire.LimitReached, what+" limit reached: the broker holds "+strconv.Itoa(n)+" "+what+"s, its "+key+
		" (raise it with warrend --"+flag+" or \""+key+"\" in the config file, or delete "+what+"s)")
}
