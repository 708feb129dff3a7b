package replication

// # Entries
//
// A durable queue's raft log holds one entry per queue per shard round
// (design/replication.md §1): a 32-byte header and the round's commands for
// that queue, each framed and 8-byte aligned. The commands are the queue's
// own (queue.Command, in the one encoding queue.AppendCommand writes); this
// file only frames them. segment sees the bytes as opaque.
//
//	entry   := header(32) | frame*
//	header  := version u8 (1 or 2) | flags u8 (=0) | ncmd u16 | reserved u32 (=0)
//	         | now_ms i64 | proposer u64 | proposal_seq u64
//	frame   := kind u8 | reserved [3]u8 (=0) | len u32 | command (len bytes) | zero pad to 8
//
//	0         1        2          4               8            16           24              32
//	+---------+--------+----------+---------------+------------+------------+---------------+
//	| version | flags  | ncmd u16 | reserved u32  | now_ms i64 | proposer   | proposal_seq  |
//	+---------+--------+----------+---------------+------------+------------+---------------+
//
// All integers are little-endian. A frame's kind repeats the command's own
// kind byte (a reader can skip a command without decoding it) and must
// agree with it. ncmd counts the frames exactly: nothing follows the last
// one. Every reserved byte, flag bit and pad byte is 0, so an entry has one
// encoding: decoding and re-encoding gives the same bytes
// (FuzzDecodeEntry).
//
//   - now_ms is the leader's clock when it proposed the entry. Every command
//     in the entry is applied at max(now_ms, the time of the entry applied
//     before it) (QueueFSM): the commands' own now_ms fields are not read.
//   - proposer (node<<48 | shard) and proposal_seq name the leader-local
//     record of the confirms waiting for this entry (§3.4). Apply does not
//     read them; it hands them to the sink.
//   - Message ids are not taken from the commands either: the i-th message
//     of the entry's Enqueue commands, counted across them, gets id
//     index<<16 | i (index: the entry's raft index), so an entry holds at
//     most MaxEntryMessages messages.
//   - Frame kinds 8 (DeleteIf) and 10 (Recover) are reserved by the design
//     for commands of the log around the machine; they are not built, and
//     a decoder refuses them.
//   - Version 2 entries may also hold the frames of enqueuer
//     deduplication (enqueuers.go, design §6.4), which are not queue
//     commands (their kind byte is the frame's alone):
//
//	publish-from  (kind 64) := enqueuer u64 | incarnation u64 | qseq u64 | an Enqueue command
//	enqueuer-down (kind 9)  := enqueuer u64 | incarnation u64
//
//     An encoder writes version 1 for an entry without them, so an entry
//     any earlier build wrote decodes, and one it could read is written as
//     it would have written it.
//
// raft's own entries (design §1.2): segment.Entry has no type field, so a
// conf change is stored with a one-byte marker in front of its data, 0xC1
// (ConfChange) or 0xC2 (ConfChangeV2); an empty normal entry (a new
// leader's no-op) is stored empty; any other normal entry is stored as is
// and must not start with a byte ≥ 0xC0 (ours start with version 1).
// Reading back only reslices.
//
// Version: EntryVersion. A decoder refuses a version it does not know with
// ErrEntryVersion (a newer Warren wrote it) rather than guess, and a
// malformed entry with ErrMalformedEntry naming what is wrong: a committed
// entry that does not decode is corruption or a newer writer, never
// skipped (every replica must apply the same commands).

import (
	"encoding/binary"
	"errors"
	"fmt"
	"strconv"

	"github.com/warren-mq/warren/queue"
	"github.com/warren-mq/warren/segment"
	"go.etcd.io/raft/v3/raftpb"
)

var le = binary.LittleEndian

// EntryVersion is the first byte of an entry with no enqueuer frames;
// EntryVersionEnqueuers of one with them (publish-from, enqueuer-down).
const (
	EntryVersion          = 1
	EntryVersionEnqueuers = 2
)

// Limits of one entry.
const (
	// MaxEntryMessages is the most messages one entry may hold: message ids
	// are index<<16 | slot.
	MaxEntryMessages = 1 << 16
	// MaxEntryCommands is the most commands one entry may hold (ncmd u16).
	MaxEntryCommands = 1<<16 - 1
	// MaxEntryBytes is the size past which an encoder refuses another
	// command (one command alone may be larger: it gets an entry of its
	// own).
	MaxEntryBytes = 4 << 20
	// MaxCommandBytes bounds one command's encoding: an entry holding it
	// alone (header, frame, padding) must be one the log takes
	// (segment.MaxEntry), or its write fails and the node stops.
	MaxCommandBytes = segment.MaxEntry - entryHeaderLen - frameHeaderLen - 8
)

const (
	entryHeaderLen = 32
	frameHeaderLen = 8
	// Frame kinds reserved for commands of the log (design §1.1), not built.
	kindDeleteIf = 8
	kindRecover  = 10
	// Enqueuer frames (enqueuers.go): version 2 entries only.
	kindEnqueuerDown = 9
	kindPublishFrom  = 64 // clear of the queue's command kinds

	markerConfChange   = 0xC1
	markerConfChangeV2 = 0xC2
	markerFirst        = 0xC0 // normal entries never start at or above this
)

// Errors for bytes that are not an entry this build reads.
var (
	// ErrMalformedEntry: truncated, trailing bytes, a reserved field not
	// zero, a frame that disagrees with its command, a bad command.
	ErrMalformedEntry = errors.New("replication: malformed log entry")
	// ErrEntryVersion: written in an entry version this build does not read
	// (a newer Warren wrote it): upgrade this node.
	ErrEntryVersion = errors.New("replication: unknown log entry version")
	// ErrEntryFull: the command does not fit the entry being built (message,
	// command or byte cap); propose this entry and start the next.
	ErrEntryFull = errors.New("replication: entry full")
	// ErrCommandTooLarge: one Enqueue holds more than MaxEntryMessages
	// messages, or more than MaxCommandBytes bytes: more than any entry
	// can; split it (a message too large alone cannot be logged).
	ErrCommandTooLarge = errors.New("replication: Enqueue holds more messages or bytes than an entry can (split it)")
)

// EntryHeader is what an entry says besides its commands.
type EntryHeader struct {
	NowMs    int64  // the proposing leader's clock (ms)
	Proposer uint64 // node<<48 | shard of the proposer
	Seq      uint64 // the proposer's proposal sequence number
}

// Entry is a decoded entry that owns its commands (DecodeEntry), for tests
// and tools; the apply path uses an EntryDecoder.
type Entry struct {
	Header   EntryHeader
	Commands []queue.Command // an enqueuer-down is nil
	// Frames: the enqueuer frames, by position in Commands (nil: none).
	Frames map[int]Frame
}

// EntryEncoder builds one entry in a buffer it reuses: Add the commands,
// then Finish. The zero value is ready; Reset starts the next entry.
// It allocates nothing in steady state.
type EntryEncoder struct {
	buf  []byte
	n    int  // commands
	msgs int  // messages in the Enqueue commands
	v2   bool // holds an enqueuer frame: version 2
	// split (0: none): an entry of at least split bytes whose buffer has
	// no room for the next command is full (ErrEntryFull) rather than
	// copied into a larger buffer.
	split int
}

// Reset empties the encoder, keeping its buffer (and split).
func (e *EntryEncoder) Reset() {
	e.buf, e.n, e.msgs, e.v2 = e.buf[:0], 0, 0, false
}

// Commands is the number of commands added since the last Reset.
func (e *EntryEncoder) Commands() int { return e.n }

// Messages is the number of messages in the Enqueue commands added.
func (e *EntryEncoder) Messages() int { return e.msgs }

// Len is the size the entry would have if finished now.
func (e *EntryEncoder) Len() int {
	if len(e.buf) == 0 {
		return entryHeaderLen
	}
	return len(e.buf)
}

// Add appends cmd. It returns ErrEntryFull, and adds nothing, when cmd
// would take the entry past MaxEntryMessages messages, MaxEntryCommands
// commands or (unless the entry is empty) MaxEntryBytes bytes, and
// ErrCommandTooLarge for an Enqueue larger than any entry. It panics on a
// value queue.AppendCommand cannot encode (the caller's bug).
func (e *EntryEncoder) Add(cmd queue.Command) error {
	return e.addFrame(0, nil, cmd, nil)
}

// AddEnqueue appends an Enqueue of msgs at nowMs whose bodies src writes
// straight into the entry (queue.AppendEnqueue: the same bytes as Add of
// an Enqueue holding those bodies, without building them first). Errors
// as Add's.
func (e *EntryEncoder) AddEnqueue(nowMs int64, msgs []queue.Message, src queue.BodySource) error {
	return e.addFrame(0, nil, nil, &enqueueSrc{nowMs, msgs, src})
}

// enqueueSrc is an Enqueue whose bodies a BodySource writes.
type enqueueSrc struct {
	nowMs int64
	msgs  []queue.Message
	src   queue.BodySource
}

// addFrame appends a frame: a queue command (kind 0: the command's own),
// or an enqueuer frame of kind kind holding pre and then cmd (nil: none);
// with es, the command is the Enqueue es describes (cmd is nil).
func (e *EntryEncoder) addFrame(kind byte, pre []byte, cmd queue.Command, es *enqueueSrc) error {
	// need: room to reserve (generous); size: an Enqueue's exact length
	// (queue.AppendCommand's header, flags, count, records, bodies).
	msgs, need, size := 0, 64+len(pre), len(pre)
	if enq, ok := cmd.(*queue.Enqueue); ok {
		msgs = len(enq.Msgs)
		if msgs > MaxEntryMessages {
			return ErrCommandTooLarge
		}
		need += msgs * 64
		size += 15 + 28*msgs
		for _, b := range enq.Bodies {
			need += 4 + len(b)
			size += 4 + len(b)
		}
	}
	if es != nil {
		msgs = len(es.msgs)
		if msgs > MaxEntryMessages {
			return ErrCommandTooLarge
		}
		need += msgs * 64
		size += 15 + 28*msgs
		for i := range msgs {
			n := es.src.BodyLen(i)
			need += 4 + n
			size += 4 + n
		}
	}
	if size > MaxCommandBytes {
		return ErrCommandTooLarge
	}
	if e.msgs+msgs > MaxEntryMessages || e.n+1 > MaxEntryCommands {
		return ErrEntryFull
	}
	if need += entryHeaderLen; cap(e.buf)-len(e.buf) < need {
		if e.split > 0 && e.n > 0 && len(e.buf) >= e.split {
			return ErrEntryFull
		}
		// Room for the whole command at once, doubling: append's own
		// growth (about 1.25× for large slices) would copy a
		// large entry many times over. The buffer comes from the pool
		// of proposal buffers and the old one goes back (it is the
		// encoder's own: what Finish returned is valid until this Add).
		nb := append(propBuf(max(2*cap(e.buf), len(e.buf)+need)), e.buf...)
		putPropBuf(e.buf)
		e.buf = nb
	}
	if len(e.buf) == 0 {
		e.buf = append(e.buf, make([]byte, entryHeaderLen)...)
	}
	start := len(e.buf)
	e.buf = append(e.buf, 0, 0, 0, 0, 0, 0, 0, 0)
	e.buf = append(e.buf, pre...)
	switch {
	case es != nil:
		e.buf = queue.AppendEnqueue(e.buf, es.nowMs, es.msgs, es.src)
	case cmd != nil:
		e.buf = queue.AppendCommand(e.buf, cmd)
	}
	n := len(e.buf) - start - frameHeaderLen
	for len(e.buf)%8 != 0 {
		e.buf = append(e.buf, 0)
	}
	if e.n > 0 && len(e.buf) > MaxEntryBytes {
		e.buf = e.buf[:start]
		return ErrEntryFull
	}
	if kind != 0 {
		e.buf[start] = kind
		e.v2 = true
	} else {
		// The kind from the encoded command, not cmd.Kind(): a dynamic
		// call would make cmd escape (an allocation per command built on
		// the stack).
		e.buf[start] = e.buf[start+frameHeaderLen+1]
	}
	le.PutUint32(e.buf[start+4:], uint32(n))
	e.n++
	e.msgs += msgs
	return nil
}

// Finish writes the header and returns the entry: the encoder's buffer,
// valid until the next Reset or Add. An entry with no commands is valid
// (a Tick-only entry carries a Tick command; this is the header alone).
func (e *EntryEncoder) Finish(h EntryHeader) []byte {
	if len(e.buf) == 0 {
		e.buf = append(e.buf, make([]byte, entryHeaderLen)...)
	}
	b := e.buf[:entryHeaderLen]
	b[0], b[1] = EntryVersion, 0
	if e.v2 {
		b[0] = EntryVersionEnqueuers
	}
	le.PutUint16(b[2:], uint16(e.n))
	le.PutUint32(b[4:], 0)
	le.PutUint64(b[8:], uint64(h.NowMs))
	le.PutUint64(b[16:], h.Proposer)
	le.PutUint64(b[24:], h.Seq)
	return e.buf
}

// AppendEntry appends the encoding of an entry holding cmds to dst (a
// convenience over EntryEncoder, which allocates; errors as Add's).
func AppendEntry(dst []byte, h EntryHeader, cmds ...queue.Command) ([]byte, error) {
	var e EntryEncoder
	for _, c := range cmds {
		if err := e.Add(c); err != nil {
			return dst, err
		}
	}
	b := e.Finish(h)
	return append(dst, b...), nil
}

func malformed(why string, args ...any) error {
	return fmt.Errorf("%w: "+why, append([]any{ErrMalformedEntry}, args...)...)
}

// parseHeader reads and checks an entry's header.
func parseHeader(b []byte) (EntryHeader, int, error) {
	if len(b) < entryHeaderLen {
		return EntryHeader{}, 0, malformed("%d bytes, shorter than the %d-byte header", len(b), entryHeaderLen)
	}
	if b[0] != EntryVersion && b[0] != EntryVersionEnqueuers {
		return EntryHeader{}, 0, fmt.Errorf("%w %d (this build reads versions %d and %d; a newer Warren wrote it: upgrade this node)", ErrEntryVersion, b[0], EntryVersion, EntryVersionEnqueuers)
	}
	if b[1] != 0 {
		return EntryHeader{}, 0, malformed("unknown header flags %#x", b[1])
	}
	if le.Uint32(b[4:]) != 0 {
		return EntryHeader{}, 0, malformed("reserved header bytes are not zero")
	}
	h := EntryHeader{NowMs: int64(le.Uint64(b[8:])), Proposer: le.Uint64(b[16:]), Seq: le.Uint64(b[24:])}
	return h, int(le.Uint16(b[2:])), nil
}

// frameIter walks an entry's frames, checking the framing (not the
// commands). No closures: the apply path must not allocate.
type frameIter struct {
	b    []byte
	off  int
	i, n int
	v2   bool // a version 2 entry: enqueuer frames allowed (at least one)
	from bool // an enqueuer frame was read
	// The last frame's kind, and an enqueuer frame's fixed part (pre) in
	// front of its command (none: an enqueuer-down).
	kind byte
	pre  []byte
}

func newFrames(b []byte, ncmd int) frameIter {
	return frameIter{b: b, off: entryHeaderLen, n: ncmd, v2: b[0] == EntryVersionEnqueuers}
}

// next returns the next command's bytes (nil for an enqueuer-down); done
// once all ncmd are read and nothing follows them.
func (it *frameIter) next() (cmd []byte, done bool, err error) {
	b, i := it.b, it.i
	if i == it.n {
		if it.off != len(b) {
			return nil, false, malformed("%d trailing bytes after %d commands", len(b)-it.off, it.n)
		}
		if it.v2 && !it.from {
			// One encoding per entry: without them it is version 1.
			return nil, false, malformed("a version %d entry with no enqueuer frame", EntryVersionEnqueuers)
		}
		return nil, true, nil
	}
	off := it.off
	if len(b)-off < frameHeaderLen {
		return nil, false, malformed("command %d of %d: truncated frame header at byte %d", i, it.n, off)
	}
	f := b[off : off+frameHeaderLen]
	kind := f[0]
	if f[1]|f[2]|f[3] != 0 {
		return nil, false, malformed("command %d: reserved frame bytes are not zero", i)
	}
	n := int(le.Uint32(f[4:]))
	off += frameHeaderLen
	if n > len(b)-off {
		return nil, false, malformed("command %d: frame of %d bytes, %d left", i, n, len(b)-off)
	}
	it.kind, it.pre = kind, nil
	switch kind {
	case kindDeleteIf, kindRecover:
		return nil, false, malformed("command %d: kind %s is reserved for a log command this build does not have", i, kindName(kind))
	case kindEnqueuerDown, kindPublishFrom:
		if !it.v2 {
			return nil, false, malformed("command %d: kind %s in a version %d entry", i, kindName(kind), EntryVersion)
		}
		it.from = true
	}
	cmd = b[off : off+n : off+n]
	switch kind {
	case kindEnqueuerDown:
		if n != enqueuerDownLen {
			return nil, false, malformed("command %d: an enqueuer-down of %d bytes, not %d", i, n, enqueuerDownLen)
		}
		it.pre, cmd = cmd, nil
	case kindPublishFrom:
		if n < publishFromLen+2 || cmd[publishFromLen+1] != byte(queue.KindEnqueue) {
			return nil, false, malformed("command %d: a publish-from that does not hold an enqueue", i)
		}
		it.pre, cmd = cmd[:publishFromLen:publishFromLen], cmd[publishFromLen:]
	default:
		if n < 2 || cmd[1] != kind {
			return nil, false, malformed("command %d: frame kind %d does not match its command", i, kind)
		}
	}
	off += n
	end := (off + 7) &^ 7
	if end > len(b) {
		return nil, false, malformed("command %d: truncated padding", i)
	}
	for _, p := range b[off:end] {
		if p != 0 {
			return nil, false, malformed("command %d: pad bytes are not zero", i)
		}
	}
	it.off, it.i = end, i+1
	return cmd, false, nil
}

// EntryDecoder decodes entries without allocating in steady state. The
// commands it hands out are views (see queue.Decoder) valid until the
// callback returns. One per goroutine.
type EntryDecoder struct {
	dec   queue.Decoder
	frame Frame
}

// Frame is what an entry says about the command Each hands out besides the
// command itself: the enqueuer frame it came in (enqueuers.go), if any.
type Frame struct {
	// From: the command is the Enqueue of a publish-from (Origin set).
	From   bool
	Origin Origin
	// Down: an enqueuer-down (the command is nil; Origin names it).
	Down bool
}

// Frame describes the frame of the command Each is handing out (valid
// during the callback).
func (d *EntryDecoder) Frame() *Frame { return &d.frame }

// frameCommand decodes the frame it.next returned: its command (nil for
// an enqueuer-down) and d.frame.
func (d *EntryDecoder) frameCommand(it *frameIter, b []byte) (queue.Command, error) {
	d.frame = Frame{}
	switch it.kind {
	case kindEnqueuerDown:
		d.frame.Down, d.frame.Origin = true, parseOrigin(it.pre)
		return nil, nil
	case kindPublishFrom:
		d.frame.From, d.frame.Origin = true, parseOrigin(it.pre)
	}
	cmd, err := d.dec.Decode(b)
	if err != nil {
		return nil, fmt.Errorf("%w: command %d: %w", ErrMalformedEntry, it.i-1, err)
	}
	return cmd, nil
}

// Check validates data whole (header, framing, every command, the message
// cap) and returns the header and the number of messages its Enqueue
// commands hold. It applies nothing.
func (d *EntryDecoder) Check(data []byte) (EntryHeader, int, error) {
	h, ncmd, err := parseHeader(data)
	if err != nil {
		return h, 0, err
	}
	msgs := 0
	for it := newFrames(data, ncmd); ; {
		b, done, err := it.next()
		if done || err != nil {
			return h, msgs, err
		}
		cmd, err := d.frameCommand(&it, b)
		if err != nil {
			return h, msgs, err
		}
		if enq, ok := cmd.(*queue.Enqueue); ok {
			msgs += len(enq.Msgs)
			if msgs > MaxEntryMessages {
				return h, msgs, malformed("more than %d messages", MaxEntryMessages)
			}
		}
	}
}

// Release drops the views the last Check or Each handed out, so that the
// decoder does not keep data alive (queue.Decoder.Release).
func (d *EntryDecoder) Release() { d.dec.Release() }

// Each decodes data's commands in order and calls fn with each (a view,
// valid during the call; fn may change its fields, such as message ids).
// An enqueuer-down comes as a nil command; Frame says what an enqueuer
// frame adds. data must have passed Check: Each stops at the first error,
// fn's or a decoding one.
func (d *EntryDecoder) Each(data []byte, fn func(i int, cmd queue.Command) error) error {
	_, ncmd, err := parseHeader(data)
	if err != nil {
		return err
	}
	for it := newFrames(data, ncmd); ; {
		b, done, err := it.next()
		if done || err != nil {
			return err
		}
		cmd, err := d.frameCommand(&it, b)
		if err != nil {
			return err
		}
		if err := fn(it.i-1, cmd); err != nil {
			return err
		}
	}
}

// DecodeEntry decodes an entry into values that share nothing with data.
func DecodeEntry(data []byte) (*Entry, error) {
	var d EntryDecoder
	h, _, err := d.Check(data)
	if err != nil {
		return nil, err
	}
	e := &Entry{Header: h}
	_, ncmd, _ := parseHeader(data)
	for it := newFrames(data, ncmd); ; {
		b, done, err := it.next()
		if err != nil {
			return nil, err
		}
		if done {
			return e, nil
		}
		var f Frame
		switch it.kind {
		case kindEnqueuerDown:
			f = Frame{Down: true, Origin: parseOrigin(it.pre)}
		case kindPublishFrom:
			f = Frame{From: true, Origin: parseOrigin(it.pre)}
		}
		if f.From || f.Down {
			if e.Frames == nil {
				e.Frames = map[int]Frame{}
			}
			e.Frames[len(e.Commands)] = f
		}
		var cmd queue.Command
		if b != nil {
			if cmd, err = queue.DecodeCommand(b); err != nil {
				return nil, fmt.Errorf("%w: command %d: %w", ErrMalformedEntry, it.i-1, err)
			}
		}
		e.Commands = append(e.Commands, cmd)
	}
}

// ---- raft's entries in segment ----

// raftData is what segment stores for raft entry e: its data, with a
// marker in front for a conf change (allocates only then). A normal entry
// whose data starts with a marker byte is refused: it could not be told
// from a conf change when read back.
func raftData(e *raftpb.Entry) ([]byte, error) {
	switch e.Type {
	case raftpb.EntryNormal:
		if len(e.Data) > 0 && e.Data[0] >= markerFirst {
			return nil, malformed("normal entry %d starts with byte %#x, reserved for raft's entry markers", e.Index, e.Data[0])
		}
		return e.Data, nil
	case raftpb.EntryConfChange, raftpb.EntryConfChangeV2:
		m := byte(markerConfChange)
		if e.Type == raftpb.EntryConfChangeV2 {
			m = markerConfChangeV2
		}
		b := make([]byte, 1+len(e.Data))
		b[0] = m
		copy(b[1:], e.Data)
		return b, nil
	}
	return nil, malformed("raft entry %d of unknown type %d", e.Index, e.Type)
}

// raftEntry rebuilds the raft entry segment stored as data (reslicing, no
// copy).
func raftEntry(index, term uint64, data []byte) (raftpb.Entry, error) {
	e := raftpb.Entry{Index: index, Term: term, Type: raftpb.EntryNormal, Data: data}
	if len(data) == 0 {
		e.Data = nil
		return e, nil
	}
	switch data[0] {
	case markerConfChange:
		e.Type, e.Data = raftpb.EntryConfChange, data[1:]
	case markerConfChangeV2:
		e.Type, e.Data = raftpb.EntryConfChangeV2, data[1:]
	default:
		if data[0] >= markerFirst {
			return e, malformed("stored entry %d starts with unknown marker %#x", index, data[0])
		}
	}
	return e, nil
}

// kindName names a frame kind for messages.
func kindName(k byte) string {
	switch k {
	case kindDeleteIf:
		return "delete-if"
	case kindPublishFrom:
		return "publish-from"
	case kindEnqueuerDown:
		return "enqueuer-down"
	case kindRecover:
		return "recover"
	}
	return queue.CommandKind(k).String() + "(" + strconv.Itoa(int(k)) + ")"
}
