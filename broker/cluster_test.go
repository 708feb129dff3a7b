package broker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/warren-mq/warren/internal/freeport"
	"github.com/warren-mq/warren/replication"
	"github.com/warren-mq/warren/replication/cluster"
	"github.com/warren-mq/warren/segment"
	"github.com/warren-mq/warren/wire"
	"go.etcd.io/raft/v3/raftpb"
)

// clusterNode is one broker of an in-process cluster: its log on its own
// MemFS (kept across a restart) and its TCP transport on loopback.
type clusterNode struct {
	id   uint64
	addr string
	fs   *segment.MemFS
	join string // the address of a member to join through (members_test.go)
	b    atomic.Pointer[Broker]
	log  *segment.Log
	tr   *cluster.Transport
	up   bool
	// spool: its transport's SpoolDir (kept across a restart)
	spool string
	// incDir holds its incarnation file (kept across a restart: the
	// MemFS has no rename); backMs sets its clock back that much for
	// the incarnation at its next start.
	incDir string
	backMs int64
}

type testCluster struct {
	t     *testing.T
	nodes []*clusterNode
	peers map[uint64]string
	// snapEntries: the metadata group's SnapshotEntries (0: default).
	snapEntries int
	// fwdTimeout: DurableConfig.ForwardTimeout (0: the default).
	fwdTimeout time.Duration
	// lose, if set, says which forwarded messages the transport loses
	// (as a broken connection does); set before the nodes send any.
	lose atomic.Pointer[func(from, to uint64, p []byte) bool]
	// skewMs is added to every node's clock (Config.Clock).
	skewMs atomic.Int64
	// softLimit: Config.QueueSoftLimit (0: none).
	softLimit int64
	// maxFrame: the transports' MaxFrameBytes (0: the default).
	maxFrame int
	// wrap, if set, wraps each node's first listener.
	wrap func(id uint64, ln net.Listener) net.Listener
	// alarm[id] is node id's Config.PublishBlocked (its memory or disk
	// alarm).
	alarm [8]atomic.Bool
	// holding[id]: the raft messages of queue groups to node id are held
	// (in held[id], in order) until release(id) delivers them: a node
	// that has not heard its queues' elections yet.
	holdMu  sync.Mutex
	holding [8]bool
	held    [8][]heldRaft
	// dropMeta, if set, says which metadata raft messages to node to are
	// lost on the way.
	dropMeta atomic.Pointer[func(to uint64, m raftpb.Message) bool]
	// oldBuild[id]: node id plays a build before metadata entry version
	// 3 (its hello names no features; one such entry sent to it fails
	// the test: that build stops at it). v3Entries counts those sent.
	oldBuild  [8]atomic.Bool
	v3Entries atomic.Int64
	// tick: every node's raft tick (MetaLogConfig.TickEvery; 0: 10 ms).
	tick time.Duration
}

// metaV3 says whether e is a version 3 metadata entry.
func metaV3(e raftpb.Entry) bool {
	return e.Type == raftpb.EntryNormal && len(e.Data) > 1 && e.Data[0] == 'M' && e.Data[1] == 3
}

// tagging waits until every node up writes version 3 metadata entries
// (every member's hello said it reads them).
func (c *testCluster) tagging() {
	c.t.Helper()
	ids := make([]uint64, 0, len(c.nodes))
	for _, nd := range c.nodes {
		ids = append(ids, nd.id)
	}
	c.waitFor("every node heard every other's features", func() bool {
		for _, nd := range c.nodes {
			if nd.up && !nd.b.Load().metaTagTerms(nd.id, ids) {
				return false
			}
		}
		return true
	})
}

type heldRaft struct {
	gid uint64
	m   raftpb.Message
}

// hold holds the raft messages of queue groups to the nodes ids.
func (c *testCluster) hold(ids ...uint64) {
	c.holdMu.Lock()
	defer c.holdMu.Unlock()
	for _, id := range ids {
		c.holding[id] = true
	}
}

// release delivers node nd's held messages, in order, and holds no more.
func (c *testCluster) release(nd *clusterNode) {
	c.holdMu.Lock()
	defer c.holdMu.Unlock()
	for _, h := range c.held[nd.id] {
		if b := nd.b.Load(); b != nil {
			b.StepRaft(h.gid, h.m)
		}
	}
	c.holding[nd.id], c.held[nd.id] = false, nil
}

// deliverRaft steps node nd with a raft message, unless held.
func (c *testCluster) deliverRaft(nd *clusterNode, gid uint64, m raftpb.Message) {
	if drop := c.dropMeta.Load(); gid == replication.MetaGroupID && drop != nil && (*drop)(nd.id, m) {
		return
	}
	if gid == replication.MetaGroupID {
		for _, e := range m.Entries {
			if metaV3(e) {
				c.v3Entries.Add(1)
				if c.oldBuild[nd.id].Load() {
					c.t.Errorf("node %d, an older build, was sent a version 3 metadata entry (index %d): it would stop", nd.id, e.Index)
				}
			}
		}
	}
	if gid != replication.MetaGroupID {
		c.holdMu.Lock()
		defer c.holdMu.Unlock()
		if c.holding[nd.id] {
			c.held[nd.id] = append(c.held[nd.id], heldRaft{gid, m})
			return
		}
	}
	if b := nd.b.Load(); b != nil {
		b.StepRaft(gid, m)
	}
}

const clusterTestSecret = "0123456789abcdef0123456789abcdef"

func newTestCluster(t *testing.T, n int) *testCluster { return newTestClusterSnap(t, n, 0) }

// newTestClusterSnap: the metadata group snapshots every snapEntries
// entries (0: the default).
func newTestClusterSnap(t *testing.T, n, snapEntries int) *testCluster {
	return newTestClusterFwd(t, n, snapEntries, 2*time.Second)
}

// newTestClusterFwd: forwarded publishes wait fwdTimeout for their
// confirm.
func newTestClusterFwd(t *testing.T, n, snapEntries int, fwdTimeout time.Duration) *testCluster {
	return newTestClusterWith(t, n, func(c *testCluster) { c.snapEntries, c.fwdTimeout = snapEntries, fwdTimeout })
}

// newTestClusterWith: set changes the cluster's settings before its nodes
// start (forwards wait 2 s by default).
func newTestClusterWith(t *testing.T, n int, set func(*testCluster)) *testCluster {
	c := &testCluster{t: t, peers: map[uint64]string{}, fwdTimeout: 2 * time.Second}
	set(c)
	ls := make([]net.Listener, n)
	for i := range ls {
		// Outside the ephemeral range: a node restarts on its address,
		// which a freed ephemeral port could have lost meanwhile to any
		// 127.0.0.1:0 listener or dial.
		l, err := freeport.Listen()
		if err != nil {
			t.Fatal(err)
		}
		ls[i] = l
		c.peers[uint64(i+1)] = l.Addr().String()
		c.nodes = append(c.nodes, &clusterNode{id: uint64(i + 1), addr: l.Addr().String(), fs: segment.NewMemFS()})
	}
	for i, nd := range c.nodes {
		ln := ls[i]
		if c.wrap != nil {
			ln = c.wrap(nd.id, ln)
		}
		c.start(nd, ln)
	}
	t.Cleanup(func() {
		for _, nd := range c.nodes {
			c.stop(nd)
		}
	})
	return c
}

// listen listens again on node nd's address.
func (c *testCluster) listen(nd *clusterNode) net.Listener {
	c.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		ln, err := net.Listen("tcp", nd.addr)
		if err == nil {
			return ln
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("node %d: listening again on %s: %v", nd.id, nd.addr, err)
		}
		time.Sleep(20 * time.Millisecond) // the port is being released: poll
	}
}

// start opens the node's broker on its log, its transport on ln (nil:
// listen again on its address), and its metadata group.
func (c *testCluster) start(nd *clusterNode, ln net.Listener) {
	t := c.t
	t.Helper()
	if ln == nil {
		ln = c.listen(nd)
	}
	if nd.spool == "" {
		nd.spool = t.TempDir()
	}
	peers := c.peers
	if nd.join != "" {
		peers = map[uint64]string{nd.id: nd.addr}
	}
	tr, err := cluster.New(cluster.Config{NodeID: nd.id, Listener: ln, Peers: peers, Secret: []byte(clusterTestSecret),
		// Every snapshot with entries installs from its spool file (as one
		// over 64 MiB does).
		SpoolDir: nd.spool, SnapshotMemBytes: 1, MaxFrameBytes: c.maxFrame,
		Deliver: func(gid uint64, m raftpb.Message) { c.deliverRaft(nd, gid, m) },
		DeliverSnapshot: func(gid uint64, s *cluster.Snapshot) {
			if b := nd.b.Load(); b != nil {
				b.StepClusterSnapshot(gid, (*SnapshotMessage)(s))
			}
		},
		OnRemoved: func(reason string) {
			if b := nd.b.Load(); b != nil {
				b.NoteRemoved(reason)
			}
		},
		Handle: func(from uint64, op byte, body []byte) ([]byte, error) {
			if b := nd.b.Load(); b != nil {
				return b.HandleClusterCall(from, op, body)
			}
			return nil, errors.New("not started")
		},
		DeliverForward: func(from uint64, p []byte) {
			if b := nd.b.Load(); b != nil {
				b.StepForward(from, p)
			}
		}})
	if err != nil {
		t.Fatal(err)
	}
	l, store, err := openNodeLog(nd.fs, "/data", nil) // as warrend opens it
	if err != nil {
		t.Fatal(err)
	}
	fatal := func(err error) { t.Errorf("node %d: %v", nd.id, err) }
	clock := func() int64 { return time.Now().UnixMilli() + c.skewMs.Load() }
	if nd.incDir == "" {
		nd.incDir = t.TempDir()
	}
	inc, err := OpenIncarnation(nd.incDir, clock()-nd.backMs)
	if err != nil {
		t.Fatal(err)
	}
	var lg *slog.Logger
	if os.Getenv("WARREN_TEST_CLUSTER_LOG") != "" {
		lg = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo})).With("node", nd.id)
	}
	b := New(Config{Shards: 2, Clock: clock, Incarnation: inc, QueueSoftLimit: c.softLimit, Logger: lg, PublishBlocked: func() bool { return c.alarm[nd.id].Load() }, Durable: &DurableConfig{Log: l, Snapshots: store, Fatal: fatal, NodeID: nd.id, Send: tr.Send, SendSnapshot: func(gid uint64, s *SnapshotMessage, done func(bool)) {
		tr.SendSnapshot(gid, (*cluster.Snapshot)(s), done)
	}, Forward: func(to uint64, p []byte) bool {
		if lose := c.lose.Load(); lose != nil && (*lose)(nd.id, to, p) {
			return true // sent, and lost on the way
		}
		return tr.SendForward(to, p)
	}, ForwardTimeout: c.fwdTimeout}})
	if c.oldBuild[nd.id].Load() {
		b.features = 0
	}
	b.Start()
	nd.b.Store(b)
	ids := make([]uint64, 0, len(c.peers))
	for id := range c.peers {
		ids = append(ids, id)
	}
	tick := c.tick
	if tick == 0 {
		tick = 10 * time.Millisecond
	}
	mc := MetaLogConfig{Log: l, Snapshots: store, NodeID: nd.id, Peers: ids, Membership: Membership{Addrs: c.peers},
		Send: tr.Send, TickEvery: tick, Timeout: 20 * time.Second, Fatal: fatal, SnapshotEntries: c.snapEntries}
	c.membership(nd, tr, &mc)
	if err := b.OpenMetaLog(context.Background(), mc); err != nil {
		t.Fatal(err)
	}
	nd.log, nd.tr, nd.up = l, tr, true
}

// stop closes the node as a crash of its process would end its part in
// the cluster: transport first (its peers lose it), then the broker.
func (c *testCluster) stop(nd *clusterNode) {
	if !nd.up {
		return
	}
	nd.up = false
	nd.tr.Close()
	b := nd.b.Swap(nil)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	_ = b.CloseMetaLog(ctx)
	_ = b.Stop(ctx)
	_ = nd.log.Close()
}

// leader waits for a node that is up to lead the metadata group, with
// every node that is up knowing it.
func (c *testCluster) leader() *clusterNode {
	c.t.Helper()
	var lead uint64
	c.waitFor("a metadata leader every node up knows", func() bool {
		lead = 0
		for _, nd := range c.nodes {
			if !nd.up {
				continue
			}
			st, _ := nd.b.Load().MetaStatus()
			if st.Leader == 0 || (lead != 0 && st.Leader != lead) {
				return false
			}
			lead = st.Leader
		}
		return c.nodes[lead-1].up
	})
	return c.nodes[lead-1]
}

func (c *testCluster) waitFor(what string, cond func() bool) {
	c.t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			c.t.Fatalf("%s: not within 20 s", what)
		}
		time.Sleep(5 * time.Millisecond) // polling with a deadline
	}
}

// sees waits until node nd's topology has every line of want.
func (c *testCluster) sees(nd *clusterNode, want ...string) {
	c.t.Helper()
	c.waitFor("node "+string(rune('0'+nd.id))+" sees "+strings.Join(want, "; "), func() bool {
		s := topoSummary(nd.b.Load())
		for _, w := range want {
			if !strings.Contains(s, w) {
				return false
			}
		}
		return true
	})
}

// declareOn declares queue d on node nd (for no connection) and fails the
// test on an error.
func (c *testCluster) declareOn(nd *clusterNode, d wire.QueueDeclare) {
	c.t.Helper()
	if _, err := nd.b.Load().DeclareQueueAs(&d, 0, ""); err != nil {
		c.t.Fatal(err)
	}
}

// declareSeen declares queue d on node 1 and waits until every node sees
// it ("queue NAME durable=BOOL").
func (c *testCluster) declareSeen(d wire.QueueDeclare) {
	c.t.Helper()
	c.declareOn(c.nodes[0], d)
	for _, nd := range c.nodes {
		c.sees(nd, fmt.Sprintf("queue %s durable=%t", d.Name, d.Durable))
	}
}

// declareOneReplica declares durable queue name with one replica (as
// declareSeen) and returns the node that holds it and the others, in
// node order.
func (c *testCluster) declareOneReplica(name string) (holder *clusterNode, others []*clusterNode) {
	c.t.Helper()
	c.declareSeen(wire.QueueDeclare{Name: name, Durable: true,
		Args: wire.Table{{Key: "replicas", Value: wire.Int(1)}}})
	holder = c.queueLeader(name)
	for _, nd := range c.nodes {
		if nd != holder {
			others = append(others, nd)
		}
	}
	return holder, others
}

// TestClusterTopology: three brokers whose metadata group has every node
// a voter, over the TCP transport on loopback. Topology declared on one
// node (a follower, whose proposals go to the leader, and the leader) is
// applied on all three and answered once applied on the node asked;
// with the leader closed the other two elect another and still take
// changes; the closed node restarts from its log and catches up.
func TestClusterTopology(t *testing.T) {
	c := newTestCluster(t, 3)
	lead := c.leader()
	follower := c.nodes[lead.id%3]
	fb := follower.b.Load()
	if err := fb.DeclareExchangeAs(&wire.ExchangeDeclare{Name: "ex", Kind: wire.ExchangeTopic, Durable: true}, ""); err != nil {
		t.Fatal(err)
	}
	q, err := fb.DeclareQueueAs(&wire.QueueDeclare{Name: "q1"}, 0, "")
	if err != nil {
		t.Fatal(err)
	}
	if q == nil || q.Name() != "q1" {
		t.Fatalf("declare answered %v before the queue was applied here", q)
	}
	if err := fb.BindAs(&wire.Bind{Source: "ex", Destination: "q1", RoutingKey: "a.*"}, Requester{Admin: true}); err != nil {
		t.Fatal(err)
	}
	// Answered once applied on the node asked: it reads its own writes.
	if s := topoSummary(fb); !strings.Contains(s, `binding ex -> q1 (x=false) "a.*"`) {
		t.Fatalf("node %d answered before applying:\n%s", follower.id, s)
	}
	// A refusal is the apply's, answered on the node that asked.
	err = fb.DeclareExchangeAs(&wire.ExchangeDeclare{Name: "ex", Kind: wire.ExchangeFanout, Durable: true}, "")
	if e, ok := err.(*wire.Error); !ok || e.Code != wire.PreconditionFailed {
		t.Fatalf("redeclaring ex with another kind: %v, want PRECONDITION_FAILED", err)
	}
	for _, nd := range c.nodes {
		c.sees(nd, "exchange ex topic durable=true", "queue q1 durable=false", `binding ex -> q1 (x=false) "a.*"`)
	}
	// A queue deleted on one node goes on every node (its shard too).
	if _, err := lead.b.Load().DeclareQueueAs(&wire.QueueDeclare{Name: "gone"}, 0, ""); err != nil {
		t.Fatal(err)
	}
	c.sees(follower, "queue gone") // another node's change: seen once applied here
	if _, err := fb.DeleteQueue(context.Background(), "gone", false, false); err != nil {
		t.Fatal(err)
	}
	for _, nd := range c.nodes {
		b := nd.b.Load()
		c.waitFor("queue gone deleted everywhere", func() bool {
			return !strings.Contains(topoSummary(b), "queue gone") && b.LookupQueue("gone") == nil
		})
	}

	// The leader goes: the other two elect one and take changes.
	c.stop(lead)
	lead2 := c.leader()
	if lead2 == lead {
		t.Fatal("the closed node still leads")
	}
	other := c.nodes[0]
	for _, nd := range c.nodes {
		if nd.up && nd != lead2 {
			other = nd
		}
	}
	if _, err := other.b.Load().DeclareQueueAs(&wire.QueueDeclare{Name: "q2", Durable: true}, 0, ""); err != nil {
		t.Fatal(err)
	}
	if err := lead2.b.Load().BindAs(&wire.Bind{Source: "ex", Destination: "q2", RoutingKey: "b.#"}, Requester{Admin: true}); err != nil {
		t.Fatal(err)
	}
	for _, nd := range []*clusterNode{lead2, other} {
		c.sees(nd, "queue q2 durable=true", `binding ex -> q2 (x=false) "b.#"`)
	}
	// Placed by the metadata group on the three nodes (the default of 3
	// replicas); the two up elect its leader and agree on it.
	for _, nd := range []*clusterNode{lead2, other} {
		if info, _ := nd.b.Load().Queue("q2"); len(info.Replicas) != 3 {
			t.Fatalf("node %d places q2 on %v", nd.id, info.Replicas)
		}
	}
	c.queueLeader("q2")

	// The old leader restarts from its log and catches up.
	c.start(lead, nil)
	c.sees(lead, "exchange ex topic durable=true", "queue q1 durable=false", "queue q2 durable=true",
		`binding ex -> q1 (x=false) "a.*"`, `binding ex -> q2 (x=false) "b.#"`)
	if _, err := lead.b.Load().DeclareQueueAs(&wire.QueueDeclare{Name: "q3"}, 0, ""); err != nil {
		t.Fatal(err)
	}
	for _, nd := range c.nodes {
		c.sees(nd, "queue q3 durable=false")
	}
}

// TestClusterNoQuorum: a topology request on a node that cannot reach a
// majority is answered with a clear error once the timeout passes, never
// dropped silently.
func TestClusterNoQuorum(t *testing.T) {
	c := newTestCluster(t, 3)
	c.leader()
	c.stop(c.nodes[1])
	c.stop(c.nodes[2])
	b := c.nodes[0].b.Load()
	// Short timeout for this request: the node's configured one is 20 s.
	b.topo.cl.Load().timeout = 300 * time.Millisecond
	err := b.DeclareExchangeAs(&wire.ExchangeDeclare{Name: "lonely", Kind: wire.ExchangeDirect}, "")
	if err == nil || !strings.Contains(err.Error(), "did not apply the change") {
		t.Fatalf("declare without a quorum: %v, want the cluster's timeout", err)
	}
}

// queueLeader waits until the nodes up that hold a replica of queue name
// agree on its leader, which is up and knows it leads, and returns it.
func (c *testCluster) queueLeader(name string) *clusterNode {
	c.t.Helper()
	var lead uint64
	c.waitFor("a leader of queue "+name+" every replica up knows", func() bool {
		lead = 0
		for _, nd := range c.nodes {
			if !nd.up {
				continue
			}
			info, ok := nd.b.Load().Queue(name)
			if !ok {
				return false
			}
			if !slices.Contains(info.Replicas, nd.id) || info.RaftRole == "failed" {
				continue // no replica there, or one that did not open
			}
			if info.Leader == 0 || (lead != 0 && info.Leader != lead) {
				return false
			}
			lead = info.Leader
		}
		return lead != 0 && c.nodes[lead-1].up
	})
	return c.nodes[lead-1]
}
