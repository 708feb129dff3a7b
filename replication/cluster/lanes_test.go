package cluster_test

import (
	"net"
	"testing"
	"time"

	"github.com/warren-mq/warren/replication/cluster"
	"go.etcd.io/raft/v3/raftpb"
)

// TestControlNotBehindData: raft messages travel on their own connection
// (design §6.1), so a forward the peer is slow to take does not hold them
// back. The receiver's DeliverForward blocks on the first forward (its
// data connection stops being read, as a large forward or snapshot
// would hold it); a heartbeat sent after it is still delivered. On one
// shared connection it could not be: it would sit behind the forward.
func TestControlNotBehindData(t *testing.T) {
	ls, addrs := listeners(t, 2)
	entered, release := make(chan struct{}), make(chan struct{})
	got := make(chan raftpb.Message, 1)
	fwds := make(chan []byte, 4)
	b, err := cluster.New(cluster.Config{NodeID: 2, Listener: ls[1], Peers: addrs, Secret: secret,
		Deliver: func(_ uint64, m raftpb.Message) { got <- m },
		DeliverForward: func(_ uint64, p []byte) {
			fwds <- append([]byte(nil), p...)
			if len(fwds) == 1 {
				close(entered)
				<-release
			}
		}})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	a, err := cluster.New(cluster.Config{NodeID: 1, Listener: ls[0], Peers: addrs, Secret: secret,
		Deliver: func(uint64, raftpb.Message) {}})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	defer close(release)
	big := make([]byte, 8<<20)
	if !a.SendForward(2, big) || !a.SendForward(2, []byte("after")) {
		t.Fatal("forwards not queued")
	}
	select {
	case <-entered:
	case <-time.After(10 * time.Second):
		t.Fatal("the forward never arrived")
	}
	a.Send(7, []raftpb.Message{{Type: raftpb.MsgHeartbeat, From: 1, To: 2, Term: 3}})
	select {
	case m := <-got:
		if m.Type != raftpb.MsgHeartbeat || m.Term != 3 {
			t.Fatalf("delivered %v", m)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the heartbeat waited behind a forward the peer has not taken")
	}
}

// TestForwardAfterPeerRestart: a forward sent to a peer that restarted
// (its old connection closed while idle) reaches the new process: the
// writer dials again when the peer closes the connection, rather than
// finding the loss by writing the next forward into it, which would lose
// that forward.
func TestForwardAfterPeerRestart(t *testing.T) {
	ls, addrs := listeners(t, 2)
	fwds := make(chan string, 10)
	cfg := func(l net.Listener) cluster.Config {
		return cluster.Config{NodeID: 2, Listener: l, Peers: addrs, Secret: secret, Deliver: func(uint64, raftpb.Message) {},
			DeliverForward: func(_ uint64, p []byte) { fwds <- string(p) }}
	}
	b, err := cluster.New(cfg(ls[1]))
	if err != nil {
		t.Fatal(err)
	}
	a, err := cluster.New(cluster.Config{NodeID: 1, Listener: ls[0], Peers: addrs, Secret: secret, Deliver: func(uint64, raftpb.Message) {}})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	wantFwd := func(want string) {
		t.Helper()
		select {
		case got := <-fwds:
			if got != want {
				t.Fatalf("forward %q, want %q", got, want)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("forward %q never arrived", want)
		}
	}
	waitData := func(connected bool) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for a.PeerStats(2).DataConnected != connected {
			if time.Now().After(deadline) {
				t.Fatalf("the data connection not connected=%v within 10 s", connected)
			}
			time.Sleep(5 * time.Millisecond) // polling with a deadline
		}
	}
	a.SendForward(2, []byte("one"))
	wantFwd("one")
	waitData(true)
	b.Close()
	// The idle data connection's loss is noticed (before anything is
	// written into it).
	waitData(false)
	l, err := net.Listen("tcp", addrs[2])
	if err != nil {
		t.Skipf("cannot listen on %s again: %v", addrs[2], err)
	}
	if b, err = cluster.New(cfg(l)); err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	waitData(true)
	a.SendForward(2, []byte("two"))
	wantFwd("two")
}
