package broker

import (
	"bytes"
	"strings"
	"testing"

	"github.com/warren-mq/warren/segment"
	"github.com/warren-mq/warren/wire"
)

// refusedAtLimit applies c, which must be refused with limit_reached
// naming the limit and its flag, with no effect and the state (its
// snapshot, queue ids included) unchanged: nothing is half-created.
func refusedAtLimit(t *testing.T, m *Meta, c MetaCommand, limit, flag string) {
	t.Helper()
	before := m.Snapshot()
	r, effs := metaDo(t, m, c, wire.LimitReached, limit)
	if !bytes.Contains([]byte(r.Reason), []byte(flag)) {
		t.Fatalf("refusal %q does not name the flag %s", r.Reason, flag)
	}
	if len(effs) != 0 {
		t.Fatalf("refused at the limit with effects %+v", effs)
	}
	if !bytes.Equal(before, m.Snapshot()) {
		t.Fatal("a command refused at the limit changed the state")
	}
}

// TestMetaLimits: at its configured limit, the next queue, exchange or
// binding is refused with limit_reached (the limit and the flag that
// raises it named), nothing of it is created, and deleting one frees room
// for the next. Redeclares and rebinds of what exists are not refused.
func TestMetaLimits(t *testing.T) {
	// The four amq.* exchanges count: 6 leaves room for two.
	m := NewMetaWithLimits(2, MetaLimits{MaxQueues: 3, MaxExchanges: 6, MaxBindings: 2})
	if l := m.Limits(); l.MaxQueues != 3 || l.MaxExchanges != 6 || l.MaxBindings != 2 {
		t.Fatalf("limits %+v", l)
	}

	// Queues.
	var ids []uint64
	for _, n := range []string{"q1", "q2", "q3"} {
		r, _ := metaDo(t, m, qDecl(n), wire.OK, "")
		ids = append(ids, r.QueueID)
	}
	metaDo(t, m, qDecl("q2"), wire.OK, "") // a redeclare creates nothing
	refusedAtLimit(t, m, qDecl("q4"), "max_queues", "--max-queues")
	gen := qDecl("amq.gen-x")
	gen.Generated = true
	refusedAtLimit(t, m, gen, "max_queues", "--max-queues")
	durable := qDecl("q4")
	durable.Queue.Durable = true
	refusedAtLimit(t, m, durable, "max_queues", "--max-queues") // not even the durable warning
	if m.HasQueue("q4") || m.NumQueues() != 3 {
		t.Fatalf("queues after refusals: %v", m.Queues())
	}
	metaDo(t, m, MetaCommand{Op: MetaDeleteQueue, Queue: wire.QueueDeclare{Name: "q1"}, QueueID: ids[0]}, wire.OK, "")
	metaDo(t, m, qDecl("q4"), wire.OK, "")
	refusedAtLimit(t, m, qDecl("q5"), "max_queues", "--max-queues")

	// Exchanges.
	metaDo(t, m, exDecl("x1", wire.ExchangeTopic), wire.OK, "")
	metaDo(t, m, exDecl("x2", wire.ExchangeDirect), wire.OK, "")
	metaDo(t, m, exDecl("x2", wire.ExchangeDirect), wire.OK, "")
	refusedAtLimit(t, m, exDecl("x3", wire.ExchangeFanout), "max_exchanges", "--max-exchanges")
	metaDo(t, m, MetaCommand{Op: MetaDeleteExchange, Delete: wire.ExchangeDelete{Name: "x2"}, Admin: true}, wire.OK, "")
	metaDo(t, m, exDecl("x3", wire.ExchangeFanout), wire.OK, "")
	refusedAtLimit(t, m, exDecl("x4", wire.ExchangeFanout), "max_exchanges", "--max-exchanges")

	// Bindings.
	metaDo(t, m, bindCmd("x1", "q2", "a"), wire.OK, "")
	metaDo(t, m, bindCmd("x1", "q3", "a"), wire.OK, "")
	metaDo(t, m, bindCmd("x1", "q3", "a"), wire.OK, "") // exists: nothing new
	refusedAtLimit(t, m, bindCmd("x1", "q4", "a"), "max_bindings", "--max-bindings")
	refusedAtLimit(t, m, bindCmd("x1", "q2", "b"), "max_bindings", "--max-bindings")
	unbind := bindCmd("x1", "q2", "a")
	unbind.Bind.Unbind, unbind.Admin = true, true
	metaDo(t, m, unbind, wire.OK, "")
	metaDo(t, m, bindCmd("x1", "q4", "a"), wire.OK, "")
	refusedAtLimit(t, m, bindCmd("x3", "q4", ""), "max_bindings", "--max-bindings")
	// Deleting a queue frees its bindings' room too.
	metaDo(t, m, MetaCommand{Op: MetaDeleteQueue, Queue: wire.QueueDeclare{Name: "q4"}, QueueID: mustQueueID(t, m, "q4")}, wire.OK, "")
	metaDo(t, m, bindCmd("x3", "q3", ""), wire.OK, "")

	// The limits are configuration, not state: a restored snapshot keeps
	// the machine's own, and a snapshot holding more than they allow is
	// restored whole (only new entities are refused).
	big := NewMeta(2)
	for _, n := range []string{"a", "b", "c", "d", "e"} {
		metaDo(t, big, qDecl(n), wire.OK, "")
	}
	small := NewMetaWithLimits(2, MetaLimits{MaxQueues: 2})
	if err := small.Restore(big.Snapshot()); err != nil {
		t.Fatal(err)
	}
	if small.NumQueues() != 5 || small.Limits().MaxQueues != 2 {
		t.Fatalf("restored %d queues, limit %d", small.NumQueues(), small.Limits().MaxQueues)
	}
	refusedAtLimit(t, small, qDecl("f"), "max_queues", "--max-queues")
}

// TestMetaLimitDefaults: zero limits take the defaults, which are bounded
// and leave room for the 100,000-queue benchmark.
func TestMetaLimitDefaults(t *testing.T) {
	for _, l := range []MetaLimits{NewMeta(1).Limits(), NewMetaWithLimits(1, MetaLimits{}).Limits()} {
		if l != DefaultMetaLimits {
			t.Fatalf("limits %+v, want the defaults %+v", l, DefaultMetaLimits)
		}
	}
	d := DefaultMetaLimits
	if d.MaxQueues < 100000 || d.MaxBindings < 100000 || d.MaxExchanges < 1000 {
		t.Fatalf("defaults %+v too small for the topology benchmark", d)
	}
	if d.MaxQueues > 10000000 || d.MaxBindings > 100000000 || d.MaxExchanges > 10000000 {
		t.Fatalf("defaults %+v: not a bound", d)
	}
}

func mustQueueID(t *testing.T, m *Meta, name string) uint64 {
	t.Helper()
	id, ok := m.QueueID(name)
	if !ok {
		t.Fatalf("no queue %q", name)
	}
	return id
}

// TestMetaLimitsDoNotCutRecovery: the limits gate new entities, not the
// recovery of logged ones: a node restarted with a lower max_queues than
// it ran with recovers every durable queue, and refuses the next.
func TestMetaLimitsDoNotCutRecovery(t *testing.T) {
	fs := segment.NewMemFS()
	open := func(limits MetaLimits) (*Broker, *segment.Log) {
		l, store := openLogStore(t, fs)
		b := New(Config{Shards: 2, Limits: limits})
		b.Start()
		if err := b.OpenMetaLog(t.Context(), MetaLogConfig{Log: l, Snapshots: store}); err != nil {
			t.Fatal(err)
		}
		return b, l
	}
	b, l := open(MetaLimits{})
	for _, n := range []string{"d1", "d2", "d3"} {
		if _, err := b.topo.declareQueue(&wire.QueueDeclare{Name: n, Durable: true}, 0, ""); err != nil {
			t.Fatal(err)
		}
	}
	(&metaNode{b: b, log: l}).close(t)

	b, l = open(MetaLimits{MaxQueues: 2})
	defer (&metaNode{b: b, log: l}).close(t)
	if got := topoSummary(b); strings.Count(got, "queue d") != 3 {
		t.Fatalf("recovered with max_queues 2:\n%s", got)
	}
	_, err := b.topo.declareQueue(&wire.QueueDeclare{Name: "d4", Durable: true}, 0, "")
	if wire.CodeOf(err) != wire.LimitReached {
		t.Fatalf("declare over the limit after recovery: %v", err)
	}
}

// TestMetaExclusivePerConnection: a connection owns at most
// MaxExclusivePerConn exclusive queues: the next is refused with
// limit_reached naming the limit and its flag, and nothing is created;
// other connections, and its own non-exclusive queues, are not held back;
// deleting one (or the node restarting) frees room; the count survives a
// snapshot and restore.
func TestMetaExclusivePerConnection(t *testing.T) {
	m := NewMetaWithLimits(2, MetaLimits{MaxExclusivePerConn: 2})
	excl := func(name string, conn uint64) MetaCommand {
		c := qDecl(name)
		c.Queue.Exclusive, c.Conn = true, conn
		return c
	}
	const flag = "--max-exclusive-queues-per-connection"
	metaDo(t, m, excl("e1", 7), wire.OK, "")
	metaDo(t, m, excl("e2", 7), wire.OK, "")
	metaDo(t, m, excl("e2", 7), wire.OK, "") // a redeclare creates nothing
	refusedAtLimit(t, m, excl("e3", 7), "max_exclusive_queues_per_connection", flag)
	metaDo(t, m, excl("f1", 8), wire.OK, "")
	plain := qDecl("p1")
	plain.Conn = 7
	metaDo(t, m, plain, wire.OK, "")

	r := NewMetaWithLimits(2, MetaLimits{MaxExclusivePerConn: 2})
	if err := r.Restore(m.Snapshot()); err != nil {
		t.Fatal(err)
	}
	refusedAtLimit(t, r, excl("e3", 7), "max_exclusive_queues_per_connection", flag)

	metaDo(t, m, MetaCommand{Op: MetaDeleteQueue, Queue: wire.QueueDeclare{Name: "e1"}, QueueID: mustQueueID(t, m, "e1")}, wire.OK, "")
	metaDo(t, m, excl("e3", 7), wire.OK, "")
	refusedAtLimit(t, m, excl("e4", 7), "max_exclusive_queues_per_connection", flag)
	// A restart drops every exclusive queue, and with them the counts.
	metaDo(t, m, MetaCommand{Op: MetaNodeUp}, wire.OK, "")
	metaDo(t, m, excl("e4", 7), wire.OK, "")
	metaDo(t, m, excl("e5", 7), wire.OK, "")
}
