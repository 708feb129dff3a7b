package wire

import (
	"encoding/json"
	"fmt"
)

// This file holds the materialized (allocating) forms of the batch frames
// and the generic Decode. Clients and tests use them; the broker's hot path
// uses the views in batch.go and settle.go.

// Props is the materialized form of a property block. An empty string is
// written as absent.
type Props struct {
	ContentType     string  `json:"content_type,omitempty"`
	ContentEncoding string  `json:"content_encoding,omitempty"`
	MessageID       string  `json:"message_id,omitempty"`
	CorrelationID   string  `json:"correlation_id,omitempty"`
	ReplyTo         string  `json:"reply_to,omitempty"`
	ExpirationMs    *uint32 `json:"expiration_ms,omitempty"`
	TimestampMs     *int64  `json:"timestamp_ms,omitempty"`
	Type            string  `json:"type,omitempty"`
	UserID          string  `json:"user_id,omitempty"`
	AppID           string  `json:"app_id,omitempty"`
	Headers         Table   `json:"headers,omitempty"`
	Deaths          []Death `json:"deaths,omitempty"`
	Unknown         []byte  `json:"unknown,omitempty"` // raw entries with ids above 12
}

// CheckProps says whether AppendProps can encode p (nil is an empty
// block): each string at most 65,535 bytes, the headers a table
// CheckTable accepts, at most 255 death records whose queue, exchange and
// routing keys (at most 255) are each at most 255 bytes, and the whole
// block at most MaxPropertiesLen bytes. AppendProps panics on anything
// else; a Props decoded from a peer's JSON (the admin API's publish) may
// be anything. The error is an InvalidArgument *Error.
func CheckProps(p *Props) error {
	if p == nil {
		return nil
	}
	bad := func(what string) error { return &Error{InvalidArgument, "message properties: " + what} }
	n := len(p.Unknown)
	for _, s := range [...]string{p.ContentType, p.ContentEncoding, p.MessageID, p.CorrelationID, p.ReplyTo, p.Type, p.UserID, p.AppID} {
		if len(s) > MaxPropertiesLen {
			return bad(fmt.Sprintf("a string of %d bytes (at most %d)", len(s), MaxPropertiesLen))
		}
		if s != "" {
			n += 3 + len(s)
		}
	}
	if p.ExpirationMs != nil {
		n += 3 + 4
	}
	if p.TimestampMs != nil {
		n += 3 + 8
	}
	if len(p.Headers) > 0 {
		if err := CheckTable(p.Headers); err != nil {
			return bad("headers: " + err.(*Error).Reason)
		}
		n += 3 + len(AppendTable(nil, p.Headers)) - 4
	}
	if len(p.Deaths) > 255 {
		return bad(fmt.Sprintf("%d death records (at most 255)", len(p.Deaths)))
	}
	for i := range p.Deaths {
		d := &p.Deaths[i]
		if len(d.Queue) > MaxNameLen || len(d.Exchange) > MaxNameLen || len(d.RoutingKeys) > 255 {
			return bad("a death record's queue or exchange over 255 bytes, or over 255 routing keys")
		}
		for _, k := range d.RoutingKeys {
			if len(k) > MaxNameLen {
				return bad(fmt.Sprintf("a death record's routing key of %d bytes (at most %d)", len(k), MaxNameLen))
			}
		}
	}
	if len(p.Deaths) > 0 {
		n += 3 + len(AppendDeaths(nil, p.Deaths))
	}
	if n > MaxPropertiesLen {
		return bad(fmt.Sprintf("%d bytes encoded (at most %d)", n, MaxPropertiesLen))
	}
	return nil
}

// AppendProps appends the u16-length-prefixed property block for p (nil:
// an empty block).
func AppendProps(dst []byte, p *Props) []byte {
	if p == nil {
		return AppendProperties(dst, nil)
	}
	var v Properties
	set := func(id PropID, s string) {
		if s != "" {
			*v.bytesField(id) = []byte(s)
			v.Set(id)
		}
	}
	set(PropContentType, p.ContentType)
	set(PropContentEncoding, p.ContentEncoding)
	set(PropMessageID, p.MessageID)
	set(PropCorrelationID, p.CorrelationID)
	set(PropReplyTo, p.ReplyTo)
	set(PropType, p.Type)
	set(PropUserID, p.UserID)
	set(PropAppID, p.AppID)
	if p.ExpirationMs != nil {
		v.ExpirationMs = *p.ExpirationMs
		v.Set(PropExpiration)
	}
	if p.TimestampMs != nil {
		v.TimestampMs = *p.TimestampMs
		v.Set(PropTimestamp)
	}
	if len(p.Headers) > 0 {
		v.Headers = AppendTable(nil, p.Headers)[4:]
		v.Set(PropHeaders)
	}
	if len(p.Deaths) > 0 {
		v.Deaths = AppendDeaths(nil, p.Deaths)
		v.Set(PropDeaths)
	}
	v.Unknown = p.Unknown
	return AppendProperties(dst, &v)
}

// DecodeProps materializes a property block (without its length prefix)
// into owned values (copies: they outlive block); an empty block gives nil.
func DecodeProps(block []byte) (*Props, error) {
	if len(block) == 0 {
		return nil, nil
	}
	var v Properties
	if err := ParseProperties(block, &v); err != nil {
		return nil, err
	}
	p := &Props{
		ContentType: string(v.ContentType), ContentEncoding: string(v.ContentEncoding),
		MessageID: string(v.MessageID), CorrelationID: string(v.CorrelationID),
		ReplyTo: string(v.ReplyTo), Type: string(v.Type), UserID: string(v.UserID),
		AppID: string(v.AppID), Unknown: cloneBytes(v.Unknown),
	}
	if v.Has(PropExpiration) {
		e := v.ExpirationMs
		p.ExpirationMs = &e
	}
	if v.Has(PropTimestamp) {
		t := v.TimestampMs
		p.TimestampMs = &t
	}
	if v.Has(PropHeaders) {
		p.Headers = materialize(v.Headers)
	}
	if v.Has(PropDeaths) {
		ds, err := DecodeDeaths(v.Deaths)
		if err != nil {
			return nil, err
		}
		p.Deaths = ds
	}
	return p, nil
}

// PublishMessage is one materialized published message.
type PublishMessage struct {
	Mandatory  bool   `json:"mandatory"`
	Persistent bool   `json:"persistent"`
	Priority   uint8  `json:"priority"`
	RoutingKey string `json:"routing_key"`
	Props      *Props `json:"properties,omitempty"`
	Body       []byte `json:"body"`
}

func (m *PublishMessage) appendTo(dst []byte) []byte {
	var fl MessageFlags
	if m.Mandatory {
		fl |= Mandatory
	}
	if m.Persistent {
		fl |= Persistent
	}
	dst = append(dst, uint8(fl), m.Priority)
	dst = appendStr8(dst, m.RoutingKey)
	dst = AppendProps(dst, m.Props)
	return appendBytes32(dst, m.Body)
}

func materializeMessage(m *Message) (PublishMessage, error) {
	p, err := DecodeProps(m.Properties)
	return PublishMessage{
		Mandatory: m.Flags&Mandatory != 0, Persistent: m.Flags&Persistent != 0,
		Priority: m.Priority, RoutingKey: string(m.RoutingKey), Props: p, Body: cloneBytes(m.Body),
	}, err
}

// Publish is a materialized PUBLISH frame.
type Publish struct {
	FirstSeq uint64           `json:"first_seq"`
	Exchange string           `json:"exchange"`
	Codec    Codec            `json:"codec"`
	Messages []PublishMessage `json:"messages"`
}

func (*Publish) FrameType() Type             { return TypePublish }
func (*Publish) appendPayload([]byte) []byte { panic("wire: BUG: Publish is framed by appendFrame") }
func (*Publish) decodePayload(*reader)       { panic("wire: BUG: Publish is decoded by DecodePublish") }
func (p *Publish) appendFrame(dst []byte, ch uint16) []byte {
	dst, mark := BeginPublish(dst, ch, p.FirstSeq, []byte(p.Exchange))
	for i := range p.Messages {
		dst = p.Messages[i].appendTo(dst)
	}
	dst, _ = mark.EndCompressed(dst, uint32(len(p.Messages)), p.Codec, nil)
	return dst
}

// DeliveredMessage is one materialized delivery.
type DeliveredMessage struct {
	Tag           uint64 `json:"tag"`
	Redelivered   bool   `json:"redelivered"`
	Persistent    bool   `json:"persistent"`
	Priority      uint8  `json:"priority"`
	DeliveryCount uint32 `json:"delivery_count"`
	FailedCount   uint32 `json:"failed_count"`
	Exchange      string `json:"exchange"`
	RoutingKey    string `json:"routing_key"`
	Props         *Props `json:"properties,omitempty"`
	Body          []byte `json:"body"`
}

// Deliver is a materialized DELIVER frame.
type Deliver struct {
	ConsumerTag string             `json:"consumer_tag"`
	Codec       Codec              `json:"codec"`
	Deliveries  []DeliveredMessage `json:"deliveries"`
}

func (*Deliver) FrameType() Type             { return TypeDeliver }
func (*Deliver) appendPayload([]byte) []byte { panic("wire: BUG: Deliver is framed by appendFrame") }
func (*Deliver) decodePayload(*reader)       { panic("wire: BUG: Deliver is decoded by DecodeDeliver") }
func (d *Deliver) appendFrame(dst []byte, ch uint16) []byte {
	dst, mark := BeginDeliver(dst, ch, []byte(d.ConsumerTag))
	for i := range d.Deliveries {
		m := &d.Deliveries[i]
		var fl DeliveryFlags
		if m.Redelivered {
			fl |= Redelivered
		}
		if m.Persistent {
			fl |= DeliveredPersistent
		}
		props := AppendProps(nil, m.Props)[2:]
		dst = AppendDelivery(dst, &Delivery{
			Tag: m.Tag, Flags: fl, Priority: m.Priority, DeliveryCount: m.DeliveryCount,
			FailedCount: m.FailedCount, Exchange: []byte(m.Exchange), RoutingKey: []byte(m.RoutingKey),
			Properties: props, Body: m.Body,
		})
	}
	dst, _ = mark.EndCompressed(dst, uint32(len(d.Deliveries)), d.Codec, nil)
	return dst
}

// ReturnedMessage is one materialized RETURN entry.
type ReturnedMessage struct {
	Seq      uint64         `json:"seq"`
	Code     Code           `json:"code"`
	Exchange string         `json:"exchange"`
	Message  PublishMessage `json:"message"`
}

// Return is a materialized RETURN frame.
type Return struct {
	Returns []ReturnedMessage `json:"returns"`
}

func (*Return) FrameType() Type             { return TypeReturn }
func (*Return) appendPayload([]byte) []byte { panic("wire: BUG: Return is framed by appendFrame") }
func (*Return) decodePayload(*reader)       { panic("wire: BUG: Return is decoded by DecodeReturn") }
func (rt *Return) appendFrame(dst []byte, ch uint16) []byte {
	dst, mark := BeginReturn(dst, ch)
	for i := range rt.Returns {
		r := &rt.Returns[i]
		dst = appendU64(dst, r.Seq)
		dst = appendU16(dst, uint16(r.Code))
		dst = appendStr8(dst, r.Exchange)
		dst = r.Message.appendTo(dst)
	}
	return mark.End(dst, uint32(len(rt.Returns)))
}

// Confirm is a materialized CONFIRM frame.
type Confirm struct {
	Ranges []ConfirmRange `json:"ranges"`
}

func (*Confirm) FrameType() Type             { return TypeConfirm }
func (*Confirm) appendPayload([]byte) []byte { panic("wire: BUG: Confirm is framed by appendFrame") }
func (*Confirm) decodePayload(*reader)       { panic("wire: BUG: Confirm is decoded by DecodeConfirm") }
func (c *Confirm) appendFrame(dst []byte, ch uint16) []byte {
	return AppendConfirm(dst, ch, c.Ranges)
}

// Settle is a materialized SETTLE frame.
type Settle struct {
	Entries []Settlement `json:"entries"`
}

func (*Settle) FrameType() Type             { return TypeSettle }
func (*Settle) appendPayload([]byte) []byte { panic("wire: BUG: Settle is framed by appendFrame") }
func (*Settle) decodePayload(*reader)       { panic("wire: BUG: Settle is decoded by DecodeSettle") }
func (s *Settle) appendFrame(dst []byte, ch uint16) []byte {
	return AppendSettle(dst, ch, s.Entries)
}

// Decode materializes any frame of a known type into owned values: nothing
// in the result aliases f.Payload or d's buffer. It validates exactly as the
// view decoders do, and allocates; use it off the hot path.
func Decode(f Frame, maxFrame uint32, d *Decompressor) (Body, error) {
	switch f.Type {
	case TypePublish:
		var b PublishBatch
		if err := DecodePublish(f, maxFrame, d, &b); err != nil {
			return nil, err
		}
		out := &Publish{FirstSeq: b.FirstSeq, Exchange: string(b.Exchange), Codec: b.Codec}
		it := b.Messages()
		var m Message
		for it.Next(&m) {
			pm, err := materializeMessage(&m)
			if err != nil {
				return nil, err
			}
			out.Messages = append(out.Messages, pm)
		}
		return out, nil
	case TypeDeliver:
		var b DeliverBatch
		if err := DecodeDeliver(f, maxFrame, d, &b); err != nil {
			return nil, err
		}
		out := &Deliver{ConsumerTag: string(b.ConsumerTag), Codec: b.Codec}
		it := b.Deliveries()
		var dv Delivery
		for it.Next(&dv) {
			p, err := DecodeProps(dv.Properties)
			if err != nil {
				return nil, err
			}
			out.Deliveries = append(out.Deliveries, DeliveredMessage{
				Tag: dv.Tag, Redelivered: dv.Flags&Redelivered != 0, Persistent: dv.Flags&DeliveredPersistent != 0,
				Priority: dv.Priority, DeliveryCount: dv.DeliveryCount, FailedCount: dv.FailedCount,
				Exchange: string(dv.Exchange), RoutingKey: string(dv.RoutingKey), Props: p, Body: cloneBytes(dv.Body),
			})
		}
		return out, nil
	case TypeReturn:
		var b ReturnBatch
		if err := DecodeReturn(f, &b); err != nil {
			return nil, err
		}
		out := &Return{}
		it := b.Returns()
		var rm Returned
		for it.Next(&rm) {
			pm, err := materializeMessage(&rm.Message)
			if err != nil {
				return nil, err
			}
			out.Returns = append(out.Returns, ReturnedMessage{Seq: rm.Seq, Code: rm.Code, Exchange: string(rm.Exchange), Message: pm})
		}
		return out, nil
	case TypeConfirm:
		var b ConfirmBatch
		if err := DecodeConfirm(f, &b); err != nil {
			return nil, err
		}
		out := &Confirm{Ranges: make([]ConfirmRange, b.Count)}
		for i := range out.Ranges {
			b.At(i, &out.Ranges[i])
		}
		return out, nil
	case TypeSettle:
		var b SettleBatch
		if err := DecodeSettle(f, &b); err != nil {
			return nil, err
		}
		out := &Settle{Entries: make([]Settlement, b.Count)}
		for i := range out.Entries {
			b.At(i, &out.Entries[i])
		}
		return out, nil
	}
	body := newBody(f.Type)
	if body == nil {
		return nil, errUnknownType
	}
	r := reader{b: f.Payload}
	body.decodePayload(&r)
	if err := r.done(); err != nil {
		return nil, err
	}
	return body, nil
}

func newBody(t Type) Body {
	switch t {
	case TypeHello:
		return &Hello{}
	case TypeAuth:
		return &Auth{}
	case TypeAuthChallenge:
		return &AuthChallenge{}
	case TypeAuthResponse:
		return &AuthResponse{}
	case TypeOpenOK:
		return &OpenOK{}
	case TypeHeartbeat:
		return &Heartbeat{}
	case TypeClose:
		return &Close{}
	case TypeCloseOK:
		return &CloseOK{}
	case TypeChannelOpen:
		return &ChannelOpen{}
	case TypeChannelClose:
		return &ChannelClose{}
	case TypeChannelCloseOK:
		return &ChannelCloseOK{}
	case TypeOK:
		return &OKReply{}
	case TypeError:
		return &ErrorReply{}
	case TypeExchangeDeclare:
		return &ExchangeDeclare{}
	case TypeExchangeDelete:
		return &ExchangeDelete{}
	case TypeQueueDeclare:
		return &QueueDeclare{}
	case TypeQueueDeclareOK:
		return &QueueDeclareOK{}
	case TypeQueueDelete:
		return &QueueDelete{}
	case TypeQueuePurge:
		return &QueuePurge{}
	case TypeBind:
		return &Bind{}
	case TypeUnbind:
		return &Bind{Unbind: true}
	case TypeFlow:
		return &Flow{}
	case TypeSubscribe:
		return &Subscribe{}
	case TypeSubscribeOK:
		return &SubscribeOK{}
	case TypeCancel:
		return &Cancel{}
	case TypeCancelled:
		return &Cancelled{}
	case TypeLeaseExpired:
		return &LeaseExpired{}
	}
	return nil
}

// MarshalJSON writes a field as {"key": ..., "value": ...}.
func (f Field) MarshalJSON() ([]byte, error) {
	return json.Marshal(struct {
		Key   string `json:"key"`
		Value Value  `json:"value"`
	}{f.Key, f.Value})
}

// MarshalJSON writes a value as a one-key object naming its kind, such as
// {"int": 5} or {"string": "x"}; bytes are base64.
func (v Value) MarshalJSON() ([]byte, error) {
	var x any
	switch v.Kind {
	case KindNull:
		x = nil
	case KindBool:
		x = v.Int != 0
	case KindInt, KindTimestamp:
		x = v.Int
	case KindFloat:
		x = v.Float
	case KindString:
		x = string(v.Bytes)
	case KindBytes:
		x = v.Bytes
	case KindTable:
		t := v.Table
		if t == nil {
			t = Table{}
		}
		x = t
	case KindArray:
		a := v.Array
		if a == nil {
			a = []Value{}
		}
		x = a
	default:
		return nil, fmt.Errorf("wire: cannot marshal value kind %v", v.Kind)
	}
	return json.Marshal(map[string]any{v.Kind.String(): x})
}

// MarshalJSON writes a nil table as [], so "no arguments" reads the same
// however it was built.
func (t Table) MarshalJSON() ([]byte, error) {
	if t == nil {
		return []byte("[]"), nil
	}
	return json.Marshal([]Field(t))
}
