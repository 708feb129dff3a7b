package wire

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"reflect"
	"testing"
)

var update = flag.Bool("update", false, "rewrite spec/vectors from the cases in this file")

const vectorDir = "../spec/vectors"

type validVector struct {
	Name       string          `json:"name"`
	Hex        string          `json:"hex"`
	DecodeOnly bool            `json:"decode_only,omitempty"`
	Channel    uint16          `json:"channel"`
	Type       string          `json:"type"`
	Flags      uint8           `json:"flags"`
	Body       json.RawMessage `json:"body"`
}

type invalidVector struct {
	Name     string `json:"name"`
	Hex      string `json:"hex"`
	MaxFrame uint32 `json:"max_frame"`
	Code     Code   `json:"code"`
	Error    string `json:"error"`
}

type vectorFile[V any] struct {
	Comment  string `json:"comment"`
	Version  int    `json:"version"`
	MaxFrame uint32 `json:"max_frame,omitempty"`
	Vectors  []V    `json:"vectors"`
}

type validCase struct {
	name       string
	ch         uint16
	body       Body
	decodeOnly bool // compressed output may differ between library versions
}

func u32p(v uint32) *uint32 { return &v }
func i64p(v int64) *int64   { return &v }

func validCases() []validCase {
	hdr := Table{
		{"region", String("eu-west")},
		{"attempt", Int(3)},
		{"score", Float(0.5)},
		{"urgent", Bool(true)},
		{"raw", Bytes([]byte{0xde, 0xad})},
		{"none", Null()},
		{"at", Timestamp(1700000000000)},
		{"nested", TableValue(Table{{"k", String("v")}})},
		{"list", ArrayValue([]Value{Int(1), String("two")})},
	}
	props := &Props{
		ContentType: "application/json", ContentEncoding: "identity", MessageID: "m-1",
		CorrelationID: "c-1", ReplyTo: "replies", ExpirationMs: u32p(60000),
		TimestampMs: i64p(1700000000000), Type: "order.created", UserID: "guest",
		AppID: "shop", Headers: hdr,
	}
	deaths := &Props{Deaths: []Death{{
		Queue: "orders", Reason: ReasonRejected, Count: 2, FirstMs: 1700000000000,
		LastMs: 1700000005000, Exchange: "events", RoutingKeys: []string{"order.created"},
	}}}
	body128 := bytes.Repeat([]byte("warren "), 19)[:128]
	// 3000 bytes that do not compress, twice: the s2 section then holds a
	// literal with a 2-byte length and copies with 2-byte offsets (§11).
	noise3000 := make([]byte, 3000)
	for i, x := 0, uint32(1); i < len(noise3000); i++ {
		x = x*1664525 + 1013904223
		noise3000[i] = byte(x >> 24)
	}
	// The deepest args table allowed (§10.2): the outer table is level 1,
	// six nested tables are levels 2–7, an array is level 8.
	depth8 := Table{{"a", ArrayValue([]Value{Int(1)})}}
	for i := 0; i < 6; i++ {
		depth8 = Table{{"t", TableValue(depth8)}}
	}
	return []validCase{
		{name: "hello", body: &Hello{Product: "warren", Version: "0.1.0", Mechanisms: []string{"PLAIN"},
			Capabilities: []string{"compression.s2", "compression.zstd"}, MaxFrame: DefaultMaxFrame, MaxChannels: 2047, HeartbeatMs: 30000}},
		{name: "auth_plain", body: &Auth{Mechanism: "PLAIN", Response: PlainResponse("guest", "guest"),
			Product: "warren-go", Version: "0.1.0", MaxFrame: 1 << 20, MaxChannels: 0, HeartbeatMs: 10000}},
		// Over TLS with a verified client certificate (§5.2 EXTERNAL).
		{name: "hello_external", body: &Hello{Product: "warren", Version: "0.1.0", Mechanisms: []string{"PLAIN", "EXTERNAL"},
			Capabilities: []string{"compression.s2", "compression.zstd"}, MaxFrame: DefaultMaxFrame, MaxChannels: 2047, HeartbeatMs: 30000}},
		{name: "auth_external", body: &Auth{Mechanism: "EXTERNAL", Response: []byte{}, Product: "warren-go", Version: "0.1.0", MaxFrame: 1 << 20, HeartbeatMs: 10000}},
		// A broker with virtual hosts lists "vhosts" (§5.2.1); the client
		// then names one in AUTH's trailing vhost field.
		{name: "hello_vhosts", body: &Hello{Product: "warren", Version: "0.1.0", Mechanisms: []string{"PLAIN"},
			Capabilities: []string{"compression.s2", "compression.zstd", "vhosts"}, MaxFrame: DefaultMaxFrame, MaxChannels: 2047, HeartbeatMs: 30000}},
		{name: "auth_vhost", body: &Auth{Mechanism: "PLAIN", Response: PlainResponse("app", "secret"),
			Product: "warren-go", Version: "0.1.0", MaxFrame: 1 << 20, HeartbeatMs: 10000, Vhost: "staging"}},
		{name: "auth_challenge", body: &AuthChallenge{Challenge: []byte("r=abc,s=c2FsdA==,i=4096")}},
		{name: "auth_response", body: &AuthResponse{Response: []byte("c=biws,r=abc,p=proof")}},
		{name: "open_ok", body: &OpenOK{ConnectionID: 42, MaxFrame: 1 << 20, MaxChannels: 2047, HeartbeatMs: 10000}},
		{name: "heartbeat", body: &Heartbeat{}},
		{name: "close", body: &Close{Code: ConnectionForced, Reason: "broker shutting down"}},
		{name: "close_ok", body: &CloseOK{}},
		{name: "channel_open", ch: 1, body: &ChannelOpen{Req: 1}},
		{name: "channel_close", ch: 1, body: &ChannelClose{Code: UnknownDeliveryTag, Reason: "tag 9 is not outstanding"}},
		{name: "channel_close_ok", ch: 1, body: &ChannelCloseOK{}},
		{name: "ok", ch: 1, body: &OKReply{Req: 7, Count: 12}},
		{name: "error", ch: 1, body: &ErrorReply{Req: 8, Code: NotFound, Message: "no queue 'orders'"}},
		{name: "exchange_declare", ch: 1, body: &ExchangeDeclare{Req: 2, Name: "events", Kind: ExchangeTopic,
			Durable: true, Alternate: "unrouted", Args: Table{}}},
		{name: "exchange_declare_hash", ch: 1, body: &ExchangeDeclare{Req: 3, Name: "shards", Kind: ExchangeConsistentHash,
			AutoDelete: true, Internal: true, Passive: true, Args: Table{{"hash-header", String("user")}}}},
		{name: "exchange_delete", ch: 1, body: &ExchangeDelete{Req: 4, Name: "events", IfUnused: true}},
		{name: "queue_declare", ch: 1, body: &QueueDeclare{Req: 5, Name: "orders", Durable: true, Args: Table{
			{"max-priority", Int(9)}, {"max-length", Int(100000)}, {"max-length-bytes", Int(1 << 30)},
			{"overflow", String("reject-publish")}, {"message-ttl", Int(60000)}, {"expires", Int(3600000)},
			{"dead-letter-exchange", String("dlx")}, {"dead-letter-routing-key", String("orders.dead")},
			{"delivery-limit", Int(5)}, {"retry-initial-ms", Int(100)}, {"retry-multiplier", Float(2)},
			{"retry-max-ms", Int(10000)}, {"consumer-timeout-ms", Int(1800000)}, {"replicas", Int(3)},
		}}},
		{name: "queue_declare_server_named", ch: 1, body: &QueueDeclare{Req: 6, Exclusive: true, AutoDelete: true, Args: Table{}}},
		{name: "queue_declare_ok", ch: 1, body: &QueueDeclareOK{Req: 6, Name: "amq.gen-1", Messages: 0, Consumers: 0}},
		{name: "queue_delete", ch: 1, body: &QueueDelete{Req: 9, Name: "orders", IfUnused: true, IfEmpty: true}},
		{name: "queue_purge", ch: 1, body: &QueuePurge{Req: 10, Name: "orders"}},
		{name: "bind", ch: 1, body: &Bind{Req: 11, Destination: "orders", Source: "events", RoutingKey: "order.*.created", Args: Table{}}},
		{name: "bind_exchange", ch: 1, body: &Bind{Req: 12, ToExchange: true, Destination: "audit", Source: "events", RoutingKey: "#", Args: Table{}}},
		{name: "bind_headers", ch: 1, body: &Bind{Req: 13, Destination: "eu", Source: "by-region",
			Args: Table{{"x-match", String("any")}, {"region", String("eu-west")}}}},
		{name: "unbind", ch: 1, body: &Bind{Unbind: true, Req: 14, Destination: "orders", Source: "events", RoutingKey: "order.*.created", Args: Table{}}},
		{name: "publish_one", ch: 1, body: &Publish{FirstSeq: 1, Exchange: "events", Messages: []PublishMessage{
			{RoutingKey: "order.eu.created", Body: []byte("hello")}}}},
		{name: "publish_batch", ch: 1, body: &Publish{FirstSeq: 2, Exchange: "", Messages: []PublishMessage{
			{Mandatory: true, Persistent: true, Priority: 5, RoutingKey: "orders", Props: props, Body: []byte(`{"id":1}`)},
			{Persistent: true, RoutingKey: "orders", Props: deaths, Body: []byte{}},
			{Priority: 9, RoutingKey: "orders", Props: &Props{Unknown: []byte{200, 2, 0, 'h', 'i'}}, Body: []byte{0, 1, 2}},
		}}},
		{name: "publish_s2", ch: 1, decodeOnly: true, body: &Publish{FirstSeq: 5, Exchange: "events", Codec: CodecS2,
			Messages: []PublishMessage{{RoutingKey: "a.b", Body: body128}, {RoutingKey: "a.c", Body: body128}}}},
		{name: "publish_zstd", ch: 1, decodeOnly: true, body: &Publish{FirstSeq: 7, Exchange: "events", Codec: CodecZstd,
			Messages: []PublishMessage{{RoutingKey: "a.b", Body: body128}, {RoutingKey: "a.c", Body: body128}}}},
		{name: "confirm", ch: 1, body: &Confirm{Ranges: []ConfirmRange{{First: 1, Last: 4, Code: OK}, {First: 5, Last: 5, Code: QueueFull}}}},
		{name: "return", ch: 1, body: &Return{Returns: []ReturnedMessage{{Seq: 3, Code: NoRoute, Exchange: "events",
			Message: PublishMessage{Mandatory: true, RoutingKey: "nowhere", Body: []byte("lost?")}}}}},
		{name: "flow_pause", ch: 0, body: &Flow{Active: false}},
		{name: "flow_resume", ch: 1, body: &Flow{Active: true}},
		{name: "subscribe", ch: 1, body: &Subscribe{Req: 15, Queue: "orders", ConsumerTag: "worker-1", Exclusive: true,
			Priority: -2, PrefetchCount: 100, PrefetchBytes: 1 << 20, Args: Table{}}},
		{name: "subscribe_auto_ack", ch: 2, body: &Subscribe{Req: 16, Queue: "logs", AutoAck: true, Args: Table{}}},
		{name: "subscribe_consumer_timeout", ch: 1, body: &Subscribe{Req: 18, Queue: "orders", PrefetchCount: 10,
			Args: Table{{"consumer-timeout-ms", Int(30000)}}}},
		{name: "subscribe_ok", ch: 1, body: &SubscribeOK{Req: 15, ConsumerTag: "worker-1"}},
		{name: "cancel", ch: 1, body: &Cancel{Req: 17, ConsumerTag: "worker-1"}},
		{name: "cancelled", ch: 1, body: &Cancelled{ConsumerTag: "worker-1", Code: NotFound, Reason: "queue deleted"}},
		{name: "deliver", ch: 1, body: &Deliver{ConsumerTag: "worker-1", Deliveries: []DeliveredMessage{
			{Tag: 1, Persistent: true, Priority: 5, DeliveryCount: 1, Exchange: "events", RoutingKey: "order.eu.created",
				Props: &Props{MessageID: "m-1"}, Body: []byte("hello")},
			{Tag: 2, Redelivered: true, DeliveryCount: 3, FailedCount: 2, Exchange: "", RoutingKey: "orders", Body: []byte("again")},
		}}},
		{name: "deliver_s2", ch: 1, decodeOnly: true, body: &Deliver{ConsumerTag: "w", Codec: CodecS2, Deliveries: []DeliveredMessage{
			{Tag: 10, DeliveryCount: 1, Exchange: "events", RoutingKey: "a.b", Body: body128}}}},
		{name: "publish_s2_long", ch: 1, decodeOnly: true, body: &Publish{FirstSeq: 9, Exchange: "events", Codec: CodecS2,
			Messages: []PublishMessage{{RoutingKey: "a.b", Body: noise3000}, {RoutingKey: "a.b", Body: noise3000}}}},
		{name: "bind_table_depth_8", ch: 1, body: &Bind{Req: 18, Destination: "deep", Source: "by-region", Args: depth8}},
		{name: "settle", ch: 1, body: &Settle{Entries: []Settlement{
			{Op: SettleAck, First: 1, Last: 1}, {Op: SettleAck, First: 0, Last: 10}, {Op: SettleRequeue, First: 11, Last: 12},
			{Op: SettleReject, First: 13, Last: 13}, {Op: SettleExtend, First: 14, Last: 20, Arg: 30000},
		}}},
		{name: "lease_expired", ch: 1, body: &LeaseExpired{ConsumerTag: "worker-1", Tags: []uint64{3, 4}}},
	}
}

// frame assembles raw bytes for an invalid vector.
func frame(t Type, flags uint8, ch uint16, payload ...[]byte) []byte {
	p := bytes.Join(payload, nil)
	b := appendU32(nil, uint32(len(p)))
	b = append(b, uint8(t), flags)
	b = appendU16(b, ch)
	return append(b, p...)
}

func cat(parts ...[]byte) []byte { return bytes.Join(parts, nil) }
func u8s(v ...uint8) []byte      { return v }
func u16b(v uint16) []byte       { return appendU16(nil, v) }
func u32b(v uint32) []byte       { return appendU32(nil, v) }
func u64b(v uint64) []byte       { return appendU64(nil, v) }
func s8(s string) []byte         { return appendStr8(nil, s) }

func invalidCases() []invalidVector {
	msg := func(flags uint8, props []byte) []byte {
		return cat(u8s(flags, 0), s8("k"), u16b(uint16(len(props))), props, u32b(1), []byte("x"))
	}
	pub := func(count uint32, msgs ...[]byte) []byte {
		return frame(TypePublish, 0, 1, u64b(1), u32b(count), s8("ex"), cat(msgs...))
	}
	return []invalidVector{
		{Name: "too_large", Hex: hex.EncodeToString(cat(u32b(HandshakeMaxFrame), u8s(uint8(TypeHeartbeat), 0), u16b(0))), MaxFrame: HandshakeMaxFrame, Code: FrameTooLarge},
		{Name: "unknown_type", Hex: hex.EncodeToString(frame(0x7f, 0, 0)), Code: UnknownFrameType},
		{Name: "bad_flags", Hex: hex.EncodeToString(frame(TypeHeartbeat, 0x80, 0)), Code: BadFlags},
		{Name: "bad_codec", Hex: hex.EncodeToString(frame(TypePublish, 0x03, 1, u64b(1), u32b(1), s8(""))), Code: BadFlags},
		{Name: "truncated_close", Hex: hex.EncodeToString(frame(TypeClose, 0, 0, u16b(411), u16b(10), []byte("short"))), Code: FrameError},
		// §5.2.1: an AUTH vhost field that is present must not be empty.
		{Name: "auth_empty_vhost", Hex: hex.EncodeToString(frame(TypeAuth, 0, 0, s8("PLAIN"), u32b(0), s8("c"), s8("1"), u8s(0),
			u32b(1<<20), u16b(0), u32b(0), s8(""))), Code: FrameError},
		{Name: "trailing_bytes", Hex: hex.EncodeToString(frame(TypeHeartbeat, 0, 0, u8s(0))), Code: FrameError},
		{Name: "bad_bool", Hex: hex.EncodeToString(frame(TypeFlow, 0, 1, u8s(2))), Code: FrameError},
		{Name: "publish_count_too_high", Hex: hex.EncodeToString(pub(2, msg(0, nil))), Code: FrameError},
		{Name: "publish_count_too_low", Hex: hex.EncodeToString(pub(1, msg(0, nil), msg(0, nil))), Code: FrameError},
		{Name: "publish_empty", Hex: hex.EncodeToString(pub(0)), Code: FrameError},
		{Name: "publish_seq_zero", Hex: hex.EncodeToString(frame(TypePublish, 0, 1, u64b(0), u32b(1), s8("ex"), msg(0, nil))), Code: FrameError},
		{Name: "publish_body_overruns", Hex: hex.EncodeToString(pub(1, cat(u8s(0, 0), s8("k"), u16b(0), u32b(100), []byte("x")))), Code: FrameError},
		{Name: "publish_message_flags", Hex: hex.EncodeToString(pub(1, msg(0x04, nil))), Code: FrameError},
		{Name: "publish_props_out_of_order", Hex: hex.EncodeToString(pub(1, msg(0, cat(u8s(3), u16b(1), []byte("a"), u8s(1), u16b(1), []byte("b"))))), Code: FrameError},
		{Name: "publish_props_duplicate", Hex: hex.EncodeToString(pub(1, msg(0, cat(u8s(3), u16b(1), []byte("a"), u8s(3), u16b(1), []byte("b"))))), Code: FrameError},
		{Name: "publish_expiration_size", Hex: hex.EncodeToString(pub(1, msg(0, cat(u8s(6), u16b(2), u16b(5))))), Code: FrameError},
		{Name: "publish_prop_empty_value", Hex: hex.EncodeToString(pub(1, msg(0, cat(u8s(1), u16b(0))))), Code: FrameError},
		{Name: "publish_headers_empty", Hex: hex.EncodeToString(pub(1, msg(0, cat(u8s(11), u16b(0))))), Code: FrameError},
		{Name: "publish_deaths_empty", Hex: hex.EncodeToString(pub(1, msg(0, cat(u8s(12), u16b(1), u8s(0))))), Code: FrameError},
		{Name: "publish_header_bad_kind", Hex: hex.EncodeToString(pub(1, msg(0, cat(u8s(11), u16b(3), s8("a"), u8s(0x2a))))), Code: FrameError},
		{Name: "publish_s2_garbage", Hex: hex.EncodeToString(frame(TypePublish, uint8(CodecS2), 1, u64b(1), u32b(1), s8("ex"), u32b(12), u8s(0xff, 0xff, 0xff, 0xff, 0x0f))), Code: DecompressError},
		{Name: "publish_raw_len_over_limit", Hex: hex.EncodeToString(frame(TypePublish, uint8(CodecZstd), 1, u64b(1), u32b(1), s8("ex"), u32b(HardMaxFrame+1), u8s(0))), Code: FrameTooLarge},
		{Name: "publish_raw_len_mismatch", Hex: hex.EncodeToString(frame(TypePublish, uint8(CodecS2), 1, u64b(1), u32b(1), s8("ex"),
			u32b(99), appendCompressed(nil, CodecS2, msg(0, nil)))), Code: DecompressError},
		{Name: "settle_bad_op", Hex: hex.EncodeToString(frame(TypeSettle, 0, 1, u16b(1), u8s(9), u64b(1), u64b(1), u32b(0))), Code: FrameError},
		{Name: "settle_reversed_range", Hex: hex.EncodeToString(frame(TypeSettle, 0, 1, u16b(1), u8s(1), u64b(5), u64b(4), u32b(0))), Code: FrameError},
		{Name: "settle_arg_on_ack", Hex: hex.EncodeToString(frame(TypeSettle, 0, 1, u16b(1), u8s(1), u64b(1), u64b(1), u32b(7))), Code: FrameError},
		{Name: "settle_count_mismatch", Hex: hex.EncodeToString(frame(TypeSettle, 0, 1, u16b(2), u8s(1), u64b(1), u64b(1), u32b(0))), Code: FrameError},
		{Name: "confirm_zero_first", Hex: hex.EncodeToString(frame(TypeConfirm, 0, 1, u16b(1), u64b(0), u64b(3), u16b(0))), Code: FrameError},
		{Name: "deliver_tag_zero", Hex: hex.EncodeToString(frame(TypeDeliver, 0, 1, s8("c"), u32b(1),
			u64b(0), u8s(0, 0), u32b(1), u32b(0), s8(""), s8("q"), u16b(0), u32b(0))), Code: FrameError},
		{Name: "exchange_declare_bad_kind", Hex: hex.EncodeToString(frame(TypeExchangeDeclare, 0, 1, u32b(1), s8("x"), u8s(9, 0), s8(""), u32b(0))), Code: FrameError},
		{Name: "table_too_deep", Hex: hex.EncodeToString(frame(TypeQueueDeclare, 0, 1, u32b(1), s8("q"), u8s(0), deepTable(MaxTableDepth+1))), Code: FrameError},
		{Name: "table_too_deep_array", Hex: hex.EncodeToString(frame(TypeBind, 0, 1, u32b(1), u8s(0), s8("q"), s8("x"), s8(""), deepArrayTable())), Code: FrameError},
		{Name: "lease_expired_count", Hex: hex.EncodeToString(frame(TypeLeaseExpired, 0, 1, s8("c"), u16b(2), u64b(1))), Code: FrameError},
	}
}

// deepArrayTable is nine levels whose last two are arrays: the outer table,
// six tables, an array, and an array inside it.
func deepArrayTable() []byte {
	t := Table{{"a", ArrayValue([]Value{ArrayValue([]Value{Int(1)})})}}
	for i := 0; i < 6; i++ {
		t = Table{{"t", TableValue(t)}}
	}
	return AppendTable(nil, t)
}

func deepTable(depth int) []byte {
	t := Table{{"leaf", Int(1)}}
	for i := 1; i < depth; i++ {
		t = Table{{"n", TableValue(t)}}
	}
	return AppendTable(nil, t)
}

func bodyJSON(t *testing.T, b Body) json.RawMessage {
	t.Helper()
	j, err := json.Marshal(b)
	if err != nil {
		t.Fatal(err)
	}
	return j
}

func TestVectors(t *testing.T) {
	if *update {
		writeVectors(t)
	}
	var valid vectorFile[validVector]
	readJSON(t, "valid.json", &valid)
	cases := map[string]validCase{}
	for _, c := range validCases() {
		cases[c.name] = c
	}
	seenTypes := map[Type]bool{}
	for _, v := range valid.Vectors {
		t.Run(v.Name, func(t *testing.T) {
			raw, err := hex.DecodeString(v.Hex)
			if err != nil {
				t.Fatal(err)
			}
			f, n, err := Split(raw, valid.MaxFrame)
			if err != nil || n != len(raw) {
				t.Fatalf("Split: n=%d of %d, err=%v", n, len(raw), err)
			}
			seenTypes[f.Type] = true
			if f.Type.String() != v.Type || f.Channel != v.Channel || f.Flags != v.Flags {
				t.Fatalf("header: got %v ch=%d flags=%d, want %s ch=%d flags=%d", f.Type, f.Channel, f.Flags, v.Type, v.Channel, v.Flags)
			}
			var d Decompressor
			body, err := Decode(f, valid.MaxFrame, &d)
			if err != nil {
				t.Fatalf("Decode: %v", err)
			}
			assertSameJSON(t, bodyJSON(t, body), v.Body)
			c, ok := cases[v.Name]
			if !ok {
				t.Fatalf("no Go case for vector %q", v.Name)
			}
			if !v.DecodeOnly {
				if got := hex.EncodeToString(AppendFrame(nil, c.ch, c.body)); got != v.Hex {
					t.Fatalf("encode:\n got %s\nwant %s", got, v.Hex)
				}
			}
		})
	}
	for ty := range types {
		if Type(ty).Known() && !seenTypes[Type(ty)] {
			t.Errorf("no valid vector for frame type %v", Type(ty))
		}
	}

	var invalid vectorFile[invalidVector]
	readJSON(t, "invalid.json", &invalid)
	for _, v := range invalid.Vectors {
		t.Run("invalid/"+v.Name, func(t *testing.T) {
			raw, err := hex.DecodeString(v.Hex)
			if err != nil {
				t.Fatal(err)
			}
			max := v.MaxFrame
			if max == 0 {
				max = invalid.MaxFrame
			}
			err = decodeAll(raw, max)
			if CodeOf(err) != v.Code || v.Code.String() != v.Error {
				t.Fatalf("got %v (code %d), want %d %s", err, CodeOf(err), v.Code, v.Error)
			}
		})
	}
}

// decodeAll splits and decodes every frame in raw, as a receiver would.
func decodeAll(raw []byte, maxFrame uint32) error {
	var d Decompressor
	for len(raw) > 0 {
		f, n, err := Split(raw, maxFrame)
		if err != nil {
			return err
		}
		if n == 0 {
			return errTruncated
		}
		if _, err := Decode(f, maxFrame, &d); err != nil {
			return err
		}
		raw = raw[n:]
	}
	return nil
}

func assertSameJSON(t *testing.T, got, want []byte) {
	t.Helper()
	var g, w any
	if err := json.Unmarshal(got, &g); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(want, &w); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(g, w) {
		t.Fatalf("decoded meaning differs:\n got %s\nwant %s", got, want)
	}
}

func readJSON(t *testing.T, name string, v any) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(vectorDir, name))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, v); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
}

func writeVectors(t *testing.T) {
	valid := vectorFile[validVector]{
		Comment:  "Warren wire protocol v1 test vectors: each hex frame and its decoded meaning. See README.md.",
		Version:  1,
		MaxFrame: DefaultMaxFrame,
	}
	for _, c := range validCases() {
		raw := AppendFrame(nil, c.ch, c.body)
		f, _, err := Split(raw, DefaultMaxFrame)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		valid.Vectors = append(valid.Vectors, validVector{
			Name: c.name, Hex: hex.EncodeToString(raw), DecodeOnly: c.decodeOnly,
			Channel: c.ch, Type: f.Type.String(), Flags: f.Flags, Body: bodyJSON(t, c.body),
		})
	}
	invalid := vectorFile[invalidVector]{
		Comment:  "Warren wire protocol v1 invalid frames: each must be refused with the error code given. See README.md.",
		Version:  1,
		MaxFrame: DefaultMaxFrame,
	}
	for _, v := range invalidCases() {
		v.Error = v.Code.String()
		invalid.Vectors = append(invalid.Vectors, v)
	}
	for name, v := range map[string]any{"valid.json": valid, "invalid.json": invalid} {
		b, err := json.MarshalIndent(v, "", "  ")
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(vectorDir, name), append(b, '\n'), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}
