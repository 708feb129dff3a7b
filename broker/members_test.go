package broker

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/warren-mq/warren/internal/freeport"
	"github.com/warren-mq/warren/replication"
	"github.com/warren-mq/warren/replication/cluster"
	"github.com/warren-mq/warren/segment"
	"github.com/warren-mq/warren/wire"
)

// membership wires a test node's membership as warrend does: the
// transport follows the members, forwards requests to the leader, sends
// the metadata snapshot, and a node with join set asks that member to
// add it.
func (c *testCluster) membership(nd *clusterNode, tr *cluster.Transport, mc *MetaLogConfig) {
	mc.SendSnapshot = func(gid uint64, s *replication.SnapshotMessage, done func(bool)) {
		tr.SendSnapshot(gid, (*cluster.Snapshot)(s), done)
	}
	mc.OnMembers = func(m map[uint64]string, removed []uint64) { tr.SetPeers(m, removed) }
	mc.Forward = tr.CallNode
	if nd.join == "" {
		return
	}
	mc.Peers, mc.Addrs = nil, nil
	mc.Join = func(ctx context.Context) (map[uint64]string, error) {
		body, _ := json.Marshal(MemberRequest{NodeID: nd.id, Address: nd.addr, Joining: true})
		_, ans, err := tr.Call(ctx, nd.join, CallJoin, body)
		if err != nil {
			return nil, err
		}
		var ja JoinAnswer
		if err := json.Unmarshal(ans, &ja); err != nil {
			return nil, err
		}
		tr.SetPeers(ja.Members, nil)
		return ja.Members, nil
	}
}

// addNode starts a new node that joins the cluster through member via.
func (c *testCluster) addNode(via *clusterNode) *clusterNode {
	c.t.Helper()
	l, err := freeport.Listen() // restarted on it: as newTestClusterWith's
	if err != nil {
		c.t.Fatal(err)
	}
	nd := &clusterNode{id: uint64(len(c.nodes) + 1), addr: l.Addr().String(), fs: segment.NewMemFS(), join: via.addr}
	c.nodes = append(c.nodes, nd)
	c.start(nd, l)
	return nd
}

// role waits until every node up has node id in the role want.
func (c *testCluster) role(id uint64, want string) {
	c.t.Helper()
	c.waitFor("node "+string(rune('0'+id))+" a "+want+" everywhere", func() bool {
		for _, nd := range c.nodes {
			if !nd.up || nd.b.Load().MetaRemoved() {
				continue
			}
			ms, _, _ := nd.b.Load().ClusterMembers()
			i := slices.IndexFunc(ms, func(m Member) bool { return m.ID == id })
			if i < 0 || ms[i].Role != want {
				return false
			}
		}
		return true
	})
}

func wantCode(t *testing.T, err error, code wire.Code, text string) {
	t.Helper()
	var we *wire.Error
	if !errors.As(err, &we) || we.Code != code || !strings.Contains(we.Reason, text) {
		t.Fatalf("got %v, want code %d with %q", err, code, text)
	}
}

// TestClusterJoin: a fourth node joins through a follower (forwarded to
// the metadata leader), installs the leader's snapshot (the log was
// compacted), is promoted to voter once caught up, takes topology
// changes, and restarts from its own data; a first node restarted with
// its original --peers still knows the joined node.
func TestClusterJoin(t *testing.T) {
	c := newTestCluster(t, 3)
	lead := c.leader()
	fb := c.nodes[lead.id%3]
	if err := fb.b.Load().DeclareExchangeAs(&wire.ExchangeDeclare{Name: "ex", Kind: wire.ExchangeTopic, Durable: true}, ""); err != nil {
		t.Fatal(err)
	}
	if _, err := fb.b.Load().DeclareQueueAs(&wire.QueueDeclare{Name: "q1"}, 0, ""); err != nil {
		t.Fatal(err)
	}
	n4 := c.addNode(fb)
	c.role(4, "voter")
	c.sees(n4, "exchange ex topic durable=true", "queue q1 durable=false")
	if !n4.b.Load().MetaReady() {
		t.Fatal("the joined node is not ready")
	}
	if _, err := n4.b.Load().DeclareQueueAs(&wire.QueueDeclare{Name: "q4"}, 0, ""); err != nil {
		t.Fatal(err)
	}
	for _, nd := range c.nodes {
		c.sees(nd, "queue q4 durable=false")
	}
	// Placement counts the joined node: of four one-replica queues, one
	// is placed on it, and it leads it.
	if got := fb.b.Load().topo.meta.Nodes(); !slices.Equal(got, []uint64{1, 2, 3, 4}) {
		t.Fatalf("placement's nodes: %v", got)
	}
	onNew := ""
	for _, name := range []string{"d1", "d2", "d3", "d4"} {
		if _, err := fb.b.Load().DeclareQueueAs(&wire.QueueDeclare{Name: name, Durable: true, Args: wire.Table{{Key: "replicas", Value: wire.Int(1)}}}, 0, ""); err != nil {
			t.Fatal(err)
		}
		if info, _ := fb.b.Load().Queue(name); slices.Equal(info.Replicas, []uint64{4}) {
			onNew = name
		}
	}
	if onNew == "" {
		t.Fatal("no one-replica queue placed on the joined node")
	}
	if c.queueLeader(onNew) != n4 {
		t.Fatalf("queue %s is not led by the joined node", onNew)
	}

	// Joining twice: the same node at the same address is already a
	// member; another address under its id is a clash.
	ctx := context.Background()
	wantCode(t, lead.b.Load().JoinNode(ctx, 4, n4.addr), wire.PreconditionFailed, "already a member")
	wantCode(t, lead.b.Load().JoinNode(ctx, 4, "127.0.0.1:1"), wire.PreconditionFailed, "taken by the member")
	wantCode(t, lead.b.Load().JoinNode(ctx, 9, n4.addr), wire.PreconditionFailed, "node 4's cluster address")
	wantCode(t, lead.b.Load().JoinNode(ctx, 0, "x:1"), wire.InvalidArgument, "a join needs")

	// The joined node restarts from its own data (no call to join): it
	// knows the durable queue it holds. (Not q4: a restarted home drops
	// the non-durable queues of its earlier life, soon after it starts.)
	c.stop(n4)
	c.start(n4, nil)
	c.sees(n4, "queue "+onNew+" durable=true")
	// A first node restarts with its --peers, which do not name node 4.
	other := c.nodes[(lead.id+1)%3]
	c.stop(other)
	c.start(other, nil)
	if _, err := n4.b.Load().DeclareQueueAs(&wire.QueueDeclare{Name: "q5"}, 0, ""); err != nil {
		t.Fatal(err)
	}
	c.sees(other, "queue q5 durable=false")
	ms, _, _ := other.b.Load().ClusterMembers()
	if len(ms) != 4 || ms[3].Address != n4.addr {
		t.Fatalf("the restarted first node's members: %+v", ms)
	}
}

// TestClusterLeave: removing a follower stops it (it says so, and is not
// ready); its id is never reused; removing an unknown node, the same node
// again, or the last voter is refused; the leader leaving hands its
// leadership on first. The non-durable queues that lived on a removed
// node are gone with it (homed.go).
func TestClusterLeave(t *testing.T) {
	c := newTestCluster(t, 3)
	lead := c.leader()
	ctx := context.Background()
	gone := c.nodes[lead.id%3]
	if _, err := gone.b.Load().DeclareQueueAs(&wire.QueueDeclare{Name: "its"}, 0, ""); err != nil {
		t.Fatal(err)
	}
	c.sees(lead, "queue its durable=false")
	if err := lead.b.Load().RemoveNode(ctx, gone.id); err != nil {
		t.Fatal(err)
	}
	c.waitFor("the removed node knows it", func() bool { return gone.b.Load().MetaRemoved() })
	c.waitFor("the removed node's queue dropped", func() bool { return !hasQueue(lead, "its") })
	if gone.b.Load().MetaReady() {
		t.Fatal("a removed node says it is ready")
	}
	err := gone.b.Load().DeclareExchangeAs(&wire.ExchangeDeclare{Name: "nope", Kind: wire.ExchangeDirect}, "")
	if err == nil {
		t.Fatal("a removed node took a topology change")
	}
	wantCode(t, lead.b.Load().RemoveNode(ctx, gone.id), wire.NotFound, "already removed")
	wantCode(t, lead.b.Load().RemoveNode(ctx, 7), wire.NotFound, "not a member")
	wantCode(t, lead.b.Load().JoinNode(ctx, gone.id, "127.0.0.1:2"), wire.PreconditionFailed, "never reused")
	// The two left still take changes.
	if err := lead.b.Load().DeclareExchangeAs(&wire.ExchangeDeclare{Name: "ex2", Kind: wire.ExchangeDirect}, ""); err != nil {
		t.Fatal(err)
	}
	c.stop(gone)
	// The leader leaves: it hands the leadership on, and the new leader
	// removes it.
	if err := lead.b.Load().RemoveNode(ctx, lead.id); err != nil {
		t.Fatal(err)
	}
	c.waitFor("the old leader removed", func() bool { return lead.b.Load().MetaRemoved() })
	var last *clusterNode
	for _, nd := range c.nodes {
		if nd != lead && nd != gone {
			last = nd
		}
	}
	c.waitFor("the last node leads", func() bool {
		st, _ := last.b.Load().MetaStatus()
		return st.Leader == last.id
	})
	wantCode(t, last.b.Load().RemoveNode(ctx, last.id), wire.PreconditionFailed, "last voter")
	if err := last.b.Load().DeclareExchangeAs(&wire.ExchangeDeclare{Name: "ex3", Kind: wire.ExchangeDirect}, ""); err != nil {
		t.Fatal(err)
	}
}

// TestClusterTransferLeadership: to a named voter, to the most caught-up
// one (0), asked of a follower (forwarded), and the shutdown hand-off.
func TestClusterTransferLeadership(t *testing.T) {
	c := newTestCluster(t, 3)
	lead := c.leader()
	ctx := context.Background()
	to := c.nodes[lead.id%3]
	asker := c.nodes[(lead.id+1)%3]
	got, err := asker.b.Load().TransferMetaLeadership(ctx, to.id)
	if err != nil || got != to.id {
		t.Fatalf("transfer to %d: %d, %v", to.id, got, err)
	}
	if c.leader() != to {
		t.Fatal("the leadership did not move")
	}
	wantCode(t, func() error { _, err := lead.b.Load().TransferMetaLeadership(ctx, 9); return err }(), wire.NotFound, "not a voter")
	// Graceful shutdown's hand-off: the leader hands on to another voter.
	hctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	got, err = to.b.Load().HandOffMetaLeadership(hctx)
	if err != nil || got == 0 || got == to.id {
		t.Fatalf("hand-off: %d, %v", got, err)
	}
	// A follower has nothing to hand off.
	if got, err := to.b.Load().HandOffMetaLeadership(hctx); got != 0 || err != nil {
		t.Fatalf("a follower's hand-off: %d, %v", got, err)
	}
	c.stop(to)
	c.leader()
}

// TestClusterMetaSnapshotInstall: a node down while the others took
// enough topology changes to snapshot and compact the metadata log gets
// the leader's snapshot when it restarts, instead of stopping, and
// follows the log again.
func TestClusterMetaSnapshotInstall(t *testing.T) {
	c := newTestClusterSnap(t, 3, 8)
	lead := c.leader()
	behind := c.nodes[lead.id%3]
	if _, err := behind.b.Load().DeclareQueueAs(&wire.QueueDeclare{Name: "old"}, 0, ""); err != nil {
		t.Fatal(err)
	}
	c.sees(behind, "queue old")
	c.stop(behind)
	lb := lead.b.Load()
	for i := range 30 {
		name := "x" + string(rune('a'+i))
		if err := lb.DeclareExchangeAs(&wire.ExchangeDeclare{Name: name, Kind: wire.ExchangeFanout, Durable: true}, ""); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := lb.DeleteQueue(context.Background(), "old", false, false); err != nil {
		t.Fatal(err)
	}
	if first := lead.log.FirstIndex(replication.MetaGroupID); first < 10 {
		t.Fatalf("the leader's metadata log starts at %d: not compacted", first)
	}
	c.start(behind, nil)
	c.sees(behind, "exchange xa fanout", "exchange x"+string(rune('a'+29))+" fanout")
	c.waitFor("the queue deleted meanwhile gone", func() bool {
		return !strings.Contains(topoSummary(behind.b.Load()), "queue old") && behind.b.Load().LookupQueue("old") == nil
	})
	// It follows the log again: a change made through it reaches the
	// leader. (A durable exchange, not a non-durable queue: a restarted
	// home drops the non-durable queues of its earlier life, so one homed
	// here would be gone soon after the restart below.)
	if err := behind.b.Load().DeclareExchangeAs(&wire.ExchangeDeclare{Name: "new", Kind: wire.ExchangeFanout, Durable: true}, ""); err != nil {
		t.Fatal(err)
	}
	c.sees(lead, "exchange new fanout")
	// And restarts from the installed snapshot.
	c.stop(behind)
	c.start(behind, nil)
	c.sees(behind, "exchange xa fanout", "exchange new fanout")
}
