package wire

import "strconv"

// ExchangeKind is an exchange's routing algorithm. The numbers are part of
// the protocol.
type ExchangeKind uint8

const (
	ExchangeDirect         ExchangeKind = 1 // routing key equals binding key
	ExchangeTopic          ExchangeKind = 2 // dotted words; * is one word, # zero or more
	ExchangeFanout         ExchangeKind = 3 // every bound queue
	ExchangeHeaders        ExchangeKind = 4 // header values match binding args (x-match all/any)
	ExchangeConsistentHash ExchangeKind = 5 // one queue, by hash of the key or a header, weighted
)

var exchangeKindNames = [...]string{"", "direct", "topic", "fanout", "headers", "consistent-hash"}

func (k ExchangeKind) String() string {
	if k >= ExchangeDirect && k <= ExchangeConsistentHash {
		return exchangeKindNames[k]
	}
	return "exchange-kind(" + strconv.Itoa(int(k)) + ")"
}

// ParseExchangeKind maps a name such as "topic" to its kind.
func ParseExchangeKind(s string) (ExchangeKind, bool) {
	for k := ExchangeDirect; k <= ExchangeConsistentHash; k++ {
		if exchangeKindNames[k] == s {
			return k, true
		}
	}
	return 0, false
}

// ExchangeDeclare creates an exchange, or checks that an existing one has
// the same settings (Passive: only check that it exists).
type ExchangeDeclare struct {
	Req        uint32       `json:"req"`
	Name       string       `json:"name"`
	Kind       ExchangeKind `json:"kind"`
	Durable    bool         `json:"durable"`
	AutoDelete bool         `json:"auto_delete"` // deleted when its last binding goes
	Internal   bool         `json:"internal"`    // no direct publishing; only exchange-to-exchange
	Passive    bool         `json:"passive"`
	Alternate  string       `json:"alternate_exchange"` // takes what nothing else routes
	Args       Table        `json:"args"`
}

const exDeclMask = 0x0f

func (*ExchangeDeclare) FrameType() Type { return TypeExchangeDeclare }
func (e *ExchangeDeclare) appendPayload(dst []byte) []byte {
	dst = appendU32(dst, e.Req)
	dst = appendStr8(dst, e.Name)
	dst = append(dst, uint8(e.Kind), flagBits(e.Durable, e.AutoDelete, e.Internal, e.Passive))
	dst = appendStr8(dst, e.Alternate)
	return AppendTable(dst, e.Args)
}
func (e *ExchangeDeclare) decodePayload(r *reader) {
	e.Req = r.u32()
	e.Name = string(r.str8())
	e.Kind = ExchangeKind(r.u8())
	fl := r.flags(exDeclMask)
	e.Durable, e.AutoDelete, e.Internal, e.Passive = fl&1 != 0, fl&2 != 0, fl&4 != 0, fl&8 != 0
	e.Alternate = string(r.str8())
	e.Args = r.materializedTable()
	if r.err == nil && (e.Kind < ExchangeDirect || e.Kind > ExchangeConsistentHash) {
		r.fail(errExchangeKind)
	}
}

// ExchangeDelete deletes an exchange (IfUnused: only if nothing is bound).
type ExchangeDelete struct {
	Req      uint32 `json:"req"`
	Name     string `json:"name"`
	IfUnused bool   `json:"if_unused"`
}

func (*ExchangeDelete) FrameType() Type { return TypeExchangeDelete }
func (e *ExchangeDelete) appendPayload(dst []byte) []byte {
	return append(appendStr8(appendU32(dst, e.Req), e.Name), flagBits(e.IfUnused))
}
func (e *ExchangeDelete) decodePayload(r *reader) {
	e.Req, e.Name = r.u32(), string(r.str8())
	e.IfUnused = r.flags(1) != 0
}

// QueueDeclare creates a queue, or checks an existing one. An empty Name
// asks the broker to pick a unique one (returned in QueueDeclareOK). The
// queue's settings are in Args, under the keys of QueueArgs.
type QueueDeclare struct {
	Req        uint32 `json:"req"`
	Name       string `json:"name"`
	Durable    bool   `json:"durable"`
	Exclusive  bool   `json:"exclusive"`   // owned by this connection; deleted when it closes
	AutoDelete bool   `json:"auto_delete"` // deleted when its last consumer leaves
	Passive    bool   `json:"passive"`
	Args       Table  `json:"args"`
}

func (*QueueDeclare) FrameType() Type { return TypeQueueDeclare }
func (q *QueueDeclare) appendPayload(dst []byte) []byte {
	dst = appendStr8(appendU32(dst, q.Req), q.Name)
	dst = append(dst, flagBits(q.Durable, q.Exclusive, q.AutoDelete, q.Passive))
	return AppendTable(dst, q.Args)
}
func (q *QueueDeclare) decodePayload(r *reader) {
	q.Req, q.Name = r.u32(), string(r.str8())
	fl := r.flags(0x0f)
	q.Durable, q.Exclusive, q.AutoDelete, q.Passive = fl&1 != 0, fl&2 != 0, fl&4 != 0, fl&8 != 0
	q.Args = r.materializedTable()
}

// QueueDeclareOK answers a QueueDeclare with the queue's name and counts.
type QueueDeclareOK struct {
	Req       uint32 `json:"req"`
	Name      string `json:"name"`
	Messages  uint64 `json:"messages"`
	Consumers uint32 `json:"consumers"`
}

func (*QueueDeclareOK) FrameType() Type { return TypeQueueDeclareOK }
func (q *QueueDeclareOK) appendPayload(dst []byte) []byte {
	return appendU32(appendU64(appendStr8(appendU32(dst, q.Req), q.Name), q.Messages), q.Consumers)
}
func (q *QueueDeclareOK) decodePayload(r *reader) {
	q.Req, q.Name, q.Messages, q.Consumers = r.u32(), string(r.str8()), r.u64(), r.u32()
}

// QueueDelete deletes a queue; the reply's count is the messages deleted.
type QueueDelete struct {
	Req      uint32 `json:"req"`
	Name     string `json:"name"`
	IfUnused bool   `json:"if_unused"` // only if it has no consumers
	IfEmpty  bool   `json:"if_empty"`  // only if it has no messages
}

func (*QueueDelete) FrameType() Type { return TypeQueueDelete }
func (q *QueueDelete) appendPayload(dst []byte) []byte {
	return append(appendStr8(appendU32(dst, q.Req), q.Name), flagBits(q.IfUnused, q.IfEmpty))
}
func (q *QueueDelete) decodePayload(r *reader) {
	q.Req, q.Name = r.u32(), string(r.str8())
	fl := r.flags(3)
	q.IfUnused, q.IfEmpty = fl&1 != 0, fl&2 != 0
}

// QueuePurge deletes a queue's ready messages (not those out with
// consumers); the reply's count is the messages deleted.
type QueuePurge struct {
	Req  uint32 `json:"req"`
	Name string `json:"name"`
}

func (*QueuePurge) FrameType() Type { return TypeQueuePurge }
func (q *QueuePurge) appendPayload(dst []byte) []byte {
	return appendStr8(appendU32(dst, q.Req), q.Name)
}
func (q *QueuePurge) decodePayload(r *reader) { q.Req, q.Name = r.u32(), string(r.str8()) }

// Bind routes messages from the Source exchange to Destination, a queue or
// (ToExchange) an exchange. Unbind has the same fields and removes the
// binding with the same source, destination, key and args.
type Bind struct {
	Unbind      bool   `json:"unbind,omitempty"`
	Req         uint32 `json:"req"`
	ToExchange  bool   `json:"to_exchange"`
	Destination string `json:"destination"`
	Source      string `json:"source"`
	RoutingKey  string `json:"routing_key"`
	Args        Table  `json:"args"`
}

func (b *Bind) FrameType() Type {
	if b.Unbind {
		return TypeUnbind
	}
	return TypeBind
}
func (b *Bind) appendPayload(dst []byte) []byte {
	dst = append(appendU32(dst, b.Req), flagBits(b.ToExchange))
	dst = appendStr8(dst, b.Destination)
	dst = appendStr8(dst, b.Source)
	dst = appendStr8(dst, b.RoutingKey)
	return AppendTable(dst, b.Args)
}
func (b *Bind) decodePayload(r *reader) {
	b.Req = r.u32()
	b.ToExchange = r.flags(1) != 0
	b.Destination = string(r.str8())
	b.Source = string(r.str8())
	b.RoutingKey = string(r.str8())
	b.Args = r.materializedTable()
}
