package cluster_test

import (
	"context"
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/warren-mq/warren/replication/cluster"
	"go.etcd.io/raft/v3/raftpb"
)

// TestCallAndSetPeers: a node no peer knows yet calls a member (a join);
// the member then adds it (SetPeers) and takes its raft messages; once
// the member lists it as removed, the node's dials are refused with a
// reason its OnRemoved hears. A call with the wrong secret is refused.
func TestCallAndSetPeers(t *testing.T) {
	la, _ := net.Listen("tcp", "127.0.0.1:0")
	lc, _ := net.Listen("tcp", "127.0.0.1:0")
	got := make(chan raftpb.Message, 16)
	a, err := cluster.New(cluster.Config{NodeID: 1, Listener: la, Peers: map[uint64]string{1: la.Addr().String()}, Secret: secret,
		Deliver: func(_ uint64, m raftpb.Message) { got <- m },
		Handle: func(from uint64, op byte, body []byte) ([]byte, error) {
			if op == 9 {
				return nil, errors.New("no such op")
			}
			return append([]byte{byte(from), op}, body...), nil
		}})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	removed := make(chan string, 4)
	c, err := cluster.New(cluster.Config{NodeID: 3, Listener: lc, Peers: map[uint64]string{3: lc.Addr().String()}, Secret: secret,
		Deliver:   func(uint64, raftpb.Message) {},
		OnRemoved: func(why string) { removed <- why }})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	from, ans, err := c.Call(ctx, la.Addr().String(), 1, []byte("hi"))
	if err != nil || from != 1 || string(ans) != "\x03\x01hi" {
		t.Fatalf("call: %d %q %v", from, ans, err)
	}
	var ce *cluster.CallError
	if _, _, err := c.Call(ctx, la.Addr().String(), 9, nil); !errors.As(err, &ce) || ce.Msg != "no such op" {
		t.Fatalf("a call the handler refuses: %v", err)
	}
	bad, _ := net.Listen("tcp", "127.0.0.1:0")
	x, _ := cluster.New(cluster.Config{NodeID: 5, Listener: bad, Secret: []byte("another-secret-of-enough-bytes!!"), Deliver: func(uint64, raftpb.Message) {}})
	defer x.Close()
	if _, _, err := x.Call(ctx, la.Addr().String(), 1, nil); err == nil || !strings.Contains(err.Error(), "secret") {
		t.Fatalf("a call with another secret: %v", err)
	}

	// Both sides add each other: node 3's messages reach node 1.
	peers := map[uint64]string{1: la.Addr().String(), 3: lc.Addr().String()}
	a.SetPeers(peers, nil)
	c.SetPeers(peers, nil)
	c.Send(2, []raftpb.Message{{Type: raftpb.MsgHeartbeat, From: 3, To: 1, Term: 7}})
	select {
	case m := <-got:
		if m.From != 3 || m.Term != 7 {
			t.Fatalf("got %+v", m)
		}
	case <-ctx.Done():
		t.Fatal("node 3's message never arrived")
	}
	// Node 1 removes node 3: its connection goes, and the next dial is
	// refused with the reason.
	// (Its writer notices on its next write: raft sends one every
	// heartbeat.)
	a.SetPeers(map[uint64]string{1: la.Addr().String()}, []uint64{3})
	tk := time.NewTicker(20 * time.Millisecond)
	defer tk.Stop()
wait:
	for {
		select {
		case why := <-removed:
			if !strings.Contains(why, "was removed from the cluster") {
				t.Fatalf("the refusal: %q", why)
			}
			break wait
		case <-tk.C:
			c.Send(2, []raftpb.Message{{Type: raftpb.MsgHeartbeat, From: 3, To: 1, Term: 7}})
		case <-ctx.Done():
			t.Fatal("node 3 never heard it was removed")
		}
	}
	if _, _, err := c.Call(ctx, la.Addr().String(), 1, nil); err == nil || !strings.Contains(err.Error(), "was removed") {
		t.Fatalf("a removed node's call: %v", err)
	}
}
