package cluster_test

import (
	"bytes"
	"net"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/warren-mq/warren/internal/freeport"
	"github.com/warren-mq/warren/queue"
	"github.com/warren-mq/warren/replication"
	"github.com/warren-mq/warren/replication/cluster"
	"github.com/warren-mq/warren/segment"
	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
)

var _ replication.Transport = (*cluster.Transport)(nil)

var secret = []byte("0123456789abcdef0123456789abcdef")

// node is one cluster node in the test: a worker driven by its own shard
// goroutine (an inbox of closures, a Round after each drain), and a TCP
// transport whose readers post what arrives into that inbox.
type node struct {
	id    uint64
	w     *replication.Worker
	g     *replication.Group
	tr    *cluster.Transport
	inbox chan func()
	stop  chan struct{}
	done  chan struct{}
	start time.Time
}

func (n *node) loop() {
	defer close(n.done)
	for {
		select {
		case fn := <-n.inbox:
			fn()
		case <-n.stop:
			return
		}
	drain:
		for {
			select {
			case fn := <-n.inbox:
				fn()
			default:
				break drain
			}
		}
		now := time.Since(n.start).Milliseconds()
		more := false
		for i := 0; i < 4; i++ {
			if more = n.w.Round(now); !more {
				break
			}
		}
		n.tr.Flush()
		if more {
			select {
			case n.inbox <- func() {}:
			default:
			}
		}
	}
}

// do runs fn on the node's shard goroutine and waits for it.
func (n *node) do(t *testing.T, fn func()) {
	t.Helper()
	done := make(chan struct{})
	select {
	case n.inbox <- func() { fn(); close(done) }:
	case <-time.After(10 * time.Second):
		t.Fatalf("node %d: inbox full for 10 s", n.id)
	}
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatalf("node %d: shard did not run a closure within 10 s", n.id)
	}
}

// listeners reserves n loopback ports (kept open: the transports take them).
func listeners(t *testing.T, n int) ([]net.Listener, map[uint64]string) {
	t.Helper()
	ls := make([]net.Listener, n)
	addrs := map[uint64]string{}
	for i := range ls {
		// Outside the ephemeral range: tests listen on an address again
		// (a node restarted), which a freed ephemeral port could have
		// lost meanwhile to any 127.0.0.1:0 listener or dial.
		l, err := freeport.Listen()
		if err != nil {
			t.Fatal(err)
		}
		ls[i] = l
		addrs[uint64(i+1)] = l.Addr().String()
	}
	return ls, addrs
}

func newCluster(t *testing.T, gid uint64) []*node {
	t.Helper()
	ls, addrs := listeners(t, 3)
	voters := raftpb.ConfState{Voters: []uint64{1, 2, 3}}
	nodes := make([]*node, 3)
	for i := range nodes {
		n := &node{id: uint64(i + 1), inbox: make(chan func(), 1024), stop: make(chan struct{}), done: make(chan struct{}), start: time.Now()}
		l, err := segment.Open(segment.NewMemFS(), "/data", segment.Options{Manual: true, WALSize: 64 << 10, SegmentSize: 64 << 10})
		if err != nil {
			t.Fatal(err)
		}
		tr, err := cluster.New(cluster.Config{
			NodeID:      n.id,
			Listener:    ls[i],
			Peers:       addrs,
			Secret:      secret,
			ManualFlush: true,
			Deliver: func(gid uint64, m raftpb.Message) {
				select {
				case n.inbox <- func() { _ = n.w.Step(gid, m) }:
				case <-n.stop:
				}
			},
		})
		if err != nil {
			t.Fatal(err)
		}
		n.tr = tr
		n.w = replication.NewWorker(l, replication.WorkerConfig{
			NodeID: n.id,
			Post:   func(fn func()) { n.inbox <- fn },
			Fatal:  func(err error) { t.Errorf("node %d: %v", n.id, err) },
			Send:   tr.Send,
		})
		g, err := n.w.Open(gid, raftpb.SnapshotMetadata{ConfState: voters}, replication.NewQueueFSM(queue.New(queue.Config{}, 0), 0, func(*replication.Applied) {}))
		if err != nil {
			t.Fatal(err)
		}
		n.g = g
		go n.loop()
		nodes[i] = n
		t.Cleanup(func() {
			close(n.stop)
			<-n.done
			tr.Close()
			n.w.Close()
			l.Close()
		})
	}
	return nodes
}

// tickUntil ticks every node's group every 5 ms (the raft clock, scaled
// down from 100 ms) until cond holds, or fails after limit.
func tickUntil(t *testing.T, nodes []*node, limit time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(limit)
	tk := time.NewTicker(5 * time.Millisecond)
	defer tk.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v", what, limit)
		}
		<-tk.C
		for _, n := range nodes {
			if n == nil {
				continue
			}
			g := n.g
			select {
			case n.inbox <- g.RaftTick:
			default:
			}
		}
	}
}

func leaderOf(t *testing.T, nodes []*node) int {
	lead := -1
	for i, n := range nodes {
		var st raft.BasicStatus
		n.do(t, func() { st = n.g.Status() })
		if st.RaftState == raft.StateLeader {
			lead = i
		}
	}
	return lead
}

// TestThreeWorkersOverTCP: three workers, each over its own MemFS, whose
// raft messages go through the TCP transport on loopback (authenticated
// with the shared secret), elect a leader, and a queue group's enqueue
// proposed at the leader is applied on all three with equal snapshots.
func TestThreeWorkersOverTCP(t *testing.T) {
	const gid = 9
	nodes := newCluster(t, gid)
	lead := -1
	tickUntil(t, nodes, 20*time.Second, "a leader", func() bool { lead = leaderOf(t, nodes); return lead >= 0 })
	nodes[lead].do(t, func() {
		if _, err := nodes[lead].g.Add(&queue.Enqueue{Msgs: make([]queue.Message, 2), Bodies: [][]byte{[]byte("a"), []byte("b")}}); err != nil {
			t.Error(err)
		}
	})
	ready := func() bool {
		for _, n := range nodes {
			var r int64
			n.do(t, func() { r = n.g.FSM().Machine().Ready() })
			if r != 2 {
				return false
			}
		}
		return true
	}
	tickUntil(t, nodes, 20*time.Second, "the enqueue applied on every node", ready)
	var want []byte
	nodes[lead].do(t, func() { want, _ = nodes[lead].g.FSM().Snapshot() })
	for _, n := range nodes {
		var got []byte
		n.do(t, func() { got, _ = n.g.FSM().Snapshot() })
		if !bytes.Equal(got, want) {
			t.Errorf("node %d: snapshot differs from the leader's", n.id)
		}
		st := n.tr.Stats()
		if st.Frames == 0 || st.Received == 0 {
			t.Errorf("node %d: stats %+v: nothing went over TCP", n.id, st)
		}
		if st.AuthFailures != 0 {
			t.Errorf("node %d: %d authentication failures", n.id, st.AuthFailures)
		}
	}
}

// TestWrongSecretRefused: a node with another secret is refused in the
// handshake on both sides, nothing it sends is delivered, and the secret
// itself never crosses the wire (the dialer's first bytes, read by a raw
// listener, do not contain it).
func TestWrongSecretRefused(t *testing.T) {
	ls, addrs := listeners(t, 2)
	var delivered atomic.Int64
	b, err := cluster.New(cluster.Config{NodeID: 2, Listener: ls[1], Peers: addrs, Secret: secret,
		Deliver: func(uint64, raftpb.Message) { delivered.Add(1) }})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	a, err := cluster.New(cluster.Config{NodeID: 1, Listener: ls[0], Peers: addrs, Secret: []byte("another secret, 32 bytes long..."),
		Deliver: func(uint64, raftpb.Message) {}})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	deadline := time.Now().Add(10 * time.Second)
	for a.Stats().AuthFailures == 0 || b.Stats().AuthFailures == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("no authentication failure on both sides within 10 s: a %+v, b %+v", a.Stats(), b.Stats())
		}
		a.Send(5, []raftpb.Message{{Type: raftpb.MsgHeartbeat, From: 1, To: 2, Term: 1}})
		time.Sleep(5 * time.Millisecond) // pacing the sends, not synchronisation: the loop waits on the counters
	}
	if n := delivered.Load(); n != 0 {
		t.Fatalf("%d messages from a node with a wrong secret were delivered", n)
	}
	if a.Stats().Connected != 0 {
		t.Fatalf("a counts %d connected peers with a wrong secret", a.Stats().Connected)
	}

	// The secret is not on the wire: a raw listener posing as node 2.
	raw, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	ls3, _ := listeners(t, 1)
	c, err := cluster.New(cluster.Config{NodeID: 1, Listener: ls3[0], Peers: map[uint64]string{1: ls3[0].Addr().String(), 2: raw.Addr().String()}, Secret: secret,
		Deliver: func(uint64, raftpb.Message) {}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.Send(5, []raftpb.Message{{Type: raftpb.MsgHeartbeat, From: 1, To: 2, Term: 1}})
	conn, err := raw.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	buf := make([]byte, 4096)
	n, _ := conn.Read(buf)
	if n == 0 {
		t.Fatal("the dialer sent no hello")
	}
	if bytes.Contains(buf[:n], secret) {
		t.Fatal("the hello carries the cluster secret")
	}
}

// TestDeadPeerDoesNotBlock: with node 3 down (nothing listening), Send
// never blocks, node 2 still gets every message, and node 3's queue stays
// within MaxQueueBytes, the excess dropped and counted.
func TestDeadPeerDoesNotBlock(t *testing.T) {
	ls, addrs := listeners(t, 3)
	ls[2].Close() // node 3 is dead
	got := make(chan raftpb.Message, 1000)
	b, err := cluster.New(cluster.Config{NodeID: 2, Listener: ls[1], Peers: addrs, Secret: secret,
		Deliver: func(_ uint64, m raftpb.Message) { got <- m }})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	const bound = 8 << 10
	a, err := cluster.New(cluster.Config{NodeID: 1, Listener: ls[0], Peers: addrs, Secret: secret, MaxQueueBytes: bound,
		Deliver: func(uint64, raftpb.Message) {}})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	data := make([]byte, 1024)
	start := time.Now()
	const n = 200
	for i := 0; i < n; i++ {
		a.Send(7, []raftpb.Message{
			{Type: raftpb.MsgApp, From: 1, To: 3, Term: 1, Index: uint64(i), Entries: []raftpb.Entry{{Data: data}}},
			{Type: raftpb.MsgHeartbeat, From: 1, To: 2, Term: 1, Commit: uint64(i)},
		})
		if q := a.PeerStats(3).QueuedBytes; q > bound {
			t.Fatalf("peer 3's queue holds %d bytes, over the %d bound", q, bound)
		}
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("%d sends took %v: Send blocks on a dead peer", n, d)
	}
	for i := 0; i < n; i++ {
		select {
		case m := <-got:
			if m.From != 1 || m.Type != raftpb.MsgHeartbeat {
				t.Fatalf("node 2 got %v from %d", m.Type, m.From)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("node 2 got %d of %d messages while node 3 is dead", i, n)
		}
	}
	ps := a.PeerStats(3)
	if ps.Dropped < n-bound/1024-2 {
		t.Fatalf("peer 3: %+v: expected most of %d messages dropped at the %d-byte bound", ps, n, bound)
	}
	if ps.Connected {
		t.Fatal("peer 3 counted connected")
	}
}

// TestConfigRefused: a multi-node cluster needs a secret of at least 16
// bytes; peers and the node's own id are checked.
func TestConfigRefused(t *testing.T) {
	peers := map[uint64]string{1: "127.0.0.1:0", 2: "127.0.0.1:1"}
	for _, c := range []struct {
		cfg  cluster.Config
		want string
	}{
		{cluster.Config{NodeID: 1, Listen: "127.0.0.1:0", Peers: peers}, "secret"},
		{cluster.Config{NodeID: 1, Listen: "127.0.0.1:0", Peers: peers, Secret: []byte("short")}, "16 bytes"},
		{cluster.Config{NodeID: 0, Listen: "127.0.0.1:0", Peers: peers, Secret: secret}, "node id"},
		{cluster.Config{NodeID: 3, Listen: "127.0.0.1:0", Peers: peers, Secret: secret}, "not in"},
	} {
		c.cfg.Deliver = func(uint64, raftpb.Message) {}
		tr, err := cluster.New(c.cfg)
		if err == nil {
			tr.Close()
			t.Errorf("%+v: accepted", c.cfg)
			continue
		}
		if !strings.Contains(err.Error(), c.want) {
			t.Errorf("error %q does not say %q", err, c.want)
		}
	}
}

// TestParsePeers: the --peers syntax, with the default cluster port.
func TestParsePeers(t *testing.T) {
	p, err := cluster.ParsePeers("1=a.example:7000,2=b.example,3=[::1]:5690")
	if err != nil {
		t.Fatal(err)
	}
	if p[1] != "a.example:7000" || p[2] != "b.example:5682" || p[3] != "[::1]:5690" || len(p) != 3 {
		t.Fatalf("got %v", p)
	}
	for _, bad := range []string{"", "1", "x=a:1", "0=a:1", "1=a:1,1=b:2", "1=", "1=a:notaport", "1=a:1,2=a:1"} {
		if _, err := cluster.ParsePeers(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

// TestFlushBatchesPerRound: with Config.ManualFlush, Send only queues and
// Flush hands each peer's queue to its writer: a round's messages for a
// peer, from any number of groups, go as one frame.
func TestFlushBatchesPerRound(t *testing.T) {
	ls, addrs := listeners(t, 2)
	got := make(chan raftpb.Message, 100)
	b, err := cluster.New(cluster.Config{NodeID: 2, Listener: ls[1], Peers: addrs, Secret: secret,
		Deliver: func(_ uint64, m raftpb.Message) { got <- m }})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	a, err := cluster.New(cluster.Config{NodeID: 1, Listener: ls[0], Peers: addrs, Secret: secret, ManualFlush: true,
		Deliver: func(uint64, raftpb.Message) {}})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	const rounds, groups = 3, 10
	for r := 0; r < rounds; r++ {
		for gid := uint64(1); gid <= groups; gid++ {
			a.Send(gid, []raftpb.Message{{Type: raftpb.MsgHeartbeat, From: 1, To: 2, Term: 1, Commit: uint64(r)}})
		}
		a.Flush()
		for i := 0; i < groups; i++ {
			select {
			case m := <-got:
				if m.Commit != uint64(r) {
					t.Fatalf("round %d: got a message of round %d", r, m.Commit)
				}
			case <-time.After(10 * time.Second):
				t.Fatalf("round %d: %d of %d messages arrived", r, i, groups)
			}
		}
	}
	// The writer counts a frame once its write returned, which may be
	// after the receiver has delivered it: wait for the count, then check
	// it is exact.
	deadline := time.Now().Add(10 * time.Second)
	for st := a.Stats(); st.Frames < rounds && time.Now().Before(deadline); st = a.Stats() {
		runtime.Gosched()
	}
	if st := a.Stats(); st.Frames != rounds || st.Sent != rounds*groups {
		t.Fatalf("stats %+v: want %d frames carrying %d messages", st, rounds, rounds*groups)
	}
}

// TestReconnect: a peer that goes away and comes back on the same address
// is dialled again (with backoff) and gets what is sent from then on; its
// writer counts the peer connected again.
func TestReconnect(t *testing.T) {
	ls, addrs := listeners(t, 2)
	got := make(chan raftpb.Message, 1000)
	deliver := func(_ uint64, m raftpb.Message) {
		select {
		case got <- m:
		default:
		}
	}
	b, err := cluster.New(cluster.Config{NodeID: 2, Listener: ls[1], Peers: addrs, Secret: secret, Deliver: deliver})
	if err != nil {
		t.Fatal(err)
	}
	a, err := cluster.New(cluster.Config{NodeID: 1, Listener: ls[0], Peers: addrs, Secret: secret, Deliver: func(uint64, raftpb.Message) {}})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	sendUntil := func(term uint64) {
		t.Helper()
		deadline := time.Now().Add(15 * time.Second)
		for {
			a.Send(1, []raftpb.Message{{Type: raftpb.MsgHeartbeat, From: 1, To: 2, Term: term}})
			select {
			case m := <-got:
				if m.Term == term {
					return
				}
			case <-time.After(10 * time.Millisecond): // pacing the sends; the loop waits on the channel
			}
			if time.Now().After(deadline) {
				t.Fatalf("nothing of term %d arrived within 15 s: %+v", term, a.PeerStats(2))
			}
		}
	}
	sendUntil(1)
	b.Close()
	l, err := net.Listen("tcp", addrs[2])
	if err != nil {
		t.Skipf("cannot listen on %s again: %v", addrs[2], err)
	}
	b, err = cluster.New(cluster.Config{NodeID: 2, Listener: l, Peers: addrs, Secret: secret, Deliver: deliver})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	sendUntil(2)
	if !a.PeerStats(2).Connected {
		t.Fatal("peer 2 not counted connected after the reconnect")
	}
}

// TestHandshakeBound: at most 16 connections may sit unauthenticated; the
// next is closed at once and counted, and once they go a peer connects.
func TestHandshakeBound(t *testing.T) {
	ls, addrs := listeners(t, 2)
	got := make(chan raftpb.Message, 100)
	b, err := cluster.New(cluster.Config{NodeID: 2, Listener: ls[1], Peers: addrs, Secret: secret,
		Deliver: func(_ uint64, m raftpb.Message) { got <- m }})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	var idle []net.Conn
	for i := 0; i < 16; i++ {
		c, err := net.Dial("tcp", addrs[2])
		if err != nil {
			t.Fatal(err)
		}
		idle = append(idle, c)
	}
	// The 17th is closed by the listener without a byte.
	deadline := time.Now().Add(10 * time.Second)
	for b.Stats().Refused == 0 {
		c, err := net.Dial("tcp", addrs[2])
		if err != nil {
			t.Fatal(err)
		}
		c.SetReadDeadline(time.Now().Add(2 * time.Second))
		var one [1]byte
		_, rerr := c.Read(one[:])
		c.Close()
		if rerr == nil {
			t.Fatal("a connection past the handshake bound got bytes")
		}
		if time.Now().After(deadline) {
			t.Fatal("no connection refused past 16 unauthenticated ones")
		}
	}
	for _, c := range idle {
		c.Close()
	}
	ls[0].Close()
	l0, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	a, err := cluster.New(cluster.Config{NodeID: 1, Listener: l0, Peers: addrs, Secret: secret, Deliver: func(uint64, raftpb.Message) {}})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	a.Send(1, []raftpb.Message{{Type: raftpb.MsgHeartbeat, From: 1, To: 2, Term: 1}})
	select {
	case <-got:
	case <-time.After(15 * time.Second):
		t.Fatalf("a peer could not connect once the idle connections closed: %+v", a.PeerStats(2))
	}
}
