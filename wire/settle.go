package wire

import "strconv"

// SettleOp is what a SETTLE entry does with its delivery tags.
type SettleOp uint8

// Settlement ops. The numbers are part of the protocol.
const (
	// SettleAck: processed; the broker deletes the messages.
	SettleAck SettleOp = 1
	// SettleRequeue (nack with requeue): the messages go back to the head of
	// their queue (after the queue's retry backoff, if any).
	SettleRequeue SettleOp = 2
	// SettleReject (reject, or nack without requeue): the messages are
	// dead-lettered, or dropped when the queue has no dead-letter exchange.
	SettleReject SettleOp = 3
	// SettleExtend: still working; restart the ack timeout of the
	// deliveries. Arg is the new lease in milliseconds (0: the queue's
	// consumer timeout).
	SettleExtend SettleOp = 4
)

func (op SettleOp) String() string {
	switch op {
	case SettleAck:
		return "ack"
	case SettleRequeue:
		return "requeue"
	case SettleReject:
		return "reject"
	case SettleExtend:
		return "extend"
	}
	return "op(" + strconv.Itoa(int(op)) + ")"
}

// Settlement is one SETTLE entry: op applied to the channel's outstanding
// delivery tags First..Last inclusive. First == 0 means "every outstanding
// tag up to Last" (AMQP's multiple flag); First == Last names one tag.
type Settlement struct {
	Op    SettleOp `json:"op"`
	First uint64   `json:"first"`
	Last  uint64   `json:"last"`
	Arg   uint32   `json:"arg"`
}

// settleEntrySize is op u8, first u64, last u64, arg u32.
const settleEntrySize = 21

// SettleEntrySize is the bytes one entry takes in a SETTLE frame, and
// MaxSettleEntries the most entries one frame holds.
const (
	SettleEntrySize  = settleEntrySize
	MaxSettleEntries = 65535
)

// SETTLE payload: count u16, count × (op u8, first u64, last u64, arg u32).

// AppendSettle appends a SETTLE frame. At most 65535 entries fit one frame.
func AppendSettle(dst []byte, ch uint16, entries []Settlement) []byte {
	if len(entries) > MaxSettleEntries {
		panic("wire: BUG: more than 65535 settle entries in one frame")
	}
	dst, start := beginFrame(dst, TypeSettle, 0, ch)
	dst = appendU16(dst, uint16(len(entries)))
	for i := range entries {
		s := &entries[i]
		dst = append(dst, uint8(s.Op))
		dst = appendU64(dst, s.First)
		dst = appendU64(dst, s.Last)
		dst = appendU32(dst, s.Arg)
	}
	return endFrame(dst, start)
}

// SettleBatch is a view of a decoded, validated SETTLE frame.
type SettleBatch struct {
	Count   int
	entries []byte
}

// DecodeSettle decodes and validates a SETTLE frame into the view b, which
// aliases f.Payload (At copies one entry out), without allocating.
func DecodeSettle(f Frame, b *SettleBatch) error {
	r := reader{b: f.Payload}
	n := int(r.u16())
	entries := r.rest()
	if r.err != nil {
		return r.err
	}
	if n == 0 {
		return errEmptyBatch
	}
	if len(entries) != n*settleEntrySize {
		return errCount
	}
	for i := 0; i < n; i++ {
		var s Settlement
		readSettlement(entries[i*settleEntrySize:], &s)
		switch {
		case s.Op < SettleAck || s.Op > SettleExtend:
			return errSettleOp
		case s.Last == 0 || (s.First > s.Last):
			return errSettleRange
		case s.Arg != 0 && s.Op != SettleExtend:
			return errSettleArg
		}
	}
	b.Count, b.entries = n, entries
	return nil
}

func readSettlement(b []byte, s *Settlement) {
	s.Op = SettleOp(b[0])
	s.First = le.Uint64(b[1:])
	s.Last = le.Uint64(b[9:])
	s.Arg = le.Uint32(b[17:])
}

// At returns entry i (0 ≤ i < Count).
func (b *SettleBatch) At(i int, s *Settlement) { readSettlement(b.entries[i*settleEntrySize:], s) }

// ConfirmRange confirms the publish sequence numbers First..Last inclusive
// on a channel: Code OK is an ack (the broker has taken responsibility),
// any other code a nack for that reason.
type ConfirmRange struct {
	First uint64 `json:"first"`
	Last  uint64 `json:"last"`
	Code  Code   `json:"code"`
}

const confirmEntrySize = 18

// ConfirmRangeSize is the bytes one range takes in a CONFIRM frame, and
// MaxConfirmRanges the most ranges one frame holds.
const (
	ConfirmRangeSize = confirmEntrySize
	MaxConfirmRanges = 65535
)

// CONFIRM payload: count u16, count × (first u64, last u64, code u16).

// AppendConfirm appends a CONFIRM frame.
func AppendConfirm(dst []byte, ch uint16, ranges []ConfirmRange) []byte {
	if len(ranges) > MaxConfirmRanges {
		panic("wire: BUG: more than 65535 confirm ranges in one frame")
	}
	dst, start := beginFrame(dst, TypeConfirm, 0, ch)
	dst = appendU16(dst, uint16(len(ranges)))
	for i := range ranges {
		dst = appendU64(dst, ranges[i].First)
		dst = appendU64(dst, ranges[i].Last)
		dst = appendU16(dst, uint16(ranges[i].Code))
	}
	return endFrame(dst, start)
}

// ConfirmBatch is a view of a decoded, validated CONFIRM frame.
type ConfirmBatch struct {
	Count   int
	entries []byte
}

// DecodeConfirm decodes and validates a CONFIRM frame into the view b, which
// aliases f.Payload (At copies one range out), without allocating.
func DecodeConfirm(f Frame, b *ConfirmBatch) error {
	r := reader{b: f.Payload}
	n := int(r.u16())
	entries := r.rest()
	if r.err != nil {
		return r.err
	}
	if n == 0 {
		return errEmptyBatch
	}
	if len(entries) != n*confirmEntrySize {
		return errCount
	}
	for i := 0; i < n; i++ {
		var c ConfirmRange
		readConfirm(entries[i*confirmEntrySize:], &c)
		if c.First == 0 || c.First > c.Last {
			return errConfirmRange
		}
	}
	b.Count, b.entries = n, entries
	return nil
}

func readConfirm(b []byte, c *ConfirmRange) {
	c.First = le.Uint64(b)
	c.Last = le.Uint64(b[8:])
	c.Code = Code(le.Uint16(b[16:]))
}

// At returns range i (0 ≤ i < Count).
func (b *ConfirmBatch) At(i int, c *ConfirmRange) { readConfirm(b.entries[i*confirmEntrySize:], c) }
