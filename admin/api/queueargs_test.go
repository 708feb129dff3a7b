package api

import (
	"encoding/json"
	"reflect"
	"testing"

	"github.com/warren-mq/warren/wire"
)

// TestQueueArgsMatchDescriptors: QueueArgs has exactly one field per
// queue-argument descriptor, in the descriptors' order, with its JSON
// name and the Go type of its kind.
func TestQueueArgsMatchDescriptors(t *testing.T) {
	st := reflect.TypeFor[QueueArgs]()
	descs := wire.QueueArgDescs()
	if st.NumField() != len(descs) {
		t.Errorf("QueueArgs has %d fields, the descriptors %d", st.NumField(), len(descs))
	}
	for i, d := range descs {
		if i >= st.NumField() {
			break
		}
		f := st.Field(i)
		if jsonName(f) != d.JSON || f.Type != GoType(d.Kind) || f.Tag.Get("json") != d.JSON+",omitempty" {
			t.Errorf("field %d: %s %s `%s`, want json %q of type %s (queue argument %s)", i, f.Name, f.Type, f.Tag, d.JSON, GoType(d.Kind), d.Key)
		}
		if fieldOf[i] != i {
			t.Errorf("queue argument %s: field index %d, want %d", d.Key, fieldOf[i], i)
		}
	}
}

// TestQueueArgsRoundTrip: every argument goes from a protocol table to
// JSON and back to the same table (so the admin API shows a queue's
// declared arguments as they were declared).
func TestQueueArgsRoundTrip(t *testing.T) {
	var tb wire.Table
	for i, d := range wire.QueueArgDescs() {
		var v wire.Value
		switch d.Kind {
		case wire.ArgInt, wire.ArgMillis:
			v = wire.Int(d.Max - int64(i%2))
		case wire.ArgNumber:
			v = wire.Float(float64(d.Min) + 0.5)
		case wire.ArgBool:
			v = wire.Bool(i%2 == 0)
		case wire.ArgString:
			v = wire.String(d.Key)
		case wire.ArgEnum:
			v = wire.String(d.Enum[len(d.Enum)-1])
		}
		tb = append(tb, wire.Field{Key: d.Key, Value: v})
	}
	a := QueueArgsOf(tb)
	b, err := json.Marshal(QueueSettings{QueueArgs: a})
	if err != nil {
		t.Fatal(err)
	}
	var back QueueSettings
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	if got := back.Table(); !reflect.DeepEqual(got, tb) {
		t.Fatalf("round trip through %s:\n got %v\nwant %v", b, got, tb)
	}
	if (&QueueArgs{}).Table() != nil {
		t.Fatal("no arguments set: want an empty table")
	}
	// An int retry-multiplier (the broker takes one) reads back as that number.
	if m := QueueArgsOf(wire.Table{{Key: "retry-multiplier", Value: wire.Int(3)}}).RetryMultiplier; m == nil || *m != 3 {
		t.Fatalf("int retry-multiplier read back as %v", m)
	}
}
