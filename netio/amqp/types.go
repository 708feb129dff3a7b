package amqp

import (
	"encoding/binary"
	"math"

	"github.com/warren-mq/warren/wire"
)

// Header value types. Warren's table has one integer kind (i64) and one
// float kind (f64); AMQP has several widths (b B s u I i l, f d and the
// decimal D). So that an AMQP consumer gets back the types an AMQP
// publisher sent, the front keeps them in a property of its own,
// propAMQPTypes (an unknown property to Warren, which keeps and forwards it
// unchanged; spec/PROTOCOL.md): one tag per header value in depth-first
// order (a decimal's tag followed by its scale), written only when some
// value is not of its kind's usual type (l, d, t, S, x, T, F, A, V). A
// consumer on the native protocol sees i64 and f64 as before.
const propAMQPTypes = 200

// canonicalTag reports whether tag is the type putValue writes for its
// kind anyway.
func canonicalTag(tag byte) bool {
	switch tag {
	case 'l', 'd', 't', 'S', 'x', 'T', 'F', 'A', 'V':
		return true
	}
	return false
}

// typeSig is the types of a table's values, read back in the order they
// were recorded; once it does not fit the table (a native client changed
// the headers but forwarded the property), the rest is written with the
// usual types.
type typeSig struct {
	b  []byte
	ok bool
}

// next is the recorded tag of the next value, if it still fits v; 0: the
// usual type.
func (s *typeSig) next(v *wire.Value) (tag, scale byte) {
	if !s.ok || len(s.b) == 0 {
		s.ok = false
		return 0, 0
	}
	tag, s.b = s.b[0], s.b[1:]
	if tag == 'D' {
		if len(s.b) == 0 {
			s.ok = false
			return 0, 0
		}
		scale, s.b = s.b[0], s.b[1:]
	}
	fits := false
	switch v.Kind {
	case wire.KindInt:
		n := v.Int
		switch tag {
		case 'b':
			fits = n >= math.MinInt8 && n <= math.MaxInt8
		case 'B':
			fits = n >= 0 && n <= math.MaxUint8
		case 's':
			fits = n >= math.MinInt16 && n <= math.MaxInt16
		case 'u':
			fits = n >= 0 && n <= math.MaxUint16
		case 'I':
			fits = n >= math.MinInt32 && n <= math.MaxInt32
		case 'i':
			fits = n >= 0 && n <= math.MaxUint32
		case 'l', 'L':
			fits = true
		}
	case wire.KindFloat:
		switch tag {
		case 'f', 'd':
			fits = true
		case 'D':
			x := math.Round(v.Float * math.Pow10(int(scale)))
			fits = x >= math.MinInt32 && x <= math.MaxInt32
		}
	default:
		fits = tag == kindTag(v.Kind)
	}
	if !fits {
		s.ok = false
		return 0, 0
	}
	return tag, scale
}

func kindTag(k wire.Kind) byte {
	switch k {
	case wire.KindBool:
		return 't'
	case wire.KindString:
		return 'S'
	case wire.KindBytes:
		return 'x'
	case wire.KindTimestamp:
		return 'T'
	case wire.KindTable:
		return 'F'
	case wire.KindArray:
		return 'A'
	}
	return 'V'
}

// putTableTyped writes a table's fields as putTable does, with the types
// sig recorded (nil: the usual ones), leaving out the fields drop names,
// then extra's.
func putTableTyped(b []byte, t wire.Table, sig *typeSig, drop func(string) bool, extra wire.Table) []byte {
	start := len(b)
	b = append(b, 0, 0, 0, 0)
	for i := range t {
		if drop != nil && drop(t[i].Key) {
			// Its types are still consumed, to keep the rest aligned.
			mark := len(b)
			b = putValueTyped(b, &t[i].Value, sig)[:mark]
			continue
		}
		b = putShortstr(b, t[i].Key)
		b = putValueTyped(b, &t[i].Value, sig)
	}
	for i := range extra {
		b = putShortstr(b, extra[i].Key)
		b = putValue(b, &extra[i].Value)
	}
	binary.BigEndian.PutUint32(b[start:], uint32(len(b)-start-4))
	return b
}

func putValueTyped(b []byte, v *wire.Value, sig *typeSig) []byte {
	if sig == nil || !sig.ok {
		return putValue(b, v)
	}
	tag, scale := sig.next(v)
	switch tag {
	case 'b', 'B':
		return append(b, tag, byte(v.Int))
	case 's', 'u':
		return binary.BigEndian.AppendUint16(append(b, tag), uint16(v.Int))
	case 'I', 'i':
		return binary.BigEndian.AppendUint32(append(b, tag), uint32(v.Int))
	case 'f':
		return binary.BigEndian.AppendUint32(append(b, 'f'), math.Float32bits(float32(v.Float)))
	case 'D':
		b = append(b, 'D', scale)
		return binary.BigEndian.AppendUint32(b, uint32(int32(math.Round(v.Float*math.Pow10(int(scale))))))
	}
	switch v.Kind {
	case wire.KindTable:
		return putTableTyped(append(b, 'F'), v.Table, sig, nil, nil)
	case wire.KindArray:
		b = append(b, 'A')
		start := len(b)
		b = append(b, 0, 0, 0, 0)
		for i := range v.Array {
			b = putValueTyped(b, &v.Array[i], sig)
		}
		binary.BigEndian.PutUint32(b[start:], uint32(len(b)-start-4))
		return b
	}
	return putValue(b, v)
}

// typesProp finds the recorded types in a message's unknown properties.
func typesProp(unknown []byte) []byte {
	for len(unknown) >= 3 {
		id, n := unknown[0], int(binary.LittleEndian.Uint16(unknown[1:]))
		if len(unknown) < 3+n {
			return nil
		}
		if id == propAMQPTypes {
			return unknown[3 : 3+n]
		}
		unknown = unknown[3+n:]
	}
	return nil
}
