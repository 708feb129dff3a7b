package broker

import (
	"bytes"
	"context"
	"fmt"
	"math"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/warren-mq/warren/segment"
	"github.com/warren-mq/warren/wire"
)

// fuzzGen turns fuzz bytes into the values a front builds from a
// client's input (names, argument tables, users, permissions, vhosts);
// past the end of its bytes it reads zeros.
type fuzzGen struct{ b []byte }

func (g *fuzzGen) byte() byte {
	if len(g.b) == 0 {
		return 0
	}
	v := g.b[0]
	g.b = g.b[1:]
	return v
}

func (g *fuzzGen) bool() bool { return g.byte()&1 != 0 }

func (g *fuzzGen) int(n int) int { return int(g.byte()) % n }

func (g *fuzzGen) u64() uint64 {
	var v uint64
	for range 8 {
		v = v<<8 | uint64(g.byte())
	}
	return v
}

// length is a string's length: mostly short, sometimes at the bounds a
// front may let through (255 bytes: AMQP's shortstr, the native str8;
// longer ones: an admin API path or body, an AMQP longstr).
func (g *fuzzGen) length() int {
	switch g.int(16) {
	case 0:
		return 0
	case 1:
		return 64
	case 2:
		return 65
	case 3:
		return 255
	case 4:
		return 256
	case 5:
		return 1100
	case 6:
		return 65536
	default:
		return 1 + g.int(12)
	}
}

// str is a string of length() bytes from an alphabet that holds a vhost
// separator, a control character, bytes that are no UTF-8 and the
// pattern characters of topic keys and regular expressions.
func (g *fuzzGen) str() string {
	const alpha = "ab.#*/-_\x1f\x00\xff(["
	n := g.length()
	b := make([]byte, n)
	seed := g.byte()
	for i := range b {
		if i < 4 {
			b[i] = alpha[g.int(len(alpha))]
		} else {
			b[i] = alpha[(int(seed)+i)%len(alpha)]
		}
	}
	return string(b)
}

// name is mostly one of a few names (so that commands meet what earlier
// ones made), or any string.
func (g *fuzzGen) name() string {
	names := [...]string{"a", "b", "q", "x", "amq.topic", "amq.direct", "", "v1\x1fa", "v1\x1fq", "dlx"}
	if g.int(4) == 0 {
		return g.str()
	}
	return names[g.int(len(names))]
}

// value is a table value nested up to depth more levels (AMQP field
// tables nest to 16, Warren's to 8).
func (g *fuzzGen) value(depth int) wire.Value {
	k := g.int(11)
	if depth <= 0 && (k == 6 || k == 7) {
		k = 4
	}
	switch k {
	case 0:
		return wire.Null()
	case 1:
		return wire.Bool(g.bool())
	case 2:
		return wire.Int(int64(g.u64()))
	case 3:
		fs := [...]float64{0, -1.5, math.NaN(), math.Inf(1), math.MaxFloat64}
		return wire.Float(fs[g.int(len(fs))])
	case 5:
		return wire.Bytes([]byte(g.str()))
	case 6:
		return wire.TableValue(g.table(depth - 1))
	case 7:
		var vs []wire.Value
		for range g.int(3) {
			vs = append(vs, g.value(depth-1))
		}
		return wire.ArrayValue(vs)
	case 8:
		return wire.Timestamp(int64(g.u64()))
	default:
		return wire.String(g.str())
	}
}

func (g *fuzzGen) table(depth int) wire.Table {
	var t wire.Table
	for range g.int(4) {
		key := g.str()
		if g.int(8) != 0 && len(key) > 255 {
			key = key[:255] // keys are short strings on both protocols, not in JSON
		}
		t = append(t, wire.Field{Key: key, Value: g.value(depth)})
	}
	return t
}

// args are arguments as a front passes them: mostly what the broker knows
// (queue arguments, a headers binding's x-match, hash-header), sometimes
// any table.
func (g *fuzzGen) args() wire.Table {
	switch g.int(5) {
	case 0:
		return nil
	case 1:
		return g.table(g.int(18))
	case 2:
		return wire.Table{{Key: "x-match", Value: wire.String([...]string{"all", "any", "bad"}[g.int(3)])}, {Key: g.str(), Value: g.value(g.int(18))}}
	case 3:
		return wire.Table{{Key: "hash-header", Value: wire.String(g.str())}}
	default:
		ds := wire.QueueArgDescs()
		var t wire.Table
		for range 1 + g.int(3) {
			d := ds[g.int(len(ds))]
			var v wire.Value
			switch g.int(3) {
			case 0:
				v = wire.Int(int64(g.int(4)))
			case 1:
				v = wire.String([...]string{"dlx", "reject-publish", "drop-head", "", "x"}[g.int(5)])
			default:
				v = g.value(1)
			}
			if d.Key == "expires" && v.Kind == wire.KindInt {
				v.Int += 1 << 30 // not within the test: a queue gone unused is no difference
			}
			t = append(t, wire.Field{Key: d.Key, Value: v})
		}
		return t
	}
}

// metaOp runs one topology, user, permission or vhost request on b as a
// front would make it from the generator's input. Refusals are expected.
func (g *fuzzGen) metaOp(b *Broker) {
	ctx := context.Background()
	who := Requester{User: [...]string{"", "u", "v"}[g.int(3)], Admin: g.bool(), Conn: uint64(g.int(3))}
	switch g.int(12) {
	case 0:
		_ = b.DeclareExchangeAs(&wire.ExchangeDeclare{Name: g.name(), Kind: wire.ExchangeKind(1 + g.int(5)),
			Durable: g.int(4) != 0, AutoDelete: g.int(4) == 0, Internal: g.int(4) == 0, Alternate: g.name(), Args: g.args()}, who.User)
	case 1, 2:
		_, _ = b.DeclareQueueAs(&wire.QueueDeclare{Name: g.name(), Durable: g.int(4) != 0, Exclusive: g.int(4) == 0,
			AutoDelete: g.int(4) == 0, Passive: g.int(8) == 0, Args: g.args()}, who.Conn, who.User)
	case 3, 4:
		_ = b.BindAs(&wire.Bind{Source: g.name(), Destination: g.name(), ToExchange: g.bool(), RoutingKey: g.name(),
			Args: g.args(), Unbind: g.int(4) == 0}, who)
	case 5:
		_ = b.DeleteExchangeAs(&wire.ExchangeDelete{Name: g.name(), IfUnused: g.bool()}, who)
	case 6:
		if q, ok := b.Queue(g.name()); ok && g.bool() {
			_, _ = b.DeleteQueue(ctx, q.Name, false, false)
		}
	case 7:
		u := MetaUser{Name: g.name(), PasswordHash: g.str()}
		for range [...]int{0, 1, 3, 16, 17, 256, 300}[g.int(7)] {
			u.Tags = append(u.Tags, g.str())
		}
		_ = b.PutUser(ctx, u)
	case 8:
		_ = b.DeleteUser(ctx, g.name())
	case 9:
		p := MetaPermission{Vhost: [...]string{"/", "v1", "nope"}[g.int(3)], User: g.name(), Configure: g.str(), Write: ".*", Read: g.str()}
		if g.int(4) == 0 {
			_ = b.ClearPermission(ctx, p.Vhost, p.User)
		} else {
			_ = b.SetPermission(ctx, p)
		}
	case 10:
		v := MetaVhost{Name: [...]string{"v1", "v2"}[g.int(2)], MaxQueues: int64(g.int(4)) - 1, MaxConnections: int64(g.int(3))}
		if g.int(4) == 0 {
			v.Name = g.str()
		}
		_ = b.PutVhost(ctx, v)
	case 11:
		_ = b.DeleteVhost(ctx, [...]string{"v1", "v2", "/"}[g.int(3)])
	}
}

// metaSnapshotAfterUp is the snapshot of m's state once a restart has
// dropped what does not outlive one (a NodeUp, as OpenMetaLog logs).
func metaSnapshotAfterUp(t *testing.T, m *Meta) []byte {
	t.Helper()
	n := NewMetaWithLimits(2, noMetaLimits)
	if err := n.Restore(m.Snapshot()); err != nil {
		t.Fatalf("the live metadata state does not restore from its own snapshot: %v", err)
	}
	n.Apply(&MetaCommand{Op: MetaNodeUp})
	return n.Snapshot()
}

// FuzzMetaLog: topology, users, permissions and vhosts requested as the
// fronts make them from a client's input (names of any length and bytes,
// argument tables of every kind nested to 17 levels, users with hundreds
// of tags, patterns that are no regular expression), against a broker
// that logs its metadata. Every command that reaches the metadata state
// machine must decode as it was encoded (in a cluster it is logged before
// the machine sees it, refused or not), and the broker must start again
// from its log with the state it had (less what a restart drops).
func FuzzMetaLog(f *testing.F) {
	for _, s := range []string{
		"",
		"\x00\x00\x00\x00\x01\x02\x03\x04\x05\x06\x07\x08\x09\x0a\x0b",
		"\x07\x01\x05\x02\x03\x04\x05\x06\x07\x00\x01\x02",
		"\x01\x00\x02\x04\x01\x01\x03\x03\x00\x02\x00\x03\x06\x06\x06\x06\x06\x06\x06\x06\x06\x06\x06\x06",
		"\x0a\x01\x00\x00\x01\x07\x01\x00\x05\x09\x01\x00\x01\x01\x07\x01\x01",
		"\x00\x00\x03\x01\x01\x01\x01\x04\x03\x00\x02\x02\x04\x01\x01\x00\x04\x00\x07\x00",
		// A user of 17 tags (the decoder reads 16).
		"\x00\x00\x00\x07\x01\x00\x08\x05\x00\x01\x01\x01\x01\x04",
		// A vhost with max_queues -1 (the decoder refuses it).
		"\x00\x00\x00\x0a\x00\x00\x00\x01",
		// A bind whose arguments have a key of 256 bytes.
		"\x00\x00\x00\x03\x01\x04\x01\x06\x00\x01\x00\x01\x02\x01\x04\x00\x00\x00\x00\x00\x00\x00\x01",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(metaLogCase)
}

// metaLogCase is one FuzzMetaLog input: requests from in on a node with
// a metadata log, then a restart.
func metaLogCase(t *testing.T, in []byte) {
	fs := segment.NewMemFS()
	n := openMetaNode(t, fs, 0)
	n.b.topo.mu.Lock()
	var bad []string
	n.b.topo.record = func(c *MetaCommand, _ MetaResult) {
		enc := AppendMetaCommand(nil, c)
		d, err := DecodeMetaCommand(enc)
		if err != nil {
			bad = append(bad, fmt.Sprintf("op %d: %v", c.Op, err))
		} else if !bytes.Equal(AppendMetaCommand(nil, &d), enc) {
			bad = append(bad, fmt.Sprintf("op %d: decodes to another command", c.Op))
		}
	}
	n.b.topo.mu.Unlock()
	g := &fuzzGen{b: in}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := 0; len(g.b) > 0 && i < 64; i++ {
			g.metaOp(n.b)
		}
	}()
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		buf := make([]byte, 1<<20)
		t.Fatalf("the requests did not return within 20 s:\n%s", buf[:runtime.Stack(buf, true)])
	}
	n.b.topo.mu.Lock()
	want := metaSnapshotAfterUp(t, n.b.topo.meta)
	n.b.topo.record = nil
	n.b.topo.mu.Unlock()
	if len(bad) > 0 {
		t.Fatalf("commands a front could send that the metadata log could not read back:\n%s", strings.Join(bad, "\n"))
	}
	n.close(t)
	n = openMetaNode(t, fs, 0)
	defer n.close(t)
	n.b.topo.mu.Lock()
	got := n.b.topo.meta.Snapshot()
	n.b.topo.mu.Unlock()
	if !bytes.Equal(got, want) {
		t.Fatalf("after a restart the metadata state differs from the one logged:\n%s\nwant\n%s", snapText(t, got), snapText(t, want))
	}
}

// snapText lists a metadata snapshot's contents, one line each.
func snapText(t *testing.T, snap []byte) string {
	m := NewMetaWithLimits(2, noMetaLimits)
	if err := m.Restore(snap); err != nil {
		return "(" + err.Error() + ")"
	}
	var sb strings.Builder
	for _, e := range m.Exchanges() {
		fmt.Fprintf(&sb, "exchange %q %v durable=%v args=%v\n", e.Name, e.Kind, e.Durable, e.Args)
	}
	for _, q := range m.Queues() {
		fmt.Fprintf(&sb, "queue %q durable=%v excl=%d args=%v\n", q.Name, q.Decl.Durable, q.Exclusive, q.Decl.Args)
	}
	for _, x := range m.Bindings() {
		fmt.Fprintf(&sb, "binding %q -> %q (x=%v) %q %v\n", x.Source, x.Destination, x.ToExchange, x.Key, x.Args)
	}
	for _, u := range m.Users() {
		fmt.Fprintf(&sb, "user %q %q\n", u.Name, u.Tags)
	}
	for _, p := range m.Permissions() {
		fmt.Fprintf(&sb, "perm %q %q\n", p.Vhost, p.User)
	}
	for _, v := range m.Vhosts() {
		fmt.Fprintf(&sb, "vhost %q %d %d\n", v.Name, v.MaxQueues, v.MaxConnections)
	}
	return sb.String()
}
