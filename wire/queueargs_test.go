package wire

import (
	"strconv"
	"strings"
	"testing"
)

// TestQueueArgDescs: the descriptor table is well formed (names unique,
// every descriptor sets something), each descriptor's bounds are exactly
// what ParseQueueArgs accepts, and each Default is what absence means.
func TestQueueArgDescs(t *testing.T) {
	keys, jsons, flags := map[string]bool{}, map[string]bool{}, map[string]bool{}
	zero, err := ParseQueueArgs(nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range QueueArgDescs() {
		if keys[d.Key] || jsons[d.JSON] || flags[d.Flag] || d.Key == "" || d.JSON == "" || d.Flag == "" {
			t.Errorf("%s: key, JSON name and flag must be set and unique (%q %q %q)", d.Key, d.Key, d.JSON, d.Flag)
		}
		keys[d.Key], jsons[d.JSON], flags[d.Flag] = true, true, true
		if d.Doc == "" || d.set == nil || d.Want() == "" {
			t.Errorf("%s: no doc or setter", d.Key)
		}
		if dd, ok := LookupQueueArg(d.Key); !ok || dd.JSON != d.JSON {
			t.Errorf("LookupQueueArg(%q) = %v, %v", d.Key, dd, ok)
		}
		parse := func(v Value) (QueueArgs, error) {
			tb := Table{{Key: d.Key, Value: v}}
			if d.Key == "overflow" && v.Kind == KindString && string(v.Bytes) == "dead-letter" {
				tb = append(tb, Field{Key: "dead-letter-exchange", Value: String("dlx")})
			}
			return ParseQueueArgs(tb)
		}
		accept := func(v Value) {
			t.Helper()
			a, err := parse(v)
			if err != nil {
				t.Errorf("%s = %v refused: %v", d.Key, v, err)
			} else if a == zero && d.Default == "" && !(v.Kind == KindInt && v.Int == 0) && !(v.Kind == KindBool && v.Int == 0) {
				t.Errorf("%s = %v: accepted but set nothing", d.Key, v)
			}
		}
		refuse := func(v Value) {
			t.Helper()
			_, err := parse(v)
			if e, ok := err.(*Error); !ok || e.Code != InvalidArgument || e.Reason != "queue argument "+d.Key+": want "+d.Want() {
				t.Errorf("%s = %v: got %v, want invalid_argument naming the key and what it wants", d.Key, v, err)
			}
		}
		switch d.Kind {
		case ArgInt, ArgMillis:
			if len(d.Enum) > 0 {
				for _, e := range d.Enum {
					n, _ := strconv.ParseInt(e, 10, 64)
					accept(Int(n))
				}
				refuse(Int(d.Min + 1)) // 2 for replicas
			} else {
				accept(Int(d.Min))
				accept(Int(d.Max))
			}
			if d.Min > -1<<63 {
				refuse(Int(d.Min - 1))
			}
			if d.Max < 1<<63-1 {
				refuse(Int(d.Max + 1))
			}
			refuse(String(strconv.FormatInt(d.Min, 10)))
		case ArgNumber:
			accept(Int(d.Min))
			accept(Float(float64(d.Max)))
			refuse(Float(float64(d.Min) - 0.5))
			refuse(Int(d.Max + 1))
			refuse(String("2"))
		case ArgBool:
			accept(Bool(true))
			accept(Bool(false))
			refuse(Int(1))
		case ArgString:
			accept(String("x"))
			accept(String(strings.Repeat("x", MaxNameLen)))
			refuse(String(strings.Repeat("x", MaxNameLen+1)))
			refuse(Int(1))
		case ArgEnum:
			for _, e := range d.Enum {
				accept(String(e))
			}
			refuse(String("explode"))
			refuse(Int(0))
		default:
			t.Errorf("%s: kind %d", d.Key, d.Kind)
		}
		if d.Default != "" {
			v := String(d.Default)
			if d.Kind == ArgNumber || d.Kind == ArgInt {
				n, _ := strconv.ParseInt(d.Default, 10, 64)
				v = Int(n)
			}
			if a, err := ParseQueueArgs(Table{{Key: d.Key, Value: v}}); err != nil || a != zero {
				t.Errorf("%s: its default %s parses to %+v (%v), but no arguments parse to %+v", d.Key, d.Default, a, err, zero)
			}
		}
	}
	if len(QueueArgDescs()) > 64 {
		t.Fatal("ParseQueueArgs keeps a 64-bit set of the arguments seen")
	}
}

// TestParseQueueArgsAllocs: parsing queue arguments (once per declare; a
// client may declare 100,000 queues) allocates only the strings it keeps.
func TestParseQueueArgsAllocs(t *testing.T) {
	tb := Table{{Key: "max-length", Value: Int(10)}, {Key: "message-ttl", Value: Int(1000)}, {Key: "overflow", Value: String("reject-publish")}}
	if n := testing.AllocsPerRun(100, func() { _, _ = ParseQueueArgs(tb) }); n != 0 {
		t.Errorf("ParseQueueArgs allocated %v times, want 0", n)
	}
}
