package broker

import (
	"bytes"
	"math/rand/v2"
	"reflect"
	"strconv"
	"strings"
	"testing"

	"github.com/warren-mq/warren/queue"
	"github.com/warren-mq/warren/replication"
	"github.com/warren-mq/warren/wire"
)

var _ replication.StateMachine = (*MetaMachine)(nil)

func metaDo(t *testing.T, m *Meta, c MetaCommand, wantCode wire.Code, wantReason string) (MetaResult, []MetaEffect) {
	t.Helper()
	r, effs := m.Apply(&c)
	if r.Code != wantCode || !strings.Contains(r.Reason, wantReason) {
		t.Fatalf("op %d: got %v %q, want %v containing %q", c.Op, r.Code, r.Reason, wantCode, wantReason)
	}
	if r.Code != wire.OK {
		for _, e := range effs {
			if e.Kind != EffDurableAccepted {
				t.Fatalf("op %d refused but has effect %+v", c.Op, e)
			}
		}
	}
	return r, effs
}

func exDecl(name string, kind wire.ExchangeKind) MetaCommand {
	return MetaCommand{Op: MetaDeclareExchange, Exchange: wire.ExchangeDeclare{Name: name, Kind: kind}}
}

func qDecl(name string) MetaCommand {
	return MetaCommand{Op: MetaDeclareQueue, Queue: wire.QueueDeclare{Name: name}}
}

func bindCmd(src, dst, key string) MetaCommand {
	return MetaCommand{Op: MetaBind, Bind: wire.Bind{Source: src, Destination: dst, RoutingKey: key}}
}

// TestMetaRules: the topology rules, in the pure state machine.
func TestMetaRules(t *testing.T) {
	m := NewMeta(4)
	for _, n := range []string{"amq.direct", "amq.topic", "amq.fanout", "amq.headers"} {
		if _, ok := m.Exchange(n); !ok {
			t.Fatalf("standard exchange %s missing", n)
		}
	}
	// Exchanges: reserved prefix, names, equivalence with its diff.
	metaDo(t, m, exDecl("amq.mine", wire.ExchangeDirect), wire.AccessRefused, "the prefix amq. is reserved")
	metaDo(t, m, exDecl("", wire.ExchangeDirect), wire.NotAllowed, "default exchange")
	metaDo(t, m, exDecl("bad\x01", wire.ExchangeDirect), wire.InvalidArgument, "control character")
	metaDo(t, m, exDecl("amq.topic", wire.ExchangeTopic), wire.PreconditionFailed, "durable is true, the declare asked for false")
	_, effs := metaDo(t, m, exDecl("x", wire.ExchangeTopic), wire.OK, "")
	if len(effs) != 1 || effs[0].Kind != EffExchangeCreated || effs[0].Exchange.Name != "x" || effs[0].Exchange.Kind != wire.ExchangeTopic {
		t.Fatalf("declare effects %+v", effs)
	}
	metaDo(t, m, exDecl("x", wire.ExchangeDirect), wire.PreconditionFailed, "type is topic, the declare asked for direct")
	_, effs = metaDo(t, m, exDecl("x", wire.ExchangeTopic), wire.OK, "")
	if len(effs) != 0 {
		t.Fatalf("an equivalent redeclare has effects %+v", effs)
	}
	pass := exDecl("nope", wire.ExchangeTopic)
	pass.Exchange.Passive = true
	metaDo(t, m, pass, wire.NotFound, `no exchange "nope"`)
	hx := exDecl("h", wire.ExchangeDirect)
	hx.Exchange.Args = wire.Table{{Key: "hash-header", Value: wire.String("k")}}
	metaDo(t, m, hx, wire.InvalidArgument, `exchange argument "hash-header" not supported here`)

	// Queues: generated names, reserved prefix, arguments, exclusivity.
	metaDo(t, m, qDecl("amq.q"), wire.AccessRefused, "declare with an empty name")
	gen := qDecl("amq.gen-abc")
	gen.Generated = true
	r, effs := metaDo(t, m, gen, wire.OK, "")
	if r.Name != "amq.gen-abc" || r.QueueID != 1 || len(effs) != 1 || effs[0].Kind != EffQueueCreated || effs[0].Queue.ID != 1 || effs[0].Shard != m.ShardOf("amq.gen-abc") {
		t.Fatalf("generated declare: %+v %+v", r, effs)
	}
	metaDo(t, m, gen, wire.InternalError, "in use")
	pq := qDecl("")
	pq.Queue.Passive = true
	metaDo(t, m, pq, wire.InvalidArgument, "passive declare needs a name")
	badArgs := qDecl("q")
	badArgs.Queue.Args = wire.Table{{Key: "x-nonsense", Value: wire.Int(1)}}
	metaDo(t, m, badArgs, wire.InvalidArgument, "x-nonsense")
	ex := qDecl("ex")
	ex.Queue.Exclusive, ex.Conn, ex.User = true, 7, "alice"
	metaDo(t, m, ex, wire.OK, "")
	other := ex
	other.Conn = 8
	metaDo(t, m, other, wire.ResourceLocked, "exclusive to another connection")
	r, _ = metaDo(t, m, ex, wire.OK, "")
	if r.QueueID != 2 {
		t.Fatalf("redeclare answered id %d, want 2", r.QueueID)
	}
	diff := ex
	diff.Queue.Durable = true
	metaDo(t, m, diff, wire.PreconditionFailed, "durable is false, the declare asked for true")
	metaDo(t, m, qDecl("q"), wire.OK, "")

	// Bindings: ends must exist, x-match, idempotent bind, unbind rights.
	metaDo(t, m, bindCmd("", "q", "k"), wire.NotAllowed, "default exchange")
	metaDo(t, m, bindCmd("nope", "q", "k"), wire.NotFound, `no exchange "nope"`)
	metaDo(t, m, bindCmd("x", "nope", "k"), wire.NotFound, `no queue "nope"`)
	hb := bindCmd("amq.headers", "q", "")
	hb.Bind.Args = wire.Table{{Key: "x-match", Value: wire.String("anyy")}}
	metaDo(t, m, hb, wire.InvalidArgument, "x-match")
	b := bindCmd("x", "q", "a.*")
	b.User = "alice"
	_, effs = metaDo(t, m, b, wire.OK, "")
	if len(effs) != 1 || effs[0].Kind != EffBindingAdded || effs[0].Binding.Key != "a.*" {
		t.Fatalf("bind effects %+v", effs)
	}
	if _, effs = metaDo(t, m, b, wire.OK, ""); len(effs) != 0 {
		t.Fatalf("a second identical bind has effects %+v", effs)
	}
	ub := b
	ub.Bind.Unbind, ub.User = true, "bob"
	metaDo(t, m, ub, wire.AccessRefused, `user "bob" may not unbind the binding from "x" to "q"`)
	ub.User = "alice"
	if _, effs = metaDo(t, m, ub, wire.OK, ""); len(effs) != 1 || effs[0].Kind != EffBindingRemoved {
		t.Fatalf("unbind effects %+v", effs)
	}
	metaDo(t, m, ub, wire.NotFound, "no such binding")

	// Deleting an exchange: rights, if-unused, its bindings go with it.
	metaDo(t, m, b, wire.OK, "")
	xb := bindCmd("amq.direct", "x", "k")
	xb.Bind.ToExchange = true
	metaDo(t, m, xb, wire.OK, "")
	del := MetaCommand{Op: MetaDeleteExchange, Delete: wire.ExchangeDelete{Name: "x", IfUnused: true}, Admin: true}
	metaDo(t, m, del, wire.PreconditionFailed, `exchange "x" has bindings`)
	del.Delete.IfUnused, del.Admin, del.User = false, false, "bob"
	metaDo(t, m, del, wire.AccessRefused, `user "bob" may not delete exchange "x"`)
	metaDo(t, m, MetaCommand{Op: MetaDeleteExchange, Delete: wire.ExchangeDelete{Name: "amq.topic"}, Admin: true}, wire.NotAllowed, "cannot be deleted")
	del.Admin = true
	_, effs = metaDo(t, m, del, wire.OK, "")
	if len(effs) != 1 || effs[0].Kind != EffExchangeRemoved || m.NumBindings() != 0 {
		t.Fatalf("delete effects %+v, %d bindings left", effs, m.NumBindings())
	}

	// Deleting a queue takes its bindings; a stale id deletes nothing.
	metaDo(t, m, bindCmd("amq.direct", "q", "k"), wire.OK, "")
	q, _ := m.Queue("q")
	metaDo(t, m, MetaCommand{Op: MetaDeleteQueue, Queue: wire.QueueDeclare{Name: "q"}, QueueID: q.ID + 1}, wire.NotFound, `no queue "q"`)
	r, effs = metaDo(t, m, MetaCommand{Op: MetaDeleteQueue, Queue: wire.QueueDeclare{Name: "q"}, QueueID: q.ID}, wire.OK, "")
	if !r.Removed || len(effs) != 1 || effs[0].Kind != EffQueueRemoved || effs[0].Queue.ID != q.ID || m.NumBindings() != 0 {
		t.Fatalf("queue delete: %+v %+v, %d bindings", r, effs, m.NumBindings())
	}
	if r, _ = metaDo(t, m, qDecl("q"), wire.OK, ""); r.QueueID != 4 {
		t.Fatalf("a redeclared queue got id %d, want a new one (4)", r.QueueID)
	}
}

// randomMetaCommand draws a command over a small name space, so that
// redeclares, conflicts, unbinds and deletes all happen.
func randomMetaCommand(rng *rand.Rand, now int64, m *Meta) MetaCommand {
	name := func(p string) string { return p + strconv.Itoa(rng.IntN(6)) }
	users := []string{"", "alice", "bob"}
	c := MetaCommand{NowMs: now, User: users[rng.IntN(3)], Admin: rng.IntN(3) == 0, Conn: uint64(rng.IntN(3))}
	switch rng.IntN(9) {
	case 0:
		c.Op = MetaDeclareExchange
		c.Exchange = wire.ExchangeDeclare{Name: name("x"), Kind: wire.ExchangeKind(1 + rng.IntN(4)), Durable: rng.IntN(4) == 0, Passive: rng.IntN(8) == 0}
	case 1:
		c.Op = MetaDeleteExchange
		c.Delete = wire.ExchangeDelete{Name: name("x"), IfUnused: rng.IntN(2) == 0}
	case 2, 3:
		c.Op = MetaDeclareQueue
		c.Queue = wire.QueueDeclare{Name: name("q"), Exclusive: rng.IntN(5) == 0, AutoDelete: rng.IntN(5) == 0, Passive: rng.IntN(8) == 0}
		if rng.IntN(4) == 0 {
			c.Queue.Args = wire.Table{{Key: "x-max-length", Value: wire.Int(int64(1 + rng.IntN(2)))}}
		}
		if rng.IntN(10) == 0 {
			c.Queue.Name, c.Generated, c.Queue.Passive = "amq.gen-"+strconv.Itoa(int(now)), true, false
		}
	case 4:
		c.Op = MetaDeleteQueue
		c.Queue.Name = name("q")
		if q, ok := m.Queue(c.Queue.Name); ok {
			c.QueueID = q.ID
		}
	default:
		c.Op = MetaBind
		srcs := []string{"amq.direct", "amq.topic", "amq.headers", name("x")}
		c.Bind = wire.Bind{Source: srcs[rng.IntN(len(srcs))], Destination: name("q"), RoutingKey: "k" + strconv.Itoa(rng.IntN(2)), Unbind: rng.IntN(3) == 0}
		if rng.IntN(4) == 0 {
			c.Bind.ToExchange, c.Bind.Destination = true, name("x")
		}
		if rng.IntN(5) == 0 {
			c.Bind.Args = wire.Table{{Key: "x-match", Value: wire.String([]string{"all", "any", "nay"}[rng.IntN(3)])}}
		}
	}
	return c
}

// TestMetaSnapshotRestore: snapshot → restore → snapshot gives the same
// bytes, and a restored Meta answers every later command as the original
// does, with the same effects.
func TestMetaSnapshotRestore(t *testing.T) {
	for seed := uint64(1); seed <= 20; seed++ {
		rng := rand.New(rand.NewPCG(seed, 7))
		a := NewMeta(4)
		for i := 0; i < 300; i++ {
			c := randomMetaCommand(rng, int64(i), a)
			a.Apply(&c)
		}
		snap := a.Snapshot()
		b := NewMeta(4)
		if err := b.Restore(snap); err != nil {
			t.Fatalf("seed %d: restore: %v", seed, err)
		}
		if again := b.Snapshot(); !bytes.Equal(snap, again) {
			t.Fatalf("seed %d: snapshot after restore differs (%d vs %d bytes)", seed, len(snap), len(again))
		}
		if a.NumBindings() == 0 || a.NumQueues() == 0 {
			t.Fatalf("seed %d: the workload left no queues or bindings: a weak test", seed)
		}
		for i := 300; i < 600; i++ {
			c := randomMetaCommand(rng, int64(i), a)
			ra, ea := a.Apply(&c)
			rb, eb := b.Apply(&c)
			if !reflect.DeepEqual(ra, rb) || !reflect.DeepEqual(ea, eb) {
				t.Fatalf("seed %d, command %d %+v: original answers %+v %+v, restored %+v %+v", seed, i, c, ra, ea, rb, eb)
			}
		}
		if !bytes.Equal(a.Snapshot(), b.Snapshot()) {
			t.Fatalf("seed %d: snapshots differ after the same commands", seed)
		}
	}
}

// TestMetaRestoreRefusesBadSnapshots: a corrupt snapshot is an error and
// leaves the state as it was.
func TestMetaRestoreRefusesBadSnapshots(t *testing.T) {
	m := NewMeta(1)
	metaDo(t, m, qDecl("q"), wire.OK, "")
	metaDo(t, m, bindCmd("amq.direct", "q", "k"), wire.OK, "")
	snap := m.Snapshot()
	before := append([]byte(nil), snap...)
	for i := 0; i < len(snap); i++ {
		if err := NewMeta(1).Restore(snap[:i]); err == nil {
			t.Fatalf("a snapshot cut to %d of %d bytes restored", i, len(snap))
		}
	}
	bad := append([]byte{MetaSnapshotVersion + 1}, snap[1:]...)
	if err := m.Restore(bad); err == nil || !strings.Contains(err.Error(), "version") {
		t.Fatalf("restore of another version: %v", err)
	}
	if !bytes.Equal(m.Snapshot(), before) {
		t.Fatal("a refused restore changed the state")
	}
}

// metaCodecSeeds are commands of every kind with every field set.
func metaCodecSeeds() []MetaCommand {
	args := wire.Table{{Key: "x-match", Value: wire.String("any")}, {Key: "n", Value: wire.Int(-3)}}
	return []MetaCommand{
		{Op: MetaDeclareExchange, NowMs: 1700000000123, User: "alice", Admin: true, Conn: 9,
			Exchange: wire.ExchangeDeclare{Name: "x", Kind: wire.ExchangeConsistentHash, Durable: true, AutoDelete: true, Internal: true, Passive: true, Alternate: "alt",
				Args: wire.Table{{Key: "hash-header", Value: wire.String("h")}}}},
		{Op: MetaDeleteExchange, NowMs: -1, User: "bob", Delete: wire.ExchangeDelete{Name: "x", IfUnused: true}},
		{Op: MetaDeclareQueue, NowMs: 5, Conn: 1 << 60, Queue: wire.QueueDeclare{Name: "amq.gen-xyz", Durable: true, Exclusive: true, AutoDelete: true,
			Args: wire.Table{{Key: "x-max-length", Value: wire.Int(10)}}}, Generated: true},
		{Op: MetaDeclareQueue, Queue: wire.QueueDeclare{Name: "p", Passive: true}},
		{Op: MetaDeleteQueue, Queue: wire.QueueDeclare{Name: "q"}, QueueID: 42},
		{Op: MetaBind, User: "u", Bind: wire.Bind{Source: "amq.headers", Destination: "q", RoutingKey: "a.#", Args: args}},
		{Op: MetaBind, Bind: wire.Bind{Unbind: true, ToExchange: true, Source: "s", Destination: "d", RoutingKey: "\x00\xff"}},
		{Op: MetaPutUser, Admin: true, Account: MetaUser{Name: "carol", PasswordHash: "$2a$10$x", Tags: []string{"administrator"}}, IfAbsent: true},
		{Op: MetaPutUser, Account: MetaUser{Name: "dave", PasswordHash: "h"}},
		{Op: MetaDeleteUser, Account: MetaUser{Name: "carol"}},
		{Op: MetaPutVhost, Admin: true, Vhost: MetaVhost{Name: "v", MaxQueues: 3, MaxConnections: 1 << 40}, IfAbsent: true},
		{Op: MetaDeleteVhost, Admin: true, Vhost: MetaVhost{Name: "v"}},
		{Op: MetaDeclareQueue, User: "u", Conn: 2<<32 | 1, Queue: wire.QueueDeclare{Name: "t", Exclusive: true}, Home: 2, HomeInc: 1 << 61},
		{Op: MetaDropHome, Home: 3, HomeInc: 9},
		{Op: MetaDropHome, Home: 3},
		{Op: MetaDropHome, Home: 4, HomeInc: 1<<62 | 1, HomeUpTo: true},
	}
}

// TestMetaCommandRoundTrip: every command decodes to what was encoded,
// and any cut or trailing byte is refused.
func TestMetaCommandRoundTrip(t *testing.T) {
	for _, c := range metaCodecSeeds() {
		enc := AppendMetaCommand(nil, &c)
		got, err := DecodeMetaCommand(enc)
		if err != nil {
			t.Fatalf("decode %+v: %v", c, err)
		}
		if !reflect.DeepEqual(got, c) {
			t.Fatalf("round trip:\n got %+v\nwant %+v", got, c)
		}
		for i := 0; i < len(enc); i++ {
			if c.Op == MetaDropHome && i == len(enc)-1 {
				continue // without its flag: as written before it (TestMetaDropHomeWithoutFlag)
			}
			if _, err := DecodeMetaCommand(enc[:i]); err == nil {
				t.Fatalf("op %d cut to %d of %d bytes decoded", c.Op, i, len(enc))
			}
		}
		if _, err := DecodeMetaCommand(append(enc, 0)); err == nil {
			t.Fatalf("op %d with a trailing byte decoded", c.Op)
		}
	}
	bad := AppendMetaCommand(nil, &MetaCommand{Op: MetaDeleteQueue})
	bad[0] = MetaCommandVersion + 1
	if _, err := DecodeMetaCommand(bad); err == nil || !strings.Contains(err.Error(), "version") {
		t.Fatalf("another version: %v", err)
	}
}

// TestMetaDropHomeWithoutFlag: a MetaDropHome written before its
// HomeUpTo flag existed (b09a9d2..4334fcd: version 2, no trailing byte)
// still decodes, with the flag false.
func TestMetaDropHomeWithoutFlag(t *testing.T) {
	c := MetaCommand{Op: MetaDropHome, NowMs: 5, Home: 3, HomeInc: 9}
	enc := AppendMetaCommand(nil, &c)
	got, err := DecodeMetaCommand(enc[:len(enc)-1])
	if err != nil || !reflect.DeepEqual(got, c) {
		t.Fatalf("a drop without its flag: %+v, %v", got, err)
	}
}

// FuzzDecodeMetaCommand: no input panics the decoder, and whatever it
// accepts encodes back to the same bytes.
func FuzzDecodeMetaCommand(f *testing.F) {
	for _, c := range metaCodecSeeds() {
		f.Add(AppendMetaCommand(nil, &c))
	}
	f.Add([]byte{})
	f.Add([]byte{MetaCommandVersion, 99})
	f.Fuzz(func(t *testing.T, b []byte) {
		c, err := DecodeMetaCommand(b)
		if err != nil {
			return
		}
		enc := AppendMetaCommand(nil, &c)
		if c.Op == MetaDropHome && len(enc) == len(b)+1 && !c.HomeUpTo {
			enc = enc[:len(b)] // written before the flag: it reads as false
		}
		if !bytes.Equal(enc, b) {
			t.Fatalf("accepted %x but encodes back to %x", b, enc)
		}
		m := NewMeta(2)
		m.Apply(&c) // any decoded command is safe to apply
	})
}

// TestMetaMachine: the replication adapter decodes, applies, hands the
// effects on, and a restore hands the effects that reach the new state.
func TestMetaMachine(t *testing.T) {
	var got []MetaEffect
	sink := sinkFunc(func(effs []MetaEffect) { got = append(got, effs...) })
	mm := &MetaMachine{Meta: NewMeta(1), Sink: sink}
	c := qDecl("q")
	res, err := mm.Apply(3, AppendMetaCommand(nil, &c))
	if err != nil || res.(MetaResult).QueueID != 1 || len(got) != 1 || got[0].Kind != EffQueueCreated || mm.Applied != 3 {
		t.Fatalf("apply: %v %v %+v", res, err, got)
	}
	if _, err := mm.Apply(4, []byte{MetaCommandVersion}); err == nil {
		t.Fatal("a corrupt entry applied")
	}
	snap, _ := mm.Snapshot()
	b := bindCmd("amq.fanout", "q", "")
	_, _ = mm.Apply(5, AppendMetaCommand(nil, &b))
	c2 := qDecl("r")
	_, _ = mm.Apply(6, AppendMetaCommand(nil, &c2))
	got = nil
	if err := mm.Restore(3, snap); err != nil {
		t.Fatal(err)
	}
	want := []MetaEffect{{Kind: EffQueueRemoved, Queue: MetaQueue{ID: 2, Name: "r"}}, {Kind: EffBindingRemoved, Binding: queue.Binding{Source: "amq.fanout", Destination: "q"}}}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("restore effects\n got %+v\nwant %+v", got, want)
	}
}

type sinkFunc func([]MetaEffect)

func (f sinkFunc) ApplyMetaEffects(effs []MetaEffect) { f(effs) }
