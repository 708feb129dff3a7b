package wire

import (
	"strings"
	"testing"
)

// TestCheckTable: CheckTable accepts exactly the tables whose encoding
// ValidateTable takes back (nesting of tables and arrays, in any mix, to
// MaxTableDepth levels), CheckTableNested those DecodeTableNested takes
// back, and refuses a key over 255 bytes, which
// AppendTable cannot encode (it panics), without encoding anything.
func TestCheckTable(t *testing.T) {
	for levels := 0; levels <= 19; levels++ {
		for mix := 0; mix < 4; mix++ {
			v := String("leaf")
			for i := range levels {
				if (mix>>(i%2))&1 == 1 {
					v = ArrayValue([]Value{Int(1), v})
				} else {
					v = TableValue(Table{{Key: "k", Value: v}})
				}
			}
			tb := Table{{Key: "a", Value: Null()}, {Key: "deep", Value: v}}
			got := CheckTable(tb)
			want := ValidateTable(AppendTable(nil, tb))
			if (got == nil) != (want == nil) {
				t.Fatalf("%d levels (mix %d): CheckTable %v, the decoder %v", levels, mix, got, want)
			}
			got = CheckTableNested(tb, 17)
			_, want = DecodeTableNested(AppendTable(nil, tb)[4:], 17)
			if (got == nil) != (want == nil) {
				t.Fatalf("%d levels (mix %d), to 17: CheckTableNested %v, the decoder %v", levels, mix, got, want)
			}
		}
	}
	for _, tb := range []Table{
		{{Key: strings.Repeat("k", 256), Value: Int(1)}},
		{{Key: "t", Value: TableValue(Table{{Key: strings.Repeat("k", 300), Value: Int(1)}})}},
		{{Key: "a", Value: ArrayValue([]Value{TableValue(Table{{Key: strings.Repeat("k", 256), Value: Null()}})})}},
	} {
		if err := CheckTable(tb); err == nil || !strings.Contains(err.Error(), "bytes: at most 255") {
			t.Errorf("a key over 255 bytes: %v", err)
		}
	}
	if err := CheckTable(Table{{Key: strings.Repeat("k", 255), Value: Value{Kind: 9}}}); err == nil {
		t.Errorf("a value of an unknown kind passed")
	}
	if err := CheckTable(nil); err != nil {
		t.Errorf("an empty table: %v", err)
	}
}
