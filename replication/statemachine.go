package replication

// The package documentation is in doc.go.

// StateMachine is what a raft group applies its committed entries to: the
// metadata state machine (broker) and the queue machines (queue) are
// applied through it.
//
// An implementation is deterministic: from the same snapshot, the same
// committed commands give the same state, the same results and the same
// snapshot bytes on every replica. Time, names and ids are in the commands;
// nothing below Apply reads a clock or a random source.
type StateMachine interface {
	// Apply applies one committed command, in the encoding its owner
	// defines, at raft index index. The result goes to the proposer if it
	// is on this node. A refused command (not found, precondition failed,
	// ...) is a result, not an error: err means the bytes are no command
	// this machine knows (a corrupt entry, or one from a newer version),
	// and the group stops rather than diverge.
	Apply(index uint64, cmd []byte) (result any, err error)
	// Snapshot encodes the state after the last applied command.
	Snapshot() ([]byte, error)
	// Restore replaces the state with that of a snapshot taken at index.
	Restore(index uint64, snap []byte) error
}
