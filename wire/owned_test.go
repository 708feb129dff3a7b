package wire

import (
	"encoding/hex"
	"encoding/json"
	"testing"
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
