package broker

import (
	"context"
	"sort"

	"github.com/warren-mq/warren/wire"
)

// This file is the broker's operator surface: the same topology operations
// the protocol offers, plus inspection, for the admin API.

// ExchangeInfo describes a declared exchange.
type ExchangeInfo struct {
	Name       string     `json:"name"`
	Type       string     `json:"type"`
	Durable    bool       `json:"durable"`
	AutoDelete bool       `json:"auto_delete"`
	Internal   bool       `json:"internal"`
	Alternate  string     `json:"alternate_exchange,omitempty"`
	Args       wire.Table `json:"arguments,omitempty"`
}

// BindingInfo describes a binding.
type BindingInfo struct {
	Source      string     `json:"exchange"`
	Destination string     `json:"destination"`
	ToExchange  bool       `json:"to_exchange"`
	RoutingKey  string     `json:"routing_key"`
	Args        wire.Table `json:"arguments,omitempty"`
}

// Exchanges lists the exchanges, by name.
func (b *Broker) Exchanges() []ExchangeInfo {
	t := b.topo
	t.mu.Lock()
	defer t.mu.Unlock()
	exs := t.meta.Exchanges()
	out := make([]ExchangeInfo, 0, len(exs))
	for _, d := range exs {
		out = append(out, ExchangeInfo{Name: d.Name, Type: d.Kind.String(), Durable: d.Durable, AutoDelete: d.AutoDelete,
			Internal: d.Internal, Alternate: d.Alternate, Args: d.Args})
	}
	return out
}

// Bindings lists the bindings, by source, then destination.
func (b *Broker) Bindings() []BindingInfo {
	t := b.topo
	t.mu.Lock()
	defer t.mu.Unlock()
	bs := t.meta.Bindings()
	out := make([]BindingInfo, 0, len(bs))
	for _, b := range bs {
		out = append(out, BindingInfo{Source: b.Source, Destination: b.Destination, ToExchange: b.ToExchange, RoutingKey: b.Key, Args: b.Args})
	}
	return out
}

// DeclareExchange declares an exchange as EXCHANGE_DECLARE does.
func (b *Broker) DeclareExchange(d wire.ExchangeDeclare) error {
	defer b.topo.publishIfDirty()
	if err := b.topo.declareExchange(&d, ""); err != nil {
		return err
	}
	return b.topo.sync(context.Background(), syncFor{})
}

// DeleteExchange deletes an exchange as EXCHANGE_DELETE does.
func (b *Broker) DeleteExchange(name string, ifUnused bool) error {
	if err := b.topo.deleteExchange(&wire.ExchangeDelete{Name: name, IfUnused: ifUnused}, Requester{Admin: true}); err != nil {
		return err
	}
	return b.topo.sync(context.Background(), syncFor{})
}

// DeclareQueue declares a queue as QUEUE_DECLARE does (exclusive queues
// need a connection, so Exclusive is refused here).
func (b *Broker) DeclareQueue(d wire.QueueDeclare) (string, error) {
	if d.Exclusive {
		return "", reqErr(wire.InvalidArgument, "exclusive queues belong to a connection")
	}
	q, err := b.topo.declareQueue(&d, 0, "")
	if err == nil {
		err = b.topo.sync(context.Background(), syncFor{})
	}
	b.topo.publishIfDirty()
	if err != nil {
		return "", err
	}
	return q.name, nil
}

// Bind adds (or, with Unbind set, removes) a binding as BIND does.
func (b *Broker) Bind(d wire.Bind) error {
	defer b.topo.publishIfDirty()
	if err := b.topo.bind(&d, Requester{Admin: true}); err != nil {
		return err
	}
	return b.topo.sync(context.Background(), syncFor{})
}

// ask submits a request command to a shard and waits for its answer.
func ask(ctx context.Context, sh *shard, c Command) (Result, error) {
	w := make(waitSink, 1)
	c.Sink = w
	sh.submit(c)
	select {
	case r := <-w:
		return r, nil
	case <-ctx.Done():
		return Result{}, ctx.Err()
	}
}

// DeleteQueue deletes a queue as QUEUE_DELETE does and returns the
// messages it held.
func (b *Broker) DeleteQueue(ctx context.Context, name string, ifUnused, ifEmpty bool) (int64, error) {
	q := b.topo.lookupQueue(name)
	if q == nil {
		return 0, reqErr(wire.NotFound, "no queue %q", name)
	}
	r, err := ask(ctx, q.shard, Command{Kind: CmdDelete, Queue: q, IfUnused: ifUnused, IfEmpty: ifEmpty, Reason: "queue deleted by an operator"})
	if err != nil {
		return 0, err
	}
	if err := r.Err(); err != nil {
		return r.N, err
	}
	return r.N, b.topo.sync(ctx, syncFor{queue: uint64(q.id)})
}

// PurgeQueue removes a queue's ready messages and returns how many.
func (b *Broker) PurgeQueue(ctx context.Context, name string) (int64, error) {
	q := b.topo.lookupQueue(name)
	if q == nil {
		return 0, reqErr(wire.NotFound, "no queue %q", name)
	}
	r, err := ask(ctx, q.shard, Command{Kind: CmdPurge, Queue: q})
	if err != nil {
		return 0, err
	}
	return r.N, r.Err()
}

// Message is a copy of a stored message, for inspection.
type Message struct {
	// ID is the message's id in its queue while the broker runs: what
	// ReplaySelected takes to name it.
	ID            uint64      `json:"id"`
	Exchange      string      `json:"exchange"`
	RoutingKey    string      `json:"routing_key"`
	Priority      uint8       `json:"priority"`
	Persistent    bool        `json:"persistent"`
	DeliveryCount uint32      `json:"delivery_count"`
	FailedCount   uint32      `json:"failed_count"`
	Properties    *wire.Props `json:"properties,omitempty"`
	Body          []byte      `json:"body"`
}

// PeekQueue copies up to n ready messages in dispatch order without
// taking them: nothing is delivered or counted. It stops at the first
// message whose body would take the copied bodies past MaxPeekBytes
// (always returning one).
func (b *Broker) PeekQueue(ctx context.Context, name string, n int) ([]Message, error) {
	q := b.topo.lookupQueue(name)
	if q == nil {
		return nil, reqErr(wire.NotFound, "no queue %q", name)
	}
	r, err := ask(ctx, q.shard, Command{Kind: CmdPeek, Queue: q, N: n})
	if err != nil {
		return nil, err
	}
	return r.Msgs, r.Err()
}

// QueueInfo is a queue's settings and counts.
type QueueInfo struct {
	QueueStats
	Durable    bool           `json:"durable"`
	Exclusive  bool           `json:"exclusive"`
	AutoDelete bool           `json:"auto_delete"`
	Args       wire.QueueArgs `json:"-"`
	Declared   wire.Table     `json:"-"`
}

// Queue returns one queue's settings and counts.
func (b *Broker) Queue(name string) (QueueInfo, bool) {
	q := b.topo.lookupQueue(name)
	if q == nil {
		return QueueInfo{}, false
	}
	return QueueInfo{QueueStats: statsOf(q), Durable: q.decl.Durable, Exclusive: q.decl.Exclusive,
		AutoDelete: q.decl.AutoDelete, Args: q.args, Declared: q.decl.Args}, true
}

func statsOf(q *Queue) QueueStats {
	st := QueueStats{
		Name: q.name, Ready: q.ready.Load(), Unacked: q.unacked.Load(), Consumers: q.consumers.Load(),
		Published: q.published.Load(), Delivered: q.delivered.Load(), Acked: q.acked.Load(),
		Redelivered: q.redelivered.Load(), DeadLettered: q.deadLettered.Load(),
		DeadLetterDropped: q.deadLetterDropped.Load(), DeadLettersHeld: q.dlHeld.Load(),
		Leader: q.leaderID(),
	}
	if r := q.shownReplicas.Load(); r != nil {
		st.Replicas = *r
	}
	q.raftStats(&st)
	return st
}

// QueueStats is a point-in-time view of one queue.
type QueueStats struct {
	Name         string `json:"name"`
	Ready        int64  `json:"ready"`
	Unacked      int64  `json:"unacked"`
	Consumers    int64  `json:"consumers"`
	Published    uint64 `json:"published_total"`
	Delivered    uint64 `json:"delivered_total"`
	Acked        uint64 `json:"acked_total"`
	Redelivered  uint64 `json:"redelivered_total"`
	DeadLettered uint64 `json:"dead_lettered_total"`
	// DeadLetterDropped counts dead letters that went nowhere (no such
	// exchange, routed to no queue, too large to carry their history…).
	DeadLetterDropped uint64 `json:"dead_letter_dropped_total"`
	// DeadLettersHeld counts the dead letters a durable queue keeps until
	// their targets have them (at-least-once dead-lettering): in flight,
	// or waiting to be sent again after a restart.
	DeadLettersHeld int64 `json:"dead_letters_held"`
	// Leader is the node leading a durable queue, as this node knows it
	// (0: none known), and Replicas the nodes holding it (placement.go);
	// both absent for a queue that is not placed (non-durable, exclusive).
	Leader   uint64   `json:"leader,omitempty"`
	Replicas []uint64 `json:"replica_nodes,omitempty"`
	// RaftRole is this node's part in the queue's raft group ("leader",
	// "follower", "none": no replica here, or "failed": its replica here
	// did not open, ReplicaError says why), RaftCommit the group's
	// commit index as this node knows it and RaftApplied what this node
	// applied (their difference: its commit lag); a replicated queue in
	// a cluster only.
	RaftRole    string `json:"raft_role,omitempty"`
	RaftCommit  uint64 `json:"raft_commit_index,omitempty"`
	RaftApplied uint64 `json:"raft_applied_index,omitempty"`
	// ReplicaError: why this node's replica did not open (damaged or
	// unreadable data, naming the file or entry); it serves nothing of
	// the queue, the other replicas do.
	ReplicaError string `json:"replica_error,omitempty"`
	// RaftVoters: the group's voters as this node applied them last (a
	// replica being rebuilt or moved here is none until promoted).
	RaftVoters []uint64 `json:"raft_voters,omitempty"`
}

// Queues returns the current queues' counts.
func (b *Broker) Queues() []QueueStats {
	var out []QueueStats
	for _, q := range b.topo.snapshotQueues() {
		out = append(out, statsOf(q))
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// Totals sums the queues' counts; the queues deleted so far stay in the
// message totals, which only grow.
type Totals struct {
	Exchanges, Queues           int
	Ready, Unacked, Consumers   int64
	Published, Delivered, Acked uint64
	// Redelivered and DeadLettered sum the live queues' only.
	Redelivered, DeadLettered uint64
}

// Totals returns the broker-wide counts.
func (b *Broker) Totals() Totals {
	t := Totals{Exchanges: len(b.Exchanges())}
	// A live queue's counters, read after the snapshot, are at least what
	// they were in it, and a queue deleted since is counted once, here.
	qs, retired := b.topo.snapshotWithRetired()
	t.Published, t.Delivered, t.Acked = retired.published, retired.delivered, retired.acked
	for _, ref := range qs {
		q := statsOf(ref)
		t.Queues++
		t.Ready += q.Ready
		t.Unacked += q.Unacked
		t.Consumers += q.Consumers
		t.Published += q.Published
		t.Delivered += q.Delivered
		t.Acked += q.Acked
		t.Redelivered += q.Redelivered
		t.DeadLettered += q.DeadLettered
	}
	return t
}
