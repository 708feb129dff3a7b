package wire

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"testing"
)

// FuzzDecode feeds arbitrary bytes to the receive path (Split, then Decode
// of every complete frame). It must never panic; every failure must carry a
// catalogued code; whatever decodes must own its bytes (overwriting the
// input afterwards changes nothing); and it must re-encode to a frame that
// decodes to the same meaning. The seed corpus is every vector plus the
// checked-in inputs under testdata/fuzz/FuzzDecode.
func FuzzDecode(f *testing.F) {
	for _, c := range validCases() {
		f.Add(AppendFrame(nil, c.ch, c.body))
	}
	for _, v := range invalidCases() {
		b, _ := hex.DecodeString(v.Hex)
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		data = append([]byte(nil), data...) // ours to overwrite
		var d Decompressor
		for len(data) > 0 {
			fr, n, err := Split(data, MinMaxFrame)
			if err != nil {
				if !CodeOf(err).Known() || CodeOf(err) == InternalError {
					t.Fatalf("uncatalogued error %v", err)
				}
				return
			}
			if n == 0 {
				return
			}
			data = data[n:]
			if fr.Type.Ignorable() {
				continue
			}
			body, err := Decode(fr, MinMaxFrame, &d)
			if err != nil {
				if !CodeOf(err).Known() || CodeOf(err) == InternalError {
					t.Fatalf("uncatalogued error %v", err)
				}
				continue
			}
			first, _ := json.Marshal(body)
			scribble(fr.Payload)
			scribble(d.buf[:cap(d.buf)])
			if again, _ := json.Marshal(body); !bytes.Equal(first, again) {
				t.Fatalf("decoded %v aliases its input:\n%s\n%s", fr.Type, first, again)
			}
			re := AppendFrame(nil, fr.Channel, body)
			fr2, n2, err := Split(re, HardMaxFrame)
			if err != nil || n2 != len(re) {
				t.Fatalf("re-encoded %v does not split: %v", fr.Type, err)
			}
			body2, err := Decode(fr2, HardMaxFrame, &d)
			if err != nil {
				t.Fatalf("re-encoded %v does not decode: %v", fr.Type, err)
			}
			second, _ := json.Marshal(body2)
			if !bytes.Equal(first, second) {
				t.Fatalf("meaning changed on re-encode:\n%s\n%s", first, second)
			}
		}
	})
}
