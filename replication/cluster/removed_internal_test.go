package cluster

import (
	"io"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"go.etcd.io/raft/v3/raftpb"

	"github.com/warren-mq/warren/internal/freeport"
)

// A refusal saying "removed" from whatever answers on a peer's address
// before the handshake proved the cluster secret does not make this node
// believe it was removed (which stops it for good): anyone on a reused
// port or on the path could send one (review). The post-proof refusal,
// which only a member can send, still does (TestCallAndSetPeers).
func TestUnauthenticatedRemovalIgnored(t *testing.T) {
	fake, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer fake.Close()
	closed := make(chan struct{})
	go func() {
		c, err := fake.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		var buf []byte
		if _, _, err := readFrame(c, &buf, 4096); err != nil { // the hello
			return
		}
		c.Write(appendFrame(nil, kindRefuse, []byte("cluster: node 1 "+removedReason)))
		_, _ = io.Copy(io.Discard, c) // until the dialer hangs up
		close(closed)
	}()
	self, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var removed atomic.Bool
	tr, err := New(Config{NodeID: 1, Listener: self, Secret: []byte("0123456789abcdef0123456789abcdef"),
		Peers:     map[uint64]string{1: self.Addr().String(), 2: fake.Addr().String()},
		Deliver:   func(uint64, raftpb.Message) {},
		OnRemoved: func(string) { removed.Store(true) }})
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	select {
	case <-closed:
	case <-time.After(10 * time.Second):
		t.Fatal("the transport never dialled the fake peer")
	}
	if removed.Load() {
		t.Fatal("an unauthenticated refusal made the node believe it was removed")
	}
}

// A snapshot queued for a peer that is never reached is reported not sent
// when the transport closes (or the peer is dropped): raft, told by done,
// leaves the follower's snapshot state. Before, done was never called.
func TestQueuedSnapshotReportedOnClose(t *testing.T) {
	self, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr, err := freeport.Addr() // nothing listens there: every dial fails (outside the ephemeral range: no 127.0.0.1:0 listener takes it)
	if err != nil {
		t.Fatal(err)
	}
	tr, err := New(Config{NodeID: 1, Listener: self, Secret: []byte("0123456789abcdef0123456789abcdef"),
		Peers: map[uint64]string{1: self.Addr().String(), 2: addr}, Deliver: func(uint64, raftpb.Message) {}})
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan bool, 1)
	tr.SendSnapshot(7, &Snapshot{Msg: raftpb.Message{Type: raftpb.MsgSnap, From: 1, To: 2}}, func(ok bool) { got <- ok })
	tr.Close()
	select {
	case ok := <-got:
		if ok {
			t.Fatal("a snapshot never written was reported sent")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the queued snapshot's done was never called")
	}
}
