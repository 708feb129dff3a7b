package wire

import "strconv"

// Code is a stable protocol error code. The numbers are part of the protocol:
// they never change meaning and are never reused. The hundreds digit is the
// scope (see Scope).
type Code uint16

// The error catalogue. spec/PROTOCOL.md §12 is the same table in prose.
const (
	OK Code = 0

	// 1xx: per message, carried in CONFIRM (nack) and RETURN; nothing closes.
	NoRoute          Code = 100 // a mandatory message matched no queue
	QueueFull        Code = 101 // a queue with overflow reject-publish is full
	ExchangeNotFound Code = 102 // the batch named an exchange that does not exist
	InternalNack     Code = 103 // the broker could not take the message (storage failure)
	ExchangeInternal Code = 104 // the batch named an internal exchange, which takes no direct publishes

	// 2xx: per request, carried in ERROR; the channel stays open.
	NotFound           Code = 200 // the named exchange, queue or consumer does not exist
	PreconditionFailed Code = 201 // exists with other settings; if-unused/if-empty not met
	AccessRefused      Code = 202 // the user may not do this
	ResourceLocked     Code = 203 // exclusive to another connection or consumer
	InvalidArgument    Code = 204 // a bad name, argument key, type or value
	NotAllowed         Code = 205 // the operation is never allowed (e.g. deleting the default exchange)
	LimitReached       Code = 206 // a configured limit on queues, exchanges, bindings or a connection's exclusive queues

	// 3xx: per channel, carried in CHANNEL_CLOSE; the channel is closed.
	UnknownDeliveryTag Code = 300 // a settlement named a tag that is not outstanding
	SequenceError      Code = 301 // a PUBLISH first_seq was not the channel's next sequence number

	// 4xx: per connection, carried in CLOSE; the connection is closed.
	FrameError       Code = 400 // a payload is malformed: truncated, inconsistent lengths, bad values
	FrameTooLarge    Code = 401 // a frame or a decompressed batch exceeds the negotiated maximum
	UnknownFrameType Code = 402 // a frame type this peer does not know outside the ignorable range
	BadFlags         Code = 403 // flag bits set that this frame type does not define
	UnexpectedFrame  Code = 404 // a valid frame at the wrong time, direction or channel
	BadVersion       Code = 405 // the preamble is wrong or names an unsupported major version
	AuthFailed       Code = 406 // bad credentials or mechanism
	HeartbeatTimeout Code = 407 // nothing received for two heartbeat intervals
	DecompressError  Code = 408 // a compressed section does not decode
	ChannelError     Code = 409 // a channel id out of range, not open, or already open
	ResourceLimit    Code = 410 // too many connections or channels, or another configured limit
	ConnectionForced Code = 411 // the broker is shutting down or an operator closed the connection
	InternalError    Code = 412 // a bug or fatal fault in the broker
)

// Scope says what an error closes.
type Scope uint8

const (
	ScopeNone       Scope = iota // OK
	ScopeMessage                 // reported for one message; nothing closes
	ScopeRequest                 // reported for one request; the channel stays open
	ScopeChannel                 // the channel is closed
	ScopeConnection              // the connection is closed
)

func (s Scope) String() string {
	switch s {
	case ScopeNone:
		return "none"
	case ScopeMessage:
		return "message"
	case ScopeRequest:
		return "request"
	case ScopeChannel:
		return "channel"
	case ScopeConnection:
		return "connection"
	}
	return "scope(" + strconv.Itoa(int(s)) + ")"
}

var codeNames = map[Code]string{
	OK:                 "ok",
	NoRoute:            "no_route",
	QueueFull:          "queue_full",
	ExchangeNotFound:   "exchange_not_found",
	InternalNack:       "internal_nack",
	ExchangeInternal:   "exchange_internal",
	NotFound:           "not_found",
	PreconditionFailed: "precondition_failed",
	AccessRefused:      "access_refused",
	ResourceLocked:     "resource_locked",
	InvalidArgument:    "invalid_argument",
	NotAllowed:         "not_allowed",
	LimitReached:       "limit_reached",
	UnknownDeliveryTag: "unknown_delivery_tag",
	SequenceError:      "sequence_error",
	FrameError:         "frame_error",
	FrameTooLarge:      "frame_too_large",
	UnknownFrameType:   "unknown_frame_type",
	BadFlags:           "bad_flags",
	UnexpectedFrame:    "unexpected_frame",
	BadVersion:         "bad_version",
	AuthFailed:         "auth_failed",
	HeartbeatTimeout:   "heartbeat_timeout",
	DecompressError:    "decompress_error",
	ChannelError:       "channel_error",
	ResourceLimit:      "resource_limit",
	ConnectionForced:   "connection_forced",
	InternalError:      "internal_error",
}

// Codes returns every defined code in ascending order.
func Codes() []Code {
	out := make([]Code, 0, len(codeNames))
	for c := Code(0); c < 500; c++ {
		if _, ok := codeNames[c]; ok {
			out = append(out, c)
		}
	}
	return out
}

// String returns the code's stable name, such as "frame_error".
func (c Code) String() string {
	if n, ok := codeNames[c]; ok {
		return n
	}
	return "code(" + strconv.Itoa(int(c)) + ")"
}

// Known reports whether c is in the catalogue.
func (c Code) Known() bool { _, ok := codeNames[c]; return ok }

// Scope returns what the error closes. Unknown codes are scoped by their
// hundreds digit, so a peer can act on a code added in a later version.
func (c Code) Scope() Scope {
	switch {
	case c == OK:
		return ScopeNone
	case c < 200:
		return ScopeMessage
	case c < 300:
		return ScopeRequest
	case c < 400:
		return ScopeChannel
	default:
		return ScopeConnection
	}
}

// Error is a protocol error: a code from the catalogue and a human-readable
// reason. Decoders return *Error for every malformed input.
type Error struct {
	Code   Code
	Reason string
}

func (e *Error) Error() string { return "wire: " + e.Code.String() + ": " + e.Reason }

// Is makes errors.Is match any *Error with the same code.
func (e *Error) Is(target error) bool {
	t, ok := target.(*Error)
	return ok && t.Code == e.Code && (t.Reason == "" || t.Reason == e.Reason)
}

// CodeOf returns the protocol code carried by err, InternalError for any
// other non-nil error, and OK for nil.
func CodeOf(err error) Code {
	if err == nil {
		return OK
	}
	if e, ok := err.(*Error); ok {
		return e.Code
	}
	return InternalError
}

// Preallocated errors for the decode paths, so malformed input costs no
// allocation either.
var (
	errTruncated      = &Error{FrameError, "truncated payload"}
	errTrailing       = &Error{FrameError, "trailing bytes after payload"}
	errBool           = &Error{FrameError, "boolean not 0 or 1"}
	errValueType      = &Error{FrameError, "unknown table value type"}
	errTableDepth     = &Error{FrameError, "table nesting too deep"}
	errPropOrder      = &Error{FrameError, "property ids not strictly ascending"}
	errPropertySize   = &Error{FrameError, "property value has the wrong size"}
	errPropertyEmpty  = &Error{FrameError, "property present with an empty value (leave an empty property out)"}
	errVhostEmpty     = &Error{FrameError, "AUTH vhost field present and empty (leave it out for \"/\")"}
	errCount          = &Error{FrameError, "count does not match the entries"}
	errEmptyBatch     = &Error{FrameError, "batch with no entries"}
	errSettleOp       = &Error{FrameError, "unknown settlement op"}
	errSettleRange    = &Error{FrameError, "settlement range with first > last"}
	errSettleArg      = &Error{FrameError, "settlement arg set on an op that takes none"}
	errExchangeKind   = &Error{FrameError, "unknown exchange type"}
	errConfirmRange   = &Error{FrameError, "confirm range with first > last or first = 0"}
	errFrameTooLarge  = &Error{FrameTooLarge, "frame exceeds the maximum frame size"}
	errRawTooLarge    = &Error{FrameTooLarge, "decompressed size exceeds the maximum frame size"}
	errUnknownType    = &Error{UnknownFrameType, "unknown frame type"}
	errBadFlags       = &Error{BadFlags, "undefined flag bits set"}
	errBadVersion     = &Error{BadVersion, "bad preamble"}
	errDecompress     = &Error{DecompressError, "compressed section does not decode"}
	errRawLenMismatch = &Error{DecompressError, "decompressed size differs from raw_len"}
	errCodec          = &Error{BadFlags, "unknown compression codec"}
)
