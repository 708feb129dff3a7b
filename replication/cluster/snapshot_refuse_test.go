package cluster

import (
	"bytes"
	"net"
	"os"
	"testing"

	"go.etcd.io/raft/v3/raftpb"
)

// TestSnapshotSpoolFailureRefusesEarly: a snapshot whose spool file
// cannot be written (a full disk) is refused at its first frame that
// fails, with an error that closes the data connection, so its sender
// stops at once (its write fails; raft sends the snapshot again) instead
// of sending all of it to be read and dropped; and no later frame of it
// opens a spool file of its own (a frame from the middle of a snapshot
// taken for the start of one). A spool file that cannot be created
// refuses as early. No spool file is left, and the refusal is counted.
func TestSnapshotSpoolFailureRefusesEarly(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	tr, err := New(Config{NodeID: 2, Listener: ln, Secret: []byte("0123456789abcdef0123456789abcdef"), SpoolDir: dir,
		Deliver: func(uint64, raftpb.Message) {}, DeliverSnapshot: func(uint64, *Snapshot) { t.Error("a snapshot was delivered") }})
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	opened := 0
	full := func() (*os.File, error) { // created, but every write fails (as on a full disk)
		opened++
		f, err := os.CreateTemp(dir, spoolPattern)
		if err != nil {
			return nil, err
		}
		name := f.Name()
		f.Close()
		return os.Open(name)
	}
	frame := append([]byte{0}, bytes.Repeat([]byte("s"), 4<<10)...)
	last := append([]byte{1}, frame[1:]...)

	for _, tc := range []struct {
		what   string
		create func() (*os.File, error)
	}{
		{"a spool write fails", full},
		{"no spool file", func() (*os.File, error) { opened++; return nil, os.ErrPermission }},
	} {
		tr.createSpool, opened = tc.create, 0
		refused := tr.Stats().SnapsRefused
		var sp *spool
		err := tr.snapFrame(1, frame, &sp)
		if err == nil {
			// Not refused early: what the sender goes on sending.
			for i := 0; i < 7 && err == nil; i++ {
				err = tr.snapFrame(1, frame, &sp)
			}
			if err == nil {
				err = tr.snapFrame(1, last, &sp)
			}
			t.Fatalf("%s: the first frame not refused (the connection stays: its sender sends all of it); %d spool files opened for one snapshot; then %v", tc.what, opened, err)
		}
		if sp != nil || opened != 1 || tr.Stats().SnapsRefused != refused+1 {
			t.Fatalf("%s: %v; spool under way %v, %d spool files opened, %d refused, want none, 1 and 1", tc.what, err, sp != nil, opened, tr.Stats().SnapsRefused-refused)
		}
		if ents, _ := os.ReadDir(dir); len(ents) != 0 {
			t.Fatalf("%s: %d spool files left", tc.what, len(ents))
		}
	}
}
