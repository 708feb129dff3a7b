package queue

import (
	"encoding/binary"
	"errors"
	"fmt"
	"strconv"

	"github.com/warren-mq/warren/wire"
)

// The command encoding is described at the top of command.go.

// Sizes and flag bits of the layout (part of the format).
const (
	cmdHeaderLen     = 10 // version u8, kind u8, now_ms i64
	msgRecordLen     = 28 // one Message in an Enqueue
	enqFlagBodies    = 1 << 0
	msgFlagExpires   = 1 << 0
	subFlagAutoAck   = 1 << 0
	subFlagExclusive = 1 << 1
	subFlagGet       = 1 << 2
)

var le = binary.LittleEndian

// AppendCommand appends cmd's encoding to dst and returns the extended
// slice. It allocates nothing when dst has room. It panics on a value the
// format cannot hold (a nil command, an Enqueue whose Bodies is not nil
// and not one per message, a body of 4 GiB or more): those are the
// caller's bugs, as in package wire.
func AppendCommand(dst []byte, cmd Command) []byte {
	// Kind and time come from the concrete types, not through the
	// interface: a dynamic call would make cmd escape (an allocation per
	// command for callers that build it on the stack).
	switch c := cmd.(type) {
	case *Enqueue:
		dst = appendHeader(dst, KindEnqueue, c.NowMs)
		flags := byte(0)
		if c.Bodies != nil {
			if len(c.Bodies) != len(c.Msgs) {
				panic(fmt.Sprintf("queue: Enqueue with %d bodies for %d messages", len(c.Bodies), len(c.Msgs)))
			}
			flags |= enqFlagBodies
		}
		dst = appendMessages(dst, flags, c.Msgs)
		for _, b := range c.Bodies {
			if uint64(len(b)) > 1<<32-1 {
				panic("queue: Enqueue body of 4 GiB or more")
			}
			dst = le.AppendUint32(dst, uint32(len(b)))
			dst = append(dst, b...)
		}
	case *Settle:
		dst = appendHeader(dst, KindSettle, c.NowMs)
		dst = le.AppendUint64(dst, uint64(c.Consumer))
		dst = append(dst, byte(c.Op))
		dst = le.AppendUint64(dst, c.First)
		dst = le.AppendUint64(dst, c.Last)
		dst = le.AppendUint32(dst, c.ArgMs)
	case *Subscribe:
		dst = appendHeader(dst, KindSubscribe, c.NowMs)
		s := &c.Spec
		dst = le.AppendUint64(dst, uint64(s.ID))
		dst = le.AppendUint64(dst, uint64(s.Owner))
		dst = le.AppendUint32(dst, s.Prefetch)
		dst = le.AppendUint32(dst, s.PrefetchBytes)
		dst = le.AppendUint16(dst, uint16(s.Priority))
		flags := byte(0)
		if s.AutoAck {
			flags |= subFlagAutoAck
		}
		if s.Exclusive {
			flags |= subFlagExclusive
		}
		if s.Get {
			flags |= subFlagGet
		}
		dst = append(dst, flags)
		dst = le.AppendUint64(dst, uint64(s.TimeoutMs))
	case *Cancel:
		dst = appendHeader(dst, KindCancel, c.NowMs)
		dst = le.AppendUint64(dst, uint64(c.Consumer))
		dst = append(dst, boolByte(c.Requeue))
	case *Down:
		dst = appendHeader(dst, KindDown, c.NowMs)
		dst = le.AppendUint64(dst, uint64(c.Owner))
	case *Tick:
		dst = appendHeader(dst, KindTick, c.NowMs)
	case *Purge:
		dst = appendHeader(dst, KindPurge, c.NowMs)
	case *SettleDeadLetter:
		dst = appendHeader(dst, KindSettleDeadLetter, c.NowMs)
		dst = le.AppendUint64(dst, c.ID)
	default:
		panic("queue: AppendCommand of a nil command")
	}
	return dst
}

// BodySource hands AppendEnqueue an Enqueue's bodies one at a time, so
// that a caller keeping its messages in another form writes each body
// straight into the encoding (one copy) rather than building the bodies
// first and having them copied again.
type BodySource interface {
	// BodyLen is the length of message i's body (less than 4 GiB).
	BodyLen(i int) int
	// AppendBody appends message i's body, BodyLen(i) bytes, to dst and
	// returns the extended slice.
	AppendBody(dst []byte, i int) []byte
}

// AppendEnqueue appends the encoding of an Enqueue of msgs at nowMs whose
// body i is what src appends for message i: the same bytes AppendCommand
// writes for an Enqueue with those Bodies. It allocates nothing when dst
// has room (and src allocates nothing). It panics when src appends other
// than BodyLen bytes (the caller's bug).
func AppendEnqueue(dst []byte, nowMs int64, msgs []Message, src BodySource) []byte {
	dst = appendHeader(dst, KindEnqueue, nowMs)
	dst = appendMessages(dst, enqFlagBodies, msgs)
	for i := range msgs {
		n := src.BodyLen(i)
		if n < 0 || uint64(n) > 1<<32-1 {
			panic("queue: Enqueue body of 4 GiB or more")
		}
		dst = le.AppendUint32(dst, uint32(n))
		at := len(dst)
		if dst = src.AppendBody(dst, i); len(dst)-at != n {
			panic(fmt.Sprintf("queue: BodySource appended %d bytes for a body of %d", len(dst)-at, n))
		}
	}
	return dst
}

// appendMessages appends an Enqueue's flags, count and message records.
func appendMessages(dst []byte, flags byte, msgs []Message) []byte {
	if len(msgs) > 1<<32-1 {
		panic("queue: Enqueue of 2^32 messages or more")
	}
	dst = append(dst, flags)
	dst = le.AppendUint32(dst, uint32(len(msgs)))
	for i := range msgs {
		dst = appendMessage(dst, &msgs[i])
	}
	return dst
}

func appendHeader(dst []byte, k CommandKind, nowMs int64) []byte {
	dst = append(dst, CommandVersion, byte(k))
	return le.AppendUint64(dst, uint64(nowMs))
}

func appendMessage(dst []byte, m *Message) []byte {
	dst = le.AppendUint64(dst, m.ID)
	dst = le.AppendUint32(dst, m.Size)
	dst = le.AppendUint32(dst, m.ExpirationMs)
	dst = le.AppendUint64(dst, m.DedupKey)
	flags := byte(0)
	if m.HasExpiration {
		flags |= msgFlagExpires
	}
	return append(dst, m.Priority, flags, 0, 0)
}

func boolByte(v bool) byte {
	if v {
		return 1
	}
	return 0
}

// Errors returned for input that is not an encoded command. A log entry
// that fails to decode is corrupt or was written by a newer version: it
// must not be skipped (every replica has to apply the same commands).
var (
	// ErrMalformedCommand: the bytes are not a command of any version this
	// build reads (truncated, trailing bytes, an unknown kind or flag).
	ErrMalformedCommand = errors.New("queue: malformed command")
	// ErrCommandVersion: the command was written in a version this build
	// does not read (a newer Warren wrote it): upgrade this node.
	ErrCommandVersion = errors.New("queue: unknown command version")
)

// cmdReader walks an encoded command. Its first failure sticks (later reads
// return zero values and read nothing), so a decoder reads every field and
// checks once. It never allocates and never reads past its slice.
type cmdReader struct {
	b    []byte
	off  int
	kind CommandKind
	bad  string // the first failure; "" while fine
}

func (r *cmdReader) fail(why string) {
	if r.bad == "" {
		r.bad = why
	}
	r.off = len(r.b)
}

func (r *cmdReader) left() int { return len(r.b) - r.off }

func (r *cmdReader) take(n int) []byte {
	if r.bad != "" {
		return nil
	}
	if n < 0 || r.left() < n {
		r.fail("truncated")
		return nil
	}
	v := r.b[r.off : r.off+n : r.off+n]
	r.off += n
	return v
}

func (r *cmdReader) u8() uint8 {
	if b := r.take(1); b != nil {
		return b[0]
	}
	return 0
}

func (r *cmdReader) u16() uint16 {
	if b := r.take(2); b != nil {
		return le.Uint16(b)
	}
	return 0
}

func (r *cmdReader) u32() uint32 {
	if b := r.take(4); b != nil {
		return le.Uint32(b)
	}
	return 0
}

func (r *cmdReader) u64() uint64 {
	if b := r.take(8); b != nil {
		return le.Uint64(b)
	}
	return 0
}

func (r *cmdReader) bool() bool {
	switch r.u8() {
	case 0:
		return false
	case 1:
		return true
	}
	r.fail("a boolean byte is neither 0 nor 1")
	return false
}

// flags reads a flag byte, refusing bits outside known.
func (r *cmdReader) flags(known byte) byte {
	f := r.u8()
	if f&^known != 0 {
		r.fail("unknown flag bits")
	}
	return f
}

// err is the reader's verdict once the command is read: nil, or an error
// wrapping ErrMalformedCommand that says what and where.
func (r *cmdReader) err() error {
	if r.bad == "" && r.off != len(r.b) {
		r.bad = strconv.Itoa(len(r.b)-r.off) + " trailing bytes"
	}
	if r.bad == "" {
		return nil
	}
	return fmt.Errorf("%w: %s: %s (%d bytes)", ErrMalformedCommand, r.kind, r.bad, len(r.b))
}

// header reads version, kind and time.
func (r *cmdReader) header() (int64, error) {
	if len(r.b) < cmdHeaderLen {
		return 0, fmt.Errorf("%w: %d bytes, shorter than the %d-byte header", ErrMalformedCommand, len(r.b), cmdHeaderLen)
	}
	if v := r.b[0]; v != CommandVersion {
		return 0, fmt.Errorf("%w %d (this build reads version %d; a newer Warren wrote it: upgrade this node)", ErrCommandVersion, v, CommandVersion)
	}
	r.kind = CommandKind(r.b[1])
	r.off = 2
	return int64(r.u64()), nil
}

// Decoder decodes commands without allocating in steady state: the
// command Decode returns, and its Msgs and Bodies slices, belong to the
// decoder and are valid until its next Decode; Bodies are views of src.
// Use one decoder per goroutine (a replica's apply loop keeps one).
type Decoder struct {
	enq    Enqueue
	settle Settle
	sub    Subscribe
	cancel Cancel
	down   Down
	tick   Tick
	purge  Purge
	sdl    SettleDeadLetter
	msgs   []Message
	bodies [][]byte
}

// Release drops the views the last Decode handed out (an Enqueue's
// bodies), so that a decoder kept between inputs does not keep the last
// input alive (a view pins its whole buffer). What Decode returned is not
// to be used after it. It allocates nothing.
func (d *Decoder) Release() { clear(d.bodies) }

// Decode decodes the one command src holds (all of src). Returns views:
// see Decoder.
func (d *Decoder) Decode(src []byte) (Command, error) {
	r := cmdReader{b: src}
	now, err := r.header()
	if err != nil {
		return nil, err
	}
	var cmd Command
	switch r.kind {
	case KindEnqueue:
		clear(d.bodies) // drop the views of the previous input
		d.enq, d.msgs, d.bodies = decodeEnqueue(&r, now, d.msgs[:0], d.bodies[:0])
		cmd = &d.enq
	case KindSettle:
		d.settle = decodeSettle(&r, now)
		cmd = &d.settle
	case KindSubscribe:
		d.sub = decodeSubscribe(&r, now)
		cmd = &d.sub
	case KindCancel:
		d.cancel = Cancel{NowMs: now, Consumer: ConsumerID(r.u64()), Requeue: r.bool()}
		cmd = &d.cancel
	case KindDown:
		d.down = Down{NowMs: now, Owner: OwnerID(r.u64())}
		cmd = &d.down
	case KindTick:
		d.tick = Tick{NowMs: now}
		cmd = &d.tick
	case KindPurge:
		d.purge = Purge{NowMs: now}
		cmd = &d.purge
	case KindSettleDeadLetter:
		d.sdl = SettleDeadLetter{NowMs: now, ID: r.u64()}
		cmd = &d.sdl
	default:
		r.fail("unknown kind")
	}
	if err := r.err(); err != nil {
		return nil, err
	}
	return cmd, nil
}

// DecodeCommand decodes the one command src holds (all of src) into a new
// value that shares nothing with src (bodies are copied). For a hot path,
// use a Decoder.
func DecodeCommand(src []byte) (Command, error) {
	r := cmdReader{b: src}
	now, err := r.header()
	if err != nil {
		return nil, err
	}
	var cmd Command
	switch r.kind {
	case KindEnqueue:
		c, _, _ := decodeEnqueue(&r, now, nil, nil)
		if r.bad == "" {
			ownBodies(c.Bodies)
		}
		cmd = &c
	case KindSettle:
		c := decodeSettle(&r, now)
		cmd = &c
	case KindSubscribe:
		c := decodeSubscribe(&r, now)
		cmd = &c
	case KindCancel:
		cmd = &Cancel{NowMs: now, Consumer: ConsumerID(r.u64()), Requeue: r.bool()}
	case KindDown:
		cmd = &Down{NowMs: now, Owner: OwnerID(r.u64())}
	case KindTick:
		cmd = &Tick{NowMs: now}
	case KindPurge:
		cmd = &Purge{NowMs: now}
	case KindSettleDeadLetter:
		cmd = &SettleDeadLetter{NowMs: now, ID: r.u64()}
	default:
		r.fail("unknown kind")
	}
	if err := r.err(); err != nil {
		return nil, err
	}
	return cmd, nil
}

// ownBodies replaces views with copies, all in one allocation.
func ownBodies(bodies [][]byte) {
	n := 0
	for _, b := range bodies {
		n += len(b)
	}
	buf := make([]byte, 0, n)
	for i, b := range bodies {
		buf = append(buf, b...)
		bodies[i] = buf[len(buf)-len(b) : len(buf) : len(buf)]
	}
}

// decodeEnqueue reads an Enqueue body, appending to msgs and bodies (which
// it returns, grown, for reuse). Counts are checked against the bytes left
// before anything is allocated.
func decodeEnqueue(r *cmdReader, now int64, msgs []Message, bodies [][]byte) (Enqueue, []Message, [][]byte) {
	c := Enqueue{NowMs: now}
	flags := r.flags(enqFlagBodies)
	n := int(r.u32())
	per := msgRecordLen
	if flags&enqFlagBodies != 0 {
		per += 4 // each body's length
	}
	if r.bad != "" || n > r.left()/per {
		r.fail("message count larger than the command")
		return c, msgs, bodies
	}
	if cap(msgs) < n {
		msgs = make([]Message, 0, n)
	}
	recs := r.take(n * msgRecordLen)
	for len(recs) >= msgRecordLen {
		b := recs[:msgRecordLen:msgRecordLen]
		recs = recs[msgRecordLen:]
		if b[25]&^msgFlagExpires != 0 || b[26] != 0 || b[27] != 0 {
			r.fail("a message's unknown flag bits or reserved bytes are not 0")
		}
		msgs = append(msgs, Message{
			ID:            le.Uint64(b[0:8]),
			Size:          le.Uint32(b[8:12]),
			ExpirationMs:  le.Uint32(b[12:16]),
			DedupKey:      le.Uint64(b[16:24]),
			Priority:      b[24],
			HasExpiration: b[25]&msgFlagExpires != 0,
		})
	}
	c.Msgs = msgs
	if flags&enqFlagBodies == 0 {
		return c, msgs, bodies
	}
	if cap(bodies) < n {
		bodies = make([][]byte, 0, n)
	}
	if bodies == nil {
		bodies = [][]byte{} // flag set, no messages: not nil (no allocation)
	}
	for range n {
		bodies = append(bodies, r.take(int(r.u32())))
	}
	c.Bodies = bodies
	return c, msgs, bodies
}

// settleLen is a Settle's body: consumer, op, first, last, arg_ms.
const settleLen = 8 + 1 + 8 + 8 + 4

func decodeSettle(r *cmdReader, now int64) Settle {
	b := r.take(settleLen)
	if b == nil {
		return Settle{NowMs: now}
	}
	return Settle{
		NowMs:    now,
		Consumer: ConsumerID(le.Uint64(b[0:8])),
		Op:       wire.SettleOp(b[8]),
		First:    le.Uint64(b[9:17]),
		Last:     le.Uint64(b[17:25]),
		ArgMs:    le.Uint32(b[25:29]),
	}
}

func decodeSubscribe(r *cmdReader, now int64) Subscribe {
	c := Subscribe{NowMs: now}
	s := &c.Spec
	s.ID = ConsumerID(r.u64())
	s.Owner = OwnerID(r.u64())
	s.Prefetch = r.u32()
	s.PrefetchBytes = r.u32()
	s.Priority = int16(r.u16())
	f := r.flags(subFlagAutoAck | subFlagExclusive | subFlagGet)
	s.AutoAck = f&subFlagAutoAck != 0
	s.Exclusive = f&subFlagExclusive != 0
	s.Get = f&subFlagGet != 0
	s.TimeoutMs = int64(r.u64())
	return c
}
