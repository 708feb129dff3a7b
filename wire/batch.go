package wire

// MessageFlags are the per-message flag bits of a published message.
type MessageFlags uint8

const (
	// Mandatory asks the broker to RETURN the message if no queue takes it.
	Mandatory MessageFlags = 1 << 0
	// Persistent asks for the message to be written to disk before it is
	// confirmed (in a durable queue).
	Persistent MessageFlags = 1 << 1

	messageFlagsMask = Mandatory | Persistent
)

// Message is a view of one published (or returned) message. All slices alias
// the decoded buffer.
type Message struct {
	Flags      MessageFlags
	Priority   uint8
	RoutingKey []byte
	Properties []byte // the property block, without its u16 length
	Body       []byte
}

// AppendMessage appends one message: flags u8, priority u8, routing_key
// str8, properties (u16 length + block), body (u32 length + bytes).
func AppendMessage(dst []byte, m *Message) []byte {
	dst = append(dst, uint8(m.Flags), m.Priority)
	dst = appendStr8(dst, m.RoutingKey)
	dst = appendStr16(dst, m.Properties)
	return appendBytes32(dst, m.Body)
}

// message reads one message. It returns a value rather than filling a
// *Message: the caller's variable is then one the compiler knows is on
// the stack, so the stores of its three slices need no write barrier
// (three per message per pass, each a lookup of the frame's buffer while
// the collector marks: 5 % of the broker's CPU in the throughput profile).
func (r *reader) message() Message {
	var m Message
	m.Flags = MessageFlags(r.u8())
	m.Priority = r.u8()
	m.RoutingKey = r.str8()
	m.Properties = r.str16()
	m.Body = r.bytes32()
	return m
}

var errMessageFlags = &Error{FrameError, "undefined message flag bits set"}

func (r *reader) validMessage(scratch *Properties) (m Message) {
	m = r.message()
	if r.err != nil {
		return
	}
	if m.Flags&^messageFlagsMask != 0 {
		r.fail(errMessageFlags)
		return
	}
	if err := ParseProperties(m.Properties, scratch); err != nil {
		r.fail(err.(*Error))
	}
	return
}

// BatchMark remembers where a batch frame begun by one of the Begin
// functions sits in its buffer, so End can patch its count and length.
type BatchMark struct {
	start   int // frame start
	countAt int // offset of the u32 count
	section int // offset of the entries (where raw_len goes if compressed)
}

// End patches the entry count and the frame length; dst must be the buffer
// the batch was begun in, with count entries appended after Begin.
func (m BatchMark) End(dst []byte, count uint32) []byte {
	le.PutUint32(dst[m.countAt:], count)
	return endFrame(dst, m.start)
}

// EndCompressed is End with the entry section compressed by c, for batches
// worth compressing (the brief's rule of thumb: 1 KiB and up). scratch is a
// reusable buffer; the grown one is returned for the next call.
func (m BatchMark) EndCompressed(dst []byte, count uint32, c Codec, scratch []byte) (out, scratchOut []byte) {
	if c == CodecNone {
		return m.End(dst, count), scratch
	}
	scratch = append(scratch[:0], dst[m.section:]...)
	dst = dst[:m.section]
	dst = appendU32(dst, uint32(len(scratch)))
	dst = appendCompressed(dst, c, scratch)
	dst[m.start+5] |= uint8(c)
	return m.End(dst, count), scratch
}

// PUBLISH payload: first_seq u64, count u32, exchange str8,
// [raw_len u32 if compressed], count × message.

// BeginPublish starts a PUBLISH frame for messages with sequence numbers
// first, first+1, … on channel ch. Append messages with AppendMessage, then
// call End or EndCompressed.
func BeginPublish(dst []byte, ch uint16, firstSeq uint64, exchange []byte) ([]byte, BatchMark) {
	dst, start := beginFrame(dst, TypePublish, 0, ch)
	dst = appendU64(dst, firstSeq)
	countAt := len(dst)
	dst = appendU32(dst, 0)
	dst = appendStr8(dst, exchange)
	return dst, BatchMark{start: start, countAt: countAt, section: len(dst)}
}

// PublishBatch is a view of a decoded PUBLISH frame (it aliases the frame,
// or the Decompressor's buffer). Every message in it has been validated, so
// iterating it cannot fail.
type PublishBatch struct {
	FirstSeq uint64
	Count    uint32
	Exchange []byte
	Codec    Codec
	section  []byte
}

// DecodePublish decodes and validates a whole PUBLISH frame into the view b,
// which aliases f.Payload (or d's buffer, if compressed): a batch is
// accepted or refused as one, never half-applied. maxFrame bounds the
// decompressed section. It allocates nothing (a compressed batch reuses
// d's buffer, which must be large enough after warm-up).
func DecodePublish(f Frame, maxFrame uint32, d *Decompressor, b *PublishBatch) error {
	r := reader{b: f.Payload}
	b.FirstSeq = r.u64()
	b.Count = r.u32()
	b.Exchange = r.str8()
	b.Codec = Codec(f.Flags & flagCodecMask)
	section, err := r.section(b.Codec, maxFrame, d)
	if err != nil {
		return err
	}
	if b.FirstSeq == 0 {
		return &Error{FrameError, "publish first_seq must be at least 1"}
	}
	b.section = section
	return validateBatch(section, b.Count, entryMessage)
}

// section reads the rest of a batch payload, decompressing it if needed.
func (r *reader) section(c Codec, maxFrame uint32, d *Decompressor) ([]byte, error) {
	var rawLen uint32
	if c != CodecNone {
		rawLen = r.u32()
	}
	s := r.rest()
	if r.err != nil {
		return nil, r.err
	}
	if c == CodecNone {
		return s, nil
	}
	out, err := d.decompress(c, s, rawLen, maxFrame)
	if err != nil {
		return nil, err
	}
	return out, nil
}

type entryKind uint8

const (
	entryMessage entryKind = iota
	entryDelivery
	entryReturn
)

// validateBatch checks that section holds exactly count well-formed entries
// of kind. (A switch rather than a callback: a closure here would escape and
// cost an allocation per batch.)
func validateBatch(section []byte, count uint32, kind entryKind) error {
	if count == 0 {
		return errEmptyBatch
	}
	r := reader{b: section}
	var (
		n       uint32
		d       Delivery
		rm      Returned
		scratch Properties
	)
	for !r.end() {
		switch kind {
		case entryMessage:
			r.validMessage(&scratch)
		case entryDelivery:
			r.validDelivery(&d, &scratch)
		case entryReturn:
			rm.Seq = r.u64()
			rm.Code = Code(r.u16())
			rm.Exchange = r.str8()
			rm.Message = r.validMessage(&scratch)
		}
		n++
		if n > count {
			return errCount
		}
	}
	if r.err != nil {
		return r.err
	}
	if n != count {
		return errCount
	}
	return nil
}

// Own copies the batch's exchange name and messages out of the frame (or
// the Decompressor's buffer) into one new buffer and returns it: from then
// on b.Exchange and what Messages yields are views of that copy, which the
// caller may keep. It is one allocation and one copy for the whole batch,
// and the buffer is not zeroed first (a make of it would be).
func (b *PublishBatch) Own() []byte {
	n := len(b.section)
	if len(b.Exchange) == 0 {
		b.section = append([]byte(nil), b.section...)
		return b.section
	}
	// Appending to a full slice copies it into a new array, zeroing only
	// what is past the appended bytes.
	buf := append(b.section[:n:n], b.Exchange...)
	b.section, b.Exchange = buf[:n:n], buf[n:len(buf):len(buf)]
	return buf
}

// MessageIter iterates the messages of a validated batch.
type MessageIter struct{ r reader }

// Messages returns an iterator over the batch's messages.
func (b *PublishBatch) Messages() MessageIter { return MessageIter{r: reader{b: b.section}} }

// Next fills m with a view of the next message (aliasing the batch's
// buffer) and reports whether there was one.
//
// It is small enough to inline, so that m, the caller's variable, is known
// to be on its stack: filling it then needs no write barriers.
func (it *MessageIter) Next(m *Message) bool {
	if it.r.off >= len(it.r.b) {
		return false // (a validated batch never sets r.err)
	}
	*m = it.r.message()
	return true
}

// DeliveryFlags are the per-delivery flag bits.
type DeliveryFlags uint8

const (
	// Redelivered: the message was handed to a consumer before.
	Redelivered DeliveryFlags = 1 << 0
	// DeliveredPersistent: the message was published persistent.
	DeliveredPersistent DeliveryFlags = 1 << 1

	deliveryFlagsMask = Redelivered | DeliveredPersistent
)

// Delivery is a view of one delivered message.
type Delivery struct {
	Tag           uint64
	Flags         DeliveryFlags
	Priority      uint8
	DeliveryCount uint32 // times handed to a consumer, this one included
	FailedCount   uint32 // times returned, rejected with requeue, or timed out
	Exchange      []byte
	RoutingKey    []byte
	Properties    []byte
	Body          []byte
}

// DELIVER payload: consumer_tag str8, count u32, [raw_len u32 if
// compressed], count × delivery.

// BeginDeliver starts a DELIVER frame for one consumer. Append deliveries
// with AppendDelivery, then End or EndCompressed.
func BeginDeliver(dst []byte, ch uint16, consumerTag []byte) ([]byte, BatchMark) {
	dst, start := beginFrame(dst, TypeDeliver, 0, ch)
	dst = appendStr8(dst, consumerTag)
	countAt := len(dst)
	dst = appendU32(dst, 0)
	return dst, BatchMark{start: start, countAt: countAt, section: len(dst)}
}

// AppendDelivery appends one delivery: tag u64, flags u8, priority u8,
// delivery_count u32, failed_count u32, exchange str8, routing_key str8,
// properties (u16 length + block), body (u32 length + bytes).
func AppendDelivery(dst []byte, d *Delivery) []byte {
	dst = appendU64(dst, d.Tag)
	dst = append(dst, uint8(d.Flags), d.Priority)
	dst = appendU32(dst, d.DeliveryCount)
	dst = appendU32(dst, d.FailedCount)
	dst = appendStr8(dst, d.Exchange)
	dst = appendStr8(dst, d.RoutingKey)
	dst = appendStr16(dst, d.Properties)
	return appendBytes32(dst, d.Body)
}

// DeliverySize is the bytes AppendDelivery appends for d.
func DeliverySize(d *Delivery) int {
	return 8 + 2 + 4 + 4 + 1 + len(d.Exchange) + 1 + len(d.RoutingKey) + 2 + len(d.Properties) + 4 + len(d.Body)
}

func (r *reader) delivery(d *Delivery) {
	d.Tag = r.u64()
	d.Flags = DeliveryFlags(r.u8())
	d.Priority = r.u8()
	d.DeliveryCount = r.u32()
	d.FailedCount = r.u32()
	d.Exchange = r.str8()
	d.RoutingKey = r.str8()
	d.Properties = r.str16()
	d.Body = r.bytes32()
}

// DeliverBatch is a view of a decoded, validated DELIVER frame (it aliases
// the frame, or the Decompressor's buffer).
type DeliverBatch struct {
	ConsumerTag []byte
	Count       uint32
	Codec       Codec
	section     []byte
}

var (
	errDeliveryFlags = &Error{FrameError, "undefined delivery flag bits set"}
	errDeliveryTag   = &Error{FrameError, "delivery tag 0"}
)

// DecodeDeliver decodes and validates a whole DELIVER frame into the view b,
// which aliases f.Payload (or dc's buffer, if compressed). It allocates
// nothing.
func DecodeDeliver(f Frame, maxFrame uint32, dc *Decompressor, b *DeliverBatch) error {
	r := reader{b: f.Payload}
	b.ConsumerTag = r.str8()
	b.Count = r.u32()
	b.Codec = Codec(f.Flags & flagCodecMask)
	section, err := r.section(b.Codec, maxFrame, dc)
	if err != nil {
		return err
	}
	b.section = section
	return validateBatch(section, b.Count, entryDelivery)
}

func (r *reader) validDelivery(d *Delivery, scratch *Properties) {
	r.delivery(d)
	switch {
	case r.err != nil:
	case d.Flags&^deliveryFlagsMask != 0:
		r.fail(errDeliveryFlags)
	case d.Tag == 0:
		r.fail(errDeliveryTag)
	default:
		if err := ParseProperties(d.Properties, scratch); err != nil {
			r.fail(err.(*Error))
		}
	}
}

// DeliveryIter iterates the deliveries of a validated batch.
type DeliveryIter struct{ r reader }

// Deliveries returns an iterator over the batch.
func (b *DeliverBatch) Deliveries() DeliveryIter { return DeliveryIter{r: reader{b: b.section}} }

// Next fills d with a view of the next delivery (aliasing the batch's
// buffer) and reports whether there was one.
func (it *DeliveryIter) Next(d *Delivery) bool {
	if it.r.end() {
		return false
	}
	it.r.delivery(d)
	return true
}

// Returned is a view of one RETURN entry: the publish sequence number of the
// returned message, why it came back, the exchange it was published to, and
// the message itself.
type Returned struct {
	Seq      uint64
	Code     Code
	Exchange []byte
	Message  Message
}

// RETURN payload: count u32, count × (seq u64, code u16, exchange str8,
// message).

// BeginReturn starts a RETURN frame.
func BeginReturn(dst []byte, ch uint16) ([]byte, BatchMark) {
	dst, start := beginFrame(dst, TypeReturn, 0, ch)
	countAt := len(dst)
	dst = appendU32(dst, 0)
	return dst, BatchMark{start: start, countAt: countAt, section: len(dst)}
}

// AppendReturned appends one RETURN entry.
func AppendReturned(dst []byte, rm *Returned) []byte {
	dst = appendU64(dst, rm.Seq)
	dst = appendU16(dst, uint16(rm.Code))
	dst = appendStr8(dst, rm.Exchange)
	return AppendMessage(dst, &rm.Message)
}

func (r *reader) returned(rm *Returned) {
	rm.Seq = r.u64()
	rm.Code = Code(r.u16())
	rm.Exchange = r.str8()
	rm.Message = r.message()
}

// ReturnBatch is a view of a decoded, validated RETURN frame.
type ReturnBatch struct {
	Count   uint32
	section []byte
}

// DecodeReturn decodes and validates a RETURN frame into the view b, which
// aliases f.Payload. It allocates nothing.
func DecodeReturn(f Frame, b *ReturnBatch) error {
	r := reader{b: f.Payload}
	b.Count = r.u32()
	b.section = r.rest()
	if r.err != nil {
		return r.err
	}
	return validateBatch(b.section, b.Count, entryReturn)
}

// ReturnIter iterates a validated RETURN batch.
type ReturnIter struct{ r reader }

// Returns returns an iterator over the batch.
func (b *ReturnBatch) Returns() ReturnIter { return ReturnIter{r: reader{b: b.section}} }

// Next fills rm with a view of the next entry (aliasing the batch's buffer)
// and reports whether there was one.
func (it *ReturnIter) Next(rm *Returned) bool {
	if it.r.end() {
		return false
	}
	it.r.returned(rm)
	return true
}
