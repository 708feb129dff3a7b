package broker

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/warren-mq/warren/queue"
	"github.com/warren-mq/warren/replication"
	"github.com/warren-mq/warren/segment"
	"github.com/warren-mq/warren/wire"
	"go.etcd.io/raft/v3/raftpb"
)

// metaQueueAt is queue name as node nd's metadata has it.
func metaQueueAt(nd *clusterNode, name string) MetaQueue {
	t := nd.b.Load().topo
	t.mu.Lock()
	defer t.mu.Unlock()
	q, _ := t.meta.Queue(name)
	return q
}

// settledOn waits until every node up (but skip) has queue name's move
// done: no target, and want as its replicas (nil: any three).
func (c *testCluster) settledOn(name string, skip *clusterNode, cond func(replicas []uint64) bool) []uint64 {
	c.t.Helper()
	var reps []uint64
	c.waitFor("queue "+name+" moved everywhere", func() bool {
		reps = nil
		for _, nd := range c.nodes {
			if !nd.up || nd == skip {
				continue
			}
			q := metaQueueAt(nd, name)
			if q.Target != nil || !cond(q.Replicas) || reps != nil && !slices.Equal(reps, q.Replicas) {
				return false
			}
			reps = q.Replicas
		}
		return true
	})
	return reps
}

// publishConfirmed publishes n persistent messages prefix0.. to queue
// name at its leader and waits for their confirms.
func (c *testCluster) publishConfirmed(name, prefix string, n int) {
	c.t.Helper()
	lead := c.queueLeader(name)
	q := lead.b.Load().topo.lookupQueue(name)
	k := newDurSink()
	var bodies []string
	for i := range n {
		bodies = append(bodies, fmt.Sprintf("%s%d", prefix, i))
	}
	batch := publish(lead.b.Load(), q, k, true, bodies...)
	k.waitFor(c.t, "the confirms of "+prefix, func() bool { return k.confirmed(batch) })
	for i, code := range batch.Codes {
		if code != 0 {
			c.t.Fatalf("%s%d nacked (%d)", prefix, i, code)
		}
	}
}

// consumeAll subscribes at queue name's leader and returns the bodies of
// the want messages delivered.
func (c *testCluster) consumeAll(name string, want int) []string {
	c.t.Helper()
	lead := c.queueLeader(name)
	q := lead.b.Load().topo.lookupQueue(name)
	k := newDurSink()
	q.shard.submit(Command{Kind: CmdSubscribe, Queue: q, Sink: k, Spec: queue.ConsumerSpec{ID: 77, Owner: 99}, Req: 1})
	k.waitFor(c.t, fmt.Sprintf("%d deliveries of %s", want, name), func() bool { return len(k.got) >= want })
	barrier(c.t, q.shard)
	k.mu.Lock()
	defer k.mu.Unlock()
	var got []string
	for _, d := range k.got {
		got = append(got, d.body)
	}
	slices.Sort(got)
	return slices.Compact(got)
}

// stoppedFollower declares durable queue name on node 1, publishes 10
// confirmed messages prefix0.. to it, and stops a node that holds a
// replica of it but does not lead it. It returns that node, the queue's
// leader and the queue's raft group.
func (c *testCluster) stoppedFollower(name, prefix string) (bad, lead *clusterNode, gid uint64) {
	c.t.Helper()
	c.declareOn(c.nodes[0], wire.QueueDeclare{Name: name, Durable: true})
	c.publishConfirmed(name, prefix, 10)
	lead = c.queueLeader(name)
	bad = c.nodes[lead.id%3]
	gid = queueGroup(bad.b.Load().topo.lookupQueue(name).id)
	c.stop(bad)
	return bad, lead, gid
}

// editStoppedLog opens the log in /data of a stopped node's fs and its
// snapshot store, hands them to edit, and closes the log.
func editStoppedLog(t *testing.T, fs segment.FS, edit func(l *segment.Log, store *replication.SnapStore) error) {
	t.Helper()
	l, store := openLogStore(t, fs)
	if err := edit(l, store); err != nil {
		t.Fatal(err)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
}

// replicaCaughtUp: whether node nd's copy of queue name is a follower
// holding ready messages, as its leader does, having applied all the
// leader committed, and the leader's group has the voters 1, 2, 3.
func (c *testCluster) replicaCaughtUp(nd *clusterNode, name string, ready int64) bool {
	info, _ := nd.b.Load().Queue(name)
	li, _ := c.queueLeader(name).b.Load().Queue(name)
	return info.RaftRole == "follower" && info.Ready == ready && li.Ready == ready && info.RaftApplied >= li.RaftCommit &&
		slices.Equal(groupVoters(c.queueLeader(name), name), []uint64{1, 2, 3})
}

// replicaRebuilt: replicaCaughtUp, with no error left on nd's copy, and
// the rebuild done in the metadata as node at has it (the replicas 1, 2,
// 3 again).
func (c *testCluster) replicaRebuilt(nd, at *clusterNode, name string, ready int64) bool {
	info, _ := nd.b.Load().Queue(name)
	mq := metaQueueAt(at, name)
	return info.ReplicaError == "" && mq.Rebuild == nil && slices.Equal(mq.Replicas, []uint64{1, 2, 3}) &&
		c.replicaCaughtUp(nd, name, ready)
}

// TestClusterMoveReplicas: a fourth node joins a cluster of three whose
// three queues have a replica on every node, and replicas move to it
// until the nodes hold counts at most one apart; the moved replica gets
// the leader's state (every confirmed message, whichever way it was
// sent), the replica it replaced is deleted, and with an old replica
// stopped the queue still serves every message. Then the fourth node is
// decommissioned while messages are published: its replicas move back to
// the first three, every queue keeps three replicas, it is removed, and
// no confirmed message is lost.
func TestClusterMoveReplicas(t *testing.T) {
	c := newTestCluster(t, 3)
	c.leader()
	names := []string{"m0", "m1", "m2"}
	for _, name := range names {
		c.declareOn(c.nodes[0], wire.QueueDeclare{Name: name, Durable: true})
	}
	for _, name := range names {
		c.publishConfirmed(name, name+"-a", 30)
	}
	n4 := c.addNode(c.nodes[0])
	c.role(4, "voter")
	var onNew []string
	c.waitFor("replicas moved to the joined node", func() bool {
		onNew = nil
		for _, name := range names {
			q := metaQueueAt(c.nodes[0], name)
			if q.Target != nil {
				return false
			}
			if slices.Contains(q.Replicas, 4) {
				onNew = append(onNew, name)
			}
		}
		return len(onNew) == 2 // 9 replicas over 4 nodes: 3, 2, 2, 2
	})
	for _, name := range onNew {
		reps := c.settledOn(name, nil, func(r []uint64) bool { return len(r) == 3 && slices.Contains(r, 4) })
		var gone *clusterNode
		for _, nd := range c.nodes[:3] {
			if !slices.Contains(reps, nd.id) {
				gone = nd
			}
		}
		// The new replica has the leader's state; the replaced one is
		// deleted (its group closed, its log removed).
		c.waitFor("node 4's copy of "+name+" caught up", func() bool {
			li, _ := c.queueLeader(name).b.Load().Queue(name)
			ni, _ := n4.b.Load().Queue(name)
			return ni.RaftRole != "none" && ni.Ready == 30 && li.Ready == 30 && ni.RaftApplied >= li.RaftCommit
		})
		c.waitFor("node "+fmt.Sprint(gone.id)+"'s copy of "+name+" deleted", func() bool {
			gi, _ := gone.b.Load().Queue(name)
			gid := queueGroup(gone.b.Load().topo.lookupQueue(name).id)
			return gi.RaftRole == "none" && !slices.Contains(gone.log.Groups(), gid)
		})
	}
	// The new replica serves: with one old replica stopped (the group
	// keeps a majority with node 4) every message is still there.
	reps := metaQueueAt(c.nodes[0], onNew[0]).Replicas
	var old *clusterNode
	for _, nd := range c.nodes[:3] {
		if slices.Contains(reps, nd.id) {
			old = nd
		}
	}
	c.stop(old)
	c.publishConfirmed(onNew[0], "b", 5)
	if got := c.consumeAll(onNew[0], 35); len(got) != 35 {
		t.Fatalf("after the move %s holds %d distinct messages, want 35", onNew[0], len(got))
	}
	c.start(old, nil)

	// Decommissioning node 4 under publishing.
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- c.nodes[0].b.Load().DecommissionNode(ctx, 4) }()
	for i := range 5 {
		for _, name := range names[1:] {
			c.publishConfirmed(name, fmt.Sprintf("%s-c%d-", name, i), 10)
		}
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	c.waitFor("node 4 removed", func() bool { return n4.b.Load().MetaRemoved() })
	for _, name := range names {
		c.settledOn(name, n4, func(r []uint64) bool { return slices.Equal(r, []uint64{1, 2, 3}) })
	}
	c.stop(n4)
	// A replica restarted now, while its queues' last committed entries
	// are the moves' changes of voters (no command), recovers once it has
	// applied them (it waited for an applied command for good).
	r := c.nodes[2]
	c.stop(r)
	c.start(r, nil)
	rctx, rcancel := context.WithTimeout(t.Context(), 15*time.Second)
	defer rcancel()
	if err := r.b.Load().WaitRecovered(rctx); err != nil {
		t.Fatalf("node %d, restarted after the moves, never recovered: %v", r.id, err)
	}
	for _, name := range names[1:] {
		want := 30 + 50
		if got := c.consumeAll(name, want); len(got) != want {
			t.Fatalf("after the decommission %s holds %d distinct messages, want %d", name, len(got), want)
		}
	}
}

// TestClusterRemoveReplacesReplicas: a node holding replicas crashes and
// is removed from the cluster: every queue it held a replica of gets a
// new one on the other nodes (the replica count is restored: three of
// four nodes), and every confirmed message is still there.
func TestClusterRemoveReplacesReplicas(t *testing.T) {
	c := newTestCluster(t, 3)
	c.leader()
	names := []string{"r0", "r1", "r2"}
	for _, name := range names {
		c.declareOn(c.nodes[0], wire.QueueDeclare{Name: name, Durable: true})
		c.publishConfirmed(name, name+"-", 20)
	}
	c.addNode(c.nodes[1])
	c.role(4, "voter")
	for _, name := range names {
		c.settledOn(name, nil, func(r []uint64) bool { return len(r) == 3 })
	}
	dead := c.nodes[0]
	c.stop(dead)
	c.leader()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := c.nodes[1].b.Load().RemoveNode(ctx, dead.id); err != nil {
		t.Fatal(err)
	}
	for _, name := range names {
		c.settledOn(name, dead, func(r []uint64) bool { return slices.Equal(r, []uint64{2, 3, 4}) })
		if got := c.consumeAll(name, 20); len(got) != 20 {
			t.Fatalf("%s holds %d distinct messages after its replica was replaced, want 20", name, len(got))
		}
	}
}

// TestClusterDamagedReplicaRebuilt: a node whose copy of a replicated
// queue cannot be opened (its stored snapshot does not decode) says so
// naming the queue, in its log, its admin API (raft_role "failed", with
// the error) and /metrics, and serves nothing of it; the other two
// replicas keep serving the queue. Its copy is rebuilt from them: taken
// out of the group, deleted, and added back new, until it holds the
// leader's state (and the three replicas every confirmed message).
func TestClusterDamagedReplicaRebuilt(t *testing.T) {
	c := newTestCluster(t, 3)
	c.leader()
	bad, lead, gid := c.stoppedFollower("dmg", "d")
	editStoppedLog(t, bad.fs, func(_ *segment.Log, store *replication.SnapStore) error {
		return store.Put(gid, raftpb.SnapshotMetadata{Index: 3, Term: 1, ConfState: raftpb.ConfState{Voters: []uint64{1, 2, 3}}}, []byte("not a queue snapshot"))
	})
	c.start(bad, nil)
	c.sees(bad, "queue dmg durable=true")
	c.waitFor("the damaged replica named", func() bool {
		info, _ := bad.b.Load().Queue("dmg")
		return info.RaftRole == "failed" && strings.Contains(info.ReplicaError, "group")
	})
	c.publishConfirmed("dmg", "e", 10)
	// Rebuilt: a follower again, with the leader's state, the rebuild
	// done in the metadata.
	c.waitFor("the damaged replica rebuilt", func() bool { return c.replicaRebuilt(bad, c.nodes[(lead.id+1)%3], "dmg", 20) })
	if got := c.consumeAll("dmg", 20); len(got) != 20 {
		t.Fatalf("with one replica damaged the queue holds %d distinct messages, want 20", len(got))
	}
}

// groupVoters is the voters of queue name's raft group as node nd applied
// them (read on its shard).
func groupVoters(nd *clusterNode, name string) []uint64 {
	q := nd.b.Load().topo.lookupQueue(name)
	ch := make(chan []uint64, 1)
	q.shard.submit(Command{Kind: cmdPost, post: func() {
		if q.grp == nil {
			ch <- nil
			return
		}
		ch <- q.grp.Conf().Voters
	}})
	return <-ch
}

// TestClusterLostCopyAddedBack: a follower's copy of a queue is deleted
// while its leader counts it (here by hand, while the node is down: the
// way a copy deleted too early looks to the leader) and the node starts
// with the copy opened empty. The leader's heartbeat then names a commit
// past its log, on which raft panicked (`tocommit(N) is out of range
// [lastIndex(0)]`); now the leader takes it out of the group and adds it
// back as a new replica, which gets every message, and the queue has its
// three voters again.
func TestClusterLostCopyAddedBack(t *testing.T) {
	c := newTestCluster(t, 3)
	c.leader()
	bad, lead, gid := c.stoppedFollower("lost", "a")
	editStoppedLog(t, bad.fs, func(l *segment.Log, store *replication.SnapStore) error {
		if err := store.Forget(gid); err != nil {
			return err
		}
		return l.RemoveGroup(gid)
	})
	c.start(bad, nil)
	c.sees(bad, "queue lost durable=true")
	c.publishConfirmed("lost", "b", 10)
	c.waitFor("the lost copy added back", func() bool { return c.replicaCaughtUp(bad, "lost", 20) })
	if c.queueLeader("lost") != lead {
		t.Log("(the leadership moved meanwhile)")
	}
}
