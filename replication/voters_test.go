package replication

import (
	"bytes"
	"errors"
	"testing"
	"time"

	"github.com/warren-mq/warren/queue"
	"github.com/warren-mq/warren/segment"
	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
)

// trio is three workers in one test, each over its own MemFS, joined by
// an in-test transport that marshals every message (as a real one would)
// and delivers it through Worker.Step. Everything runs on the test
// goroutine: the appenders' completions are run as soon as they are
// posted. replication/sim is the randomized version of this.
type trio struct {
	t      *testing.T
	shards [3]*shard
	groups [3]*Group
	wire   []trioMsg
	sent   int
	logs   [3]*segment.Log
	// down: messages to and from these nodes are dropped.
	down map[uint64]bool
}

type trioMsg struct {
	gid uint64
	to  uint64
	b   []byte
}

type trioTransport struct{ tr *trio }

func (x trioTransport) Send(gid uint64, msgs []raftpb.Message) {
	for _, m := range msgs {
		b, err := m.Marshal()
		if err != nil {
			x.tr.t.Fatal(err)
		}
		x.tr.wire = append(x.tr.wire, trioMsg{gid: gid, to: m.To, b: b})
		x.tr.sent++
	}
}

var _ Transport = trioTransport{}

func newTrio(t *testing.T, gid uint64, sink func(node int) Sink) *trio {
	return newTrioPaced(t, gid, sink, 0)
}

// newTrioPaced: newTrio with WorkerConfig.MaxUncommittedBytes.
func newTrioPaced(t *testing.T, gid uint64, sink func(node int) Sink, maxUncommitted int) *trio {
	tr := &trio{t: t, down: map[uint64]bool{}}
	voters := raftpb.ConfState{Voters: []uint64{1, 2, 3}}
	for i := range tr.shards {
		l := openMemLog(t, segment.NewMemFS())
		t.Cleanup(func() { l.Close() })
		tr.logs[i] = l
		s := &shard{t: t, inbox: make(chan func(), 1024)}
		s.w = NewWorker(l, WorkerConfig{
			NodeID: uint64(i + 1),
			Post:   func(fn func()) { s.inbox <- fn },
			Fatal:  func(err error) { s.fatal = err },
			Send:   trioTransport{tr}.Send,

			MaxUncommittedBytes: maxUncommitted,
		})
		t.Cleanup(s.w.Close)
		tr.shards[i] = s
		g, err := s.w.Open(gid, raftpb.SnapshotMetadata{ConfState: voters}, NewQueueFSM(queue.New(queue.Config{}, 0), 0, sink(i)))
		if err != nil {
			t.Fatal(err)
		}
		tr.groups[i] = g
	}
	return tr
}

// step runs rounds and completions on every node, then delivers what was
// sent, until the wire is empty and no node has work.
func (tr *trio) step() {
	for iter := 0; tr.stepOnce(iter); iter++ {
		if iter > 1000 {
			tr.t.Fatal("the three workers never settle")
		}
	}
}

// stepOnce runs a round and the completions on every node, then delivers
// what was sent; it reports whether anything happened (iter: the
// iteration of step's loop, which bounds a paced group's rounds).
func (tr *trio) stepOnce(iter int) bool {
	busy := false
	for i, s := range tr.shards {
		sent := len(tr.wire)
		more := s.w.Round(s.nowMs)
		tr.checkTerms(i, tr.wire[sent:])
		for s.w.Stats().Appends > s.w.Stats().Persisted {
			select {
			case fn := <-s.inbox:
				fn()
			case <-time.After(10 * time.Second):
				tr.t.Fatal("no completion from the appender within 10 s")
			}
			busy = true
		}
		// A paced group stays dirty while it waits for applies: more
		// keeps the loop going only for a while.
		busy = busy || more && iter < 50
	}
	msgs := tr.wire
	tr.wire = nil
	for _, m := range msgs {
		var msg raftpb.Message
		if err := msg.Unmarshal(m.b); err != nil {
			tr.t.Fatal(err)
		}
		if tr.down[msg.From] || tr.down[msg.To] {
			continue
		}
		// (raft refuses what a peer removed from the group says)
		if err := tr.shards[m.to-1].w.Step(m.gid, msg); err != nil && !errors.Is(err, raft.ErrStepPeerNotFound) {
			tr.t.Fatalf("node %d: step %v: %v", m.to, msg.Type, err)
		}
		busy = true
	}
	return busy
}

// checkTerms: what node i sent during a round (before its write, if any,
// is durable) carries no term its durable hard state does not have yet
// (raft: no message goes before the latest HardState is persisted; a vote
// request sent before the candidate's own vote is on disk lets it, after a
// crash, vote for another candidate in the same term). Pre-vote messages
// carry the next term without changing anything, and are exempt.
func (tr *trio) checkTerms(i int, sent []trioMsg) {
	durable := tr.groups[i].st.hs
	for _, m := range sent {
		var msg raftpb.Message
		if err := msg.Unmarshal(m.b); err != nil {
			tr.t.Fatal(err)
		}
		if msg.Type == raftpb.MsgPreVote || msg.Type == raftpb.MsgPreVoteResp {
			continue
		}
		if msg.Term > durable.Term {
			tr.t.Errorf("node %d sent %v to %d at term %d while its durable term was %d", i+1, msg.Type, msg.To, msg.Term, durable.Term)
		}
	}
}

// elect ticks every node until a leader is elected.
func (tr *trio) elect() int {
	for tick := 0; tr.leader() < 0; tick++ {
		if tick > 100 {
			tr.t.Fatal("no leader after 100 ticks")
		}
		tr.tick()
	}
	return tr.leader()
}

func (tr *trio) tick() {
	for i, g := range tr.groups {
		tr.shards[i].nowMs += 100
		g.RaftTick()
	}
	tr.step()
}

func (tr *trio) leader() int {
	for i, g := range tr.groups {
		if g.Leader() {
			return i
		}
	}
	return -1
}

// TestThreeVotersReplicate: a group with three voters on three workers
// elects a leader as its raft clock ticks (Group.RaftTick), with raft's
// messages carried by a Transport into Worker.Step; a command proposed at
// the leader is applied on all three, each FSM reaching the same snapshot
// bytes at the same index, and the leader's Status names the same term
// and leader as the followers'.
func TestThreeVotersReplicate(t *testing.T) {
	const gid = 7
	var applied [3]int
	tr := newTrio(t, gid, func(node int) Sink {
		return func(a *Applied) {
			if _, ok := a.Command.(*queue.Enqueue); ok {
				applied[node]++
			}
		}
	})
	lead := tr.elect()
	for i, g := range tr.groups {
		st := g.Status()
		if st.Lead != uint64(lead+1) || st.Term != tr.groups[lead].Status().Term {
			t.Fatalf("node %d: lead %d term %d, want %d and the leader's term %d", i+1, st.Lead, st.Term, lead+1, tr.groups[lead].Status().Term)
		}
		if (st.RaftState == raft.StateLeader) != (i == lead) {
			t.Fatalf("node %d is %v", i+1, st.RaftState)
		}
	}
	if _, err := tr.groups[lead].Add(&queue.Enqueue{Msgs: make([]queue.Message, 2), Bodies: [][]byte{[]byte("a"), []byte("b")}}); err != nil {
		t.Fatal(err)
	}
	tr.step()
	// The followers learn the commit index with the next heartbeat.
	for i, g := range tr.groups {
		tr.shards[i].nowMs += 100
		g.RaftTick()
	}
	tr.step()
	want, _ := tr.groups[lead].FSM().Snapshot()
	for i, g := range tr.groups {
		if applied[i] != 1 {
			t.Errorf("node %d applied %d enqueues, want 1", i+1, applied[i])
		}
		if g.FSM().Machine().Ready() != 2 {
			t.Errorf("node %d: %d ready, want 2", i+1, g.FSM().Machine().Ready())
		}
		got, _ := g.FSM().Snapshot()
		if !bytes.Equal(got, want) {
			t.Errorf("node %d: snapshot at %d differs from the leader's at %d", i+1, g.FSM().AppliedIndex(), tr.groups[lead].FSM().AppliedIndex())
		}
		if err := g.Err(); err != nil {
			t.Errorf("node %d: %v", i+1, err)
		}
	}
}

// TestFollowerAppliesOnlyStoredEntries: a follower that was cut off gets
// entries the other two committed meanwhile, in a message that also tells
// it they are committed. It must store them before it applies them (raft's
// order: persist Ready.Entries, then apply Ready.CommittedEntries): an
// entry applied before it is stored could be in the FSM's live set, and so
// in a snapshot's compaction list, without being in the log, and its
// effects would run on a replica that may still lose it.
func TestFollowerAppliesOnlyStoredEntries(t *testing.T) {
	const gid = 9
	var tr *trio
	checked := 0
	tr = newTrio(t, gid, func(node int) Sink {
		return func(a *Applied) {
			if last := tr.logs[node].LastIndex(gid); last < a.Index {
				t.Errorf("node %d applied entry %d while its log ends at %d", node+1, a.Index, last)
			}
			checked++
		}
	})
	lead := tr.elect()
	lag := (lead + 1) % 3
	tr.down[uint64(lag+1)] = true
	for i := range 3 {
		if _, err := tr.groups[lead].Add(&queue.Enqueue{Msgs: make([]queue.Message, 1), Bodies: [][]byte{{byte(i)}}}); err != nil {
			t.Fatal(err)
		}
		tr.step()
	}
	tr.tick()
	if got := tr.groups[lag].FSM().AppliedIndex(); got >= tr.groups[lead].FSM().AppliedIndex() {
		t.Fatalf("the cut-off follower applied up to %d, the leader %d", got, tr.groups[lead].FSM().AppliedIndex())
	}
	delete(tr.down, uint64(lag+1))
	for range 3 {
		tr.tick()
	}
	if got, want := tr.groups[lag].FSM().AppliedIndex(), tr.groups[lead].FSM().AppliedIndex(); got != want {
		t.Fatalf("the follower applied up to %d after the heal, the leader %d", got, want)
	}
	if checked == 0 {
		t.Fatal("nothing applied")
	}
}

// TestVotesAfterTheirTermIsDurable: when the leader is cut off and a
// follower campaigns, its vote requests leave only once its new term and
// its vote for itself are on disk (trio.checkTerms, on every round), and a
// new leader is elected.
func TestVotesAfterTheirTermIsDurable(t *testing.T) {
	const gid = 5
	tr := newTrio(t, gid, func(int) Sink { return nil })
	old := tr.elect()
	term := tr.groups[old].Status().Term
	tr.down[uint64(old+1)] = true
	for tick := 0; ; tick++ {
		if tick > 100 {
			t.Fatal("no new leader 100 ticks after the old one was cut off")
		}
		tr.tick()
		if l := tr.leader(); l >= 0 && l != old && tr.groups[l].Status().Term > term {
			break
		}
	}
}

// TestPacingAfterLostLeadership: a leader cut off by a partition proposes
// entries that never commit (the others elect a new leader and overwrite
// them). Its pacing (proposed bytes not yet applied, kept below half of
// raft's uncommitted limit) must not go on counting them: once it leads
// again, what is added to the group is proposed and applied.
func TestPacingAfterLostLeadership(t *testing.T) {
	const gid = 6
	body := make([]byte, 1000)
	applied := map[byte]bool{}
	tr := newTrioPaced(t, gid, func(node int) Sink {
		return func(a *Applied) {
			if e, ok := a.Command.(*queue.Enqueue); ok {
				applied[e.Bodies[0][0]] = true
			}
		}
	}, 8<<10)
	old := tr.elect()
	tr.down[uint64(old+1)] = true
	for i := range 6 {
		b := append([]byte{byte(i)}, body...)
		if _, err := tr.groups[old].Add(&queue.Enqueue{Msgs: make([]queue.Message, 1), Bodies: [][]byte{b}}); err != nil {
			t.Fatal(err)
		}
		tr.step()
	}
	for tick := 0; tr.groups[old].Leader() || tr.leader() < 0; tick++ {
		if tick > 100 {
			t.Fatal("the cut-off leader did not step down, or no other was elected")
		}
		tr.tick()
	}
	delete(tr.down, uint64(old+1))
	for range 3 {
		tr.tick()
	}
	// The new leader hands leadership back.
	lead := tr.leader()
	tr.groups[lead].rn.TransferLeader(uint64(old + 1))
	tr.shards[lead].w.mark(tr.groups[lead])
	for tick := 0; !tr.groups[old].Leader(); tick++ {
		if tick > 30 {
			t.Fatal("leadership did not come back to the first leader")
		}
		tr.tick()
	}
	if _, err := tr.groups[old].Add(&queue.Enqueue{Msgs: make([]queue.Message, 1), Bodies: [][]byte{{100}}}); err != nil {
		t.Fatal(err)
	}
	for range 5 {
		tr.tick()
	}
	if !applied[100] {
		t.Fatalf("a command added at the leader was not applied five ticks later (the leader counts %d bytes as proposed and unapplied)", tr.groups[old].unapplied)
	}
}

// TestTransferLeadership: the leader hands leadership to a chosen voter
// (design §6: a node leaving gracefully moves its leaderships away first),
// which then leads and commits.
func TestTransferLeadership(t *testing.T) {
	const gid = 4
	n := 0
	tr := newTrio(t, gid, func(int) Sink {
		return func(a *Applied) {
			if _, ok := a.Command.(*queue.Enqueue); ok {
				n++
			}
		}
	})
	old := tr.elect()
	to := (old + 2) % 3
	tr.groups[old].TransferLeadership(uint64(to + 1))
	for tick := 0; !tr.groups[to].Leader(); tick++ {
		if tick > 20 {
			t.Fatalf("node %d does not lead 20 ticks after the transfer (leader: node %d)", to+1, tr.leader()+1)
		}
		tr.step()
		tr.tick()
	}
	if tr.groups[old].Leader() {
		t.Fatal("the old leader still leads")
	}
	if _, err := tr.groups[to].Add(&queue.Enqueue{Msgs: make([]queue.Message, 1), Bodies: [][]byte{{1}}}); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		tr.tick()
	}
	if n != 3 {
		t.Fatalf("the new leader's publish was applied on %d of 3 nodes", n)
	}
}

// TestFollowerAppliesOverwrittenEntriesOnceStored: a leader cut off
// appends entries only it holds; the other two elect a new leader, which
// commits entries of its own at the same indexes. Healed, the old leader
// gets them in a message that also says they are committed: its Ready
// overwrites its own entries and commits the new ones. It must apply them
// only once they are stored (what its log held at those indexes, durable
// as it was, is not what it applies): applied before, a snapshot could
// record them while a crash kept the old entries in the log, and the
// replica would be stuck (replication/sim seed 9000183: its log's term at
// the snapshot's index not the leader's, every append refused).
func TestFollowerAppliesOverwrittenEntriesOnceStored(t *testing.T) {
	const gid = 11
	var tr *trio
	checked := 0
	tr = newTrio(t, gid, func(node int) Sink {
		return func(a *Applied) {
			enq, ok := a.Command.(*queue.Enqueue)
			if !ok {
				return
			}
			es, release, err := tr.logs[node].EntriesView(gid, a.Index, a.Index+1)
			if err != nil {
				t.Errorf("node %d applied entry %d, not in its log: %v", node+1, a.Index, err)
				return
			}
			defer release()
			for _, b := range enq.Bodies {
				if !bytes.Contains(es[0].Data, b) {
					t.Errorf("node %d applied entry %d with body %q while its log holds another entry there", node+1, a.Index, b)
				}
			}
			checked++
		}
	})
	old := tr.elect()
	tr.down[uint64(old+1)] = true
	for i := range 3 {
		if _, err := tr.groups[old].Add(&queue.Enqueue{Msgs: make([]queue.Message, 1), Bodies: [][]byte{[]byte("old-" + string(rune('a'+i)))}}); err != nil {
			t.Fatal(err)
		}
		tr.step()
	}
	term := tr.groups[old].Status().Term
	lead := -1
	for tick := 0; lead < 0; tick++ {
		if tick > 100 {
			t.Fatal("no new leader 100 ticks after the old one was cut off")
		}
		tr.tick()
		if l := tr.leader(); l >= 0 && l != old && tr.groups[l].Status().Term > term {
			lead = l
		}
	}
	for i := range 4 {
		if _, err := tr.groups[lead].Add(&queue.Enqueue{Msgs: make([]queue.Message, 1), Bodies: [][]byte{[]byte("new-" + string(rune('a'+i)))}}); err != nil {
			t.Fatal(err)
		}
		tr.step()
	}
	tr.tick()
	delete(tr.down, uint64(old+1))
	for range 4 {
		tr.tick()
	}
	if got, want := tr.groups[old].FSM().AppliedIndex(), tr.groups[lead].FSM().AppliedIndex(); got != want {
		t.Fatalf("the old leader applied up to %d after the heal, the new one %d", got, want)
	}
	want, _ := tr.groups[lead].FSM().Snapshot()
	if got, _ := tr.groups[old].FSM().Snapshot(); !bytes.Equal(got, want) {
		t.Fatal("the old leader's snapshot differs from the new leader's at the same index")
	}
	if checked == 0 {
		t.Fatal("nothing applied")
	}
}
