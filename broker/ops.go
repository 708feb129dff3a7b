package netio

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net"
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
func (s *Server) Exchanges() []ExchangeInfo {
	t := s.topo
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make([]ExchangeInfo, 0, len(t.exDecl))
	for _, d := range t.exDecl {
		out = append(out, ExchangeInfo{Name: d.Name, Type: d.Kind.String(), Durable: d.Durable, AutoDelete: d.AutoDelete,
			Internal: d.Internal, Alternate: d.Alternate, Args: d.Args})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// Bindings lists the bindings.
func (s *Server) Bindings() []BindingInfo {
	t := s.topo
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make([]BindingInfo, 0, len(t.top.Bindings))
	for _, b := range t.top.Bindings {
		out = append(out, BindingInfo{Source: b.Source, Destination: b.Destination, ToExchange: b.ToExchange, RoutingKey: b.Key, Args: b.Args})
	}
	return out
}

// DeclareExchange declares an exchange as EXCHANGE_DECLARE does.
func (s *Server) DeclareExchange(d wire.ExchangeDeclare) error {
	defer s.topo.publishIfDirty()
	return s.topo.declareExchange(&d, "")
}

// DeleteExchange deletes an exchange as EXCHANGE_DELETE does.
func (s *Server) DeleteExchange(name string, ifUnused bool) error {
	return s.topo.deleteExchange(&wire.ExchangeDelete{Name: name, IfUnused: ifUnused}, nil)
}

// DeclareQueue declares a queue as QUEUE_DECLARE does (exclusive queues
// need a connection, so Exclusive is refused here).
func (s *Server) DeclareQueue(d wire.QueueDeclare) (string, error) {
	if d.Exclusive {
		return "", reqErr(wire.InvalidArgument, "exclusive queues belong to a connection")
	}
	q, err := s.topo.declareQueue(&d, 0, "")
	s.topo.publishIfDirty()
	if err != nil {
		return "", err
	}
	return q.name, nil
}

// Bind adds (or, with Unbind set, removes) a binding as BIND does.
func (s *Server) Bind(b wire.Bind) error {
	defer s.topo.publishIfDirty()
	return s.topo.bind(&b, "", nil)
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
func (s *Server) DeleteQueue(ctx context.Context, name string, ifUnused, ifEmpty bool) (int64, error) {
	q := s.topo.lookupQueue(name)
	if q == nil {
		return 0, reqErr(wire.NotFound, "no queue %q", name)
	}
	r, err := ask(ctx, q.shard, Command{Kind: CmdDelete, Queue: q, IfUnused: ifUnused, IfEmpty: ifEmpty, Reason: "queue deleted by an operator"})
	if err != nil {
		return 0, err
	}
	return r.N, r.Err()
}

// PurgeQueue removes a queue's ready messages and returns how many.
func (s *Server) PurgeQueue(ctx context.Context, name string) (int64, error) {
	q := s.topo.lookupQueue(name)
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
// taking them: nothing is delivered or counted.
func (s *Server) PeekQueue(ctx context.Context, name string, n int) ([]Message, error) {
	q := s.topo.lookupQueue(name)
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
func (s *Server) Queue(name string) (QueueInfo, bool) {
	q := s.topo.lookupQueue(name)
	if q == nil {
		return QueueInfo{}, false
	}
	return QueueInfo{QueueStats: statsOf(q), Durable: q.decl.Durable, Exclusive: q.decl.Exclusive,
		AutoDelete: q.decl.AutoDelete, Args: q.args, Declared: q.decl.Args}, true
}

func statsOf(q *Queue) QueueStats {
	return QueueStats{
		Name: q.name, Ready: q.ready.Load(), Unacked: q.unacked.Load(), Consumers: q.consumers.Load(),
		Published: q.published.Load(), Delivered: q.delivered.Load(), Acked: q.acked.Load(),
		Redelivered: q.redelivered.Load(), DeadLettered: q.deadLettered.Load(),
		DeadLetterDropped: q.deadLetterDropped.Load(),
	}
}

// Overview sums the broker's state.
type Overview struct {
	Version             string `json:"version"`
	Connections         int    `json:"connections"`
	Channels            int64  `json:"channels"`
	Exchanges           int    `json:"exchanges"`
	Queues              int    `json:"queues"`
	Ready               int64  `json:"ready"`
	Unacked             int64  `json:"unacked"`
	Consumers           int64  `json:"consumers"`
	StoredMessageBytes  int64  `json:"stored_message_bytes"`
	MemoryHighWatermark int64  `json:"memory_high_watermark_bytes"`
	FlowBlocked         bool   `json:"flow_blocked"`
	Published           uint64 `json:"published_total"`
	Delivered           uint64 `json:"delivered_total"`
	Acked               uint64 `json:"acked_total"`
}

// Overview returns the broker's totals.
func (s *Server) Overview() Overview {
	o := Overview{Version: Version, Connections: s.ConnectionCount(), Channels: s.metrics.channels.Load(),
		Exchanges: len(s.Exchanges()), StoredMessageBytes: s.storedBytes.Load(),
		MemoryHighWatermark: s.cfg.MemoryHighWater, FlowBlocked: s.flowOff.Load()}
	// Deleted queues' counts stay in the totals, which only grow: a live
	// queue's counters, read after the snapshot, are at least what they were
	// in it, and a queue deleted since is counted once, here.
	qs, retired := s.topo.snapshotWithRetired()
	o.Published, o.Delivered, o.Acked = retired.published, retired.delivered, retired.acked
	for _, ref := range qs {
		q := statsOf(ref)
		o.Queues++
		o.Ready += q.Ready
		o.Unacked += q.Unacked
		o.Consumers += q.Consumers
		o.Published += q.Published
		o.Delivered += q.Delivered
		o.Acked += q.Acked
	}
	return o
}

// Authenticate checks a user's password as the protocol does and returns
// the user's tags. remote is the client's address (host:port); guest from
// loopback is an administrator.
func (s *Server) Authenticate(user, pass, remote string) (tags []string, ok bool) {
	loopback := false
	if ip := net.ParseIP(sourceHost(remote)); ip != nil {
		loopback = ip.IsLoopback()
	}
	if !s.auth.check(user, pass, remote, loopback) {
		s.metrics.authFailures.Inc()
		return nil, false
	}
	if u, found := s.auth.user(user); found {
		return u.Tags, true
	}
	return []string{"administrator"}, true // guest (loopback) or the internal user
}

// AuthRefusal is the reason to give a client whose credentials
// Authenticate refused; remote is its address (host:port).
func (s *Server) AuthRefusal(user, remote string) string {
	ip := net.ParseIP(sourceHost(remote))
	return s.auth.refusal(user, ip != nil && ip.IsLoopback())
}

// SetUsers replaces the configured users (guest and the internal user are
// not among them). Credentials verified for a user before the change are
// checked again.
func (s *Server) SetUsers(users []User) { s.auth.setUsers(users) }

// InternalURL is a warren:// URL with credentials that only this process
// knows, for broker-side clients such as the admin API's replay.
func (s *Server) InternalURL() string {
	return "warren://" + internalUser + ":" + s.auth.internalPass + "@" + s.addr.String()
}

const internalUser = "warren-internal"

func randomSecret() string {
	b := make([]byte, 24)
	if _, err := rand.Read(b); err != nil {
		panic("netio: no randomness for the internal secret: " + err.Error())
	}
	return hex.EncodeToString(b)
}
