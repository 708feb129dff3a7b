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
