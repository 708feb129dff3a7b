package replication

import (
	"context"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/warren-mq/warren/replication/cluster"
	"github.com/warren-mq/warren/segment"
	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
)

// listMachine applies commands by appending them to a list (tests).
type listMachine struct {
	mu      sync.Mutex
	applied []string
	index   uint64
}

func (m *listMachine) Apply(index uint64, cmd []byte) (any, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.applied = append(m.applied, string(cmd))
	m.index = index
	return nil, nil
}

func (m *listMachine) Snapshot() ([]byte, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return []byte(strings.Join(m.applied, "\n")), nil
}

func (m *listMachine) Restore(index uint64, snap []byte) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.applied, m.index = nil, index
	if len(snap) > 0 {
		m.applied = strings.Split(string(snap), "\n")
	}
	return nil
}

func (m *listMachine) list() string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return strings.Join(m.applied, ",")
}

// TestMetaThreeVotersOverTCP: three metadata groups with every node a
// voter (MetaConfig.Peers), their raft messages carried by the TCP
// transport, elect a leader as they are ticked; commands added on the
// leader are applied at commit on all three, in the same order, and the
// leader's Wait returns once they are applied there (on several voters
// the caller does not apply at add: an entry the leader appended may be
// lost with its leadership).
type metaNode struct {
	fs      *segment.MemFS
	log     *segment.Log
	g       atomic.Pointer[MetaGroup]
	machine *listMachine
	lock    *sync.Mutex
	tr      *cluster.Transport
	// untagged: its TagTerms says a member does not read version 3
	// entries (a cluster mid-upgrade).
	untagged atomic.Bool
	// done: what Done was told, by seq (lock).
	done map[uint64]any
}

// openMetaNode opens node id's group over its TCP transport.
func openMetaNode(t *testing.T, n *metaNode, id uint64) {
	t.Helper()
	openMetaNodeSend(t, n, id, n.tr.Send)
}

// openMetaNodeSend opens node id's group (a voter of three) on n's
// filesystem, with send for the transport.
func openMetaNodeSend(t *testing.T, n *metaNode, id uint64, send func(uint64, []raftpb.Message)) {
	t.Helper()
	l, err := segment.Open(n.fs, "/data", segment.Options{Manual: true, WALSize: 16 << 10, SegmentSize: 32 << 10})
	if err != nil {
		t.Fatal(err)
	}
	store, err := OpenSnapStore(l)
	if err != nil {
		t.Fatal(err)
	}
	n.log, n.machine, n.lock, n.done = l, &listMachine{}, &sync.Mutex{}, map[uint64]any{}
	m := n.machine
	g, err := OpenMeta(MetaConfig{Log: l, Snapshots: store, Machine: m, Lock: n.lock,
		Snapshot: func() []byte { b, _ := m.Snapshot(); return b },
		NodeID:   id, Peers: []uint64{1, 2, 3}, Send: send,
		TagTerms: func([]uint64) bool { return !n.untagged.Load() },
		Done:     func(seq uint64, res any) { n.done[seq] = res },
		Fatal:    func(err error) { t.Errorf("node %d: %v", id, err) }})
	if err != nil {
		t.Fatal(err)
	}
	g.Start()
	n.g.Store(g)
}

func closeMetaNode(n *metaNode) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if g := n.g.Swap(nil); g != nil {
		g.Close(ctx)
	}
	n.log.Close()
}

// newMetaTrio: three metadata groups, every node a voter, over the TCP
// transport on loopback.
func newMetaTrio(t *testing.T) []*metaNode {
	ls := make([]net.Listener, 3)
	addrs := map[uint64]string{}
	for i := range ls {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		ls[i], addrs[uint64(i+1)] = l, l.Addr().String()
	}
	secret := []byte("0123456789abcdef0123456789abcdef")
	nodes := make([]*metaNode, 3)
	for i := range nodes {
		n := &metaNode{fs: segment.NewMemFS()}
		tr, err := cluster.New(cluster.Config{NodeID: uint64(i + 1), Listener: ls[i], Peers: addrs, Secret: secret,
			Deliver: func(gid uint64, m raftpb.Message) {
				if g := n.g.Load(); g != nil && gid == MetaGroupID {
					g.Step(m)
				}
			}})
		if err != nil {
			t.Fatal(err)
		}
		n.tr = tr
		openMetaNode(t, n, uint64(i+1))
		nodes[i] = n
		t.Cleanup(func() {
			tr.Close()
			closeMetaNode(n)
		})
	}
	return nodes
}

// metaTickUntil ticks every group every 5 ms (100 ms in a node) until
// cond holds.
func metaTickUntil(t *testing.T, nodes []*metaNode, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	tk := time.NewTicker(5 * time.Millisecond)
	defer tk.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 20 s", what)
		}
		<-tk.C
		for _, n := range nodes {
			if g := n.g.Load(); g != nil {
				g.Tick()
			}
		}
	}
}

func metaLeader(t *testing.T, nodes []*metaNode) int {
	lead := -1
	metaTickUntil(t, nodes, "a leader", func() bool {
		for i, n := range nodes {
			if g := n.g.Load(); g != nil && g.Status().RaftState == raft.StateLeader {
				lead = i
				return true
			}
		}
		return false
	})
	return lead
}

// metaAdd adds cmds on node i and waits (ticking) for its Wait.
func metaAdd(t *testing.T, nodes []*metaNode, i int, cmds ...string) {
	t.Helper()
	metaAwait(t, nodes, "the leader's Wait", waitAsync(nodes[i].g.Load(), addOn(nodes[i], cmds...)))
}

// addOn adds cmds on n (under its lock) and returns the last one's seq.
func addOn(n *metaNode, cmds ...string) uint64 {
	n.lock.Lock()
	defer n.lock.Unlock()
	var seq uint64
	for _, c := range cmds {
		seq = n.g.Load().Add([]byte(c))
	}
	return seq
}

// waitAsync starts g.Wait(seq) and returns its answer's channel.
func waitAsync(g *MetaGroup, seq uint64) chan error {
	ch := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		ch <- g.Wait(ctx, seq)
	}()
	return ch
}

// metaAwait ticks nodes until done answers (what names the wait), and
// fails the test on the error it answers.
func metaAwait(t *testing.T, nodes []*metaNode, what string, done chan error) {
	t.Helper()
	var err error
	metaTickUntil(t, nodes, what, func() bool {
		select {
		case err = <-done:
			return true
		default:
			return false
		}
	})
	if err != nil {
		t.Fatal(err)
	}
}

// metaAllApplied: whether every one of nodes has applied exactly want.
func metaAllApplied(nodes []*metaNode, want string) func() bool {
	return func() bool {
		for _, n := range nodes {
			if n.machine.list() != want {
				return false
			}
		}
		return true
	}
}

// TestMetaThreeVotersOverTCP: three metadata groups with every node a
// voter (MetaConfig.Peers), their raft messages carried by the TCP
// transport, elect a leader as they are ticked; commands added on the
// leader are applied at commit on all three, in the same order, and the
// leader's Wait returns once they are applied there (on several voters
// the caller does not apply at add: an entry the leader appended may be
// lost with its leadership).
func TestMetaThreeVotersOverTCP(t *testing.T) {
	nodes := newMetaTrio(t)
	lead := metaLeader(t, nodes)
	metaAdd(t, nodes, lead, "declare a", "declare b")
	if got := nodes[lead].machine.list(); got != "declare a,declare b" {
		t.Fatalf("leader applied %q once Wait returned", got)
	}
	metaTickUntil(t, nodes, "every node applying both", metaAllApplied(nodes, "declare a,declare b"))
}

// TestMetaVoterRestarts: a follower closed and reopened from its log
// (a fresh machine: OpenMeta replays what its log has committed) rejoins
// and ends with every command applied exactly once, in order.
func TestMetaVoterRestarts(t *testing.T) {
	nodes := newMetaTrio(t)
	lead := metaLeader(t, nodes)
	metaAdd(t, nodes, lead, "declare a", "declare b")
	f := (lead + 1) % 3
	metaTickUntil(t, nodes, "the follower applying both", func() bool { return nodes[f].machine.list() == "declare a,declare b" })
	closeMetaNode(nodes[f])
	openMetaNode(t, nodes[f], uint64(f+1))
	if got := nodes[f].machine.list(); got != "" && got != "declare a" && got != "declare a,declare b" {
		t.Fatalf("the reopened follower replayed %q", got)
	}
	lead = metaLeader(t, nodes)
	metaAdd(t, nodes, lead, "declare c")
	metaTickUntil(t, nodes, "every node applying all three", metaAllApplied(nodes, "declare a,declare b,declare c"))
}
