package replication

import (
	"bytes"
	"slices"
	"testing"

	"github.com/warren-mq/warren/queue"
	"github.com/warren-mq/warren/segment"
	"go.etcd.io/raft/v3/raftpb"
)

// TestCopyDeletedWhileCounted replays the sequence behind CI's raft panic
// (`tocommit(3) is out of range [lastIndex(0)]`), with three voters.
//
//  1. A voter, v, is removed from the group and applies its removal.
//  2. It is added back as a learner while cut off; once back, the leader
//     sends it the entries it missed in several messages (each at most
//     raft's MaxSizePerMsg): v has acknowledged the first ones, so the
//     leader counts it (Match > 0), and has not yet received the re-add.
//     Here v's configuration does not have v: the broker's old deletion
//     rule (dropDue: not a member, or no leader heard from lately) took
//     this for a copy no leader counts and deleted it. The rule now kept
//     (no leader heard from for dropQuietTicks) does not: a leader that
//     counts a node sends it a heartbeat every two ticks.
//  3. The copy is deleted anyway (as a long partition from that leader
//     would have it) and opened empty. The leader's next heartbeat names
//     a commit past its log: raft panicked there. Now the copy cuts the
//     commit to its log and tells the leader, which reports the peer
//     lost (PeerLostLog, WorkerConfig.PeerLost); taken out of the group
//     and added back as a new learner (what the broker's reconcile does),
//     it gets the whole log and ends with the leader's state.
func TestCopyDeletedWhileCounted(t *testing.T) {
	const gid = 12
	tr := newTrio(t, gid, func(int) Sink { return nil })
	var lostFrom []uint64
	lead := tr.elect()
	v := (lead + 1) % 3
	vid := uint64(v + 1)
	tr.groups[lead].w.cfg.PeerLost = func(g *Group, peer uint64) { lostFrom = append(lostFrom, peer) }
	add := func(n int, size int) {
		t.Helper()
		for i := range n {
			body := bytes.Repeat([]byte{byte(i)}, size)
			if _, err := tr.groups[lead].Add(&queue.Enqueue{Msgs: make([]queue.Message, 1), Bodies: [][]byte{body}}); err != nil {
				t.Fatal(err)
			}
			tr.step()
		}
	}
	conf := func(typ raftpb.ConfChangeType) {
		t.Helper()
		if err := tr.groups[lead].ProposeConf(raftpb.ConfChangeV2{Changes: []raftpb.ConfChangeSingle{{Type: typ, NodeID: vid}}}); err != nil {
			t.Fatal(err)
		}
	}
	add(3, 10)
	tr.tick()

	// 1. v out; it applies its removal.
	conf(raftpb.ConfChangeRemoveNode)
	for tick := 0; tr.groups[v].Member() || inConf(tr.groups[lead].Conf(), vid); tick++ {
		if tick > 20 {
			t.Fatalf("v's removal not applied on v and its leader 20 ticks on (v: %v, leader: %v)", tr.groups[v].Conf(), tr.groups[lead].Conf())
		}
		tr.tick()
	}

	// 2. Cut off, added back behind entries it needs several messages for.
	tr.down[vid] = true
	add(4, 700<<10) // each message holds one (MaxSizePerMsg 1 MiB)
	conf(raftpb.ConfChangeAddLearnerNode)
	for tick := 0; !inConf(tr.groups[lead].Conf(), vid); tick++ {
		if tick > 20 {
			t.Fatal("v not added back on the leader 20 ticks on")
		}
		tr.tick()
	}
	delete(tr.down, vid)
	for _, g := range tr.groups {
		g.RaftTick()
	}
	counted := func() uint64 { return tr.groups[lead].rn.Status().Progress[vid].Match }
	for iter := 0; counted() == 0 || tr.groups[v].Member(); iter++ {
		if iter > 100 || tr.groups[v].Member() {
			t.Fatalf("never saw v counted (match %d) while its configuration lacks it (%v)", counted(), tr.groups[v].Conf())
		}
		tr.stepOnce(iter)
	}
	match := counted()
	if !tr.groups[v].LedWithin(30) {
		t.Fatal("v, which its leader counts, reads as not led lately: the broker would delete it")
	}
	t.Logf("v's configuration lacks v, while its leader counts it at match %d", match)

	// 3. Deleted anyway, opened empty.
	tr.down[vid] = true
	tr.step()
	tr.reopenEmpty(v, gid)
	delete(tr.down, vid)
	for tick := 0; len(lostFrom) == 0; tick++ {
		if tick > 10 {
			t.Fatal("the leader never heard that v lost what it acknowledged")
		}
		tr.tick() // (raft panicked here: the heartbeat's commit is past v's log)
	}
	if !slices.Equal(lostFrom, []uint64{vid}) || !tr.groups[lead].PeerLostLog(vid) {
		t.Fatalf("lost peers reported %v, PeerLostLog(%d) %v", lostFrom, vid, tr.groups[lead].PeerLostLog(vid))
	}
	if got := tr.groups[v].Status().Commit; got != 0 {
		t.Fatalf("the empty copy took commit %d on the leader's word", got)
	}
	conf(raftpb.ConfChangeRemoveNode)
	for tick := 0; inConf(tr.groups[lead].Conf(), vid); tick++ {
		if tick > 20 {
			t.Fatal("v not taken out 20 ticks on")
		}
		tr.tick()
	}
	if tr.groups[lead].PeerLostLog(vid) {
		t.Fatal("a peer out of the group is still reported lost")
	}
	conf(raftpb.ConfChangeAddLearnerNode)
	add(1, 10)
	want := tr.groups[lead].FSM()
	for tick := 0; tr.groups[v].FSM().AppliedIndex() != want.AppliedIndex(); tick++ {
		if tick > 50 {
			t.Fatalf("v applied up to %d 50 ticks after it was added back, the leader %d", tr.groups[v].FSM().AppliedIndex(), want.AppliedIndex())
		}
		tr.tick()
	}
	a, _ := want.Snapshot()
	b, _ := tr.groups[v].FSM().Snapshot()
	if !bytes.Equal(a, b) || tr.groups[v].FSM().Machine().Ready() != 8 {
		t.Fatalf("v's state after it was added back differs from the leader's (%d ready)", tr.groups[v].FSM().Machine().Ready())
	}
	if tr.groups[lead].PeerLostLog(vid) {
		t.Fatal("v, added back and caught up, is still reported lost")
	}
}

// reopenEmpty replaces node i's copy of group gid with an empty one (a
// new log), opened in the group's first configuration.
func (tr *trio) reopenEmpty(i int, gid uint64) {
	t := tr.t
	l := openMemLog(t, segment.NewMemFS())
	t.Cleanup(func() { l.Close() })
	tr.logs[i] = l
	s := &shard{t: t, inbox: make(chan func(), 1024), nowMs: tr.shards[i].nowMs}
	s.w = NewWorker(l, WorkerConfig{
		NodeID: uint64(i + 1),
		Post:   func(fn func()) { s.inbox <- fn },
		Fatal:  func(err error) { s.fatal = err },
		Send:   trioTransport{tr}.Send,
	})
	t.Cleanup(s.w.Close)
	tr.shards[i] = s
	g, err := s.w.Open(gid, raftpb.SnapshotMetadata{ConfState: raftpb.ConfState{Voters: []uint64{1, 2, 3}}},
		NewQueueFSM(queue.New(queue.Config{}, 0), 0, nil))
	if err != nil {
		t.Fatal(err)
	}
	tr.groups[i] = g
}
