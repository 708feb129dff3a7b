package broker

import (
	"sort"
	"strconv"
	"strings"

	"github.com/warren-mq/warren/queue"
	"github.com/warren-mq/warren/wire"
)

// MetaVhost is a virtual host as the metadata state machine keeps it, with
// its limits (0: none beyond the broker's). "/" always exists.
type MetaVhost struct {
	Name string
	// MaxQueues bounds the queues of the vhost (Meta refuses a declare
	// past it); MaxConnections its client connections (the fronts refuse
	// an open past it).
	MaxQueues, MaxConnections int64
}

// maxVhosts bounds the vhosts a broker holds (a vhost costs its four
// amq.* exchanges and a record).
const maxVhosts = 10_000

// vhostStandardExchanges are the exchanges every vhost has.
var vhostStandardExchanges = [...]struct {
	name string
	kind wire.ExchangeKind
}{{"amq.direct", wire.ExchangeDirect}, {"amq.topic", wire.ExchangeTopic}, {"amq.fanout", wire.ExchangeFanout}, {"amq.headers", wire.ExchangeHeaders}}

// checkVhostOf refuses a name in a vhost that does not exist (a client's
// vhost deleted while it was connected).
func (m *Meta) checkVhostOf(internal string) (MetaResult, bool) {
	v := VhostOf(internal)
	if _, ok := m.vhosts[v]; !ok {
		return refuse(wire.NotFound, "no virtual host "+strconv.Quote(v)), false
	}
	return MetaResult{}, true
}

// countQueue keeps the per-vhost queue counts (derived state) as a queue
// of that internal name is added (+1) or removed (-1).
func (m *Meta) countQueue(internal string, d int) {
	v := VhostOf(internal)
	if m.vqueues[v] += d; m.vqueues[v] <= 0 {
		delete(m.vqueues, v)
	}
}

// vhostQueueLimit refuses a new queue in a vhost at its max_queues.
func (m *Meta) vhostQueueLimit(internal string) (MetaResult, bool) {
	v := VhostOf(internal)
	if vh := m.vhosts[v]; vh != nil && vh.MaxQueues > 0 && int64(m.vqueues[v]) >= vh.MaxQueues {
		return refuse(wire.LimitReached, "queue limit of virtual host "+strconv.Quote(v)+" reached: it holds "+strconv.Itoa(m.vqueues[v])+
			" queues, its max_queues (an administrator raises it: PUT /api/vhosts/{vhost}, or delete queues)"), false
	}
	return MetaResult{}, true
}

func (m *Meta) putVhost(c *MetaCommand) (MetaResult, []MetaEffect) {
	v := c.Vhost
	if !c.Admin {
		return refuse(wire.AccessRefused, "changing virtual hosts needs the administrator tag"), nil
	}
	if err := checkMetaVhost(&v); err != nil {
		return refuseErr(err), nil
	}
	old, exists := m.vhosts[v.Name]
	if exists && (c.IfAbsent || *old == v) {
		return MetaResult{}, nil
	}
	if !exists && len(m.vhosts) >= maxVhosts {
		return refuse(wire.LimitReached, "virtual host limit reached: the broker holds "+strconv.Itoa(len(m.vhosts))+" vhosts (delete some first)"), nil
	}
	nv := v
	m.vhosts[v.Name] = &nv
	effs := []MetaEffect{{Kind: EffVhostPut, Name: v.Name}}
	if !exists && v.Name != DefaultVhost {
		for _, e := range vhostStandardExchanges {
			d := wire.ExchangeDeclare{Name: QualifyName(v.Name, e.name), Kind: e.kind, Durable: true}
			if _, taken := m.exchanges[d.Name]; taken {
				continue
			}
			m.exchanges[d.Name] = &metaExchange{decl: d}
			effs = append(effs, MetaEffect{Kind: EffExchangeCreated, Exchange: exchangeOf(&d)})
		}
	}
	return MetaResult{}, effs
}

// checkMetaVhost checks a vhost's name and limits: by the metadata
// machine, and before the command is logged or proposed (the metadata
// decoder refuses a negative limit).
func checkMetaVhost(v *MetaVhost) error {
	if err := checkVhostName(v.Name); err != nil {
		return err
	}
	if v.MaxQueues < 0 || v.MaxConnections < 0 {
		return reqErr(wire.InvalidArgument, "virtual host limits are 0 (none) or more")
	}
	return nil
}

// deleteVhost removes a vhost and everything in it: its queues (the
// runtime has deleted them through their shards before, when it could),
// exchanges, bindings and permissions.
func (m *Meta) deleteVhost(c *MetaCommand) (MetaResult, []MetaEffect) {
	name := c.Vhost.Name
	if !c.Admin {
		return refuse(wire.AccessRefused, "changing virtual hosts needs the administrator tag"), nil
	}
	if name == DefaultVhost {
		return refuse(wire.NotAllowed, "the default virtual host \"/\" cannot be deleted"), nil
	}
	if _, ok := m.vhosts[name]; !ok {
		return refuse(wire.NotFound, "no virtual host "+strconv.Quote(name)), nil
	}
	prefix := QualifyName(name, "")
	var effs []MetaEffect
	for _, q := range m.Queues() {
		if !strings.HasPrefix(q.Name, prefix) {
			continue
		}
		m.count(m.queues[q.Name], -1)
		delete(m.queues, q.Name)
		delete(m.ids, q.ID)
		m.countQueue(q.Name, -1)
		m.forgetExclusive(q.Exclusive)
		m.unlinkAll(m.byQueue[q.Name])
		effs = append(effs, MetaEffect{Kind: EffQueueRemoved, Queue: MetaQueue{ID: q.ID, Name: q.Name}})
	}
	for _, d := range m.Exchanges() {
		if !strings.HasPrefix(d.Name, prefix) {
			continue
		}
		delete(m.exchanges, d.Name)
		m.unlinkAll(m.bySource[d.Name])
		m.unlinkAll(m.byExDest[d.Name])
		effs = append(effs, MetaEffect{Kind: EffExchangeRemoved, Exchange: queue.Exchange{Name: d.Name}})
	}
	for k, p := range m.perms {
		if p.Vhost == name {
			delete(m.perms, k)
			effs = append(effs, MetaEffect{Kind: EffPermissionsChanged, Name: p.User})
		}
	}
	delete(m.vhosts, name)
	delete(m.vqueues, name)
	return MetaResult{Removed: true}, append(effs, MetaEffect{Kind: EffVhostRemoved, Name: name})
}

// Vhost is the vhost of that name, if it exists.
func (m *Meta) Vhost(name string) (MetaVhost, bool) {
	v, ok := m.vhosts[name]
	if !ok {
		return MetaVhost{}, false
	}
	return *v, true
}

// Vhosts lists the vhosts, by name.
func (m *Meta) Vhosts() []MetaVhost {
	out := make([]MetaVhost, 0, len(m.vhosts))
	for _, v := range m.vhosts {
		out = append(out, *v)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// VhostQueues counts the queues of a vhost.
func (m *Meta) VhostQueues(name string) int { return m.vqueues[name] }

// diffVhosts: the vhost effects that turn a's vhosts into b's.
func diffVhosts(a, b *Meta) []MetaEffect {
	var effs []MetaEffect
	for _, v := range a.Vhosts() {
		if _, ok := b.vhosts[v.Name]; !ok {
			effs = append(effs, MetaEffect{Kind: EffVhostRemoved, Name: v.Name})
		}
	}
	for _, v := range b.Vhosts() {
		if o, ok := a.vhosts[v.Name]; !ok || *o != v {
			effs = append(effs, MetaEffect{Kind: EffVhostPut, Name: v.Name})
		}
	}
	return effs
}

func appendMetaVhost(dst []byte, v *MetaVhost) []byte {
	dst = appendMetaStr(dst, v.Name)
	dst = appendMetaI64(dst, v.MaxQueues)
	return appendMetaI64(dst, v.MaxConnections)
}

func appendMetaI64(dst []byte, v int64) []byte {
	u := uint64(v)
	return append(dst, byte(u), byte(u>>8), byte(u>>16), byte(u>>24), byte(u>>32), byte(u>>40), byte(u>>48), byte(u>>56))
}

func (r *metaReader) metaVhost() MetaVhost {
	v := MetaVhost{Name: r.str(), MaxQueues: int64(r.u64()), MaxConnections: int64(r.u64())}
	if r.err == nil && (v.MaxQueues < 0 || v.MaxConnections < 0) {
		r.fail("virtual host " + strconv.Quote(v.Name) + " with a negative limit")
	}
	return v
}
