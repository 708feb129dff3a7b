package replication

import (
	"context"
	"fmt"
	"log/slog"

	"go.etcd.io/raft/v3"
)

// groupConfig is the raft configuration of a group (design §3.7): node
// id, its storage, and the index its state machine has applied (raft
// hands out only later entries). Single-voter groups are never ticked, so
// the tick counts matter only in a cluster (tick 100 ms).
func groupConfig(id uint64, st raft.Storage, applied uint64, log *slog.Logger) *raft.Config {
	return &raft.Config{
		ID:                        id,
		ElectionTick:              10,
		HeartbeatTick:             2,
		Storage:                   st,
		Applied:                   applied,
		MaxSizePerMsg:             1 << 20,
		MaxCommittedSizePerReady:  8 << 20, // bounds the apply work per round; defaults to MaxSizePerMsg if unset
		MaxUncommittedEntriesSize: 64 << 20,
		MaxInflightMsgs:           256,
		MaxInflightBytes:          16 << 20,
		CheckQuorum:               true,
		PreVote:                   true,
		DisableProposalForwarding: true, // the leader stamps time: proposals go to it
		StepDownOnRemoval:         true,
		Logger:                    raftLogger{log},
	}
}

// raftLogger sends raft's log lines to slog (raft.Logger); Fatal and Panic
// panic, as a library must not exit the process. raft's Info lines are the
// routine of elections and configuration ("became leader at term 1",
// "received MsgVoteResp", "newRaft …": about ten on every start), so they
// go to Debug; its Warning and Error lines are what an operator needs.
type raftLogger struct{ l *slog.Logger }

func (r raftLogger) Debug(v ...any)              { r.debug(fmt.Sprint, v...) }
func (r raftLogger) Debugf(f string, v ...any)   { r.debugf(f, v...) }
func (r raftLogger) Info(v ...any)               { r.debug(fmt.Sprint, v...) }
func (r raftLogger) Infof(f string, v ...any)    { r.debugf(f, v...) }
func (r raftLogger) Warning(v ...any)            { r.l.Warn(fmt.Sprint(v...)) }
func (r raftLogger) Warningf(f string, v ...any) { r.l.Warn(fmt.Sprintf(f, v...)) }
func (r raftLogger) Error(v ...any)              { r.l.Error(fmt.Sprint(v...)) }
func (r raftLogger) Errorf(f string, v ...any)   { r.l.Error(fmt.Sprintf(f, v...)) }
func (r raftLogger) Fatal(v ...any)              { r.Panic(v...) }
func (r raftLogger) Fatalf(f string, v ...any)   { r.Panicf(f, v...) }
func (r raftLogger) Panic(v ...any)              { s := fmt.Sprint(v...); r.l.Error(s); panic(s) }
func (r raftLogger) Panicf(f string, v ...any)   { s := fmt.Sprintf(f, v...); r.l.Error(s); panic(s) }

// debug and debugf format only when Debug is enabled: raft calls them
// often and the broker usually runs at Info.
func (r raftLogger) debug(sprint func(...any) string, v ...any) {
	if r.l.Enabled(context.Background(), slog.LevelDebug) {
		r.l.Debug(sprint(v...))
	}
}

func (r raftLogger) debugf(f string, v ...any) {
	if r.l.Enabled(context.Background(), slog.LevelDebug) {
		r.l.Debug(fmt.Sprintf(f, v...))
	}
}
