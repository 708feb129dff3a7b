package cluster

import (
	"encoding/binary"
	"os"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/warren-mq/warren/segment"
	"go.etcd.io/raft/v3/raftpb"
)

// appendSnapshot is the whole encoding of a snapshot (what writeSnap
// streams).
func appendSnapshot(b []byte, gid uint64, s *Snapshot) []byte {
	b = binary.BigEndian.AppendUint64(b, gid)
	n := s.Msg.Size()
	b = binary.BigEndian.AppendUint32(b, uint32(n))
	off := len(b)
	b = append(b, make([]byte, n)...)
	if _, err := s.Msg.MarshalTo(b[off:]); err != nil {
		panic("cluster: BUG: a raft message that does not marshal: " + err.Error())
	}
	b = binary.BigEndian.AppendUint32(b, uint32(len(s.Data)))
	b = append(b, s.Data...)
	b = binary.BigEndian.AppendUint32(b, uint32(len(s.Entries)))
	for _, e := range s.Entries {
		b = binary.BigEndian.AppendUint64(b, e.Index)
		b = binary.BigEndian.AppendUint64(b, e.Term)
		b = binary.BigEndian.AppendUint32(b, uint32(len(e.Data)))
		b = append(b, e.Data...)
	}
	return b
}

// TestSnapshotFrame: a spooled snapshot decodes to what was encoded, its
// entries in memory or read from the file, and every truncation, a
// trailing byte and a message that is not a MsgSnap are refused.
func TestSnapshotFrame(t *testing.T) {
	s := &Snapshot{
		Msg: raftpb.Message{Type: raftpb.MsgSnap, From: 1, To: 2, Term: 3,
			Snapshot: &raftpb.Snapshot{Metadata: raftpb.SnapshotMetadata{Index: 40, Term: 3, ConfState: raftpb.ConfState{Voters: []uint64{1, 2, 3}}}}},
		Data:    []byte("the machine's image"),
		Entries: []segment.Entry{{Index: 12, Term: 2, Data: []byte("twelve")}, {Index: 30, Term: 3, Data: []byte{}}},
	}
	pl := appendSnapshot(nil, 1<<32+5, s)
	f, err := os.Create(filepath.Join(t.TempDir(), "spool"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.Write(append(pl, 0)); err != nil {
		t.Fatal(err)
	}
	size := int64(len(pl))
	for _, mem := range []int64{1 << 20, 0} {
		gid, got, err := readSpool(f, size, mem)
		if err != nil {
			t.Fatal(err)
		}
		if mem == 0 {
			if got.ReadEntry == nil || got.Entries[0].Data != nil {
				t.Fatal("entries over SnapshotMemBytes read into memory")
			}
			for i := range got.Entries {
				if got.Entries[i].Data, err = got.ReadEntry(i, nil); err != nil {
					t.Fatal(err)
				}
			}
			got.ReadEntry = nil
		}
		if gid != 1<<32+5 || !reflect.DeepEqual(got.Data, s.Data) || got.Msg.Snapshot.Metadata.Index != 40 ||
			len(got.Entries) != 2 || string(got.Entries[0].Data) != "twelve" || len(got.Entries[1].Data) != 0 ||
			got.Entries[1].Index != 30 || got.Entries[0].Term != 2 {
			t.Fatalf("decoded %d %+v", gid, got)
		}
	}
	for n := range size {
		for _, mem := range []int64{1 << 20, 0} {
			if _, _, err := readSpool(f, n, mem); err == nil {
				t.Fatalf("a snapshot cut at %d of %d bytes decoded", n, size)
			}
		}
	}
	if _, _, err := readSpool(f, size+1, 1<<20); err == nil {
		t.Fatal("a trailing byte accepted")
	}
	s.Msg.Type = raftpb.MsgApp
	if _, err := f.WriteAt(appendSnapshot(nil, 1, s), 0); err != nil {
		t.Fatal(err)
	}
	if _, _, err := readSpool(f, size, 1<<20); err == nil {
		t.Fatal("a MsgApp in a snapshot accepted")
	}
}
