package cluster_test

import (
	"bytes"
	"fmt"
	"testing"
	"time"

	"github.com/warren-mq/warren/replication/cluster"
	"github.com/warren-mq/warren/segment"
	"go.etcd.io/raft/v3/raftpb"
)

// TestSnapshotOverFrames: a snapshot many times a frame's size crosses
// the transport in frames and arrives whole; one over MaxSnapshotBytes is
// refused at once (done false) and never sent.
func TestSnapshotOverFrames(t *testing.T) {
	ls, addrs := listeners(t, 2)
	got := make(chan *cluster.Snapshot, 1)
	var trs []*cluster.Transport
	for i := range 2 {
		tr, err := cluster.New(cluster.Config{NodeID: uint64(i + 1), Listener: ls[i], Peers: addrs, Secret: secret,
			MaxFrameBytes: 4 << 10, MaxSnapshotBytes: 1 << 20,
			Deliver:         func(uint64, raftpb.Message) {},
			DeliverSnapshot: func(gid uint64, s *cluster.Snapshot) { got <- s }})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { tr.Close() })
		trs = append(trs, tr)
	}
	s := &cluster.Snapshot{Msg: raftpb.Message{Type: raftpb.MsgSnap, From: 1, To: 2, Term: 2,
		Snapshot: &raftpb.Snapshot{Metadata: raftpb.SnapshotMetadata{Index: 99, Term: 2}}}, Data: bytes.Repeat([]byte("d"), 10<<10)}
	for i := range 40 {
		s.Entries = append(s.Entries, segment.Entry{Index: uint64(10 + i), Term: 2, Data: []byte(fmt.Sprintf("%01000d", i))})
	}
	sent := make(chan bool, 2)
	trs[0].SendSnapshot(1<<32+1, s, func(ok bool) { sent <- ok })
	select {
	case r := <-got:
		if !bytes.Equal(r.Data, s.Data) || len(r.Entries) != 40 || string(r.Entries[39].Data) != string(s.Entries[39].Data) || r.Msg.Snapshot.Metadata.Index != 99 {
			t.Fatalf("the snapshot arrived changed: %d bytes of data, %d entries", len(r.Data), len(r.Entries))
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the snapshot did not arrive within 10 s")
	}
	if !<-sent {
		t.Fatal("done said the snapshot was not sent")
	}
	s.Data = make([]byte, 2<<20)
	trs[0].SendSnapshot(1<<32+1, s, func(ok bool) { sent <- ok })
	if <-sent {
		t.Fatal("a snapshot over MaxSnapshotBytes was sent")
	}
}
