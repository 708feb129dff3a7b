package broker

import (
	"encoding/binary"
	"net"
	"os"
	"strings"
	"testing"

	"github.com/warren-mq/warren/internal/cutnet"
	"github.com/warren-mq/warren/queue"
	"github.com/warren-mq/warren/wire"
	"go.etcd.io/raft/v3/raftpb"
)

// snapshotPayload is a cutnet counter of the payload bytes of snapshot
// frames (kind 7) on a transport connection: it follows the frames
// (len u32 | kind | payload) as they are read.
func snapshotPayload() func(read []byte) int64 {
	var hdr [5]byte
	got, left := 0, 0 // header bytes read; payload bytes of the current frame still to come
	return func(read []byte) int64 {
		var snapBytes int64
		for p := read; len(p) > 0; {
			if left == 0 {
				k := copy(hdr[got:], p)
				got += k
				p = p[k:]
				if got == 5 {
					got, left = 0, int(binary.BigEndian.Uint32(hdr[:4]))-1
				}
				continue
			}
			k := min(left, len(p))
			if hdr[4] == 7 {
				snapBytes += int64(k)
			}
			left -= k
			p = p[k:]
		}
		return snapBytes
	}
}

// TestClusterSnapshotStreamedAndCut: a replica whose queue's raft
// messages were lost while its leader snapshotted and compacted gets a
// snapshot about 20 times the frame size (16 KiB frames, 40 messages of
// 8 KiB), spooled to disk and installed from the file; its connection is
// lost a third of the way through the first time: nothing partial is
// installed, the leader sends it again, and the replica ends with every
// message (served with the old leader stopped), its spool file gone.
func TestClusterSnapshotStreamedAndCut(t *testing.T) {
	cuts := map[uint64]*cutnet.Listener{}
	c := newTestClusterWith(t, 3, func(c *testCluster) {
		c.maxFrame = 16 << 10
		c.wrap = func(id uint64, ln net.Listener) net.Listener {
			cuts[id] = &cutnet.Listener{Listener: ln, Count: snapshotPayload}
			cuts[id].CutAfter.Store(1 << 62)
			return cuts[id]
		}
	})
	c.leader()
	if _, err := c.nodes[0].b.Load().DeclareQueueAs(&wire.QueueDeclare{Name: "big", Durable: true}, 0, ""); err != nil {
		t.Fatal(err)
	}
	for _, nd := range c.nodes {
		c.sees(nd, "queue big durable=true")
	}
	lead := c.queueLeader("big")
	behind := c.nodes[lead.id%3]
	c.hold(behind.id) // its queue's raft messages: lost below
	lb := lead.b.Load()
	lq := lb.topo.lookupQueue("big")
	k := newDurSink()
	var bodies []string
	for i := range 40 {
		bodies = append(bodies, strings.Repeat(string(rune('a'+i%26)), 8<<10))
	}
	for _, body := range bodies { // one entry each: an entry fits a frame
		batch := publish(lb, lq, k, true, body)
		k.waitFor(t, "the confirm", func() bool { return k.confirmed(batch) })
	}
	// The others snapshot and compact: the entries it lacks are gone from
	// their logs.
	for _, nd := range c.nodes {
		if nd == behind {
			continue
		}
		b := nd.b.Load()
		q := b.topo.lookupQueue("big")
		c.waitFor("the replica applied the publishes", func() bool {
			info, _ := b.Queue("big")
			return info.Ready == 40
		})
		snapped := make(chan error, 1)
		q.shard.submit(Command{Kind: cmdPost, post: func() {
			if err := q.grp.Snapshot(b.cfg.Durable.Snapshots, func(_ raftpb.SnapshotMetadata, err error) { snapped <- err }); err != nil {
				snapped <- err
			}
		}})
		if err := <-snapped; err != nil {
			t.Fatal(err)
		}
	}
	cut := cuts[behind.id]
	cut.CutAfter.Store(100 << 10) // (no snapshot frame read yet: nothing was sent)
	c.holdMu.Lock()
	c.holding[behind.id], c.held[behind.id] = false, nil // lost
	c.holdMu.Unlock()

	c.waitFor("the replica installed the snapshot and caught up", func() bool {
		got, _ := behind.b.Load().Queue("big")
		return got.Ready == 40 && cut.Cut()
	})
	bq := behind.b.Load().topo.lookupQueue("big")
	installs := make(chan uint64, 1)
	bq.shard.submit(Command{Kind: cmdPost, post: func() { installs <- bq.shard.rw.Stats().SnapshotsInstalled }})
	if n := <-installs; n != 1 {
		t.Fatalf("the restarted replica installed %d snapshots, want 1", n)
	}
	var sent uint64 // by either node (the leadership may move meanwhile)
	for _, nd := range c.nodes {
		if nd == behind {
			continue
		}
		q := nd.b.Load().topo.lookupQueue("big")
		n := make(chan uint64, 1)
		q.shard.submit(Command{Kind: cmdPost, post: func() { n <- q.shard.rw.Stats().SnapshotsSent }})
		sent += <-n
	}
	if sent < 2 {
		t.Fatalf("%d snapshots sent: the cut did not fall in one (sent again)", sent)
	}
	if ents, err := os.ReadDir(behind.spool); err != nil || len(ents) != 0 {
		t.Fatalf("the spool directory holds %d files after the install (%v)", len(ents), err)
	}
	// Its copy serves: consumed with the leader stopped.
	c.stop(lead)
	sub := newDurSink()
	var nq *Queue
	c.waitFor("a new leader", func() bool {
		nl := c.queueLeader("big")
		if nl == nil {
			return false
		}
		nq = nl.b.Load().topo.lookupQueue("big")
		return true
	})
	nq.shard.submit(Command{Kind: CmdSubscribe, Queue: nq, Sink: sub, Spec: queue.ConsumerSpec{ID: 9, Owner: 9}, Req: 1})
	sub.waitFor(t, "40 deliveries", func() bool { return len(sub.got) == 40 })
	sub.mu.Lock()
	defer sub.mu.Unlock()
	for i, d := range sub.got {
		if d.body != bodies[i] {
			t.Fatalf("message %d: %d bytes %.8q..., want %.8q...", i, len(d.body), d.body, bodies[i])
		}
	}
}
