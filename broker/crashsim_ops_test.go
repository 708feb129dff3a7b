package broker

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/warren-mq/warren/queue"
	"github.com/warren-mq/warren/segment"
	"github.com/warren-mq/warren/wire"
)

// publish publishes 1-3 messages through dx (one queue's key, or "all")
// or tx, persistent or transient, some with a per-message TTL, and maybe
// waits for the confirm.
func (s *crashSim) publish() {
	r := s.rng
	b := s.n.b
	ex, key := "dx", "all"
	switch x := r.IntN(10); {
	case x < 1:
		ex, key = "tx", ""
	case x < 2:
		if lx := s.liveExchanges(); len(lx) > 0 {
			ex, key = lx[r.IntN(len(lx))], ""
		}
	case x < 8:
		if qs := s.live(); len(qs) > 0 {
			key = qs[r.IntN(len(qs))].name
		}
	}
	view := b.View()
	refs, _ := view.Table.Route(nil, ex, []byte(key), nil)
	var qs []*Queue
	for _, ref := range refs {
		if q := view.Queue(ref); q != nil {
			qs = append(qs, q)
		}
	}
	n := 1 + r.IntN(3)
	persistent := r.IntN(4) != 0
	var p wire.Properties
	expires := r.IntN(6) == 0
	if expires {
		p.ExpirationMs = uint32(100 + r.IntN(2000))
		p.Set(wire.PropExpiration)
	}
	props := wire.AppendProperties(nil, &p)[2:]
	prio := uint8(r.IntN(6))
	pad := 0
	if r.IntN(5) == 0 {
		pad = r.IntN(3000)
	}
	if len(qs) == 0 {
		s.logf("publish via %s %q: routed nowhere", ex, key)
		return
	}
	var fl wire.MessageFlags
	if persistent {
		fl = wire.Persistent
	}
	ar := &Arena{}
	ar.Refs.Store(int64(n * len(qs)))
	batch := &PublishBatch{Sink: s.sink, Codes: make([]uint32, n)}
	msgs := make([]*StoredMsg, n)
	var names []string
	for _, q := range qs {
		names = append(names, s.cur[q.name])
	}
	var bodies []string
	for i := range n {
		s.nmsgs++
		body := fmt.Sprintf("m%d.", s.nmsgs) + strings.Repeat(".", pad)
		bodies = append(bodies, body[:min(len(body), 8)])
		msgs[i] = ar.add([]byte(ex), []byte(key), props, []byte(body), fl, prio)
		ar.Cost += int64(len(body)+len(props)) + StoredMsgOverhead
		s.msgs[body] = &simMsg{seq: s.nmsgs, persistent: persistent, expires: expires, queues: names, batch: batch, idx: i}
	}
	b.AddStoredBytes(ar.Cost)
	// One part per shard, its items grouped by queue.
	parts := make([][]EnqItem, len(b.shards))
	for _, q := range qs {
		for i, m := range msgs {
			meta := queue.Message{Size: uint32(len(m.Body())), Priority: prio, ExpirationMs: p.ExpirationMs, HasExpiration: expires}
			parts[q.shardIdx] = append(parts[q.shardIdx], EnqItem{Q: q, Msg: m, Meta: meta, Idx: i})
		}
	}
	pending := int32(1)
	for _, part := range parts {
		if len(part) > 0 {
			pending++
		}
	}
	batch.Pending.Store(pending)
	for _, part := range parts {
		if len(part) > 0 {
			b.Submit(Command{Kind: CmdPublish, Items: part, Batch: batch})
		}
	}
	batch.PartDone()
	wait := r.IntN(2) == 0
	s.logf("publish %v via %s %q to %v persistent=%v ttl=%v prio=%d wait=%v", bodies, ex, key, names, persistent, expires, prio, wait)
	if wait {
		s.wait("a confirm", func() bool { return s.sink.confirmed[batch] })
	}
}

// subscribe adds a consumer (prefetch 1-4) to a live queue.
func (s *crashSim) subscribe() {
	qs := s.live()
	if len(qs) == 0 {
		return
	}
	sq := qs[s.rng.IntN(len(qs))]
	q := s.n.b.topo.lookupQueue(sq.name)
	if q == nil {
		return
	}
	id := s.n.b.NewConsumerID()
	owner := uint64(1 + s.rng.IntN(3))
	s.consumers[id] = &simConsumer{queue: sq.key, owner: owner, alive: true}
	prefetch := uint32(1 + s.rng.IntN(4))
	s.n.b.Submit(Command{Kind: CmdSubscribe, Queue: q, Sink: s.sink, Spec: queue.ConsumerSpec{ID: id, Owner: queue.OwnerID(owner), Prefetch: prefetch}, Req: 1})
	s.logf("subscribe c%d to %s owner %d prefetch %d", id, sq.name, owner, prefetch)
	s.wait("a subscribe's answer", func() bool { _, ok := s.sink.subs[id]; return ok })
	s.absorb()
}

// settle acks, requeues or rejects an outstanding delivery, and maybe
// waits for its queue's barrier (an ack on disk).
func (s *crashSim) settle() {
	// Deliveries of consumers gone since are not outstanding.
	kept := s.open[:0]
	for _, i := range s.open {
		if s.consumers[s.delivery(i).consumer].alive {
			kept = append(kept, i)
		}
	}
	s.open = kept
	if len(s.open) == 0 {
		return
	}
	k := s.rng.IntN(len(s.open))
	d := s.delivery(s.open[k])
	s.open = slices.Delete(s.open, k, k+1)
	c := s.consumers[d.consumer]
	sq := s.queues[c.queue]
	if sq.deleting {
		return
	}
	q := s.n.b.topo.lookupQueue(sq.name)
	if q == nil {
		return
	}
	op := wire.SettleAck
	switch x := s.rng.IntN(10); {
	case x < 2:
		op = wire.SettleRequeue
	case x < 4:
		op = wire.SettleReject
	}
	key := simCopy{d.body, c.queue, d.path}
	st := s.copyState(key)
	switch op {
	case wire.SettleAck:
		st.ackSent = true
		s.pendAcks[c.queue] = append(s.pendAcks[c.queue], key)
	case wire.SettleReject:
		st.rejected = true
		s.pendAcks[c.queue] = append(s.pendAcks[c.queue], key)
	}
	s.n.b.Submit(Command{Kind: CmdSettle, Settles: []SettleItem{{Q: q, Consumer: d.consumer, Op: op, QTag: d.qtag}}})
	wait := s.rng.IntN(2) == 0
	s.logf("%v %q (path %q) in %s by c%d tag %d (count %d) wait=%v", op, d.body[:min(len(d.body), 8)], d.path, c.queue, d.consumer, d.qtag, d.count, wait)
	if wait {
		s.barrierQ(sq)
	}
}

// cancel cancels a live consumer (its deliveries requeued).
func (s *crashSim) cancel() {
	var ids []queue.ConsumerID
	for id, c := range s.consumers {
		if c.alive {
			ids = append(ids, id)
		}
	}
	if len(ids) == 0 {
		return
	}
	slices.Sort(ids)
	id := ids[s.rng.IntN(len(ids))]
	c := s.consumers[id]
	c.alive = false
	if sq := s.queues[c.queue]; sq.deleting {
		// Gone with its queue (a queue of that name now is another).
	} else if q := s.n.b.topo.lookupQueue(sq.name); q != nil {
		s.n.b.Submit(Command{Kind: CmdCancel, Queue: q, Consumer: id, Requeue: true})
	}
	s.logf("cancel c%d on %s", id, c.queue)
}

// down closes a connection: its consumers' deliveries go back, its
// exclusive queue goes.
func (s *crashSim) down() {
	owner := uint64(1 + s.rng.IntN(3))
	for _, c := range s.consumers {
		if c.owner == owner {
			c.alive = false
		}
	}
	if owner == 3 {
		if sq := s.queues["ex0"]; sq != nil && !sq.deleting {
			sq.deleting = true
			s.unsureOf("ex0")
		}
	}
	s.n.b.Submit(Command{Kind: CmdDown, Owner: owner})
	s.logf("down connection %d", owner)
}

// advance moves the clock and fires the timers (TTLs, snapshots' idle
// rule after 5 s).
func (s *crashSim) advance() {
	d := int64(1 + s.rng.IntN(2500))
	if s.rng.IntN(5) == 0 {
		d = 5000 + int64(s.rng.IntN(2000))
	}
	s.now.Add(d)
	s.n.b.FireTimers()
	s.logf("advance %d ms, fire timers", d)
	if s.rng.IntN(2) == 0 {
		s.barrierAll()
	}
}

func (s *crashSim) randomLive() *simQueue {
	qs := s.live()
	if len(qs) == 0 {
		return nil
	}
	return qs[s.rng.IntN(len(qs))]
}

func (s *crashSim) purge() {
	sq := s.randomLive()
	if sq == nil {
		return
	}
	q := s.n.b.topo.lookupQueue(sq.name)
	if q == nil {
		return
	}
	sq.purgedAt = s.nmsgs
	s.req++
	req := s.req
	s.n.b.Submit(Command{Kind: CmdPurge, Queue: q, Sink: s.sink, Req: req})
	s.logf("purge %s", sq.name)
	s.wait("a purge's answer", func() bool { _, ok := s.sink.answers[req]; return ok })
}

func (s *crashSim) deleteQueue() {
	sq := s.randomLive()
	if sq == nil {
		return
	}
	if s.rng.IntN(2) == 0 {
		// Late queues first: their names are declared again.
		for _, l := range s.live() {
			if strings.HasPrefix(l.name, "late") {
				sq = l
				break
			}
		}
	}
	sq.deleting = true
	s.unsureOf(sq.name)
	s.logf("delete %s", sq.name)
	if _, err := s.n.b.DeleteQueue(s.ctx, sq.name, false, false); err != nil {
		if s.ctx.Err() != nil || s.isFailure(err) {
			return
		}
		s.t.Fatalf("seed %d: deleting %s: %v", s.seed, sq.name, err)
	}
	sq.deleted = true
}

// declareLate declares a durable queue (maybe with a TTL) and binds it to
// dx, each its own answered request.
func (s *crashSim) declareLate() {
	name := fmt.Sprintf("late%d", len(s.order))
	key := name
	// Half the time, the name of a late queue whose delete was answered:
	// a new queue, which none of the old one's messages may reach.
	var reuse []*simQueue
	for _, k := range s.order {
		if sq := s.queues[k]; sq.deleted && strings.HasPrefix(sq.name, "late") && s.cur[sq.name] == k {
			reuse = append(reuse, sq)
		}
	}
	if len(reuse) > 0 && s.rng.IntN(2) == 0 {
		old := reuse[s.rng.IntN(len(reuse))]
		name = old.name
		key = fmt.Sprintf("%s~%d", name, len(s.order))
	}
	sq := &simQueue{name: name, key: key, logged: true, purgedAt: -1}
	var args wire.Table
	if s.rng.IntN(2) == 0 {
		sq.ttl = true
		args = wire.Table{{Key: "message-ttl", Value: wire.Int(int64(100 + s.rng.IntN(2000)))}}
	}
	s.queues[key] = sq
	s.cur[name] = key
	s.order = append(s.order, key)
	s.logf("declare %s (%s) ttl=%v", name, key, sq.ttl)
	if _, err := s.n.b.DeclareQueue(wire.QueueDeclare{Name: name, Durable: true, Args: args}); err != nil {
		if s.isFailure(err) {
			return
		}
		s.t.Fatalf("seed %d: declaring %s: %v", s.seed, name, err)
	}
	sq.declared = true
	if key != name {
		s.st.redeclared++
	}
	s.bindings["dx>"+name+" "+name] = bindMaybe
	if err := s.n.b.Bind(wire.Bind{Source: "dx", Destination: name, RoutingKey: name}); err != nil {
		if s.isFailure(err) {
			return
		}
		s.t.Fatalf("seed %d: binding %s: %v", s.seed, name, err)
	}
	s.bindings["dx>"+name+" "+name] = bindMade
}

// unsureOf marks every binding with an end named name as maybe there
// (its end's delete was submitted).
func (s *crashSim) unsureOf(name string) {
	for k, v := range s.bindings {
		src, rest, _ := strings.Cut(k, ">")
		dst, _, _ := strings.Cut(rest, " ")
		if v == bindMade && (src == name || dst == name) {
			s.bindings[k] = bindMaybe
		}
	}
}

// liveExchanges lists the late exchanges declared and not (being) deleted.
func (s *crashSim) liveExchanges() []string {
	var out []string
	for i := range s.nex {
		name := fmt.Sprintf("lx%d", i)
		if e := s.exchanges[name]; e != nil && e.declared && !e.deleting {
			out = append(out, name)
		}
	}
	return out
}

// declareExchange declares a fanout exchange, durable or not, and binds
// it to one or two live queues, each its own answered request.
func (s *crashSim) declareExchange() {
	name := fmt.Sprintf("lx%d", s.nex)
	s.nex++
	e := &simExchange{durable: s.rng.IntN(2) == 0}
	s.exchanges[name] = e
	s.logf("declare exchange %s durable=%v", name, e.durable)
	if err := s.n.b.DeclareExchange(wire.ExchangeDeclare{Name: name, Kind: wire.ExchangeFanout, Durable: e.durable}); err != nil {
		if s.isFailure(err) {
			return
		}
		s.t.Fatalf("seed %d: declaring exchange %s: %v", s.seed, name, err)
	}
	e.declared = true
	for range 1 + s.rng.IntN(2) {
		sq := s.randomLive()
		if sq == nil {
			return
		}
		k := name + ">" + sq.name + " "
		if s.bindings[k] == bindMade {
			continue
		}
		s.bindings[k] = bindMaybe
		s.logf("bind %s to %s", name, sq.name)
		if err := s.n.b.Bind(wire.Bind{Source: name, Destination: sq.name}); err != nil {
			if s.isFailure(err) {
				return
			}
			s.t.Fatalf("seed %d: binding %s to %s: %v", s.seed, name, sq.name, err)
		}
		s.bindings[k] = bindMade
	}
}

// deleteExchange deletes a late exchange.
func (s *crashSim) deleteExchange() {
	lx := s.liveExchanges()
	if len(lx) == 0 {
		return
	}
	name := lx[s.rng.IntN(len(lx))]
	e := s.exchanges[name]
	e.deleting = true
	s.unsureOf(name)
	s.logf("delete exchange %s", name)
	if err := s.n.b.DeleteExchange(name, false); err != nil {
		if s.isFailure(err) {
			return
		}
		s.t.Fatalf("seed %d: deleting exchange %s: %v", s.seed, name, err)
	}
	e.deleted = true
}

// isFailure reports whether a request failed because the node's log
// failed (the injected fsync error): waits until Fatal was told.
func (s *crashSim) isFailure(err error) bool {
	if !errors.Is(err, segment.ErrStopped) && !errors.Is(err, segment.ErrInjected) && !strings.Contains(err.Error(), "may not be on disk") {
		return false
	}
	select {
	case <-s.ctx.Done():
	case <-time.After(20 * time.Second):
		s.t.Fatalf("seed %d: a request failed (%v) and Fatal was not told", s.seed, err)
	}
	return true
}

// takeDrops lists the dead letters dropped since the last call, by reason.
func (s *crashSim) takeDrops() []string {
	var drops []string
	for r := range s.dlDrops {
		if n := s.dlDrops[r].Swap(0); n > 0 {
			drops = append(drops, fmt.Sprintf("%v %d", DLDrop(r), n))
		}
	}
	return drops
}
