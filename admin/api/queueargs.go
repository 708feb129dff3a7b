package api

import (
	"reflect"
	"strings"

	"github.com/warren-mq/warren/wire"
)

// QueueArgs are a queue's protocol arguments under their admin API JSON
// names; nil is unset. There is one field for each of
// wire.QueueArgDescs, in its order, tagged with the descriptor's JSON
// name, of the Go type its kind takes (*int64 for ints and milliseconds,
// *float64 for numbers, *bool, *string for strings and enums);
// TestQueueArgsMatchDescriptors holds them to it, and Table and
// QueueArgsOf find each field by its descriptor.
type QueueArgs struct {
	MaxPriority          *int64   `json:"max_priority,omitempty"`
	StrictPriority       *bool    `json:"strict_priority,omitempty"`
	MaxLength            *int64   `json:"max_length,omitempty"`
	MaxLengthBytes       *int64   `json:"max_length_bytes,omitempty"`
	Overflow             *string  `json:"overflow,omitempty"`
	MessageTTLMs         *int64   `json:"message_ttl_ms,omitempty"`
	ExpiresMs            *int64   `json:"expires_ms,omitempty"`
	DeadLetterExchange   *string  `json:"dead_letter_exchange,omitempty"`
	DeadLetterRoutingKey *string  `json:"dead_letter_routing_key,omitempty"`
	DeliveryLimit        *int64   `json:"delivery_limit,omitempty"`
	RetryInitialMs       *int64   `json:"retry_initial_ms,omitempty"`
	RetryMultiplier      *float64 `json:"retry_multiplier,omitempty"`
	RetryMaxMs           *int64   `json:"retry_max_ms,omitempty"`
	ConsumerTimeoutMs    *int64   `json:"consumer_timeout_ms,omitempty"`
	Replicas             *int64   `json:"replicas,omitempty"`
	SingleActiveConsumer *bool    `json:"single_active_consumer,omitempty"`
	DedupWindowMs        *int64   `json:"dedup_window_ms,omitempty"`
}

// GoType is the type of the QueueArgs field that holds an argument of
// kind k.
func GoType(k wire.ArgKind) reflect.Type {
	switch k {
	case wire.ArgInt, wire.ArgMillis:
		return reflect.TypeFor[*int64]()
	case wire.ArgNumber:
		return reflect.TypeFor[*float64]()
	case wire.ArgBool:
		return reflect.TypeFor[*bool]()
	case wire.ArgString, wire.ArgEnum:
		return reflect.TypeFor[*string]()
	}
	return nil
}

// jsonName is a struct field's JSON name.
func jsonName(f reflect.StructField) string {
	name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
	return name
}

// fieldOf[i] is the index in QueueArgs of wire.QueueArgDescs()[i]'s field,
// or -1 when it has none (a bug that TestQueueArgsMatchDescriptors
// reports; Table and QueueArgsOf panic on it).
var fieldOf = func() []int {
	t := reflect.TypeFor[QueueArgs]()
	idx := make([]int, len(wire.QueueArgDescs()))
	for i, d := range wire.QueueArgDescs() {
		idx[i] = -1
		for j := range t.NumField() {
			if jsonName(t.Field(j)) == d.JSON && t.Field(j).Type == GoType(d.Kind) {
				idx[i] = j
			}
		}
	}
	return idx
}()

func field(v reflect.Value, i int) reflect.Value {
	if fieldOf[i] < 0 {
		panic("api: BUG: QueueArgs has no field for queue argument " + wire.QueueArgDescs()[i].Key)
	}
	return v.Field(fieldOf[i])
}

// DescOfJSON returns the descriptor of the queue argument whose admin API
// JSON name is name.
func DescOfJSON(name string) (*wire.QueueArgDesc, bool) {
	descs := wire.QueueArgDescs()
	for i := range descs {
		if descs[i].JSON == name {
			return &descs[i], true
		}
	}
	return nil, false
}

// Check checks each argument that is set on its own, and names the first
// bad one by its JSON name: "queue setting max_priority: want an int in
// [1, 255]" (invalid_argument). The broker checks them all again, and
// against each other, when it takes the declare.
func (a *QueueArgs) Check() error {
	for _, f := range a.Table() {
		d, _ := wire.LookupQueueArg(f.Key)
		if !d.Accepts(f.Value) {
			return SettingError(d)
		}
	}
	return nil
}

// SettingError is the invalid_argument error for a bad value of d's
// setting, in the admin API's terms.
func SettingError(d *wire.QueueArgDesc) error {
	return &wire.Error{Code: wire.InvalidArgument, Reason: "queue setting " + d.JSON + ": want " + d.Want()}
}

// Table returns the arguments that are set as a protocol table, in the
// descriptors' order, for a QUEUE_DECLARE. The values are not checked
// here: the broker checks them as it checks any declare's.
func (a *QueueArgs) Table() wire.Table {
	var t wire.Table
	v := reflect.ValueOf(a).Elem()
	for i, d := range wire.QueueArgDescs() {
		f := field(v, i)
		if f.IsNil() {
			continue
		}
		var w wire.Value
		switch x := f.Interface().(type) {
		case *int64:
			w = wire.Int(*x)
		case *float64:
			w = wire.Float(*x)
		case *bool:
			w = wire.Bool(*x)
		case *string:
			w = wire.String(*x)
		}
		t = append(t, wire.Field{Key: d.Key, Value: w})
	}
	return t
}

// QueueArgsOf reads protocol arguments (a queue's declared ones) back
// into QueueArgs. Keys that are not queue arguments are left out; a value
// of another kind than its field's is converted as the broker reads it
// (an int retry-multiplier is that number).
func QueueArgsOf(t wire.Table) QueueArgs {
	var a QueueArgs
	v := reflect.ValueOf(&a).Elem()
	for _, fl := range t {
		i := -1
		for j, d := range wire.QueueArgDescs() {
			if d.Key == fl.Key {
				i = j
			}
		}
		if i < 0 {
			continue
		}
		x := fl.Value
		var p any
		switch d := wire.QueueArgDescs()[i]; d.Kind {
		case wire.ArgInt, wire.ArgMillis:
			n := x.Int
			if x.Kind == wire.KindFloat {
				n = int64(x.Float)
			}
			p = &n
		case wire.ArgNumber:
			f := x.Float
			if x.Kind != wire.KindFloat {
				f = float64(x.Int)
			}
			p = &f
		case wire.ArgBool:
			b := x.Int != 0
			p = &b
		case wire.ArgString, wire.ArgEnum:
			s := string(x.Bytes)
			p = &s
		}
		field(v, i).Set(reflect.ValueOf(p))
	}
	return a
}
