package wire

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"errors"
	"math/rand/v2"
	"testing"
)

// allValidFrames concatenates every valid vector into one stream.
func allValidFrames(t testing.TB) []byte {
	var stream []byte
	for _, c := range validCases() {
		stream = AppendFrame(stream, c.ch, c.body)
	}
	return stream
}

// receive splits stream as a network reader would, given the chunks it
// arrives in, and returns the JSON of every decoded frame.
func receive(t testing.TB, chunks [][]byte) []string {
	var buf []byte
	var out []string
	var d Decompressor
	for _, c := range chunks {
		buf = append(buf, c...)
		for {
			f, n, err := Split(buf, DefaultMaxFrame)
			if err != nil {
				t.Fatalf("Split: %v", err)
			}
			if n == 0 {
				break
			}
			b, err := Decode(f, DefaultMaxFrame, &d)
			if err != nil {
				t.Fatalf("Decode %v: %v", f.Type, err)
			}
			j, _ := json.Marshal(b)
			out = append(out, f.Type.String()+" "+string(j))
			buf = buf[n:]
		}
	}
	if len(buf) != 0 {
		t.Fatalf("%d bytes left over", len(buf))
	}
	return out
}

// TestSplitAtEveryByte feeds the stream cut in two at every offset, and
// byte by byte, and checks the same frames come out.
func TestSplitAtEveryByte(t *testing.T) {
	stream := allValidFrames(t)
	want := receive(t, [][]byte{stream})
	if len(want) != len(validCases()) {
		t.Fatalf("got %d frames, want %d", len(want), len(validCases()))
	}
	for i := 0; i <= len(stream); i++ {
		got := receive(t, [][]byte{stream[:i], stream[i:]})
		if !equalStrings(got, want) {
			t.Fatalf("cut at %d: frames differ", i)
		}
	}
	var bytewise [][]byte
	for i := range stream {
		bytewise = append(bytewise, stream[i:i+1])
	}
	if got := receive(t, bytewise); !equalStrings(got, want) {
		t.Fatal("byte-by-byte: frames differ")
	}
}

func equalStrings(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// TestTooLargeRefusedFromHeader: the size check needs only the header, so
// a receiver never buffers an oversized frame.
func TestTooLargeRefusedFromHeader(t *testing.T) {
	hdr := cat(u32b(1<<20), u8s(uint8(TypePublish), 0), u16b(1))
	_, _, err := Split(hdr, 1<<20)
	if CodeOf(err) != FrameTooLarge {
		t.Fatalf("got %v, want frame_too_large", err)
	}
	// Exactly at the limit is fine (and incomplete).
	ok := cat(u32b(1<<20-HeaderSize), u8s(uint8(TypePublish), 0), u16b(1))
	if _, n, err := Split(ok, 1<<20); err != nil || n != 0 {
		t.Fatalf("at limit: n=%d err=%v", n, err)
	}
}

// TestDecompressedSizeCappedByNegotiatedLimit: a compressed batch may not
// expand past the connection's max_frame.
func TestDecompressedSizeCappedByNegotiatedLimit(t *testing.T) {
	big := bytes.Repeat([]byte{'a'}, 200<<10)
	raw := AppendFrame(nil, 1, &Publish{FirstSeq: 1, Codec: CodecS2, Messages: []PublishMessage{{RoutingKey: "q", Body: big}}})
	if len(raw) > MinMaxFrame {
		t.Fatalf("test needs a small compressed frame, got %d bytes", len(raw))
	}
	f, _, err := Split(raw, MinMaxFrame)
	if err != nil {
		t.Fatal(err)
	}
	var d Decompressor
	var b PublishBatch
	if err := DecodePublish(f, MinMaxFrame, &d, &b); CodeOf(err) != FrameTooLarge {
		t.Fatalf("got %v, want frame_too_large", err)
	}
	if cap(d.buf) != 0 {
		t.Fatalf("decompressor allocated %d bytes for a refused batch", cap(d.buf))
	}
	if err := DecodePublish(f, 1<<20, &d, &b); err != nil {
		t.Fatalf("with a larger limit: %v", err)
	}
}

func TestIgnorableTypeIsSplitNotRefused(t *testing.T) {
	raw := frame(0xE5, 0xff, 3, []byte("future"))
	f, n, err := Split(raw, DefaultMaxFrame)
	if err != nil || n != len(raw) || !f.Type.Ignorable() || string(f.Payload) != "future" {
		t.Fatalf("got %+v n=%d err=%v", f, n, err)
	}
}

func TestErrorsIsByCode(t *testing.T) {
	err := decodeAll(frame(TypeHeartbeat, 0, 0, u8s(1)), DefaultMaxFrame)
	if !errors.Is(err, &Error{Code: FrameError}) || errors.Is(err, &Error{Code: BadFlags}) {
		t.Fatalf("errors.Is by code broken: %v", err)
	}
}

func TestCodeScopes(t *testing.T) {
	for _, c := range Codes() {
		if c.String() == "" || !c.Known() {
			t.Fatalf("code %d has no name", c)
		}
	}
	cases := map[Code]Scope{OK: ScopeNone, NoRoute: ScopeMessage, NotFound: ScopeRequest,
		UnknownDeliveryTag: ScopeChannel, FrameError: ScopeConnection, Code(499): ScopeConnection}
	for c, s := range cases {
		if c.Scope() != s {
			t.Errorf("%v: scope %v, want %v", c, c.Scope(), s)
		}
	}
}

func TestPreamble(t *testing.T) {
	if _, _, err := CheckPreamble(Preamble[:]); err != nil {
		t.Fatal(err)
	}
	if _, _, err := CheckPreamble([]byte("AMQP\x00\x00\x09\x01")); CodeOf(err) != BadVersion {
		t.Fatalf("AMQP preamble: %v", err)
	}
	if maj, _, err := CheckPreamble([]byte("WARREN\x02\x00")); CodeOf(err) != BadVersion || maj != 2 {
		t.Fatalf("v2 preamble: %v", err)
	}
}

func TestPlain(t *testing.T) {
	u, p, ok := ParsePlain(PlainResponse("guest", "pa:ss"))
	if !ok || u != "guest" || p != "pa:ss" {
		t.Fatalf("got %q %q %v", u, p, ok)
	}
	for _, bad := range []string{"", "\x00", "x", "other\x00guest\x00pw", "\x00u\x00p\x00"} {
		if _, _, ok := ParsePlain([]byte(bad)); ok {
			t.Errorf("accepted %q", bad)
		}
	}
}

// randomBody builds a random frame body of a random type.
func randomBody(r *rand.Rand) (uint16, Body) {
	str := func(n int) string {
		b := make([]byte, r.IntN(n+1))
		for i := range b {
			b[i] = byte('a' + r.IntN(26))
		}
		return string(b)
	}
	bin := func(n int) []byte {
		b := make([]byte, r.IntN(n+1))
		for i := range b {
			b[i] = byte(r.Uint32())
		}
		return b
	}
	var randValue func(depth int) Value
	randValue = func(depth int) Value {
		k := Kind(r.IntN(9))
		if depth >= 3 && (k == KindTable || k == KindArray) {
			k = KindInt
		}
		switch k {
		case KindNull:
			return Null()
		case KindBool:
			return Bool(r.IntN(2) == 1)
		case KindInt:
			return Int(r.Int64() - r.Int64())
		case KindFloat:
			return Float(r.NormFloat64())
		case KindString:
			return String(str(20))
		case KindBytes:
			return Bytes(bin(20))
		case KindTable:
			var t Table
			for i := r.IntN(3); i > 0; i-- {
				t = append(t, Field{str(8), randValue(depth + 1)})
			}
			return TableValue(t)
		case KindArray:
			a := []Value{}
			for i := r.IntN(3); i > 0; i-- {
				a = append(a, randValue(depth+1))
			}
			return ArrayValue(a)
		}
		return Timestamp(r.Int64())
	}
	table := func() Table {
		var t Table
		for i := r.IntN(4); i > 0; i-- {
			t = append(t, Field{str(10), randValue(1)})
		}
		return t
	}
	props := func() *Props {
		if r.IntN(3) == 0 {
			return nil
		}
		p := &Props{ContentType: str(5), MessageID: str(8), ReplyTo: str(3), Headers: table()}
		if r.IntN(2) == 0 {
			p.ExpirationMs = u32p(r.Uint32())
		}
		if r.IntN(2) == 0 {
			p.TimestampMs = i64p(r.Int64())
		}
		if r.IntN(4) == 0 {
			p.Deaths = []Death{{Queue: str(5), Reason: DeathReason(1 + r.IntN(4)), Count: r.Uint32(), FirstMs: r.Int64(), LastMs: r.Int64(), Exchange: str(4), RoutingKeys: []string{str(4)}}}
		}
		if r.IntN(4) == 0 {
			p.Unknown = append([]byte{byte(13 + r.IntN(200)), 1, 0}, 'z')
		}
		if reflectEmpty(p) {
			return nil
		}
		return p
	}
	codec := func() Codec { return Codec(r.IntN(3)) }
	ch := uint16(1 + r.IntN(100))
	switch r.IntN(8) {
	case 0:
		p := &Publish{FirstSeq: 1 + r.Uint64()>>1, Exchange: str(10), Codec: codec()}
		for i := 1 + r.IntN(5); i > 0; i-- {
			p.Messages = append(p.Messages, PublishMessage{Mandatory: r.IntN(2) == 0, Persistent: r.IntN(2) == 0,
				Priority: uint8(r.IntN(256)), RoutingKey: str(20), Props: props(), Body: bin(300)})
		}
		return ch, p
	case 1:
		d := &Deliver{ConsumerTag: str(10), Codec: codec()}
		for i := 1 + r.IntN(5); i > 0; i-- {
			d.Deliveries = append(d.Deliveries, DeliveredMessage{Tag: 1 + r.Uint64()>>1, Redelivered: r.IntN(2) == 0,
				Persistent: r.IntN(2) == 0, Priority: uint8(r.IntN(10)), DeliveryCount: r.Uint32(), FailedCount: r.Uint32(),
				Exchange: str(8), RoutingKey: str(8), Props: props(), Body: bin(300)})
		}
		return ch, d
	case 2:
		s := &Settle{}
		for i := 1 + r.IntN(6); i > 0; i-- {
			e := Settlement{Op: SettleOp(1 + r.IntN(4)), Last: 1 + r.Uint64()>>1}
			e.First = r.Uint64N(e.Last + 1)
			if e.Op == SettleExtend {
				e.Arg = r.Uint32()
			}
			s.Entries = append(s.Entries, e)
		}
		return ch, s
	case 3:
		c := &Confirm{}
		for i := 1 + r.IntN(6); i > 0; i-- {
			last := 1 + r.Uint64()>>1
			c.Ranges = append(c.Ranges, ConfirmRange{First: 1 + r.Uint64N(last), Last: last, Code: Code(r.IntN(500))})
		}
		return ch, c
	case 4:
		return ch, &QueueDeclare{Req: r.Uint32(), Name: str(30), Durable: r.IntN(2) == 0, Exclusive: r.IntN(2) == 0, Args: table()}
	case 5:
		return ch, &Bind{Unbind: r.IntN(2) == 0, Req: r.Uint32(), ToExchange: r.IntN(2) == 0, Destination: str(9), Source: str(9), RoutingKey: str(30), Args: table()}
	case 6:
		return 0, &Hello{Product: str(6), Version: str(5), Mechanisms: []string{str(5)}, MaxFrame: r.Uint32(), MaxChannels: uint16(r.Uint32()), HeartbeatMs: r.Uint32()}
	}
	rt := &Return{}
	for i := 1 + r.IntN(3); i > 0; i-- {
		rt.Returns = append(rt.Returns, ReturnedMessage{Seq: r.Uint64(), Code: NoRoute, Exchange: str(5),
			Message: PublishMessage{Mandatory: true, RoutingKey: str(5), Props: props(), Body: bin(50)}})
	}
	return ch, rt
}

func reflectEmpty(p *Props) bool {
	j, _ := json.Marshal(p)
	return string(j) == "{}"
}

// TestRoundTripProperty: encode then decode gives back the same meaning,
// for random bodies of every batch type and several control types.
func TestRoundTripProperty(t *testing.T) {
	for seed := uint64(0); seed < 3000; seed++ {
		r := rand.New(rand.NewPCG(seed, 0x5eed))
		ch, body := randomBody(r)
		raw := AppendFrame(nil, ch, body)
		f, n, err := Split(raw, HardMaxFrame)
		if err != nil || n != len(raw) || f.Channel != ch || f.Type != body.FrameType() {
			t.Fatalf("seed %d: Split n=%d/%d err=%v", seed, n, len(raw), err)
		}
		var d Decompressor
		got, err := Decode(f, HardMaxFrame, &d)
		if err != nil {
			t.Fatalf("seed %d: Decode %v: %v\n%s", seed, f.Type, err, hex.EncodeToString(raw))
		}
		want, _ := json.Marshal(body)
		gotJ, _ := json.Marshal(got)
		if !bytes.Equal(want, gotJ) {
			t.Fatalf("seed %d: round trip differs\n got %s\nwant %s", seed, gotJ, want)
		}
	}
}
