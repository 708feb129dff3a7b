package replication

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"

	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
)

// recordHandler keeps every record at or above Debug.
type recordHandler struct {
	mu   sync.Mutex
	recs []slog.Record
}

func (h *recordHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h *recordHandler) Handle(_ context.Context, r slog.Record) error {
	h.mu.Lock()
	h.recs = append(h.recs, r)
	h.mu.Unlock()
	return nil
}
func (h *recordHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *recordHandler) WithGroup(string) slog.Handler      { return h }

// A single-node group's start (new raft, campaign, leader at term 1) is
// routine: raft's logger says it at Debug, never Info.
func TestSingleNodeStartLogsNoRaftInfo(t *testing.T) {
	h := &recordHandler{}
	ms := raft.NewMemoryStorage()
	if err := ms.ApplySnapshot(raftpb.Snapshot{Metadata: raftpb.SnapshotMetadata{Index: 1, Term: 1, ConfState: raftpb.ConfState{Voters: []uint64{1}}}}); err != nil {
		t.Fatal(err)
	}
	rn, err := raft.NewRawNode(groupConfig(1, ms, 1, slog.New(h)))
	if err != nil {
		t.Fatal(err)
	}
	if err := rn.Campaign(); err != nil {
		t.Fatal(err)
	}
	for rn.HasReady() {
		rd := rn.Ready()
		if !raft.IsEmptyHardState(rd.HardState) {
			_ = ms.SetHardState(rd.HardState)
		}
		_ = ms.Append(rd.Entries)
		rn.Advance(rd)
	}
	if st := rn.BasicStatus(); st.RaftState != raft.StateLeader {
		t.Fatalf("the single node is %v, not leader", st.RaftState)
	}
	leaderLine := false
	for _, r := range h.recs {
		if r.Level >= slog.LevelInfo {
			t.Errorf("raft logged at %v on a single-node start: %q", r.Level, r.Message)
		}
		leaderLine = leaderLine || strings.Contains(r.Message, "became leader")
	}
	if !leaderLine {
		t.Error("no \"became leader\" line at Debug either: the test saw none of raft's lines")
	}
}
