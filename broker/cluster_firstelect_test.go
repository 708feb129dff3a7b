package broker

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/warren-mq/warren/wire"
	"go.etcd.io/raft/v3/raftpb"
)

// agreedLeader reports whether every node has applied queue name's
// declare and every replica knows the same leader of it.
func (c *testCluster) agreedLeader(name string) bool {
	var lead uint64
	for _, nd := range c.nodes {
		info, ok := nd.b.Load().Queue(name)
		if !ok {
			return false
		}
		if !slices.Contains(info.Replicas, nd.id) {
			continue
		}
		if info.Leader == 0 || (lead != 0 && info.Leader != lead) {
			return false
		}
		lead = info.Leader
	}
	return lead != 0
}

// TestClusterFirstElection: a new replicated queue has a leader every
// replica knows within a round trip or two of its declare's answer, not
// after raft's election timeout. The preferred leader campaigns as it
// opens the group, often before the other replicas have applied the
// declare; their groups were not open when its vote requests came, and
// without parking them (raftpark.go) the election waited for the
// timeout (10-20 ticks: 1-2 s at this test's tick of 100 ms, the
// production one). 20 queues declared one after another on the three
// nodes in turn, each waited for before the next: without the parking
// about a third waited for the timeout. WARREN_FIRST_ELECTION_N declares
// more (a measurement: the distribution is logged, go test -v).
func TestClusterFirstElection(t *testing.T) {
	n := 20
	if s := os.Getenv("WARREN_FIRST_ELECTION_N"); s != "" {
		var err error
		if n, err = strconv.Atoi(s); err != nil || n < 1 {
			t.Fatalf("WARREN_FIRST_ELECTION_N=%q", s)
		}
	}
	const tick = 100 * time.Millisecond
	c := newTestClusterWith(t, 3, func(c *testCluster) { c.tick = tick })
	c.leader()
	lat := make([]time.Duration, n)
	for i := range n {
		name := fmt.Sprintf("fe%d", i)
		if _, err := c.nodes[i%3].b.Load().DeclareQueueAs(&wire.QueueDeclare{Name: name, Durable: true}, 0, ""); err != nil {
			t.Fatal(err)
		}
		ok := time.Now()
		for !c.agreedLeader(name) {
			if time.Since(ok) > 10*time.Second {
				t.Fatalf("queue %s: no leader every replica knows within 10 s of its declare", name)
			}
			time.Sleep(time.Millisecond) // polling with a deadline
		}
		lat[i] = time.Since(ok)
	}
	s := slices.Clone(lat)
	slices.Sort(s)
	pct := func(p int) time.Duration { return s[(len(s)-1)*p/100] }
	// Well under the election timeout (1 s here), well over a
	// metadata apply and a round trip or two on loopback.
	const limit = 500 * time.Millisecond
	r := func(d time.Duration) time.Duration { return d.Round(time.Millisecond / 10) }
	over := len(s) - len(slices.DeleteFunc(slices.Clone(s), func(d time.Duration) bool { return d > limit }))
	t.Logf("declare-ok → a leader every replica knows, %d queues (tick %v, election timeout %v-%v): min %v p50 %v p90 %v p99 %v max %v; over %v: %d",
		n, tick, 10*tick, 20*tick, r(s[0]), r(pct(50)), r(pct(90)), r(pct(99)), r(s[n-1]), limit, over)
	for i, d := range lat {
		if d > limit {
			t.Errorf("queue fe%d: first leader known everywhere %v after its declare (want under %v; the election timeout is %v-%v)", i, d, limit, 10*tick, 20*tick)
		}
	}

	// Held only for a queue not declared on the node yet: a message for
	// a deleted queue's group (its id is below Meta's next) is dropped,
	// as is one for a group far past it or for a queue created here.
	b1 := c.nodes[0].b.Load()
	goneID := uint64(b1.topo.lookupQueue("fe0").id)
	if _, err := b1.DeleteQueue(context.Background(), "fe0", false, false); err != nil {
		t.Fatal(err)
	}
	c.waitFor("fe0 deleted on every node", func() bool {
		for _, nd := range c.nodes {
			if nd.b.Load().LookupQueue("fe0") != nil {
				return false
			}
		}
		return true
	})
	stale := raftpb.Message{Type: raftpb.MsgPreVote, From: 2, To: 1, Term: 9}
	for _, nd := range c.nodes {
		b := nd.b.Load()
		next := b.park.next.Load()
		for _, id := range []uint64{goneID, next + parkAhead, uint64(b.topo.lookupQueue("fe1").id)} {
			b.StepRaft(QueueGroupBase+id, stale)
		}
		barrier(t, b.topo.lookupQueue("fe1").shard)
		b.park.mu.Lock()
		n := len(b.park.groups)
		b.park.mu.Unlock()
		if n != 0 {
			t.Fatalf("node %d holds messages for %d groups: a deleted queue's, one far ahead or one open", nd.id, n)
		}
		// The next queue's: held until its shard creates it.
		b.StepRaft(QueueGroupBase+next, stale)
		if got := b.park.take(QueueGroupBase + next); len(got) != 1 {
			t.Fatalf("node %d held %d messages for the next queue's group, want 1", nd.id, len(got))
		}
	}

	// A node that began leaving after a leadership transfer's
	// MsgTimeoutNow was held takes none back: createQueue gets the
	// group's other messages only.
	b := c.nodes[0].b.Load()
	next := QueueGroupBase + b.park.next.Load()
	b.StepRaft(next, raftpb.Message{Type: raftpb.MsgTimeoutNow, From: 2, To: 1, Term: 9})
	b.StepRaft(next, stale)
	b.leaving.Store(true)
	defer b.leaving.Store(false)
	if got := b.takeParked(next); len(got) != 1 || got[0].Type != raftpb.MsgPreVote {
		t.Fatalf("a leaving node took %v for a new group, want the MsgPreVote alone", got)
	}
}

// TestRaftParkBounds: what a node holds for groups not open yet is
// bounded in messages per group, message size, groups, bytes and time;
// past a bound a message is dropped, and take hands over what was held
// once.
func TestRaftParkBounds(t *testing.T) {
	var p raftPark
	small := raftpb.Message{Type: raftpb.MsgPreVote, From: 2, To: 1, Term: 3}
	park := func(gid uint64, m raftpb.Message) bool { return p.park(gid, m) }
	for i := range parkPerGroup {
		if !park(QueueGroupBase+1, small) {
			t.Fatalf("message %d of a group refused", i)
		}
	}
	if park(QueueGroupBase+1, small) {
		t.Fatalf("held more than %d messages for one group", parkPerGroup)
	}
	big := raftpb.Message{Type: raftpb.MsgApp, From: 2, To: 1, Entries: []raftpb.Entry{{Data: make([]byte, parkMsgBytes)}}}
	if park(QueueGroupBase+2, big) {
		t.Fatal("held a message over parkMsgBytes")
	}
	for gid := uint64(QueueGroupBase + 2); len(p.groups) < parkGroups; gid++ {
		if !park(gid, small) {
			t.Fatalf("group %d refused with %d held", gid, len(p.groups))
		}
	}
	if park(QueueGroupBase+1<<20, small) {
		t.Fatalf("held messages for more than %d groups", parkGroups)
	}
	if got := p.take(QueueGroupBase + 1); len(got) != parkPerGroup || got[0].Type != raftpb.MsgPreVote {
		t.Fatalf("take: %d messages, want %d", len(got), parkPerGroup)
	}
	if got := p.take(QueueGroupBase + 1); got != nil {
		t.Fatalf("taken twice: %v", got)
	}
	// Bytes in all: a group's worth of near-limit messages, for as many
	// groups as fit.
	var q raftPark
	mid := raftpb.Message{Type: raftpb.MsgApp, Entries: []raftpb.Entry{{Data: make([]byte, parkMsgBytes-64)}}}
	held := 0
	for gid := uint64(QueueGroupBase); gid < QueueGroupBase+parkGroups; gid++ {
		for range parkPerGroup {
			if q.park(gid, mid) {
				held += mid.Size()
			}
		}
	}
	if held > parkBytes || q.bytes != held || held < parkBytes-mid.Size() {
		t.Fatalf("held %d bytes (counted %d), bound %d", held, q.bytes, parkBytes)
	}
	// Time: dropped parkTicks ticks after the group's first message.
	for range parkTicks - 1 {
		q.tick()
	}
	if len(q.groups) == 0 {
		t.Fatal("dropped before parkTicks ticks")
	}
	q.tick()
	if q.bytes != 0 || len(q.groups) != 0 {
		t.Fatalf("after parkTicks ticks: %d groups, %d bytes held", len(q.groups), q.bytes)
	}
	if !q.park(QueueGroupBase, mid) {
		t.Fatal("refused once emptied")
	}
}
