package cluster

import (
	"reflect"
	"testing"

	"github.com/warren-mq/warren/segment"
	"go.etcd.io/raft/v3/raftpb"
)

// TestSnapshotFrame: a snapshot frame decodes to what was encoded (owned
// copies), and every truncation, a trailing byte and a message that is
// not a MsgSnap are refused.
func TestSnapshotFrame(t *testing.T) {
	s := &Snapshot{
		Msg: raftpb.Message{Type: raftpb.MsgSnap, From: 1, To: 2, Term: 3,
			Snapshot: &raftpb.Snapshot{Metadata: raftpb.SnapshotMetadata{Index: 40, Term: 3, ConfState: raftpb.ConfState{Voters: []uint64{1, 2, 3}}}}},
		Data:    []byte("the machine's image"),
		Entries: []segment.Entry{{Index: 12, Term: 2, Data: []byte("twelve")}, {Index: 30, Term: 3, Data: []byte{}}},
	}
	pl := appendSnapshot(nil, 1<<32+5, s)
	gid, got, err := parseSnapshot(pl)
	if err != nil {
		t.Fatal(err)
	}
	if gid != 1<<32+5 || !reflect.DeepEqual(got.Data, s.Data) || got.Msg.Snapshot.Metadata.Index != 40 ||
		len(got.Entries) != 2 || string(got.Entries[0].Data) != "twelve" || got.Entries[1].Index != 30 || got.Entries[0].Term != 2 {
		t.Fatalf("decoded %d %+v", gid, got)
	}
	pl[len(pl)-1] = 'X' // the decoded copies do not alias the frame
	if string(got.Entries[0].Data) != "twelve" {
		t.Fatal("a decoded entry aliases the frame's buffer")
	}
	for n := range len(pl) {
		if _, _, err := parseSnapshot(pl[:n]); err == nil {
			t.Fatalf("a snapshot frame cut at %d of %d bytes decoded", n, len(pl))
		}
	}
	if _, _, err := parseSnapshot(append(pl, 0)); err == nil {
		t.Fatal("a trailing byte accepted")
	}
	s.Msg.Type = raftpb.MsgApp
	if _, _, err := parseSnapshot(appendSnapshot(nil, 1, s)); err == nil {
		t.Fatal("a MsgApp in a snapshot frame accepted")
	}
}
