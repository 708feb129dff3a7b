package wire

import (
	"encoding/hex"
	"encoding/json"
	"testing"
	"unsafe"
)

// scribble overwrites b, as a reused read buffer would be by the next read.
func scribble(b []byte) {
	for i := range b {
		b[i] = 0xa5
	}
}

// TestDecodedValuesOwnTheirBytes checks the promise of the package doc and
// DESIGN.md §2: what Decode returns is an owned copy. Every valid vector is
// decoded, then its input (and the Decompressor's buffer, for compressed
// batches) is overwritten; the decoded value must still read the same.
func TestDecodedValuesOwnTheirBytes(t *testing.T) {
	var valid vectorFile[validVector]
	readJSON(t, "valid.json", &valid)
	for _, v := range valid.Vectors {
		t.Run(v.Name, func(t *testing.T) {
			raw, err := hex.DecodeString(v.Hex)
			if err != nil {
				t.Fatal(err)
			}
			f, _, err := Split(raw, valid.MaxFrame)
			if err != nil {
				t.Fatal(err)
			}
			var d Decompressor
			body, err := Decode(f, valid.MaxFrame, &d)
			if err != nil {
				t.Fatal(err)
			}
			scribble(raw)
			scribble(d.buf[:cap(d.buf)])
			assertSameJSON(t, bodyJSON(t, body), v.Body)
		})
	}
}

// TestDecodeTableOwnsItsBytes: DecodeTable, DecodeProps and DecodeDeaths,
// called directly (as netio and the client do), copy too.
func TestDecodeTableOwnsItsBytes(t *testing.T) {
	tbl := Table{
		{"s", String("eu-west")}, {"b", Bytes([]byte{1, 2, 3})}, {"empty", String("")},
		{"nested", TableValue(Table{{"k", String("v")}, {"deeper", TableValue(Table{{"x", Bytes([]byte("y"))}})}})},
		{"list", ArrayValue([]Value{String("two"), Bytes([]byte{9}), ArrayValue([]Value{String("in")})})},
	}
	want, _ := json.Marshal(tbl)

	raw := AppendTable(nil, tbl)[4:]
	got, err := DecodeTable(raw)
	if err != nil {
		t.Fatal(err)
	}
	scribble(raw)
	assertSameJSON(t, mustJSON(t, got), want)

	props := &Props{ContentType: "text/plain", Headers: tbl, Deaths: []Death{{Queue: "q", Reason: ReasonExpired,
		Count: 1, Exchange: "ex", RoutingKeys: []string{"rk"}}}, Unknown: []byte{200, 1, 0, 'u'}}
	wantProps, _ := json.Marshal(props)
	block := AppendProps(nil, props)[2:]
	p, err := DecodeProps(block)
	if err != nil {
		t.Fatal(err)
	}
	scribble(block)
	assertSameJSON(t, mustJSON(t, p), wantProps)
}

func mustJSON(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestPublishBatchOwn: after Own, the messages a batch yields are views of
// the returned copy, not of the frame (plain or s2-compressed, whose
// messages sit in the Decompressor's buffer), and read the same after the
// frame and that buffer are overwritten.
func TestPublishBatchOwn(t *testing.T) {
	for _, codec := range []Codec{CodecNone, CodecS2} {
		raw := publishFrameCodec(3, 40, codec)
		f, _, err := Split(raw, DefaultMaxFrame)
		if err != nil {
			t.Fatal(err)
		}
		var d Decompressor
		var b PublishBatch
		if err := DecodePublish(f, DefaultMaxFrame, &d, &b); err != nil {
			t.Fatal(err)
		}
		buf := b.Own()
		scribble(raw)
		scribble(d.buf[:cap(d.buf)])
		n := 0
		var m Message
		for it := b.Messages(); it.Next(&m); n++ {
			if string(m.RoutingKey) != "order.eu.created" || len(m.Body) != 40 || m.Body[0] != 'x' || m.Flags != Persistent {
				t.Fatalf("codec %d: message %d after Own and the frame overwritten: %+v", codec, n, m)
			}
			if start, end := &buf[0], &buf[len(buf)-1]; !within(m.Body, start, end) || !within(m.RoutingKey, start, end) {
				t.Fatalf("codec %d: message %d is not a view of Own's buffer", codec, n)
			}
		}
		if n != 3 {
			t.Fatalf("codec %d: %d messages after Own, want 3", codec, n)
		}
	}
}

// within reports whether p's bytes lie in [start, end].
func within(p []byte, start, end *byte) bool {
	a, b := uintptr(unsafe.Pointer(&p[0])), uintptr(unsafe.Pointer(&p[len(p)-1]))
	return a >= uintptr(unsafe.Pointer(start)) && b <= uintptr(unsafe.Pointer(end))
}
