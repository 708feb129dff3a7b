package broker

import (
	"context"
	"reflect"
	"testing"

	"github.com/warren-mq/warren/wire"
)

// TestMetaVhosts: a vhost is a namespace in the one metadata state
// machine: the same queue name in two vhosts is two queues, each vhost
// has its own amq.* exchanges, its max_queues bounds only its queues,
// deleting it removes everything in it (and its permissions), and the
// snapshot keeps the vhosts.
func TestMetaVhosts(t *testing.T) {
	m := NewMeta(4)
	v := func(n string) string { return QualifyName("v", n) }
	metaDo(t, m, qDecl(v("q")), wire.NotFound, `no virtual host "v"`)
	metaDo(t, m, MetaCommand{Op: MetaPutVhost, Vhost: MetaVhost{Name: "v"}}, wire.AccessRefused, "administrator")
	metaDo(t, m, MetaCommand{Op: MetaPutVhost, Admin: true, Vhost: MetaVhost{Name: "a\x1fb"}}, wire.InvalidArgument, "control character")
	_, effs := metaDo(t, m, MetaCommand{Op: MetaPutVhost, Admin: true, Vhost: MetaVhost{Name: "v", MaxQueues: 2}}, wire.OK, "")
	if len(effs) != 5 { // the vhost and its four amq.* exchanges
		t.Fatalf("put vhost effects %+v", effs)
	}
	if _, ok := m.Exchange(v("amq.topic")); !ok {
		t.Fatal("the new vhost has no amq.topic")
	}
	r1, _ := metaDo(t, m, qDecl("q"), wire.OK, "")
	r2, _ := metaDo(t, m, qDecl(v("q")), wire.OK, "")
	if r1.QueueID == r2.QueueID {
		t.Fatalf("queue q in / and in v are one queue (id %d)", r1.QueueID)
	}
	metaDo(t, m, qDecl(v("amq.x")), wire.AccessRefused, "reserved")
	metaDo(t, m, qDecl(v("r")), wire.OK, "")
	metaDo(t, m, qDecl(v("s")), wire.LimitReached, `virtual host "v"`)
	metaDo(t, m, qDecl("s"), wire.OK, "") // "/" has no such limit
	metaDo(t, m, exDecl(v("x"), wire.ExchangeDirect), wire.OK, "")
	metaDo(t, m, bindCmd(v("x"), v("q"), "k"), wire.OK, "")
	metaDo(t, m, MetaCommand{Op: MetaBind, Bind: wire.Bind{Source: v(""), Destination: v("q")}}, wire.NotAllowed, "default exchange")
	metaDo(t, m, MetaCommand{Op: MetaDeleteExchange, Delete: wire.ExchangeDelete{Name: v("amq.direct")}}, wire.NotAllowed, "cannot be deleted")
	metaDo(t, m, MetaCommand{Op: MetaPutUser, Admin: true, Account: MetaUser{Name: "u", PasswordHash: "h"}}, wire.OK, "")
	metaDo(t, m, MetaCommand{Op: MetaSetPermission, Admin: true, Permission: MetaPermission{Vhost: "v", User: "u", Read: ".*"}}, wire.OK, "")
	metaDo(t, m, MetaCommand{Op: MetaSetPermission, Admin: true, Permission: MetaPermission{Vhost: "w", User: "u", Read: ".*"}}, wire.NotFound, `no virtual host "w"`)

	snap := m.Snapshot()
	n := NewMeta(4)
	if err := n.Restore(snap); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(n.Vhosts(), m.Vhosts()) || n.VhostQueues("v") != 2 || n.VhostQueues("/") != 2 {
		t.Fatalf("restored vhosts %+v, queues in v %d, in / %d", n.Vhosts(), n.VhostQueues("v"), n.VhostQueues("/"))
	}

	metaDo(t, m, MetaCommand{Op: MetaDeleteVhost, Admin: true, Vhost: MetaVhost{Name: "/"}}, wire.NotAllowed, "cannot be deleted")
	metaDo(t, m, MetaCommand{Op: MetaDeleteVhost, Admin: true, Vhost: MetaVhost{Name: "v"}}, wire.OK, "")
	for _, q := range m.Queues() {
		if InVhost(q.Name, "v") {
			t.Fatalf("queue %q outlived its vhost", q.Name)
		}
	}
	for _, e := range m.Exchanges() {
		if InVhost(e.Name, "v") {
			t.Fatalf("exchange %q outlived its vhost", e.Name)
		}
	}
	if m.NumBindings() != 0 || len(m.Permissions()) != 0 || m.NumQueues() != 2 {
		t.Fatalf("after the delete: %d bindings, %d permissions, %d queues", m.NumBindings(), len(m.Permissions()), m.NumQueues())
	}
	metaDo(t, m, qDecl(v("q")), wire.NotFound, "no virtual host")
	// A restore to the snapshot brings them back, as effects.
	mm := &MetaMachine{Meta: m}
	var got []MetaEffect
	mm.Sink = sinkFunc(func(e []MetaEffect) { got = append(got, e...) })
	if err := mm.Restore(1, snap); err != nil {
		t.Fatal(err)
	}
	if !hasEffect(got, EffVhostPut, "v") || m.VhostQueues("v") != 2 {
		t.Fatalf("restore effects %+v", got)
	}
}

func hasEffect(effs []MetaEffect, k MetaEffectKind, name string) bool {
	for _, e := range effs {
		if e.Kind == k && e.Name == name {
			return true
		}
	}
	return false
}

// TestVhostRouting: a vhost's default exchange routes to that vhost's
// queue of the key's name, dead letters go to the dead-letter exchange of
// the queue's vhost, and deleting a vhost through the broker deletes its
// queues.
func TestVhostRouting(t *testing.T) {
	b := startBroker(t, Config{Shards: 2})
	ctx := context.Background()
	if err := b.PutVhost(ctx, MetaVhost{Name: "v"}); err != nil {
		t.Fatal(err)
	}
	qa, err := b.DeclareQueueAs(&wire.QueueDeclare{Name: "q"}, 0, "")
	if err != nil {
		t.Fatal(err)
	}
	qb, err := b.DeclareQueueAs(&wire.QueueDeclare{Name: QualifyName("v", "q")}, 0, "")
	if err != nil {
		t.Fatal(err)
	}
	gen, err := b.DeclareQueueAs(&wire.QueueDeclare{Name: QualifyName("v", "")}, 0, "")
	if err != nil || VhostOf(gen.Name()) != "v" || LocalName(gen.Name())[:8] != "amq.gen-" {
		t.Fatalf("a generated name in v: %v %q", err, gen.Name())
	}
	view := b.View()
	for _, c := range []struct {
		ex   string
		want *Queue
	}{{"", qa}, {QualifyName("v", ""), qb}} {
		refs, ok := view.Table.Route(nil, c.ex, []byte("q"), nil)
		if !ok || len(refs) != 1 || view.Queue(refs[0]) != c.want {
			t.Fatalf("route via %q: %v %v", c.ex, refs, ok)
		}
	}
	if refs, _ := view.Table.Route(nil, QualifyName("w", ""), []byte("q"), nil); len(refs) != 0 {
		t.Fatalf("another vhost's default exchange reached %v", refs)
	}
	if q := b.LookupQueue(QualifyName("/", QualifyName("v", "q"))); q != nil {
		t.Fatalf("a name holding the separator, given in /, found %q", q.Name())
	}
	if err := b.DeleteVhost(ctx, "v"); err != nil {
		t.Fatal(err)
	}
	if b.LookupQueue(QualifyName("v", "q")) != nil || b.LookupQueue("q") != qa || !qb.Gone() && !qb.deleted.Load() {
		t.Fatal("deleting v did not delete exactly its queues")
	}
	if err := b.DeleteVhost(ctx, "v"); wire.CodeOf(err) != wire.NotFound {
		t.Fatalf("deleting it again: %v", err)
	}
}

// TestLocalText: refusals built from internal names read as the client's.
func TestLocalText(t *testing.T) {
	for in, want := range map[string]string{
		`no queue "v\x1fq"`:                  `no queue "q"`,
		`from "a\x1fx" to "a\x1fy" (is "/")`: `from "x" to "y" (is "/")`,
		`plain "q"`:                          `plain "q"`,
	} {
		if got := LocalText(in); got != want {
			t.Errorf("LocalText(%s) = %s, want %s", in, got, want)
		}
	}
}
