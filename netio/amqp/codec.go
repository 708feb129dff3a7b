package amqp

import (
	"encoding/binary"
	"errors"
	"math"

	"github.com/warren-mq/warren/broker"
	"github.com/warren-mq/warren/wire"
)

// AMQP 0-9-1 frame types, and the frame-end octet.
const (
	frameMethod    = 1
	frameHeader    = 2
	frameBody      = 3
	frameHeartbeat = 8
	frameEnd       = 0xCE
	frameMinSize   = 4096 // frame-max before tune, and the least a peer may ask
)

// AMQP reply codes (the spec's constants).
const (
	replySuccess       = 200
	contentTooLarge    = 311
	noRoute            = 312
	connectionForced   = 320
	accessRefused      = 403
	notFound           = 404
	resourceLocked     = 405
	preconditionFailed = 406
	frameError         = 501
	syntaxError        = 502
	commandInvalid     = 503
	channelError       = 504
	unexpectedFrame    = 505
	resourceError      = 506
	notAllowed         = 530
	notImplemented     = 540
	internalError      = 541
)

// Class and method ids.
const (
	classConnection = 10
	classChannel    = 20
	classExchange   = 40
	classQueue      = 50
	classBasic      = 60
	classConfirm    = 85
	classTx         = 90
)

// amqpError is a protocol error: a reply code, its text, and the method
// that caused it. conn says whether it closes the connection (else the
// channel).
type amqpError struct {
	code          uint16
	text          string
	class, method uint16
	conn          bool
}

func (e *amqpError) Error() string { return e.text }

func chErr(code uint16, text string) *amqpError { return &amqpError{code: code, text: text} }
func connErr(code uint16, text string) *amqpError {
	return &amqpError{code: code, text: text, conn: true}
}

// replyCodeOf maps a Warren error code to the AMQP reply code RabbitMQ
// sends in the same case.
func replyCodeOf(c wire.Code) uint16 {
	switch c {
	case wire.NotFound, wire.ExchangeNotFound:
		return notFound
	case wire.PreconditionFailed, wire.InvalidArgument, wire.ResourceLimit, wire.QueueFull, wire.LimitReached:
		return preconditionFailed
	case wire.AccessRefused, wire.NotAllowed, wire.ExchangeInternal:
		return accessRefused
	case wire.ResourceLocked:
		return resourceLocked
	case wire.UnknownDeliveryTag:
		return preconditionFailed
	case wire.ConnectionForced:
		return connectionForced
	}
	return internalError
}

// replyName is a reply code's name, which RabbitMQ puts before every
// reply text ("NOT_FOUND - no queue 'q' in vhost '/'").
func replyName(code uint16) string {
	switch code {
	case contentTooLarge:
		return "CONTENT_TOO_LARGE"
	case noRoute:
		return "NO_ROUTE"
	case connectionForced:
		return "CONNECTION_FORCED"
	case accessRefused:
		return "ACCESS_REFUSED"
	case notFound:
		return "NOT_FOUND"
	case resourceLocked:
		return "RESOURCE_LOCKED"
	case preconditionFailed:
		return "PRECONDITION_FAILED"
	case frameError:
		return "FRAME_ERROR"
	case syntaxError:
		return "SYNTAX_ERROR"
	case commandInvalid:
		return "COMMAND_INVALID"
	case channelError:
		return "CHANNEL_ERROR"
	case unexpectedFrame:
		return "UNEXPECTED_FRAME"
	case resourceError:
		return "RESOURCE_ERROR"
	case notAllowed:
		return "NOT_ALLOWED"
	case notImplemented:
		return "NOT_IMPLEMENTED"
	}
	return "INTERNAL_ERROR"
}

// brokerErr is a refusal by the broker (code, reason) as a channel error:
// the reply code RabbitMQ sends in the same case, named as RabbitMQ names
// it, then the broker's reason.
func brokerErr(code wire.Code, reason string) *amqpError {
	rc := replyCodeOf(code)
	return chErr(rc, replyName(rc)+" - "+reason)
}

// errOf is an error from the broker as a channel error.
func errOf(err error) *amqpError {
	var ae *amqpError
	if errors.As(err, &ae) {
		return ae
	}
	var we *wire.Error
	if errors.As(err, &we) {
		return brokerErr(we.Code, broker.LocalText(we.Reason))
	}
	return chErr(internalError, err.Error())
}

var errShort = connErr(frameError, "FRAME_ERROR - method frame too short")

// reader decodes a method payload. The first error sticks.
type reader struct {
	b   []byte
	off int
	err error
	// bits: the octet being read bit by bit, and the next bit.
	bits, bit uint8
}

func (r *reader) take(n int) []byte {
	r.bit = 0
	if r.err != nil || n < 0 || len(r.b)-r.off < n {
		r.err = errShort
		return nil
	}
	p := r.b[r.off : r.off+n]
	r.off += n
	return p
}

func (r *reader) u8() uint8 {
	if p := r.take(1); p != nil {
		return p[0]
	}
	return 0
}
func (r *reader) u16() uint16 {
	if p := r.take(2); p != nil {
		return binary.BigEndian.Uint16(p)
	}
	return 0
}
func (r *reader) u32() uint32 {
	if p := r.take(4); p != nil {
		return binary.BigEndian.Uint32(p)
	}
	return 0
}
func (r *reader) u64() uint64 {
	if p := r.take(8); p != nil {
		return binary.BigEndian.Uint64(p)
	}
	return 0
}
func (r *reader) shortstr() string { return string(r.take(int(r.u8()))) }
func (r *reader) longstr() []byte  { return r.take(int(r.u32())) }
func (r *reader) bitAt() bool {
	if r.bit == 0 {
		r.bits = r.u8()
	}
	v := r.bits&(1<<r.bit) != 0
	r.bit = (r.bit + 1) % 8
	return v
}

// timestampMs is an AMQP timestamp (seconds, read as signed as RabbitMQ
// does) in Warren's milliseconds. One past what int64 milliseconds hold
// (beyond ±292 million years) is the farthest whole second that fits, so
// it comes back as one timestamp, not as a wrapped product.
func timestampMs(sec uint64) int64 {
	const lim = math.MaxInt64 / 1000
	return min(max(int64(sec), -lim), lim) * 1000
}

// table reads a field table into Warren's table model.
func (r *reader) table() wire.Table {
	raw := r.longstr()
	if r.err != nil {
		return nil
	}
	t, err := parseTable(raw, 0)
	if err != nil {
		r.err = err
	}
	return t
}

const maxTableDepth = 16

var errTable = connErr(syntaxError, "SYNTAX_ERROR - malformed field table")

// parseTable reads the entries of a field table (without its length).
func parseTable(raw []byte, depth int) (wire.Table, error) {
	if depth > maxTableDepth {
		return nil, errTable
	}
	fr := reader{b: raw}
	var t wire.Table
	for fr.off < len(fr.b) && fr.err == nil {
		k := fr.shortstr()
		v := fr.value(depth)
		if fr.err != nil {
			return nil, errTable
		}
		t = append(t, wire.Field{Key: k, Value: v})
	}
	if fr.err != nil {
		return nil, errTable
	}
	return t, nil
}

func (r *reader) value(depth int) wire.Value {
	switch r.u8() {
	case 't':
		return wire.Bool(r.u8() != 0)
	case 'b':
		return wire.Int(int64(int8(r.u8())))
	case 'B':
		return wire.Int(int64(r.u8()))
	case 's':
		return wire.Int(int64(int16(r.u16())))
	case 'u':
		return wire.Int(int64(r.u16()))
	case 'I':
		return wire.Int(int64(int32(r.u32())))
	case 'i':
		return wire.Int(int64(r.u32()))
	case 'l':
		return wire.Int(int64(r.u64()))
	case 'L':
		return wire.Int(int64(r.u64()))
	case 'f':
		return wire.Float(float64(math.Float32frombits(r.u32())))
	case 'd':
		return wire.Float(math.Float64frombits(r.u64()))
	case 'D':
		scale := r.u8()
		v := float64(int32(r.u32()))
		return wire.Float(v / math.Pow10(int(scale)))
	case 'S':
		return wire.Value{Kind: wire.KindString, Bytes: append([]byte(nil), r.longstr()...)}
	case 'x':
		return wire.Bytes(append([]byte(nil), r.longstr()...))
	case 'T':
		return wire.Timestamp(timestampMs(r.u64()))
	case 'V':
		return wire.Null()
	case 'F':
		raw := r.longstr()
		if r.err != nil {
			return wire.Value{}
		}
		t, err := parseTable(raw, depth+1)
		if err != nil {
			r.err = err
		}
		return wire.TableValue(t)
	case 'A':
		raw := r.longstr()
		if r.err != nil || depth+1 > maxTableDepth {
			r.err = errTable
			return wire.Value{}
		}
		ar := reader{b: raw}
		var vs []wire.Value
		for ar.off < len(ar.b) && ar.err == nil {
			vs = append(vs, ar.value(depth+1))
		}
		if ar.err != nil {
			r.err = errTable
		}
		return wire.ArrayValue(vs)
	}
	r.err = errTable
	return wire.Value{}
}

// Writing.

func putShortstr(b []byte, s string) []byte {
	if len(s) > 255 {
		s = s[:255]
	}
	return append(append(b, byte(len(s))), s...)
}
func putLongstr(b []byte, s []byte) []byte {
	return append(binary.BigEndian.AppendUint32(b, uint32(len(s))), s...)
}

// putTable writes t as a field table.
func putTable(b []byte, t wire.Table) []byte {
	start := len(b)
	b = append(b, 0, 0, 0, 0)
	for i := range t {
		b = putShortstr(b, t[i].Key)
		b = putValue(b, &t[i].Value)
	}
	binary.BigEndian.PutUint32(b[start:], uint32(len(b)-start-4))
	return b
}

func putValue(b []byte, v *wire.Value) []byte {
	switch v.Kind {
	case wire.KindBool:
		return append(b, 't', byte(v.Int))
	case wire.KindInt:
		return binary.BigEndian.AppendUint64(append(b, 'l'), uint64(v.Int))
	case wire.KindFloat:
		return binary.BigEndian.AppendUint64(append(b, 'd'), math.Float64bits(v.Float))
	case wire.KindString:
		return putLongstr(append(b, 'S'), v.Bytes)
	case wire.KindBytes:
		return putLongstr(append(b, 'x'), v.Bytes)
	case wire.KindTimestamp:
		return binary.BigEndian.AppendUint64(append(b, 'T'), uint64(v.Int/1000))
	case wire.KindTable:
		return putTable(append(b, 'F'), v.Table)
	case wire.KindArray:
		b = append(b, 'A')
		start := len(b)
		b = append(b, 0, 0, 0, 0)
		for i := range v.Array {
			b = putValue(b, &v.Array[i])
		}
		binary.BigEndian.PutUint32(b[start:], uint32(len(b)-start-4))
		return b
	}
	return append(b, 'V')
}

// frame appends a frame around the payload that fill appends.
func beginFrame(b []byte, typ byte, ch uint16) ([]byte, int) {
	b = append(b, typ)
	b = binary.BigEndian.AppendUint16(b, ch)
	start := len(b)
	return append(b, 0, 0, 0, 0), start
}

func endFrame(b []byte, start int) []byte {
	binary.BigEndian.PutUint32(b[start:], uint32(len(b)-start-4))
	return append(b, frameEnd)
}

// method begins a method frame with its ids.
func method(b []byte, ch, class, id uint16) ([]byte, int) {
	b, start := beginFrame(b, frameMethod, ch)
	b = binary.BigEndian.AppendUint16(b, class)
	return binary.BigEndian.AppendUint16(b, id), start
}
