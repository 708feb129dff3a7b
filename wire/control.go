package wire

import "strconv"

// Body is the materialized payload of one frame type. Control frames
// (handshake, topology, replies) are used only in this form; the batch
// frames also have zero-allocation views (PublishBatch, DeliverBatch,
// SettleBatch, ConfirmBatch, ReturnBatch) for the hot path.
type Body interface {
	FrameType() Type
	appendPayload(dst []byte) []byte
	decodePayload(r *reader)
}

// AppendFrame appends the frame for b on channel ch.
func AppendFrame(dst []byte, ch uint16, b Body) []byte {
	if fb, ok := b.(interface {
		appendFrame(dst []byte, ch uint16) []byte
	}); ok {
		return fb.appendFrame(dst, ch)
	}
	dst, start := beginFrame(dst, b.FrameType(), 0, ch)
	dst = b.appendPayload(dst)
	return endFrame(dst, start)
}

// Hello is the broker's first frame: who it is, how a client may
// authenticate, which optional capabilities it has, and its limits.
type Hello struct {
	Product      string   `json:"product"`
	Version      string   `json:"version"`
	Mechanisms   []string `json:"mechanisms"`
	Capabilities []string `json:"capabilities"`
	MaxFrame     uint32   `json:"max_frame"`
	MaxChannels  uint16   `json:"max_channels"`
	HeartbeatMs  uint32   `json:"heartbeat_ms"`
}

func (*Hello) FrameType() Type { return TypeHello }
func (h *Hello) appendPayload(dst []byte) []byte {
	dst = appendStr8(dst, h.Product)
	dst = appendStr8(dst, h.Version)
	dst = appendStrList(dst, h.Mechanisms)
	dst = appendStrList(dst, h.Capabilities)
	dst = appendU32(dst, h.MaxFrame)
	dst = appendU16(dst, h.MaxChannels)
	return appendU32(dst, h.HeartbeatMs)
}
func (h *Hello) decodePayload(r *reader) {
	h.Product = string(r.str8())
	h.Version = string(r.str8())
	h.Mechanisms = r.strList()
	h.Capabilities = r.strList()
	h.MaxFrame = r.u32()
	h.MaxChannels = r.u16()
	h.HeartbeatMs = r.u32()
}

// Auth is the client's answer to Hello: a mechanism and its first response,
// who the client is, and the limits it wants (0 = accept the broker's).
type Auth struct {
	Mechanism    string   `json:"mechanism"`
	Response     []byte   `json:"response"`
	Product      string   `json:"product"`
	Version      string   `json:"version"`
	Capabilities []string `json:"capabilities"`
	MaxFrame     uint32   `json:"max_frame"`
	MaxChannels  uint16   `json:"max_channels"`
	HeartbeatMs  uint32   `json:"heartbeat_ms"`
	// Vhost is the virtual host to open (spec §5.2.1), a str8 after the
	// other fields, present only when the broker's HELLO lists the
	// capability CapVhosts: empty (or absent) means "/". A v1 client that
	// ignores the capability sends none.
	Vhost string `json:"vhost,omitempty"`
}

// CapVhosts is the HELLO capability of a broker with virtual hosts: it
// reads AUTH's vhost field.
const CapVhosts = "vhosts"

func (*Auth) FrameType() Type { return TypeAuth }
func (a *Auth) appendPayload(dst []byte) []byte {
	dst = appendStr8(dst, a.Mechanism)
	dst = appendBytes32(dst, a.Response)
	dst = appendStr8(dst, a.Product)
	dst = appendStr8(dst, a.Version)
	dst = appendStrList(dst, a.Capabilities)
	dst = appendU32(dst, a.MaxFrame)
	dst = appendU16(dst, a.MaxChannels)
	dst = appendU32(dst, a.HeartbeatMs)
	if a.Vhost != "" {
		dst = appendStr8(dst, a.Vhost)
	}
	return dst
}
func (a *Auth) decodePayload(r *reader) {
	a.Mechanism = string(r.str8())
	a.Response = cloneBytes(r.bytes32())
	a.Product = string(r.str8())
	a.Version = string(r.str8())
	a.Capabilities = r.strList()
	a.MaxFrame = r.u32()
	a.MaxChannels = r.u16()
	a.HeartbeatMs = r.u32()
	if !r.end() {
		if v := r.str8(); len(v) > 0 {
			a.Vhost = string(v)
		} else {
			r.fail(errVhostEmpty) // one encoding per AUTH: "/" is no field
		}
	}
}

// PlainResponse builds the PLAIN mechanism's response: NUL user NUL password
// (RFC 4616, with an empty authorization identity).
func PlainResponse(user, password string) []byte {
	b := make([]byte, 0, 2+len(user)+len(password))
	b = append(b, 0)
	b = append(b, user...)
	b = append(b, 0)
	return append(b, password...)
}

// ParsePlain splits a PLAIN response into user and password.
func ParsePlain(resp []byte) (user, password string, ok bool) {
	if len(resp) < 2 {
		return "", "", false
	}
	// authzid NUL authcid NUL passwd; authzid must be empty or equal authcid.
	i := indexByte(resp, 0)
	if i < 0 {
		return "", "", false
	}
	rest := resp[i+1:]
	j := indexByte(rest, 0)
	if j < 0 {
		return "", "", false
	}
	authz, authc, pass := resp[:i], rest[:j], rest[j+1:]
	if len(authz) != 0 && string(authz) != string(authc) {
		return "", "", false
	}
	if indexByte(pass, 0) >= 0 {
		return "", "", false
	}
	return string(authc), string(pass), true
}

func indexByte(b []byte, c byte) int {
	for i, x := range b {
		if x == c {
			return i
		}
	}
	return -1
}

// AuthChallenge carries a challenge of a multi-step mechanism.
type AuthChallenge struct {
	Challenge []byte `json:"challenge"`
}

func (*AuthChallenge) FrameType() Type                   { return TypeAuthChallenge }
func (a *AuthChallenge) appendPayload(dst []byte) []byte { return appendBytes32(dst, a.Challenge) }
func (a *AuthChallenge) decodePayload(r *reader)         { a.Challenge = cloneBytes(r.bytes32()) }

// AuthResponse answers an AuthChallenge.
type AuthResponse struct {
	Response []byte `json:"response"`
}

func (*AuthResponse) FrameType() Type                   { return TypeAuthResponse }
func (a *AuthResponse) appendPayload(dst []byte) []byte { return appendBytes32(dst, a.Response) }
func (a *AuthResponse) decodePayload(r *reader)         { a.Response = cloneBytes(r.bytes32()) }

// OpenOK ends the handshake: the client is authenticated and these are the
// negotiated limits.
type OpenOK struct {
	ConnectionID uint64 `json:"connection_id"`
	MaxFrame     uint32 `json:"max_frame"`
	MaxChannels  uint16 `json:"max_channels"`
	HeartbeatMs  uint32 `json:"heartbeat_ms"`
}

func (*OpenOK) FrameType() Type { return TypeOpenOK }
func (o *OpenOK) appendPayload(dst []byte) []byte {
	dst = appendU64(dst, o.ConnectionID)
	dst = appendU32(dst, o.MaxFrame)
	dst = appendU16(dst, o.MaxChannels)
	return appendU32(dst, o.HeartbeatMs)
}
func (o *OpenOK) decodePayload(r *reader) {
	o.ConnectionID = r.u64()
	o.MaxFrame = r.u32()
	o.MaxChannels = r.u16()
	o.HeartbeatMs = r.u32()
}

// Negotiate picks the value both sides accept: the smaller of two non-zero
// proposals, or the other side's when one proposes 0.
func Negotiate[T uint16 | uint32](server, client T) T {
	switch {
	case client == 0:
		return server
	case server == 0:
		return client
	case client < server:
		return client
	}
	return server
}

// Heartbeat has no payload; either side sends one when it has sent nothing
// else for a heartbeat interval.
type Heartbeat struct{}

func (*Heartbeat) FrameType() Type                 { return TypeHeartbeat }
func (*Heartbeat) appendPayload(dst []byte) []byte { return dst }
func (*Heartbeat) decodePayload(*reader)           {}

// Close ends a connection with a code and a reason.
type Close struct {
	Code   Code   `json:"code"`
	Reason string `json:"reason"`
}

func (*Close) FrameType() Type { return TypeClose }
func (c *Close) appendPayload(dst []byte) []byte {
	return appendStr16(appendU16(dst, uint16(c.Code)), c.Reason)
}
func (c *Close) decodePayload(r *reader) { c.Code, c.Reason = Code(r.u16()), string(r.str16()) }

// CloseOK acknowledges a Close; after it the socket is closed.
type CloseOK struct{}

func (*CloseOK) FrameType() Type                 { return TypeCloseOK }
func (*CloseOK) appendPayload(dst []byte) []byte { return dst }
func (*CloseOK) decodePayload(*reader)           {}

// ChannelOpen opens the channel it is sent on; the broker replies OK.
type ChannelOpen struct {
	Req uint32 `json:"req"`
}

func (*ChannelOpen) FrameType() Type                   { return TypeChannelOpen }
func (c *ChannelOpen) appendPayload(dst []byte) []byte { return appendU32(dst, c.Req) }
func (c *ChannelOpen) decodePayload(r *reader)         { c.Req = r.u32() }

// ChannelClose closes the channel it is sent on, by either side.
type ChannelClose struct {
	Code   Code   `json:"code"`
	Reason string `json:"reason"`
}

func (*ChannelClose) FrameType() Type { return TypeChannelClose }
func (c *ChannelClose) appendPayload(dst []byte) []byte {
	return appendStr16(appendU16(dst, uint16(c.Code)), c.Reason)
}
func (c *ChannelClose) decodePayload(r *reader) { c.Code, c.Reason = Code(r.u16()), string(r.str16()) }

// ChannelCloseOK acknowledges a ChannelClose; the channel id is free again.
type ChannelCloseOK struct{}

func (*ChannelCloseOK) FrameType() Type                 { return TypeChannelCloseOK }
func (*ChannelCloseOK) appendPayload(dst []byte) []byte { return dst }
func (*ChannelCloseOK) decodePayload(*reader)           {}

// OKReply answers a request: Count is the number of messages the request
// affected (deleted or purged), 0 where that has no meaning.
type OKReply struct {
	Req   uint32 `json:"req"`
	Count uint64 `json:"count"`
}

func (*OKReply) FrameType() Type                   { return TypeOK }
func (o *OKReply) appendPayload(dst []byte) []byte { return appendU64(appendU32(dst, o.Req), o.Count) }
func (o *OKReply) decodePayload(r *reader)         { o.Req, o.Count = r.u32(), r.u64() }

// ErrorReply refuses a request; the channel stays open.
type ErrorReply struct {
	Req     uint32 `json:"req"`
	Code    Code   `json:"code"`
	Message string `json:"message"`
}

func (*ErrorReply) FrameType() Type { return TypeError }
func (e *ErrorReply) appendPayload(dst []byte) []byte {
	return appendStr16(appendU16(appendU32(dst, e.Req), uint16(e.Code)), e.Message)
}
func (e *ErrorReply) decodePayload(r *reader) {
	e.Req, e.Code, e.Message = r.u32(), Code(r.u16()), string(r.str16())
}

// Flow pauses (Active false) or resumes publishing on its channel, or on the
// whole connection when sent on channel 0.
type Flow struct {
	Active bool `json:"active"`
}

func (*Flow) FrameType() Type                   { return TypeFlow }
func (f *Flow) appendPayload(dst []byte) []byte { return appendBool(dst, f.Active) }
func (f *Flow) decodePayload(r *reader)         { f.Active = r.bool() }

// Subscribe starts a consumer on a queue.
type Subscribe struct {
	Req           uint32 `json:"req"`
	Queue         string `json:"queue"`
	ConsumerTag   string `json:"consumer_tag"` // empty: the broker picks one
	AutoAck       bool   `json:"auto_ack"`     // at-most-once: settled when sent
	Exclusive     bool   `json:"exclusive"`
	Priority      int16  `json:"priority"`
	PrefetchCount uint32 `json:"prefetch_count"` // 0: unlimited
	PrefetchBytes uint32 `json:"prefetch_bytes"` // 0: unlimited
	Args          Table  `json:"args"`
}

const (
	subAutoAck   = 1 << 0
	subExclusive = 1 << 1
	subMask      = subAutoAck | subExclusive
)

func (*Subscribe) FrameType() Type { return TypeSubscribe }
func (s *Subscribe) appendPayload(dst []byte) []byte {
	dst = appendU32(dst, s.Req)
	dst = appendStr8(dst, s.Queue)
	dst = appendStr8(dst, s.ConsumerTag)
	dst = append(dst, flagBits(s.AutoAck, s.Exclusive))
	dst = appendU16(dst, uint16(s.Priority))
	dst = appendU32(dst, s.PrefetchCount)
	dst = appendU32(dst, s.PrefetchBytes)
	return AppendTable(dst, s.Args)
}
func (s *Subscribe) decodePayload(r *reader) {
	s.Req = r.u32()
	s.Queue = string(r.str8())
	s.ConsumerTag = string(r.str8())
	fl := r.flags(subMask)
	s.AutoAck, s.Exclusive = fl&subAutoAck != 0, fl&subExclusive != 0
	s.Priority = int16(r.u16())
	s.PrefetchCount = r.u32()
	s.PrefetchBytes = r.u32()
	s.Args = r.materializedTable()
}

// SubscribeOK confirms a Subscribe and names the consumer.
type SubscribeOK struct {
	Req         uint32 `json:"req"`
	ConsumerTag string `json:"consumer_tag"`
}

func (*SubscribeOK) FrameType() Type { return TypeSubscribeOK }
func (s *SubscribeOK) appendPayload(dst []byte) []byte {
	return appendStr8(appendU32(dst, s.Req), s.ConsumerTag)
}
func (s *SubscribeOK) decodePayload(r *reader) { s.Req, s.ConsumerTag = r.u32(), string(r.str8()) }

// Cancel stops a consumer; the broker replies OK. Unacked deliveries stay
// outstanding until settled or the channel closes.
type Cancel struct {
	Req         uint32 `json:"req"`
	ConsumerTag string `json:"consumer_tag"`
}

func (*Cancel) FrameType() Type { return TypeCancel }
func (c *Cancel) appendPayload(dst []byte) []byte {
	return appendStr8(appendU32(dst, c.Req), c.ConsumerTag)
}
func (c *Cancel) decodePayload(r *reader) { c.Req, c.ConsumerTag = r.u32(), string(r.str8()) }

// Cancelled tells a client the broker stopped one of its consumers (its
// queue was deleted, say).
type Cancelled struct {
	ConsumerTag string `json:"consumer_tag"`
	Code        Code   `json:"code"`
	Reason      string `json:"reason"`
}

func (*Cancelled) FrameType() Type { return TypeCancelled }
func (c *Cancelled) appendPayload(dst []byte) []byte {
	return appendStr16(appendU16(appendStr8(dst, c.ConsumerTag), uint16(c.Code)), c.Reason)
}
func (c *Cancelled) decodePayload(r *reader) {
	c.ConsumerTag, c.Code, c.Reason = string(r.str8()), Code(r.u16()), string(r.str16())
}

// LeaseExpired tells a consumer that deliveries it held past the queue's
// ack timeout were taken back; their tags are no longer valid.
type LeaseExpired struct {
	ConsumerTag string   `json:"consumer_tag"`
	Tags        []uint64 `json:"tags"`
}

func (*LeaseExpired) FrameType() Type { return TypeLeaseExpired }
func (l *LeaseExpired) appendPayload(dst []byte) []byte {
	if len(l.Tags) > 65535 {
		panic("wire: BUG: more than 65535 tags in LEASE_EXPIRED")
	}
	dst = appendU16(appendStr8(dst, l.ConsumerTag), uint16(len(l.Tags)))
	for _, t := range l.Tags {
		dst = appendU64(dst, t)
	}
	return dst
}
func (l *LeaseExpired) decodePayload(r *reader) {
	l.ConsumerTag = string(r.str8())
	n := int(r.u16())
	if n == 0 {
		r.fail(errEmptyBatch)
		return
	}
	if len(r.b)-r.off != 8*n {
		r.fail(errCount)
		return
	}
	l.Tags = make([]uint64, n)
	for i := range l.Tags {
		l.Tags[i] = r.u64()
	}
}

func flagBits(bits ...bool) uint8 {
	var v uint8
	for i, b := range bits {
		if b {
			v |= 1 << i
		}
	}
	return v
}

var errPayloadFlags = &Error{FrameError, "undefined flag bits set in a payload flags field"}

// flags reads a u8 flags field and fails if bits outside mask are set.
func (r *reader) flags(mask uint8) uint8 {
	v := r.u8()
	if v&^mask != 0 {
		r.fail(errPayloadFlags)
	}
	return v
}

func (r *reader) materializedTable() Table {
	raw := r.table()
	if r.err != nil || len(raw) == 0 {
		return nil
	}
	return materialize(raw)
}

func cloneBytes(b []byte) []byte {
	if b == nil {
		return nil
	}
	return append([]byte{}, b...)
}

func itoa(v int) string { return strconv.Itoa(v) }
