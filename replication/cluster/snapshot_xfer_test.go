package cluster_test

import (
	"bytes"
	"fmt"
	"net"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/warren-mq/warren/internal/cutnet"
	"github.com/warren-mq/warren/replication/cluster"
	"github.com/warren-mq/warren/segment"
	"go.etcd.io/raft/v3/raftpb"
)

// TestSnapshotStreamed: a snapshot about 300 times a frame's size (and
// over the receiver's SnapshotMemBytes, so its entries stay in the spool
// file) crosses the transport in frames and arrives whole, its entries
// read from the file; releasing it removes the file. A connection lost
// mid-snapshot delivers nothing and leaves no file; the snapshot sent
// again arrives. A snapshot over MaxSpools (one not yet released) is
// refused, and taken again once the first is released.
func TestSnapshotStreamed(t *testing.T) {
	ls, addrs := listeners(t, 2)
	cut := &cutnet.Listener{Listener: ls[1]}
	cut.CutAfter.Store(300 << 10)
	ls[1] = cut
	spool := t.TempDir()
	got := make(chan *cluster.Snapshot, 4)
	var trs []*cluster.Transport
	for i := range 2 {
		tr, err := cluster.New(cluster.Config{NodeID: uint64(i + 1), Listener: ls[i], Peers: addrs, Secret: secret,
			MaxFrameBytes: 4 << 10, SpoolDir: spool, MaxSpools: 1, SnapshotMemBytes: 64 << 10,
			Deliver:         func(uint64, raftpb.Message) {},
			DeliverSnapshot: func(gid uint64, s *cluster.Snapshot) { got <- s }})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { tr.Close() })
		trs = append(trs, tr)
	}
	s := &cluster.Snapshot{Msg: raftpb.Message{Type: raftpb.MsgSnap, From: 1, To: 2, Term: 2,
		Snapshot: &raftpb.Snapshot{Metadata: raftpb.SnapshotMetadata{Index: 999, Term: 2}}}, Data: bytes.Repeat([]byte("d"), 10<<10)}
	for i := range 600 {
		s.Entries = append(s.Entries, segment.Entry{Index: uint64(10 + i), Term: 2, Data: fmt.Appendf(nil, "%02000d", i)})
	}
	sent := make(chan bool, 1)
	send := func() {
		trs[0].SendSnapshot(1<<32+1, s, func(ok bool) { sent <- ok })
	}
	heard := func() bool {
		t.Helper()
		select {
		case ok := <-sent:
			return ok
		case <-time.After(10 * time.Second):
			t.Fatal("the sender heard nothing of its snapshot within 10 s")
			return false
		}
	}
	// sendWhole sends until the sender hears its snapshot was written
	// whole, as raft sends again a snapshot reported failed: one sent
	// just after the cut may go out on the lost connection before the
	// sender has noticed the loss.
	sendWhole := func() {
		t.Helper()
		for range 10 {
			if send(); heard() {
				return
			}
		}
		t.Fatal("the snapshot was not sent whole in 10 tries")
	}
	spooled := func() int {
		ents, err := os.ReadDir(spool)
		if err != nil {
			t.Fatal(err)
		}
		return len(ents)
	}
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); !cond(); {
			if time.Now().After(deadline) {
				t.Fatalf("%s: not within 10 s", what)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	receive := func() *cluster.Snapshot {
		t.Helper()
		select {
		case r := <-got:
			return r
		case <-time.After(10 * time.Second):
			t.Fatal("the snapshot did not arrive within 10 s")
			return nil
		}
	}

	// Cut at 300 KiB of 1.2 MiB: nothing arrives, no file is left.
	send()
	waitFor("the cut", cut.Cut)
	heard() // written into socket buffers before the cut, or failed: either
	waitFor("the partial spool file removed", func() bool { return spooled() == 0 })
	select {
	case r := <-got:
		t.Fatalf("a snapshot cut mid-stream was delivered (%d entries)", len(r.Entries))
	default:
	}

	// Sent again (raft does so): whole, its entries in the file.
	sendWhole()
	r := receive()
	if !bytes.Equal(r.Data, s.Data) || len(r.Entries) != 600 || r.Msg.Snapshot.Metadata.Index != 999 || r.ReadEntry == nil || r.Release == nil {
		t.Fatalf("the snapshot arrived changed: %d bytes of data, %d entries, read from a file %v", len(r.Data), len(r.Entries), r.ReadEntry != nil)
	}
	var buf []byte
	for i, e := range r.Entries {
		var err error
		if buf, err = r.ReadEntry(i, buf); err != nil {
			t.Fatal(err)
		}
		if e.Index != s.Entries[i].Index || e.Term != 2 || !bytes.Equal(buf, s.Entries[i].Data) {
			t.Fatalf("entry %d arrived as %d/%d %q", i, e.Index, e.Term, buf[:min(len(buf), 20)])
		}
	}
	if n := spooled(); n != 1 {
		t.Fatalf("%d files spooled for the snapshot not yet released, want 1", n)
	}

	// MaxSpools 1: the next one is refused while it is held.
	sendWhole()
	waitFor("the second snapshot refused", func() bool { return trs[1].Stats().SnapsRefused == 1 })
	r.Release()
	if n := spooled(); n != 0 {
		t.Fatalf("%d files spooled after the release, want 0", n)
	}
	sendWhole()
	receive().Release()
}

// pauseListener's connections stop reading, once they have read past
// after bytes, until resume is closed (paused is closed then).
type pauseListener struct {
	net.Listener
	after          int64
	paused, resume chan struct{}
	once           sync.Once
}

func (l *pauseListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &pauseConn{Conn: c, l: l}, nil
}

type pauseConn struct {
	net.Conn
	l    *pauseListener
	read int64
}

func (c *pauseConn) Read(b []byte) (int, error) {
	if c.read > c.l.after {
		c.l.once.Do(func() { close(c.l.paused) })
		<-c.l.resume
	}
	n, err := c.Conn.Read(b)
	c.read += int64(n)
	return n, err
}

// TestForwardBetweenSnapshotFrames: a forward queued while a snapshot of
// 16 MiB is being written goes between its frames: it arrives before the
// snapshot does.
func TestForwardBetweenSnapshotFrames(t *testing.T) {
	ls, addrs := listeners(t, 2)
	pl := &pauseListener{Listener: ls[1], after: 256 << 10, paused: make(chan struct{}), resume: make(chan struct{})}
	ls[1] = pl
	var order []string
	var mu sync.Mutex
	note := func(what string) {
		mu.Lock()
		order = append(order, what)
		mu.Unlock()
	}
	snapped := make(chan struct{})
	var trs []*cluster.Transport
	for i := range 2 {
		tr, err := cluster.New(cluster.Config{NodeID: uint64(i + 1), Listener: ls[i], Peers: addrs, Secret: secret,
			MaxFrameBytes: 64 << 10, SpoolDir: t.TempDir(),
			Deliver:        func(uint64, raftpb.Message) {},
			DeliverForward: func(from uint64, p []byte) { note(string(p)) },
			DeliverSnapshot: func(gid uint64, s *cluster.Snapshot) {
				note("snapshot")
				if s.Release != nil {
					s.Release()
				}
				close(snapped)
			}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { tr.Close() })
		trs = append(trs, tr)
	}
	s := &cluster.Snapshot{Msg: raftpb.Message{Type: raftpb.MsgSnap, From: 1, To: 2, Term: 2,
		Snapshot: &raftpb.Snapshot{Metadata: raftpb.SnapshotMetadata{Index: 99, Term: 2}}}}
	body := make([]byte, 1<<20)
	for i := range 16 {
		s.Entries = append(s.Entries, segment.Entry{Index: uint64(10 + i), Term: 2, Data: body})
	}
	trs[0].SendSnapshot(1, s, func(bool) {})
	select {
	case <-pl.paused:
	case <-time.After(10 * time.Second):
		t.Fatal("the snapshot's first frames never came")
	}
	if !trs[0].SendForward(2, []byte("forward")) {
		t.Fatal("the forward was not queued")
	}
	close(pl.resume)
	select {
	case <-snapped:
	case <-time.After(10 * time.Second):
		t.Fatal("the snapshot did not arrive within 10 s")
	}
	mu.Lock()
	defer mu.Unlock()
	if len(order) != 2 || order[0] != "forward" {
		t.Fatalf("delivered in the order %v, want the forward first", order)
	}
}
