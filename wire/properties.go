package wire

import "strconv"

// PropID identifies a message property. The numbers are part of the
// protocol. A receiver keeps properties whose id it does not know and the
// broker forwards them unchanged, so clients can add properties without a
// broker upgrade.
type PropID uint8

const (
	PropContentType     PropID = 1  // bytes
	PropContentEncoding PropID = 2  // bytes
	PropMessageID       PropID = 3  // bytes; the dedup key
	PropCorrelationID   PropID = 4  // bytes
	PropReplyTo         PropID = 5  // bytes
	PropExpiration      PropID = 6  // u32 milliseconds (per-message TTL)
	PropTimestamp       PropID = 7  // i64 milliseconds since the Unix epoch
	PropType            PropID = 8  // bytes
	PropUserID          PropID = 9  // bytes
	PropAppID           PropID = 10 // bytes
	PropHeaders         PropID = 11 // table entries (no length prefix)
	PropDeaths          PropID = 12 // dead-letter history, written by the broker
	maxKnownProp               = PropDeaths
)

// MaxPropertiesLen bounds the encoded property block (u16 on the wire).
const MaxPropertiesLen = 65535

// Properties is a view of a message's property block. Byte slices alias the
// decoded buffer. Present has bit (1<<id) set for every known property found.
type Properties struct {
	Present         uint16
	ContentType     []byte
	ContentEncoding []byte
	MessageID       []byte
	CorrelationID   []byte
	ReplyTo         []byte
	ExpirationMs    uint32
	TimestampMs     int64
	Type            []byte
	UserID          []byte
	AppID           []byte
	Headers         []byte // raw table entries; iterate with NewTableIter
	Deaths          []byte // raw; decode with DecodeDeaths
	// Unknown holds the raw entries (id, length, value) of properties this
	// version does not know, in their original order, for forwarding.
	Unknown []byte
}

// Has reports whether property id is present.
func (p *Properties) Has(id PropID) bool { return id <= maxKnownProp && p.Present&(1<<id) != 0 }

// Set marks a property present; AppendProperties writes only present ones.
func (p *Properties) Set(id PropID) { p.Present |= 1 << id }

func (p *Properties) bytesField(id PropID) *[]byte {
	switch id {
	case PropContentType:
		return &p.ContentType
	case PropContentEncoding:
		return &p.ContentEncoding
	case PropMessageID:
		return &p.MessageID
	case PropCorrelationID:
		return &p.CorrelationID
	case PropReplyTo:
		return &p.ReplyTo
	case PropType:
		return &p.Type
	case PropUserID:
		return &p.UserID
	case PropAppID:
		return &p.AppID
	case PropHeaders:
		return &p.Headers
	case PropDeaths:
		return &p.Deaths
	}
	return nil
}

// ParseProperties decodes a property block (the bytes after its u16 length)
// into the view p, whose slices alias block, without allocating. Each entry
// is id u8, length u16, value; ids are strictly ascending (so each appears
// once and the unknown ones, all above the known range, form the tail); a
// known id's value must have the size its type fixes, and a known
// variable-size value must not be empty (a table with no fields, a death
// history with no entries): a property is absent or has a value, so every
// block has one meaning and one encoding.
func ParseProperties(block []byte, p *Properties) error {
	*p = Properties{}
	r := reader{b: block}
	var last PropID
	for !r.end() {
		entryStart := r.off
		id := PropID(r.u8())
		v := r.str16()
		if r.err != nil {
			break
		}
		if id <= last {
			return errPropOrder
		}
		last = id
		if id > maxKnownProp {
			// Ids ascend, so the unknown ones form the block's tail.
			p.Unknown = block[entryStart:]
			return validateUnknownProps(p.Unknown, id)
		}
		p.Present |= 1 << id
		if len(v) == 0 && id != PropExpiration && id != PropTimestamp {
			return errPropertyEmpty
		}
		switch id {
		case PropExpiration:
			if len(v) != 4 {
				return errPropertySize
			}
			p.ExpirationMs = le.Uint32(v)
		case PropTimestamp:
			if len(v) != 8 {
				return errPropertySize
			}
			p.TimestampMs = int64(le.Uint64(v))
		case PropHeaders:
			if err := validateEntries(v, true, 1); err != nil {
				return err
			}
			p.Headers = v
		case PropDeaths:
			if v[0] == 0 {
				return errPropertyEmpty
			}
			if err := validateDeaths(v); err != nil {
				return err
			}
			p.Deaths = v
		default:
			*p.bytesField(id) = v
		}
	}
	return r.done()
}

func validateUnknownProps(tail []byte, last PropID) error {
	r := reader{b: tail}
	r.u8()
	r.str16()
	for !r.end() {
		id := PropID(r.u8())
		r.str16()
		if id <= last {
			return errPropOrder
		}
		last = id
	}
	return r.done()
}

// ValidateProperties checks a property block without keeping the view.
func ValidateProperties(block []byte) error {
	var p Properties
	return ParseProperties(block, &p)
}

// AppendProperties appends the u16-length-prefixed property block for the
// present fields of p, in id order, followed by p.Unknown verbatim. A
// present variable-size field with an empty value (or a death history with
// no entries) is written as absent, the one encoding ParseProperties
// accepts.
func AppendProperties(dst []byte, p *Properties) []byte {
	start := len(dst)
	dst = append(dst, 0, 0)
	if p != nil {
		for id := PropID(1); id <= maxKnownProp; id++ {
			if !p.Has(id) {
				continue
			}
			switch id {
			case PropExpiration:
				dst = append(dst, uint8(id), 4, 0)
				dst = appendU32(dst, p.ExpirationMs)
			case PropTimestamp:
				dst = append(dst, uint8(id), 8, 0)
				dst = appendU64(dst, uint64(p.TimestampMs))
			default:
				v := *p.bytesField(id)
				if len(v) == 0 || (id == PropDeaths && v[0] == 0) {
					continue
				}
				dst = appendStr16(append(dst, uint8(id)), v)
			}
		}
		dst = append(dst, p.Unknown...)
	}
	n := len(dst) - start - 2
	if n > MaxPropertiesLen {
		panic("wire: BUG: property block over 65535 bytes")
	}
	le.PutUint16(dst[start:], uint16(n))
	return dst
}

// DeathReason says why a message was dead-lettered. The numbers are part of
// the protocol.
type DeathReason uint8

const (
	ReasonRejected      DeathReason = 1 // rejected or nacked without requeue
	ReasonExpired       DeathReason = 2 // its TTL ran out
	ReasonMaxLen        DeathReason = 3 // dropped from the head of a full queue
	ReasonDeliveryLimit DeathReason = 4 // delivered more times than the queue allows
)

var reasonNames = [...]string{"", "rejected", "expired", "maxlen", "delivery_limit"}

func (r DeathReason) String() string {
	if r >= 1 && int(r) < len(reasonNames) {
		return reasonNames[r]
	}
	return "reason(" + strconv.Itoa(int(r)) + ")"
}

// Death is one entry of a message's dead-letter history: one per (queue,
// reason), most recent first.
type Death struct {
	Queue       string      `json:"queue"`
	Reason      DeathReason `json:"reason"`
	Count       uint32      `json:"count"`
	FirstMs     int64       `json:"first_ms"`
	LastMs      int64       `json:"last_ms"`
	Exchange    string      `json:"exchange"`
	RoutingKeys []string    `json:"routing_keys"`
}

// AppendDeaths encodes a death history (the value of PropDeaths): a u8 count,
// then per entry queue str8, reason u8, count u32, first_ms i64, last_ms i64,
// exchange str8, and a u8 count of str8 routing keys.
func AppendDeaths(dst []byte, ds []Death) []byte {
	if len(ds) > 255 {
		panic("wire: BUG: more than 255 death records")
	}
	dst = append(dst, uint8(len(ds)))
	for i := range ds {
		d := &ds[i]
		dst = appendStr8(dst, d.Queue)
		dst = append(dst, uint8(d.Reason))
		dst = appendU32(dst, d.Count)
		dst = appendU64(dst, uint64(d.FirstMs))
		dst = appendU64(dst, uint64(d.LastMs))
		dst = appendStr8(dst, d.Exchange)
		dst = appendStrList(dst, d.RoutingKeys)
	}
	return dst
}

func (r *reader) death(d *Death, keep bool) {
	q := r.str8()
	reason := DeathReason(r.u8())
	count := r.u32()
	first := int64(r.u64())
	last := int64(r.u64())
	ex := r.str8()
	if reason < ReasonRejected || reason > ReasonDeliveryLimit {
		r.fail(&Error{FrameError, "unknown death reason"})
	}
	if !keep {
		for n := int(r.u8()); n > 0; n-- {
			r.str8()
		}
		return
	}
	*d = Death{Queue: string(q), Reason: reason, Count: count, FirstMs: first, LastMs: last, Exchange: string(ex)}
	d.RoutingKeys = r.strList()
}

func validateDeaths(v []byte) *Error {
	r := reader{b: v}
	for n := int(r.u8()); n > 0; n-- {
		r.death(nil, false)
	}
	if r.err == nil && r.off != len(v) {
		return errTrailing
	}
	return r.err
}

// DecodeDeaths materializes a death history into owned values.
func DecodeDeaths(v []byte) ([]Death, error) {
	r := reader{b: v}
	n := int(r.u8())
	out := make([]Death, n)
	for i := 0; i < n; i++ {
		r.death(&out[i], true)
	}
	if err := r.done(); err != nil {
		return nil, err
	}
	return out, nil
}
