package queue

// # Commands
//
// Every change of a queue's state is a command: a value that could be
// written to a log, replayed on another node, and applied there with the
// same result. The commands mirror the Machine's mutating methods one for
// one, and Machine.Apply dispatches each to its method, so a caller may use
// either; the two give identical effects and identical snapshots
// (TestApplyThroughCodecIsDeterministic).
//
//	command      method              logged by a durable queue because
//	*Enqueue     Machine.Enqueue     it is the publish, and carries the bodies
//	*Settle      Machine.Settle      it changes ready, unacked and counters
//	*Subscribe   Machine.Subscribe   dispatch depends on the consumer list
//	*Cancel      Machine.Cancel      (the same)
//	*Down        Machine.Down        the owner's deliveries come back
//	*Tick        Machine.Tick        expiry, retries, leases: a log decision
//	*Purge       Machine.Purge       it empties the ready set
//	*SettleDeadLetter  Machine.SettleDeadLetter  a held dead letter's targets have it
//
// Each command carries its time, NowMs (milliseconds), stamped once by the
// one place that reads a clock (the shard, or a raft leader at propose).
// The Machine never reads a clock; a replica applying a command uses the
// time in it, so it computes what the leader computed.
//
// Commands are passed by pointer. Apply and AppendCommand keep no
// reference to one, so a command built on the caller's stack costs no
// allocation (TestCommandCodecAllocatesNothing).
//
// # The encoding
//
// One binary encoding per command, the same in every log and every
// process: AppendCommand writes it, DecodeCommand (owned copies) and
// Decoder.Decode (views, no allocation) read it. All integers are
// little-endian, as in package wire. A command is self-delimiting: its
// length follows from its kind and its counts, and a decoder refuses both a
// short input and bytes left over. A framing around it (a raft entry) keeps
// its own length.
//
//	0         1        2                        10
//	+---------+--------+------------------------+=====================+
//	| version | kind   | now_ms (i64)           | body (by kind)      |
//	+---------+--------+------------------------+=====================+
//
//	kind 1  Enqueue    flags u8 | n u32 | n × message | (flags&1) n × body
//	kind 2  Settle     consumer u64 | op u8 | first u64 | last u64 | arg_ms u32
//	kind 3  Subscribe  id u64 | owner u64 | prefetch u32 | prefetch_bytes u32
//	                   | priority i16 | flags u8 | timeout_ms i64
//	kind 4  Cancel     consumer u64 | requeue u8 (0 or 1)
//	kind 5  Down       owner u64
//	kind 6  Tick       (no body)
//	kind 7  Purge      (no body)
//	kind 11 SettleDeadLetter  id u64
//
//	message (28 bytes):
//	0        8        12              16        24     25      26     28
//	+--------+--------+---------------+---------+------+-------+------+
//	| id u64 | size   | expiration_ms | dedup   | prio | flags | 0 0  |
//	|        | u32    | u32           | key u64 | u8   | u8    | u16  |
//	+--------+--------+---------------+---------+------+-------+------+
//
//	body: len u32 | len bytes
//
// Flags: Enqueue bit 0 = bodies follow the messages; message bit 0 =
// HasExpiration; Subscribe bit 0 = AutoAck, bit 1 = Exclusive. Every other
// flag bit and the message's reserved u16 must be 0, and a boolean byte must
// be 0 or 1, so each command has exactly one encoding: decoding then
// re-encoding gives back the same bytes (FuzzDecodeCommand checks this).
//
// Bodies are optional and opaque. A queue whose bodies live in memory
// passes none (the message ID is the reference: the caller keeps the bytes
// under it). A durable queue's log entry is the only copy of a body, so its
// Enqueue carries them: Bodies[i] belongs to Msgs[i], in whatever form the
// caller stores a message (the Machine never reads them; Size is what
// length limits count). A message's ID is carried as given: a log that
// numbers messages by its own index (index<<16 | slot) may write 0 and set
// the IDs after decoding, before Apply.
//
// The version byte is CommandVersion. The numbers of the kinds, the flag
// bits, the field order and widths are part of the format and never change
// meaning: a change is a new version, and a decoder refuses a version it
// does not know (ErrCommandVersion) rather than guess. The numbers of the
// kinds match the durable-queue entry design (design/replication.md §1.1),
// which reserves 8 (DeleteIf), 9 (EnqueuerDown) and 10 (Recover) for
// commands of the log around the machine; 11 came later, for
// at-least-once dead-lettering.
//
// Decoding checks every count against the bytes left before it allocates,
// so a command can make a decoder allocate at most a small multiple of its
// own length (a Message per 28-byte record, a slice header per body), and
// malformed input is an error, never a panic.

import (
	"errors"
	"fmt"

	"github.com/warren-mq/warren/wire"
)

// CommandVersion is the version byte every encoded command starts with.
const CommandVersion = 1

// CommandKind names a command in the encoding. The numbers are part of the
// format.
type CommandKind uint8

const (
	KindEnqueue   CommandKind = 1
	KindSettle    CommandKind = 2
	KindSubscribe CommandKind = 3
	KindCancel    CommandKind = 4
	KindDown      CommandKind = 5
	KindTick      CommandKind = 6
	KindPurge     CommandKind = 7
	// KindSettleDeadLetter is 11: 8 to 10 are reserved (see above).
	KindSettleDeadLetter CommandKind = 11
)

var commandNames = [...]string{"", "enqueue", "settle", "subscribe", "cancel", "down", "tick", "purge", "", "", "", "settle-dead-letter"}

func (k CommandKind) String() string {
	if int(k) < len(commandNames) && commandNames[k] != "" {
		return commandNames[k]
	}
	return fmt.Sprintf("command(%d)", uint8(k))
}

// Command is one state change of a queue Machine: one of *Enqueue,
// *Settle, *Subscribe, *Cancel, *Down, *Tick, *Purge, *SettleDeadLetter. The set is closed
// (the method command is unexported): Machine.Apply and the encoding know
// every member.
type Command interface {
	Kind() CommandKind
	// TimeMs is the time the command was stamped with (ms).
	TimeMs() int64
	command()
}

// Enqueue adds a batch of messages (Machine.Enqueue).
type Enqueue struct {
	NowMs int64
	Msgs  []Message
	// Bodies, when not nil, holds one opaque byte string per message
	// (len(Bodies) == len(Msgs)); nil when the caller keeps the bodies
	// under the message IDs. See the format notes above.
	Bodies [][]byte
}

// Settle settles consumer Consumer's deliveries with tags First..Last
// (Machine.Settle: First 0 means every outstanding tag ≤ Last).
type Settle struct {
	NowMs    int64
	Consumer ConsumerID
	Op       wire.SettleOp
	First    uint64
	Last     uint64
	ArgMs    uint32 // SettleExtend: the new lease (0: the queue's consumer timeout)
}

// Subscribe adds a consumer (Machine.Subscribe).
type Subscribe struct {
	NowMs int64
	Spec  ConsumerSpec
}

// Cancel stops a consumer; with Requeue its deliveries come back now
// (Machine.Cancel).
type Cancel struct {
	NowMs    int64
	Consumer ConsumerID
	Requeue  bool
}

// Down takes back everything held by Owner's consumers and removes them
// (Machine.Down).
type Down struct {
	NowMs int64
	Owner OwnerID
}

// Tick advances time (Machine.Tick).
type Tick struct {
	NowMs int64
}

// Purge removes every ready message (Machine.Purge). Through Apply, the
// count Machine.Purge returns is the number of Remove effects: a purge
// emits one per message it removed and no other.
type Purge struct {
	NowMs int64
}

// SettleDeadLetter ends the hold of a held dead letter: every target of
// its republish has it (Machine.SettleDeadLetter).
type SettleDeadLetter struct {
	NowMs int64
	ID    uint64
}

func (*SettleDeadLetter) Kind() CommandKind { return KindSettleDeadLetter }
func (c *SettleDeadLetter) TimeMs() int64   { return c.NowMs }
func (*SettleDeadLetter) command()          {}

func (*Enqueue) Kind() CommandKind   { return KindEnqueue }
func (*Settle) Kind() CommandKind    { return KindSettle }
func (*Subscribe) Kind() CommandKind { return KindSubscribe }
func (*Cancel) Kind() CommandKind    { return KindCancel }
func (*Down) Kind() CommandKind      { return KindDown }
func (*Tick) Kind() CommandKind      { return KindTick }
func (*Purge) Kind() CommandKind     { return KindPurge }

func (c *Enqueue) TimeMs() int64   { return c.NowMs }
func (c *Settle) TimeMs() int64    { return c.NowMs }
func (c *Subscribe) TimeMs() int64 { return c.NowMs }
func (c *Cancel) TimeMs() int64    { return c.NowMs }
func (c *Down) TimeMs() int64      { return c.NowMs }
func (c *Tick) TimeMs() int64      { return c.NowMs }
func (c *Purge) TimeMs() int64     { return c.NowMs }

func (*Enqueue) command()   {}
func (*Settle) command()    {}
func (*Subscribe) command() {}
func (*Cancel) command()    {}
func (*Down) command()      {}
func (*Tick) command()      {}
func (*Purge) command()     {}

// ErrUnknownCommand is returned by Apply for a nil command.
var ErrUnknownCommand = errors.New("queue: unknown command")

// Apply applies cmd with the time it carries, exactly as the matching
// method would (see Command), and returns the effects, owned by the
// machine and valid until the next command. Errors are those of the
// method: they leave the machine unchanged. Apply keeps no reference to
// cmd.
func (m *Machine) Apply(cmd Command) ([]Effect, error) {
	switch c := cmd.(type) {
	case *Enqueue:
		return m.Enqueue(c.NowMs, c.Msgs), nil
	case *Settle:
		return m.Settle(c.NowMs, c.Consumer, c.Op, c.First, c.Last, c.ArgMs)
	case *Subscribe:
		return m.Subscribe(c.NowMs, c.Spec)
	case *Cancel:
		return m.Cancel(c.NowMs, c.Consumer, c.Requeue)
	case *Down:
		return m.Down(c.NowMs, c.Owner), nil
	case *Tick:
		return m.Tick(c.NowMs), nil
	case *Purge:
		_, effs := m.Purge(c.NowMs)
		return effs, nil
	case *SettleDeadLetter:
		return m.SettleDeadLetter(c.NowMs, c.ID), nil
	}
	return nil, ErrUnknownCommand
}
