package wire

import (
	"math"
	"strconv"
)

// Kind is the type tag of a table value.
type Kind uint8

// Value kinds. The numbers are part of the protocol.
const (
	KindNull      Kind = 0x00 // no value
	KindBool      Kind = 0x01 // u8 0 or 1
	KindInt       Kind = 0x02 // i64
	KindFloat     Kind = 0x03 // f64, IEEE 754 bits as u64
	KindString    Kind = 0x04 // u32 length + UTF-8 bytes
	KindBytes     Kind = 0x05 // u32 length + bytes
	KindTable     Kind = 0x06 // a nested table
	KindArray     Kind = 0x07 // u32 length + values (kind u8 + value each)
	KindTimestamp Kind = 0x08 // i64 milliseconds since the Unix epoch
)

var kindNames = [...]string{"null", "bool", "int", "float", "string", "bytes", "table", "array", "timestamp"}

func (k Kind) String() string {
	if int(k) < len(kindNames) {
		return kindNames[k]
	}
	return "kind(" + strconv.Itoa(int(k)) + ")"
}

// Field is one key/value pair of a table.
type Field struct {
	Key   string
	Value Value
}

// Table is a materialized table: ordered fields. Keys should be unique; the
// first occurrence wins on lookup.
type Table []Field

// Get returns the first value stored under key.
func (t Table) Get(key string) (Value, bool) {
	for _, f := range t {
		if f.Key == key {
			return f.Value, true
		}
	}
	return Value{}, false
}

// Value is one table value. Which fields are meaningful depends on Kind:
// Int for KindInt, KindTimestamp and KindBool (0 or 1); Float for KindFloat;
// Bytes for KindString and KindBytes; Table and Array for the containers.
type Value struct {
	Kind  Kind
	Int   int64
	Float float64
	Bytes []byte
	Table Table
	Array []Value
}

// Constructors for building tables.
func Null() Value                 { return Value{Kind: KindNull} }
func Int(v int64) Value           { return Value{Kind: KindInt, Int: v} }
func Float(v float64) Value       { return Value{Kind: KindFloat, Float: v} }
func String(s string) Value       { return Value{Kind: KindString, Bytes: []byte(s)} }
func Bytes(b []byte) Value        { return Value{Kind: KindBytes, Bytes: b} }
func Timestamp(ms int64) Value    { return Value{Kind: KindTimestamp, Int: ms} }
func TableValue(t Table) Value    { return Value{Kind: KindTable, Table: t} }
func ArrayValue(vs []Value) Value { return Value{Kind: KindArray, Array: vs} }
func Bool(v bool) Value {
	if v {
		return Value{Kind: KindBool, Int: 1}
	}
	return Value{Kind: KindBool}
}

// AppendTable encodes t: a u32 byte length, then per field the key (str8),
// the kind (u8) and the value.
func AppendTable(dst []byte, t Table) []byte {
	start := len(dst)
	dst = append(dst, 0, 0, 0, 0)
	for i := range t {
		dst = appendStr8(dst, t[i].Key)
		dst = appendValue(dst, &t[i].Value)
	}
	le.PutUint32(dst[start:], uint32(len(dst)-start-4))
	return dst
}

func appendValue(dst []byte, v *Value) []byte {
	dst = append(dst, uint8(v.Kind))
	switch v.Kind {
	case KindNull:
	case KindBool:
		dst = appendBool(dst, v.Int != 0)
	case KindInt, KindTimestamp:
		dst = appendU64(dst, uint64(v.Int))
	case KindFloat:
		dst = appendU64(dst, math.Float64bits(v.Float))
	case KindString, KindBytes:
		dst = appendBytes32(dst, v.Bytes)
	case KindTable:
		dst = AppendTable(dst, v.Table)
	case KindArray:
		start := len(dst)
		dst = append(dst, 0, 0, 0, 0)
		for i := range v.Array {
			dst = appendValue(dst, &v.Array[i])
		}
		le.PutUint32(dst[start:], uint32(len(dst)-start-4))
	default:
		panic("wire: BUG: unknown value kind " + v.Kind.String())
	}
	return dst
}

// CheckTable says whether AppendTable can encode t as a table that
// DecodeTable reads back: every key at most 255 bytes (a str8), every
// value of a known kind, tables and arrays nested at most MaxTableDepth
// levels (t itself is the first). A table built from a peer's JSON, or
// from an AMQP field table (nested to 16), may be none of these; encoding
// such a table panics or writes what no decoder takes back. It allocates
// nothing.
func CheckTable(t Table) error { return checkFields(t, 1, MaxTableDepth) }

// CheckTableNested is CheckTable with tables and arrays nested up to
// maxDepth levels (at least MaxTableDepth), as DecodeTableNested reads
// them.
func CheckTableNested(t Table, maxDepth int) error {
	return checkFields(t, 1, max(maxDepth, MaxTableDepth))
}

func checkFields(t Table, depth, maxDepth int) error {
	if depth > maxDepth {
		return errTableDepth
	}
	for i := range t {
		if n := len(t[i].Key); n > math.MaxUint8 {
			return &Error{InvalidArgument, "table key of " + strconv.Itoa(n) + " bytes: at most 255"}
		}
		if err := checkValue(&t[i].Value, depth, maxDepth); err != nil {
			return err
		}
	}
	return nil
}

func checkValue(v *Value, depth, maxDepth int) error {
	switch v.Kind {
	case KindNull, KindBool, KindInt, KindFloat, KindTimestamp:
	case KindString, KindBytes:
		if uint64(len(v.Bytes)) > math.MaxUint32 {
			return &Error{InvalidArgument, "table value of 4 GiB or more"}
		}
	case KindTable:
		return checkFields(v.Table, depth+1, maxDepth)
	case KindArray:
		if depth+1 > maxDepth {
			return errTableDepth
		}
		for i := range v.Array {
			if err := checkValue(&v.Array[i], depth+1, maxDepth); err != nil {
				return err
			}
		}
	default:
		return errValueType
	}
	return nil
}

// table reads a u32-length-prefixed table and returns the raw entries,
// validated to the depth limit, without allocating.
func (r *reader) table() []byte {
	raw := r.bytes32()
	if r.err == nil {
		if err := validateEntries(raw, true, 1); err != nil {
			r.fail(err)
			return nil
		}
	}
	return raw
}

// ValidateTable checks a complete encoded table (length prefix included).
func ValidateTable(b []byte) error {
	r := reader{b: b}
	r.table()
	return r.done()
}

func validateEntries(b []byte, keyed bool, depth int) *Error {
	if depth > MaxTableDepth {
		return errTableDepth
	}
	r := reader{b: b}
	for !r.end() {
		if keyed {
			r.str8()
		}
		r.skipValue(depth)
	}
	return r.err
}

func (r *reader) skipValue(depth int) {
	switch k := Kind(r.u8()); k {
	case KindNull:
	case KindBool:
		r.bool()
	case KindInt, KindFloat, KindTimestamp:
		r.take(8)
	case KindString, KindBytes:
		r.bytes32()
	case KindTable, KindArray:
		raw := r.bytes32()
		if r.err == nil {
			if err := validateEntries(raw, k == KindTable, depth+1); err != nil {
				r.fail(err)
			}
		}
	default:
		r.fail(errValueType)
	}
}

// TableIter walks validated raw table entries in place, without allocating:
// the keys and values it returns are views of the entries and die with
// them. Container values come back with Bytes holding their raw entries;
// pass them to NewTableIter (tables) or DecodeTable (an owned copy).
type TableIter struct{ r reader }

// NewTableIter returns an iterator of views over the raw entries of a table
// (without its length prefix), such as Properties.Headers.
func NewTableIter(entries []byte) TableIter { return TableIter{r: reader{b: entries}} }

// Next returns the next field as views of the entries. The input must have
// been validated.
func (it *TableIter) Next() (key []byte, v Value, ok bool) {
	if it.r.end() {
		return nil, Value{}, false
	}
	key = it.r.str8()
	v = it.r.valueView()
	return key, v, it.r.err == nil
}

func (r *reader) valueView() Value {
	v := Value{Kind: Kind(r.u8())}
	switch v.Kind {
	case KindBool:
		if r.bool() {
			v.Int = 1
		}
	case KindInt, KindTimestamp:
		v.Int = int64(r.u64())
	case KindFloat:
		v.Float = math.Float64frombits(r.u64())
	case KindString, KindBytes, KindTable, KindArray:
		v.Bytes = r.bytes32()
	case KindNull:
	default:
		r.fail(errValueType)
	}
	return v
}

// DecodeTable materializes raw table entries (without the length prefix)
// into a Table that owns its bytes: string and bytes values are copies, so
// the Table outlives the buffer it was decoded from. It allocates (one copy
// of the entries plus the fields); for topology arguments, headers a client
// hands to its application, and tests, not for the message path, which
// reads headers in place with NewTableIter.
func DecodeTable(entries []byte) (Table, error) {
	return DecodeTableNested(entries, MaxTableDepth)
}

// DecodeTableNested is DecodeTable with tables and arrays nested up to
// maxDepth levels (at least MaxTableDepth): for tables a program stored
// under a larger bound than the protocol's, never for what a peer sends.
func DecodeTableNested(entries []byte, maxDepth int) (Table, error) {
	// validateEntries refuses past MaxTableDepth: starting the count
	// lower allows the extra levels.
	if err := validateEntries(entries, true, 1-(max(maxDepth, MaxTableDepth)-MaxTableDepth)); err != nil {
		return nil, err
	}
	return materialize(entries), nil
}

// materialize builds an owned Table from validated entries: it copies the
// entries once and points every string and bytes value into that copy
// (each value capped to its own length, so appending to one cannot reach
// its neighbour).
func materialize(entries []byte) Table {
	return materializeView(append([]byte(nil), entries...))
}

func materializeView(entries []byte) Table {
	var t Table
	it := NewTableIter(entries)
	for k, v, ok := it.Next(); ok; k, v, ok = it.Next() {
		t = append(t, Field{Key: string(k), Value: materializeValue(v)})
	}
	return t
}

func materializeValue(v Value) Value {
	switch v.Kind {
	case KindTable:
		v.Table, v.Bytes = materializeView(v.Bytes), nil
	case KindArray:
		r := reader{b: v.Bytes}
		v.Bytes = nil
		v.Array = []Value{}
		for !r.end() {
			v.Array = append(v.Array, materializeValue(r.valueView()))
		}
	}
	return v
}
