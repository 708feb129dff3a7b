package broker

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/warren-mq/warren/replication"
	"github.com/warren-mq/warren/segment"
	"github.com/warren-mq/warren/wire"
)

// metaNode is a broker whose topology is logged in a segment.Log on fs
// (design §4: the metadata group), as warrend runs it with --data.
type metaNode struct {
	b   *Broker
	log *segment.Log
}

// openLogStore opens the log in /data of fs and its snapshot store.
func openLogStore(t *testing.T, fs segment.FS) (*segment.Log, *replication.SnapStore) {
	t.Helper()
	l, err := segment.Open(fs, "/data", segment.Options{})
	if err != nil {
		t.Fatal(err)
	}
	store, err := replication.OpenSnapStore(l)
	if err != nil {
		t.Fatal(err)
	}
	return l, store
}

func openMetaNode(t *testing.T, fs segment.FS, snapEvery int) *metaNode {
	t.Helper()
	l, store := openLogStore(t, fs)
	b := New(Config{Shards: 2})
	b.Start()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := b.OpenMetaLog(ctx, MetaLogConfig{Log: l, Snapshots: store, SnapshotEntries: snapEvery}); err != nil {
		t.Fatal(err)
	}
	return &metaNode{b: b, log: l}
}

func (n *metaNode) close(t *testing.T) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := n.b.CloseMetaLog(ctx); err != nil {
		t.Fatal(err)
	}
	if err := n.b.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if err := n.log.Close(); err != nil {
		t.Fatal(err)
	}
}

// topoSummary lists what the metadata state machine holds, one line per
// exchange, queue (with its durable flag and arguments) and binding.
func topoSummary(b *Broker) string {
	t := b.topo
	t.mu.Lock()
	defer t.mu.Unlock()
	var sb strings.Builder
	for _, e := range t.meta.Exchanges() {
		fmt.Fprintf(&sb, "exchange %s %v durable=%v\n", e.Name, e.Kind, e.Durable)
	}
	for _, q := range t.meta.Queues() {
		fmt.Fprintf(&sb, "queue %s durable=%v max-length=%d\n", q.Name, q.Decl.Durable, q.Args.MaxLength)
	}
	for _, x := range t.meta.Bindings() {
		fmt.Fprintf(&sb, "binding %s -> %s (x=%v) %q\n", x.Source, x.Destination, x.ToExchange, x.Key)
	}
	return sb.String()
}

// declareMix declares durable and non-durable exchanges, queues (one
// exclusive) and bindings between them through the requests a connection
// makes, in one control run.
func declareMix(t *testing.T, b *Broker) {
	t.Helper()
	maxLen := wire.Table{{Key: "max-length", Value: wire.Int(10)}}
	b.BeginControlRun()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(b.DeclareExchangeAs(&wire.ExchangeDeclare{Name: "dx", Kind: wire.ExchangeTopic, Durable: true}, "u"))
	must(b.DeclareExchangeAs(&wire.ExchangeDeclare{Name: "dx2", Kind: wire.ExchangeFanout, Durable: true}, "u"))
	must(b.DeclareExchangeAs(&wire.ExchangeDeclare{Name: "tx", Kind: wire.ExchangeDirect}, "u"))
	_, err := b.DeclareQueueAs(&wire.QueueDeclare{Name: "dq", Durable: true, Args: maxLen}, 7, "u")
	must(err)
	_, err = b.DeclareQueueAs(&wire.QueueDeclare{Name: "tq"}, 7, "u")
	must(err)
	_, err = b.DeclareQueueAs(&wire.QueueDeclare{Name: "eq", Durable: true, Exclusive: true}, 7, "u")
	must(err)
	who := Requester{User: "u", Conn: 7}
	must(b.BindAs(&wire.Bind{Source: "dx", Destination: "dq", RoutingKey: "a.*"}, who))
	must(b.BindAs(&wire.Bind{Source: "dx", Destination: "dx2", ToExchange: true, RoutingKey: "#"}, who))
	must(b.BindAs(&wire.Bind{Source: "amq.direct", Destination: "dq", RoutingKey: "k"}, who))
	must(b.BindAs(&wire.Bind{Source: "tx", Destination: "dq", RoutingKey: "t"}, who))
	must(b.BindAs(&wire.Bind{Source: "dx", Destination: "tq", RoutingKey: "b"}, who))
	must(b.BindAs(&wire.Bind{Source: "dx", Destination: "eq", RoutingKey: "c"}, who))
	must(b.EndControlRun(0))
}

const wantDurableOnly = `exchange amq.direct direct durable=true
exchange amq.fanout fanout durable=true
exchange amq.headers headers durable=true
exchange amq.topic topic durable=true
exchange dx topic durable=true
exchange dx2 fanout durable=true
queue dq durable=true max-length=10
binding amq.direct -> dq (x=false) "k"
binding dx -> dq (x=false) "a.*"
binding dx -> dx2 (x=true) "#"
`

// TestMetaLogRestartKeepsDurableTopology: after a clean stop and a reopen
// of the same log, the durable exchanges, queues (with their arguments)
// and the bindings between durable ends exist; the non-durable ones, the
// exclusive queue and every binding touching them are gone, and routing
// works on what was recovered.
func TestMetaLogRestartKeepsDurableTopology(t *testing.T) {
	fs := segment.NewMemFS()
	n := openMetaNode(t, fs, 0)
	declareMix(t, n.b)
	if got := topoSummary(n.b); !strings.Contains(got, "queue tq") || !strings.Contains(got, "exchange tx") {
		t.Fatalf("before the restart everything is there:\n%s", got)
	}
	n.close(t)

	n = openMetaNode(t, fs, 0)
	if got := topoSummary(n.b); got != wantDurableOnly {
		t.Fatalf("after the restart:\n%s\nwant:\n%s", got, wantDurableOnly)
	}
	v := n.b.View()
	refs, _ := v.Table.Route(nil, "dx", []byte("a.b"), nil)
	if len(refs) != 1 || v.Queue(refs[0]) == nil || v.Queue(refs[0]).Name() != "dq" {
		t.Fatalf("dx a.b routes to %v, want dq", refs)
	}
	// A second restart recovers the same (the drop was logged, not redone
	// from a stale log), and a name freed by the drop can be declared anew.
	if _, err := n.b.DeclareQueue(wire.QueueDeclare{Name: "tq", Durable: true}); err != nil {
		t.Fatal(err)
	}
	n.close(t)
	n = openMetaNode(t, fs, 0)
	if got := topoSummary(n.b); !strings.Contains(got, "queue tq durable=true") {
		t.Fatalf("the durable tq declared after the first restart is lost:\n%s", got)
	}
	n.close(t)
}

// TestMetaLogCrashKeepsAnsweredDeclares: a crash (unsynced writes lost)
// right after a control run was answered keeps everything the run did.
func TestMetaLogCrashKeepsAnsweredDeclares(t *testing.T) {
	fs := segment.NewMemFS()
	n := openMetaNode(t, fs, 0)
	declareMix(t, n.b)
	crashed := fs.Crash(0)
	n.close(t)

	n = openMetaNode(t, crashed, 0)
	defer n.close(t)
	if got := topoSummary(n.b); got != wantDurableOnly {
		t.Fatalf("after the crash:\n%s\nwant:\n%s", got, wantDurableOnly)
	}
}

// TestMetaLogBounded: many declare/bind/delete cycles, each its own
// answered request, leave a metadata log of bounded length (snapshots and
// compaction), and the state recovers.
func TestMetaLogBounded(t *testing.T) {
	fs := segment.NewMemFS()
	const snapEvery = 50
	n := openMetaNode(t, fs, snapEvery)
	ctx := context.Background()
	most := uint64(0)
	for i := range 2000 {
		name := fmt.Sprintf("q%d", i%7)
		if _, err := n.b.DeclareQueue(wire.QueueDeclare{Name: name, Durable: true}); err != nil {
			t.Fatal(err)
		}
		if err := n.b.Bind(wire.Bind{Source: "amq.topic", Destination: name, RoutingKey: "r"}); err != nil {
			t.Fatal(err)
		}
		if _, err := n.b.DeleteQueue(ctx, name, false, false); err != nil {
			t.Fatal(err)
		}
		g := uint64(replication.MetaGroupID)
		most = max(most, n.log.LastIndex(g)-n.log.FirstIndex(g)+1)
	}
	if most > 4*snapEvery {
		t.Fatalf("the metadata log held up to %d entries over 6,000 requests (snapshot every %d)", most, snapEvery)
	}
	if _, err := n.b.DeclareQueue(wire.QueueDeclare{Name: "last", Durable: true}); err != nil {
		t.Fatal(err)
	}
	n.close(t)
	n = openMetaNode(t, fs, snapEvery)
	defer n.close(t)
	if got := topoSummary(n.b); !strings.Contains(got, "queue last durable=true") || strings.Contains(got, "queue q") {
		t.Fatalf("recovered:\n%s", got)
	}
	t.Logf("longest metadata log: %d entries", most)
}

// TestMetaLogOneEntryPerControlRun: a run of control requests (what one
// connection pipelines) is written as one entry of the metadata log, one
// fdatasync, not one per request.
func TestMetaLogOneEntryPerControlRun(t *testing.T) {
	n := openMetaNode(t, segment.NewMemFS(), 0)
	defer n.close(t)
	g := uint64(replication.MetaGroupID)
	before := n.log.LastIndex(g)
	n.b.BeginControlRun()
	for i := range 500 {
		name := fmt.Sprintf("q%d", i)
		if _, err := n.b.DeclareQueueAs(&wire.QueueDeclare{Name: name, Durable: true}, 1, "u"); err != nil {
			t.Fatal(err)
		}
		if err := n.b.BindAs(&wire.Bind{Source: "amq.topic", Destination: name, RoutingKey: name}, Requester{User: "u", Conn: 1}); err != nil {
			t.Fatal(err)
		}
	}
	if err := n.b.EndControlRun(0); err != nil {
		t.Fatal(err)
	}
	if got := n.log.LastIndex(g) - before; got != 1 {
		t.Fatalf("a control run of 1,000 requests wrote %d entries, want 1", got)
	}
}

// TestMetaLogWriteFailureStops: when the metadata log cannot be written
// (an fsync fails), the run's end reports it instead of answering, the
// node is told (Fatal: warrend exits non-zero), later requests are
// refused, and a restart recovers what was on disk before.
func TestMetaLogWriteFailureStops(t *testing.T) {
	fs := segment.NewMemFS()
	n := openMetaNode(t, fs, 0)
	if _, err := n.b.DeclareQueue(wire.QueueDeclare{Name: "before", Durable: true}); err != nil {
		t.Fatal(err)
	}
	n.close(t)

	l, store := openLogStore(t, fs)
	b := New(Config{Shards: 1})
	b.Start()
	defer b.Stop(context.Background())
	fatal := make(chan error, 1)
	if err := b.OpenMetaLog(context.Background(), MetaLogConfig{Log: l, Snapshots: store, Fatal: func(err error) { fatal <- err }}); err != nil {
		t.Fatal(err)
	}
	fs.FailSync(1)
	b.BeginControlRun()
	if _, err := b.DeclareQueueAs(&wire.QueueDeclare{Name: "lost", Durable: true}, 1, "u"); err != nil {
		t.Fatal(err)
	}
	if err := b.EndControlRun(0); err == nil {
		t.Fatal("the run ended without an error though its change was not written")
	}
	select {
	case err := <-fatal:
		if !errors.Is(err, segment.ErrStopped) {
			t.Fatalf("Fatal got %v, want segment.ErrStopped", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Fatal was not called")
	}
	if _, err := b.DeclareQueue(wire.QueueDeclare{Name: "after", Durable: true}); err == nil {
		t.Fatal("a declare after the failure was answered")
	}
	_ = b.CloseMetaLog(context.Background())
	_ = l.Close()

	n = openMetaNode(t, fs.Crash(0), 0)
	defer n.close(t)
	if got := topoSummary(n.b); !strings.Contains(got, "queue before durable=true") {
		t.Fatalf("recovered after the failure:\n%s", got)
	}
}

// TestMetaLogRecoveryPublishesRoutesBeforeQueuesOpen: when a node recovers
// its topology, every queue's shard gets the queue's create only once the
// routing view holds the whole recovered topology. A durable queue opened
// earlier replays its log (and expires what is due) against the view of
// before the recovery: its dead letters found no dead-letter exchange and
// were dropped (found by TestCrashSim: "dead letters dropped: no_exchange"
// after recovery, confirmed persistent messages lost). The test holds the
// shard of the second queue created, so the recovery stops there; the
// first queue's create has reached its shard by then.
func TestMetaLogRecoveryPublishesRoutesBeforeQueuesOpen(t *testing.T) {
	fs := segment.NewMemFS()
	n := openMetaNode(t, fs, 0)
	// Two queues on different shards, first and second in the order the
	// recovery creates them (by name).
	var first, second string
	for i := 0; first == "" || second == ""; i++ {
		name := fmt.Sprintf("q%03d", i)
		switch n.b.topo.meta.ShardOf(name) {
		case 0:
			if first == "" {
				first = name
			}
		case 1:
			if first != "" && second == "" {
				second = name
			}
		}
	}
	if err := n.b.DeclareExchange(wire.ExchangeDeclare{Name: "dlx", Kind: wire.ExchangeDirect, Durable: true}); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{first, second} {
		if _, err := n.b.DeclareQueue(wire.QueueDeclare{Name: name, Durable: true}); err != nil {
			t.Fatal(err)
		}
		if err := n.b.Bind(wire.Bind{Source: "dlx", Destination: name, RoutingKey: name}); err != nil {
			t.Fatal(err)
		}
	}
	n.close(t)

	l, err := segment.Open(fs, "/data", segment.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	store, err := replication.OpenSnapStore(l)
	if err != nil {
		t.Fatal(err)
	}
	created := make(chan string, 1) // what the view routed when the first queue's create was applied
	var b *Broker
	b = New(Config{Shards: 2, OnApply: func(_ int, _ int64, c *Command) {
		if c.Kind == CmdCreate && c.Queue.name == first {
			refs, _ := b.View().Table.Route(nil, "dlx", []byte(second), nil)
			created <- fmt.Sprintf("dlx routes %q to %d queue(s)", second, len(refs))
		}
	}})
	b.Start()
	defer b.Stop(context.Background())
	sh := b.shards[1]
	sh.mu.Lock() // the recovery's create of the second queue waits here
	opened := make(chan error, 1)
	go func() { opened <- b.OpenMetaLog(context.Background(), MetaLogConfig{Log: l, Snapshots: store}) }()
	var got string
	select {
	case got = <-created:
	case <-time.After(10 * time.Second):
		sh.mu.Unlock()
		t.Fatal("the first queue's create was not applied")
	}
	sh.mu.Unlock()
	if err := <-opened; err != nil {
		t.Fatal(err)
	}
	defer b.CloseMetaLog(context.Background())
	if want := fmt.Sprintf("dlx routes %q to 1 queue(s)", second); got != want {
		t.Fatalf("when the first recovered queue was created on its shard, %s; want %s (the recovered routes published first)", got, want)
	}
}

// nestedArgs is a table of one entry holding a value nested levels
// tables deep: its encoding nests levels+1 deep (the outer table is one).
func nestedArgs(levels int) wire.Table {
	v := wire.String("leaf")
	for range levels {
		v = wire.Value{Kind: wire.KindTable, Table: wire.Table{{Key: "k", Value: v}}}
	}
	return wire.Table{{Key: "x-match", Value: wire.String("any")}, {Key: "deep", Value: v}}
}

// TestMetaLogDeepArgs: arguments nested deeper than Warren's tables may
// (wire.MaxTableDepth; AMQP's field tables nest to 16) are refused before
// the metadata log: a binding's were logged and the next start failed to
// decode the entry ("table nesting too deep"), so one AMQP client's bind
// kept the node from starting. A log written before, holding one nested
// 16 deep, still decodes.
func TestMetaLogDeepArgs(t *testing.T) {
	fs := segment.NewMemFS()
	n := openMetaNode(t, fs, 0)
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(n.b.DeclareExchangeAs(&wire.ExchangeDeclare{Name: "hx", Kind: wire.ExchangeHeaders, Durable: true}, "u"))
	if _, err := n.b.DeclareQueue(wire.QueueDeclare{Name: "hq", Durable: true}); err != nil {
		t.Fatal(err)
	}
	ok := wire.Bind{Source: "hx", Destination: "hq", Args: nestedArgs(wire.MaxTableDepth - 1)}
	must(n.b.Bind(ok))
	deep := wire.Bind{Source: "hx", Destination: "hq", Args: nestedArgs(wire.MaxTableDepth)}
	err := n.b.Bind(deep)
	var we *wire.Error
	if !errors.As(err, &we) || we.Code != wire.InvalidArgument || !strings.Contains(we.Reason, "levels deep") {
		t.Fatalf("a binding nested %d deep: %v, want invalid_argument", wire.MaxTableDepth+1, err)
	}
	// A binding as deep as an old log's may be (applied as its replay
	// would) can be removed: the unbind is let through (logged, and read
	// back at the restart below); one deeper than any log holds is not.
	old := wire.Bind{Source: "hx", Destination: "hq", Args: nestedArgs(legacyMetaTableDepth - 1)}
	n.b.topo.mu.Lock()
	r := n.b.topo.applyLocked(&MetaCommand{Op: MetaBind, NowMs: 1, Bind: old})
	n.b.topo.mu.Unlock()
	if r.Err() != nil {
		t.Fatal(r.Err())
	}
	n.b.topo.publishIfDirty()
	old.Unbind = true
	if err := n.b.Bind(old); err != nil {
		t.Fatalf("the unbind of a binding nested %d deep: %v", legacyMetaTableDepth, err)
	}
	if err := n.b.Bind(wire.Bind{Source: "hx", Destination: "hq", Unbind: true, Args: nestedArgs(legacyMetaTableDepth)}); !errors.As(err, &we) || we.Code != wire.InvalidArgument {
		t.Fatalf("an unbind nested %d deep: %v, want invalid_argument", legacyMetaTableDepth+1, err)
	}
	err = n.b.DeclareExchangeAs(&wire.ExchangeDeclare{Name: "hx2", Kind: wire.ExchangeHeaders, Durable: true, Args: nestedArgs(wire.MaxTableDepth)}, "u")
	if err == nil || !strings.Contains(err.Error(), "levels deep") {
		t.Fatalf("an exchange declared with arguments nested too deep: %v", err)
	}
	n.close(t)
	n = openMetaNode(t, fs, 0)
	if got := topoSummary(n.b); strings.Count(got, "binding hx -> hq") != 1 {
		t.Fatalf("after the restart, want the binding nested %d deep and not the one unbound:\n%s", wire.MaxTableDepth, got)
	}
	n.close(t)

	// What the AMQP front read (netio/amqp maxTableDepth: 16 below the
	// outer table) and logged before the check still decodes; deeper was
	// never read.
	for _, levels := range []int{16, 17} {
		c := MetaCommand{Op: MetaBind, Bind: wire.Bind{Source: "hx", Destination: "hq", Args: nestedArgs(levels)}}
		got, err := DecodeMetaCommand(AppendMetaCommand(nil, &c))
		if levels == 16 && (err != nil || !reflect.DeepEqual(got.Bind.Args, c.Bind.Args)) {
			t.Fatalf("a logged binding nested %d deep decodes as %v, %v", levels+1, got.Bind.Args, err)
		}
		if levels == 17 && err == nil {
			t.Fatalf("a logged binding nested %d deep decoded", levels+1)
		}
	}
}

// TestArgsLongKey: arguments with a key over 255 bytes (the admin API's
// JSON arguments may have one; both protocols' keys are short strings)
// are refused before anything is encoded: encoding one panicked (the
// admin API's request got no answer but a closed connection).
func TestArgsLongKey(t *testing.T) {
	n := openMetaNode(t, segment.NewMemFS(), 0)
	defer n.close(t)
	long := wire.Table{{Key: strings.Repeat("k", 256), Value: wire.String("v")}}
	if _, err := n.b.DeclareQueue(wire.QueueDeclare{Name: "q", Durable: true}); err != nil {
		t.Fatal(err)
	}
	for what, err := range map[string]error{
		"exchange declare": n.b.DeclareExchangeAs(&wire.ExchangeDeclare{Name: "hx", Kind: wire.ExchangeHeaders, Durable: true, Args: long}, ""),
		"bind":             n.b.Bind(wire.Bind{Source: "amq.headers", Destination: "q", Args: long}),
		"unbind":           n.b.Bind(wire.Bind{Unbind: true, Source: "amq.headers", Destination: "q", Args: long}),
	} {
		var we *wire.Error
		if !errors.As(err, &we) || we.Code != wire.InvalidArgument || !strings.Contains(we.Reason, "key of 256 bytes") {
			t.Errorf("%s with an argument key of 256 bytes: %v, want invalid_argument", what, err)
		}
	}
	if _, err := n.b.DeclareQueue(wire.QueueDeclare{Name: "q2", Durable: true, Args: long}); err == nil {
		t.Errorf("a queue declared with an argument key of 256 bytes")
	}
}

// TestMetaLogLargeControlRun: one control run's changes are one round of
// the metadata log, and a round was one entry: a client's run of 600
// bindings with 60 KiB arguments each (each within MaxBindingArgsLen)
// made an entry of 36 MiB, which the log refuses (segment.MaxEntry, 32
// MiB): the run's end failed ('segment: an entry over 33554432 bytes')
// and the metadata group, so the node, stopped. A round past 4 MiB is
// proposed as several entries; all 600 bindings are there after a
// restart.
func TestMetaLogLargeControlRun(t *testing.T) {
	fs := segment.NewMemFS()
	n := openMetaNode(t, fs, 0)
	if _, err := n.b.DeclareQueue(wire.QueueDeclare{Name: "hq", Durable: true}); err != nil {
		t.Fatal(err)
	}
	val := strings.Repeat("v", 60000)
	// 1,200 × 60 KB: past raft's bound on uncommitted entries (64 MiB)
	// too, which a round that proposed all its chunks before writing any
	// reached (its 17th was dropped, and the node stopped).
	const bindings = 1200
	n.b.BeginControlRun()
	for i := range bindings {
		b := wire.Bind{Source: "amq.headers", Destination: "hq", Args: wire.Table{{Key: "x-match", Value: wire.String("any")}, {Key: fmt.Sprint("k", i), Value: wire.String(val)}}}
		if err := n.b.BindAs(&b, Requester{Admin: true, Conn: 1}); err != nil {
			t.Fatal(err)
		}
	}
	if err := n.b.EndControlRun(1); err != nil {
		t.Fatalf("the run's end: %v", err)
	}
	n.close(t)
	n = openMetaNode(t, fs, 0)
	defer n.close(t)
	if got := len(n.b.Bindings()); got != bindings {
		t.Fatalf("%d bindings after a restart, want %d", got, bindings)
	}
}
