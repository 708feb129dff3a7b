package wire

import "strconv"

// Protocol version spoken by this package.
const (
	VersionMajor = 1
	VersionMinor = 0
)

// Preamble is the 8 bytes a client sends first: "WARREN", major, minor.
var Preamble = [8]byte{'W', 'A', 'R', 'R', 'E', 'N', VersionMajor, VersionMinor}

// CheckPreamble validates the 8 preamble bytes. A server that gets an error
// writes its own Preamble (so the client learns what it speaks) and closes.
func CheckPreamble(b []byte) (major, minor uint8, err error) {
	if len(b) < len(Preamble) || string(b[:6]) != "WARREN" {
		return 0, 0, errBadVersion
	}
	major, minor = b[6], b[7]
	if major != VersionMajor {
		return major, minor, errBadVersion
	}
	return major, minor, nil
}

// Limits. Each is part of the protocol; spec/PROTOCOL.md §3 gives the same
// numbers.
const (
	// HeaderSize is the fixed frame header: length u32, type u8, flags u8,
	// channel u16.
	HeaderSize = 8
	// HandshakeMaxFrame bounds every frame before OPEN_OK, so an
	// unauthenticated peer can make the broker buffer at most 64 KiB.
	HandshakeMaxFrame = 64 << 10
	// MinMaxFrame is the smallest max_frame a peer may negotiate; every
	// control frame fits in it.
	MinMaxFrame = 64 << 10
	// DefaultMaxFrame is the broker's default proposal: large enough for a
	// batch of a thousand 1 KiB messages.
	DefaultMaxFrame = 4 << 20
	// HardMaxFrame is the largest max_frame any peer may negotiate; it also
	// bounds a decompressed batch. Bigger payloads belong in object storage.
	HardMaxFrame = 64 << 20
	// MaxChannels is the largest channel id (channel 0 is the connection).
	MaxChannels = 65535
	// MaxTableDepth bounds nesting of tables and arrays, so a decoder's
	// recursion is bounded.
	MaxTableDepth = 8
	// MaxNameLen bounds exchange, queue and consumer names and routing keys
	// (they are str8 on the wire).
	MaxNameLen = 255
)

// Type is a frame type.
type Type uint8

// Frame types. The numbers are part of the protocol.
const (
	// Connection (channel 0).
	TypeHello         Type = 0x01 // S→C
	TypeAuth          Type = 0x02 // C→S
	TypeAuthChallenge Type = 0x03 // S→C
	TypeAuthResponse  Type = 0x04 // C→S
	TypeOpenOK        Type = 0x05 // S→C
	TypeHeartbeat     Type = 0x06 // both
	TypeClose         Type = 0x07 // both
	TypeCloseOK       Type = 0x08 // both

	// Channels and replies.
	TypeChannelOpen    Type = 0x10 // C→S
	TypeChannelClose   Type = 0x11 // both
	TypeChannelCloseOK Type = 0x12 // both
	TypeOK             Type = 0x13 // S→C
	TypeError          Type = 0x14 // S→C

	// Topology.
	TypeExchangeDeclare Type = 0x20 // C→S
	TypeExchangeDelete  Type = 0x21 // C→S
	TypeQueueDeclare    Type = 0x22 // C→S
	TypeQueueDeclareOK  Type = 0x23 // S→C
	TypeQueueDelete     Type = 0x24 // C→S
	TypeQueuePurge      Type = 0x25 // C→S
	TypeBind            Type = 0x26 // C→S
	TypeUnbind          Type = 0x27 // C→S

	// Publishing.
	TypePublish Type = 0x30 // C→S
	TypeConfirm Type = 0x31 // S→C
	TypeReturn  Type = 0x32 // S→C
	TypeFlow    Type = 0x33 // S→C

	// Consuming.
	TypeSubscribe    Type = 0x40 // C→S
	TypeSubscribeOK  Type = 0x41 // S→C
	TypeCancel       Type = 0x42 // C→S
	TypeCancelled    Type = 0x43 // S→C
	TypeDeliver      Type = 0x44 // S→C
	TypeSettle       Type = 0x45 // C→S
	TypeLeaseExpired Type = 0x46 // S→C

	// IgnorableMin starts the range of extension frame types that a peer
	// which does not know them skips instead of closing the connection.
	IgnorableMin Type = 0xE0
)

// Direction says who may send a frame type.
type Direction uint8

const (
	ClientToServer Direction = 1 << iota
	ServerToClient
	Both = ClientToServer | ServerToClient
)

type typeInfo struct {
	name      string
	dir       Direction
	conn      bool  // sent on channel 0 only; otherwise on channels ≥ 1 only
	flagsMask uint8 // defined flag bits
}

var types = [256]*typeInfo{
	TypeHello:           {"hello", ServerToClient, true, 0},
	TypeAuth:            {"auth", ClientToServer, true, 0},
	TypeAuthChallenge:   {"auth_challenge", ServerToClient, true, 0},
	TypeAuthResponse:    {"auth_response", ClientToServer, true, 0},
	TypeOpenOK:          {"open_ok", ServerToClient, true, 0},
	TypeHeartbeat:       {"heartbeat", Both, true, 0},
	TypeClose:           {"close", Both, true, 0},
	TypeCloseOK:         {"close_ok", Both, true, 0},
	TypeChannelOpen:     {"channel_open", ClientToServer, false, 0},
	TypeChannelClose:    {"channel_close", Both, false, 0},
	TypeChannelCloseOK:  {"channel_close_ok", Both, false, 0},
	TypeOK:              {"ok", ServerToClient, false, 0},
	TypeError:           {"error", ServerToClient, false, 0},
	TypeExchangeDeclare: {"exchange_declare", ClientToServer, false, 0},
	TypeExchangeDelete:  {"exchange_delete", ClientToServer, false, 0},
	TypeQueueDeclare:    {"queue_declare", ClientToServer, false, 0},
	TypeQueueDeclareOK:  {"queue_declare_ok", ServerToClient, false, 0},
	TypeQueueDelete:     {"queue_delete", ClientToServer, false, 0},
	TypeQueuePurge:      {"queue_purge", ClientToServer, false, 0},
	TypeBind:            {"bind", ClientToServer, false, 0},
	TypeUnbind:          {"unbind", ClientToServer, false, 0},
	TypePublish:         {"publish", ClientToServer, false, flagCodecMask},
	TypeConfirm:         {"confirm", ServerToClient, false, 0},
	TypeReturn:          {"return", ServerToClient, false, 0},
	TypeFlow:            {"flow", ServerToClient, false, 0},
	TypeSubscribe:       {"subscribe", ClientToServer, false, 0},
	TypeSubscribeOK:     {"subscribe_ok", ServerToClient, false, 0},
	TypeCancel:          {"cancel", ClientToServer, false, 0},
	TypeCancelled:       {"cancelled", ServerToClient, false, 0},
	TypeDeliver:         {"deliver", ServerToClient, false, flagCodecMask},
	TypeSettle:          {"settle", ClientToServer, false, 0},
	TypeLeaseExpired:    {"lease_expired", ServerToClient, false, 0},
}

// FLOW is the one channel frame that may also travel on channel 0 (it then
// applies to the whole connection); ChannelOK accounts for it.

// Known reports whether t is defined by this version.
func (t Type) Known() bool { return types[t] != nil }

// Ignorable reports whether t is in the extension range a peer may skip.
func (t Type) Ignorable() bool { return t >= IgnorableMin }

func (t Type) String() string {
	if i := types[t]; i != nil {
		return i.name
	}
	return "type(0x" + strconv.FormatUint(uint64(t), 16) + ")"
}

// Direction returns who may send t (0 for unknown types).
func (t Type) Direction() Direction {
	if i := types[t]; i != nil {
		return i.dir
	}
	return 0
}

// ChannelOK reports whether t may travel on channel ch: connection frames on
// channel 0, the others on channels ≥ 1, and FLOW on either.
func (t Type) ChannelOK(ch uint16) bool {
	i := types[t]
	if i == nil {
		return false
	}
	if t == TypeFlow {
		return true
	}
	return i.conn == (ch == 0)
}

// Frame is one decoded frame header with a view of its payload. Payload
// aliases the buffer given to Split and is valid only as long as that buffer.
type Frame struct {
	Type    Type
	Flags   uint8
	Channel uint16
	Payload []byte
}

// Split returns a view of the next frame in buf (its Payload aliases buf)
// and the number of bytes it used, or n == 0 and a nil error when buf holds only part of a
// frame (read more and call again). maxFrame is the negotiated maximum frame
// size (header included); a header announcing more is refused with
// FrameTooLarge before the rest is read, so the caller never buffers it.
// Unknown types outside the ignorable range and undefined flag bits are
// errors; a frame of an ignorable type is returned for the caller to skip.
func Split(buf []byte, maxFrame uint32) (f Frame, n int, err error) {
	if len(buf) < HeaderSize {
		return Frame{}, 0, nil
	}
	length := le.Uint32(buf)
	if uint64(length)+HeaderSize > uint64(maxFrame) {
		return Frame{}, 0, errFrameTooLarge
	}
	f.Type = Type(buf[4])
	f.Flags = buf[5]
	f.Channel = le.Uint16(buf[6:])
	info := types[f.Type]
	switch {
	case info != nil:
		if f.Flags&^info.flagsMask != 0 {
			return Frame{}, 0, errBadFlags
		}
		if info.flagsMask&flagCodecMask != 0 && Codec(f.Flags&flagCodecMask) > CodecZstd {
			return Frame{}, 0, errCodec
		}
	case !f.Type.Ignorable():
		return Frame{}, 0, errUnknownType
	}
	total := HeaderSize + int(length)
	if len(buf) < total {
		return Frame{}, 0, nil
	}
	f.Payload = buf[HeaderSize:total:total]
	return f, total, nil
}

// FrameSize returns the full size of the frame whose header starts buf, or 0
// if fewer than HeaderSize bytes are present. Event loops use it to wait for
// a whole frame before calling Split.
func FrameSize(buf []byte) int {
	if len(buf) < HeaderSize {
		return 0
	}
	return HeaderSize + int(le.Uint32(buf))
}

// beginFrame appends a header with a zero length and returns the offset of
// the frame's start, for endFrame to patch.
func beginFrame(dst []byte, t Type, flags uint8, ch uint16) ([]byte, int) {
	start := len(dst)
	dst = append(dst, 0, 0, 0, 0, uint8(t), flags)
	return le.AppendUint16(dst, ch), start
}

// endFrame patches the length of the frame begun at start.
func endFrame(dst []byte, start int) []byte {
	le.PutUint32(dst[start:], uint32(len(dst)-start-HeaderSize))
	return dst
}
