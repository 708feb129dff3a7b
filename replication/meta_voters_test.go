package replication

import (
	"context"
	"net"
	"strings"
	"sync"
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
func TestMetaThreeVotersOverTCP(t *testing.T) {
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
	groups := make([]*MetaGroup, 3)
	machines := make([]*listMachine, 3)
	locks := make([]*sync.Mutex, 3)
	for i := range groups {
		i := i
		log := openMemLog(t, segment.NewMemFS())
		store, err := OpenSnapStore(log)
		if err != nil {
			t.Fatal(err)
		}
		var g *MetaGroup
		var ready sync.WaitGroup
		ready.Add(1)
		tr, err := cluster.New(cluster.Config{NodeID: uint64(i + 1), Listener: ls[i], Peers: addrs, Secret: secret,
			Deliver: func(gid uint64, m raftpb.Message) {
				ready.Wait()
				if gid == MetaGroupID {
					g.Step(m)
				}
			}})
		if err != nil {
			t.Fatal(err)
		}
		machines[i], locks[i] = &listMachine{}, &sync.Mutex{}
		g, err = OpenMeta(MetaConfig{Log: log, Snapshots: store, Machine: machines[i], Lock: locks[i],
			Snapshot: func() []byte { b, _ := machines[i].Snapshot(); return b },
			NodeID:   uint64(i + 1), Peers: []uint64{1, 2, 3}, Send: tr.Send,
			Fatal: func(err error) { t.Errorf("node %d: %v", i+1, err) }})
		if err != nil {
			t.Fatal(err)
		}
		ready.Done()
		g.Start()
		groups[i] = g
		t.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			tr.Close()
			g.Close(ctx)
			log.Close()
		})
	}
	// The raft clock: a tick every 5 ms (100 ms in a node), until cond.
	tickUntil := func(what string, cond func() bool) {
		t.Helper()
		deadline := time.Now().Add(20 * time.Second)
		tk := time.NewTicker(5 * time.Millisecond)
		defer tk.Stop()
		for !cond() {
			if time.Now().After(deadline) {
				t.Fatalf("%s: not within 20 s", what)
			}
			<-tk.C
			for _, g := range groups {
				g.Tick()
			}
		}
	}
	lead := -1
	tickUntil("a leader", func() bool {
		for i, g := range groups {
			if g.Status().RaftState == raft.StateLeader {
				lead = i
				return true
			}
		}
		return false
	})
	locks[lead].Lock()
	groups[lead].Add([]byte("declare a"))
	seq := groups[lead].Add([]byte("declare b"))
	locks[lead].Unlock()
	waited := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		waited <- groups[lead].Wait(ctx, seq)
	}()
	var werr error
	tickUntil("the leader's Wait", func() bool {
		select {
		case werr = <-waited:
			return true
		default:
			return false
		}
	})
	if werr != nil {
		t.Fatal(werr)
	}
	if got := machines[lead].list(); got != "declare a,declare b" {
		t.Fatalf("leader applied %q once Wait returned", got)
	}
	tickUntil("every node applying both", func() bool {
		for _, m := range machines {
			if m.list() != "declare a,declare b" {
				return false
			}
		}
		return true
	})
}
