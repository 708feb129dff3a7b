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

// Warren's table encoding (wire/table.go), read in place: the headers of
// a stored message were validated when it was published, so a value that
// does not parse ends the table (never a panic).
type wreader struct {
	b   []byte
	bad bool
}

func (r *wreader) take(n int) []byte {
	if r.bad || n < 0 || len(r.b) < n {
		r.bad = true
		return nil
	}
	p := r.b[:n]
	r.b = r.b[n:]
	return p
}

func (r *wreader) u8() byte {
	if p := r.take(1); p != nil {
		return p[0]
	}
	return 0
}

func (r *wreader) u32() uint32 {
	if p := r.take(4); p != nil {
		return binary.LittleEndian.Uint32(p)
	}
	return 0
}

func (r *wreader) u64() uint64 {
	if p := r.take(8); p != nil {
		return binary.LittleEndian.Uint64(p)
	}
	return 0
}

// value reads one value as a view (tables and arrays as their raw bytes).
func (r *wreader) value() wire.Value {
	v := wire.Value{Kind: wire.Kind(r.u8())}
	switch v.Kind {
	case wire.KindNull:
	case wire.KindBool:
		v.Int = int64(r.u8())
	case wire.KindInt, wire.KindTimestamp:
		v.Int = int64(r.u64())
	case wire.KindFloat:
		v.Float = math.Float64frombits(r.u64())
	case wire.KindString, wire.KindBytes, wire.KindTable, wire.KindArray:
		v.Bytes = r.take(int(r.u32()))
	default:
		r.bad = true
	}
	return v
}

// putHeaders writes Warren's raw table entries as an AMQP field table,
// with the types sig recorded (nil: the usual ones), leaving out the
// fields drop names, then extra's fields and, if deliveryCount > 1,
// x-delivery-count. It allocates nothing.
func putHeaders(b []byte, entries []byte, sig *typeSig, drop func([]byte) bool, extra wire.Table, deliveryCount uint32) []byte {
	start := len(b)
	b = append(b, 0, 0, 0, 0)
	b = putEntries(b, entries, sig, drop)
	for i := range extra {
		b = putShortstr(b, extra[i].Key)
		b = putValue(b, &extra[i].Value)
	}
	if deliveryCount > 1 {
		b = putShortstr(b, "x-delivery-count")
		b = binary.BigEndian.AppendUint64(append(b, 'l'), uint64(deliveryCount-1))
	}
	binary.BigEndian.PutUint32(b[start:], uint32(len(b)-start-4))
	return b
}

func putEntries(b []byte, entries []byte, sig *typeSig, drop func([]byte) bool) []byte {
	r := wreader{b: entries}
	for len(r.b) > 0 && !r.bad {
		k := r.take(int(r.u8()))
		v := r.value()
		if r.bad {
			break
		}
		if drop != nil && drop(k) {
			// Its types are still consumed, to keep the rest aligned.
			mark := len(b)
			b = putValueTyped(b, &v, sig)[:mark]
			continue
		}
		b = append(append(b, byte(len(k))), k...)
		b = putValueTyped(b, &v, sig)
	}
	return b
}

// putValueTyped writes a value read by wreader (tables and arrays raw).
func putValueTyped(b []byte, v *wire.Value, sig *typeSig) []byte {
	var tag, scale byte
	if sig != nil && sig.ok {
		tag, scale = sig.next(v)
	}
	switch tag {
	case 'b', 'B':
		return append(b, tag, byte(v.Int))
	case 's', 'u':
		return binary.BigEndian.AppendUint16(append(b, tag), uint16(v.Int))
	case 'I', 'i':
		return binary.BigEndian.AppendUint32(append(b, tag), uint32(v.Int))
	case 'L':
		return binary.BigEndian.AppendUint64(append(b, 'L'), uint64(v.Int))
	case 'f':
		return binary.BigEndian.AppendUint32(append(b, 'f'), math.Float32bits(float32(v.Float)))
	case 'D':
		b = append(b, 'D', scale)
		return binary.BigEndian.AppendUint32(b, uint32(int32(math.Round(v.Float*math.Pow10(int(scale))))))
	}
	switch v.Kind {
	case wire.KindTable:
		b = append(b, 'F')
		start := len(b)
		b = append(b, 0, 0, 0, 0)
		b = putEntries(b, v.Bytes, sig, nil)
		binary.BigEndian.PutUint32(b[start:], uint32(len(b)-start-4))
		return b
	case wire.KindArray:
		b = append(b, 'A')
		start := len(b)
		b = append(b, 0, 0, 0, 0)
		ar := wreader{b: v.Bytes}
		for len(ar.b) > 0 && !ar.bad {
			e := ar.value()
			if ar.bad {
				break
			}
			b = putValueTyped(b, &e, sig)
		}
		binary.BigEndian.PutUint32(b[start:], uint32(len(b)-start-4))
		return b
	case wire.KindString:
		return putLongstr(append(b, 'S'), v.Bytes)
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

// pubScratch holds the buffers parseHeader builds a message's properties
// in, reused from one publish to the next (the arena gets a copy).
type pubScratch struct {
	hdr, sig, unk, props []byte
}

// appendWarrenEntries transcodes an AMQP field table's entries (raw,
// without its length) into Warren's table entries, appending each value's
// AMQP type tag to sig (types.go) in depth-first order. It allocates only
// to grow dst and sig.
func appendWarrenEntries(dst, raw []byte, depth int, sig *[]byte) ([]byte, error) {
	if depth > maxTableDepth {
		return dst, errTable
	}
	r := reader{b: raw}
	for r.off < len(r.b) && r.err == nil {
		k := r.take(int(r.u8()))
		if r.err != nil {
			break
		}
		dst = append(append(dst, byte(len(k))), k...)
		var err error
		if dst, err = r.appendWarrenValue(dst, depth, sig); err != nil {
			return dst, err
		}
	}
	if r.err != nil {
		return dst, errTable
	}
	return dst, nil
}

func (r *reader) appendWarrenValue(dst []byte, depth int, sig *[]byte) ([]byte, error) {
	tag := r.u8()
	if r.err != nil {
		return dst, errTable
	}
	*sig = append(*sig, tag)
	i64 := func(v int64) []byte {
		return binary.LittleEndian.AppendUint64(append(dst, byte(wire.KindInt)), uint64(v))
	}
	f64 := func(v float64) []byte {
		return binary.LittleEndian.AppendUint64(append(dst, byte(wire.KindFloat)), math.Float64bits(v))
	}
	switch tag {
	case 't':
		v := byte(0)
		if r.u8() != 0 {
			v = 1
		}
		dst = append(dst, byte(wire.KindBool), v)
	case 'b':
		dst = i64(int64(int8(r.u8())))
	case 'B':
		dst = i64(int64(r.u8()))
	case 's':
		dst = i64(int64(int16(r.u16())))
	case 'u':
		dst = i64(int64(r.u16()))
	case 'I':
		dst = i64(int64(int32(r.u32())))
	case 'i':
		dst = i64(int64(r.u32()))
	case 'l', 'L':
		dst = i64(int64(r.u64()))
	case 'f':
		dst = f64(float64(math.Float32frombits(r.u32())))
	case 'd':
		dst = f64(math.Float64frombits(r.u64()))
	case 'D':
		scale := r.u8()
		*sig = append(*sig, scale)
		dst = f64(float64(int32(r.u32())) / math.Pow10(int(scale)))
	case 'S', 'x':
		kind := wire.KindString
		if tag == 'x' {
			kind = wire.KindBytes
		}
		v := r.longstr()
		dst = append(binary.LittleEndian.AppendUint32(append(dst, byte(kind)), uint32(len(v))), v...)
	case 'T':
		dst = binary.LittleEndian.AppendUint64(append(dst, byte(wire.KindTimestamp)), uint64(timestampMs(r.u64())))
	case 'V':
		dst = append(dst, byte(wire.KindNull))
	case 'F', 'A':
		raw := r.longstr()
		if r.err != nil || depth+1 > maxTableDepth {
			return dst, errTable
		}
		kind := wire.KindTable
		if tag == 'A' {
			kind = wire.KindArray
		}
		dst = append(dst, byte(kind), 0, 0, 0, 0)
		at := len(dst)
		var err error
		if tag == 'F' {
			dst, err = appendWarrenEntries(dst, raw, depth+1, sig)
		} else {
			ar := reader{b: raw}
			for ar.off < len(ar.b) && ar.err == nil && err == nil {
				dst, err = ar.appendWarrenValue(dst, depth+1, sig)
			}
			if ar.err != nil {
				err = errTable
			}
		}
		if err != nil {
			return dst, err
		}
		binary.LittleEndian.PutUint32(dst[at-4:], uint32(len(dst)-at))
	default:
		return dst, errTable
	}
	if r.err != nil {
		return dst, errTable
	}
	return dst, nil
}
