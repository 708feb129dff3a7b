package broker

import (
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/warren-mq/warren/queue"
	"github.com/warren-mq/warren/replication"
	"github.com/warren-mq/warren/segment"
	"github.com/warren-mq/warren/wire"
)

// Damage found when the node's log opens (segment quarantine, issue 14):
// a durable queue's damaged data refuses that queue by name; damaged
// metadata refuses the node.

// sealWAL opens the log in /data (by hand: Manual) and seals its WAL
// file: a new one is started, with the metadata's hard state in it. The
// caller closes the log.
func sealWAL(t *testing.T, fs segment.FS) *segment.Log {
	t.Helper()
	l, err := segment.Open(fs, "/data", segment.Options{Manual: true})
	if err != nil {
		t.Fatal(err)
	}
	l.Rotate()
	hs, _ := l.HardState(replication.MetaGroupID)
	if err := l.Append(segment.Batch{Group: replication.MetaGroupID, HardState: &hs}); err != nil {
		t.Fatal(err)
	}
	return l
}

// moveToSegments moves everything in the WAL files of the log in /data
// into segment files (as the worker does in time), so that damage can be
// placed in one group's file.
func moveToSegments(t *testing.T, fs segment.FS) {
	t.Helper()
	l := sealWAL(t, fs)
	if err := l.Maintain(); err != nil {
		t.Fatal(err)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
}

// damageGroup flips a bit in the first record of group gid's newest
// segment file and returns the file's name.
func damageGroup(t *testing.T, mem *segment.MemFS, gid uint64) string {
	t.Helper()
	names, err := mem.List("/data")
	if err != nil {
		t.Fatal(err)
	}
	var segs []string
	for _, n := range names {
		if strings.HasPrefix(n, fmt.Sprintf("seg-%016x-", gid)) {
			segs = append(segs, n)
		}
	}
	if len(segs) == 0 {
		t.Fatalf("group %d has no segment file: %v", gid, names)
	}
	slices.Sort(segs)
	name := segs[len(segs)-1]
	mem.Corrupt("/data/"+name, 16+16+5, 2) // the first record's payload
	return name
}

// TestDurableDamagedQueueRefused: on a single node, a durable queue whose
// data is damaged is refused by name (consumers told why, publishes
// nacked) and never opened short of what it held; the other durable
// queue serves every message.
func TestDurableDamagedQueueRefused(t *testing.T) {
	mem := segment.NewMemFS()
	n := openDurNode(t, mem)
	k := newDurSink()
	for _, name := range []string{"good", "bad"} {
		q := declareDurable(t, n.b, name, true)
		batch := publish(n.b, q, k, true, "a", "b", "c")
		k.waitFor(t, "the confirm", func() bool { return k.confirmed(batch) })
	}
	gid := queueGroup(n.b.topo.lookupQueue("bad").id)
	n.close(t)
	moveToSegments(t, mem)
	file := damageGroup(t, mem, gid)

	var logged atomic.Pointer[string]
	n2 := openDurNodeOpts(t, mem, "/data", segment.Options{Quarantine: true}, func(c *Config, _ *MetaLogConfig) {
		c.Logger = captureLogger(func(line string) {
			if strings.Contains(line, "level=ERROR") && strings.Contains(line, "durable queue refused") {
				logged.Store(&line)
			}
		})
	})
	if err := n2.b.WaitRecovered(t.Context()); err != nil {
		t.Fatal(err)
	}
	if l := logged.Load(); l == nil || !strings.Contains(*l, "queue=bad") || !strings.Contains(*l, "vhost=/") || !strings.Contains(*l, file) {
		t.Fatalf("no error log line naming the queue, its vhost and the file: %v", l)
	}
	good, bad := n2.b.topo.lookupQueue("good"), n2.b.topo.lookupQueue("bad")
	k2 := newDurSink()
	bad.shard.submit(Command{Kind: CmdSubscribe, Queue: bad, Sink: k2, Spec: queue.ConsumerSpec{ID: 1, Owner: 7}, Req: 1})
	k2.waitFor(t, "the refused subscribe", func() bool { return len(k2.subs) == 1 })
	if k2.subs[0] != wire.PreconditionFailed || !strings.Contains(k2.reasons[0], `queue "bad"`) || !strings.Contains(k2.reasons[0], "damaged") {
		t.Fatalf("subscribe to the damaged queue: %v %q", k2.subs[0], k2.reasons[0])
	}
	nack := publish(n2.b, bad, k2, true, "d")
	k2.waitFor(t, "the nack", func() bool { return k2.confirmed(nack) })
	if wire.Code(nack.Codes[0]) != wire.InternalNack {
		t.Fatalf("publish to the damaged queue: code %d, want a nack", nack.Codes[0])
	}
	good.shard.submit(Command{Kind: CmdSubscribe, Queue: good, Sink: k2, Spec: queue.ConsumerSpec{ID: 2, Owner: 7}, Req: 2})
	k2.waitFor(t, "the good queue's messages", func() bool { return len(k2.got) == 3 })
	if _, ok := n2.log.Quarantined(gid); !ok {
		t.Fatal("the damaged group is no longer quarantined")
	}

	// Deleted, the queue's damaged copy goes at the next start.
	if _, err := n2.b.DeleteQueue(t.Context(), "bad", false, false); err != nil {
		t.Fatal(err)
	}
	if err := n2.b.MetaSync(t.Context()); err != nil {
		t.Fatal(err)
	}
	n2.close(t)
	n3 := openDurNodeOpts(t, mem, "/data", segment.Options{Quarantine: true}, nil)
	defer n3.close(t)
	if err := n3.b.WaitRecovered(t.Context()); err != nil {
		t.Fatal(err)
	}
	if d := n3.log.Damaged(); len(d) != 0 {
		t.Fatalf("the deleted queue's damaged copy is still there: %+v", d)
	}
}

type lineWriter func(string)

func (w lineWriter) Write(p []byte) (int, error) { w(string(p)); return len(p), nil }

// captureLogger is a text logger handing each line to fn.
func captureLogger(fn func(string)) *slog.Logger {
	return slog.New(slog.NewTextHandler(lineWriter(fn), nil))
}

// TestNodeLogMetadataDamage: damage in the metadata group's data refuses
// the node, saying that the metadata is damaged and naming the file.
func TestNodeLogMetadataDamage(t *testing.T) {
	mem := segment.NewMemFS()
	n := openDurNode(t, mem)
	declareDurable(t, n.b, "q", true)
	n.close(t)
	moveToSegments(t, mem)
	file := damageGroup(t, mem, replication.MetaGroupID)
	_, _, err := openNodeLog(mem, "/data", nil)
	if !errors.Is(err, segment.ErrCorrupt) || !strings.Contains(err.Error(), "metadata of this node is damaged") || !strings.Contains(err.Error(), file) {
		t.Fatalf("open with damaged metadata: %v", err)
	}
}

// TestClusterDamagedSegmentRebuilt: a node whose log holds damaged data of
// one replicated queue starts (the rest of its log is intact), refuses
// that replica naming the queue and the file (admin API raft_role
// "failed"), and the copy is rebuilt from the other replicas until the
// replica count is back and it holds every confirmed message.
func TestClusterDamagedSegmentRebuilt(t *testing.T) {
	c := newTestCluster(t, 3)
	c.leader()
	bad, lead, gid := c.stoppedFollower("dmg", "d")
	moveToSegments(t, bad.fs)
	file := damageGroup(t, bad.fs, gid)
	c.start(bad, nil)
	c.sees(bad, "queue dmg durable=true")
	c.waitFor("the damaged replica refused by name", func() bool {
		info, _ := bad.b.Load().Queue("dmg")
		return info.RaftRole == "failed" && strings.Contains(info.ReplicaError, `queue "dmg"`) && strings.Contains(info.ReplicaError, file)
	})
	c.publishConfirmed("dmg", "e", 10)
	c.waitFor("the damaged replica rebuilt", func() bool {
		info, _ := bad.b.Load().Queue("dmg")
		return c.replicaRebuilt(bad, c.nodes[(lead.id+1)%3], "dmg", 20) &&
			slices.Equal(info.RaftVoters, []uint64{1, 2, 3}) // as the admin API shows them (the fault harness waits for it)
	})
	if _, ok := bad.log.Quarantined(gid); ok {
		t.Fatal("the rebuilt group is still quarantined")
	}
	if got := c.consumeAll("dmg", 20); len(got) != 20 {
		t.Fatalf("with one replica damaged the queue holds %d distinct messages, want 20", len(got))
	}
}
