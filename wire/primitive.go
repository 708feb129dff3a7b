package wire

import (
	"encoding/binary"
	"math"
)

// All integers on the wire are little-endian (see the package doc for why).
var le = binary.LittleEndian

// reader walks a payload. Its first failure sticks: every later read returns
// zero values and err stays set, so a decoder reads all fields and checks
// once at the end. A reader never allocates and never reads past its slice.
type reader struct {
	b   []byte
	off int
	err *Error
}

func (r *reader) fail(e *Error) {
	if r.err == nil {
		r.err = e
	}
	r.off = len(r.b)
}

func (r *reader) take(n int) []byte {
	if n < 0 || len(r.b)-r.off < n {
		r.fail(errTruncated)
		return nil
	}
	v := r.b[r.off : r.off+n : r.off+n]
	r.off += n
	return v
}

func (r *reader) u8() uint8 {
	if r.off >= len(r.b) {
		r.fail(errTruncated)
		return 0
	}
	v := r.b[r.off]
	r.off++
	return v
}

func (r *reader) u16() uint16 {
	if b := r.take(2); b != nil {
		return le.Uint16(b)
	}
	return 0
}

func (r *reader) u32() uint32 {
	if b := r.take(4); b != nil {
		return le.Uint32(b)
	}
	return 0
}

func (r *reader) u64() uint64 {
	if b := r.take(8); b != nil {
		return le.Uint64(b)
	}
	return 0
}

func (r *reader) bool() bool {
	switch r.u8() {
	case 0:
		return false
	case 1:
		return true
	}
	r.fail(errBool)
	return false
}

// str8 reads a u8 length and that many bytes (names, keys, tags).
func (r *reader) str8() []byte { return r.take(int(r.u8())) }

// str16 reads a u16 length and that many bytes (reasons, property blocks).
func (r *reader) str16() []byte { return r.take(int(r.u16())) }

// bytes32 reads a u32 length and that many bytes (bodies, auth data).
func (r *reader) bytes32() []byte {
	n := r.u32()
	if uint64(n) > uint64(len(r.b)-r.off) {
		r.fail(errTruncated)
		return nil
	}
	return r.take(int(n))
}

func (r *reader) rest() []byte { return r.take(len(r.b) - r.off) }

// done reports the sticky error, or errTrailing if bytes are left over.
func (r *reader) done() error {
	if r.err != nil {
		return r.err
	}
	if r.off != len(r.b) {
		return errTrailing
	}
	return nil
}

func (r *reader) end() bool { return r.err != nil || r.off >= len(r.b) }

func appendU16(b []byte, v uint16) []byte { return le.AppendUint16(b, v) }
func appendU32(b []byte, v uint32) []byte { return le.AppendUint32(b, v) }
func appendU64(b []byte, v uint64) []byte { return le.AppendUint64(b, v) }

func appendBool(b []byte, v bool) []byte {
	if v {
		return append(b, 1)
	}
	return append(b, 0)
}

// appendStr8 writes a u8 length and s. Strings longer than 255 bytes are a
// caller bug (names are validated before they reach an encoder).
func appendStr8[S string | []byte](b []byte, s S) []byte {
	if len(s) > math.MaxUint8 {
		panic("wire: BUG: str8 longer than 255 bytes")
	}
	return append(append(b, uint8(len(s))), s...)
}

func appendStr16[S string | []byte](b []byte, s S) []byte {
	if len(s) > math.MaxUint16 {
		panic("wire: BUG: str16 longer than 65535 bytes")
	}
	return append(le.AppendUint16(b, uint16(len(s))), s...)
}

func appendBytes32[S string | []byte](b []byte, s S) []byte {
	if uint64(len(s)) > math.MaxUint32 {
		panic("wire: BUG: bytes32 longer than 4 GiB")
	}
	return append(le.AppendUint32(b, uint32(len(s))), s...)
}

// strList is a u8 count followed by that many str8.
func appendStrList(b []byte, list []string) []byte {
	if len(list) > math.MaxUint8 {
		panic("wire: BUG: more than 255 strings in a list")
	}
	b = append(b, uint8(len(list)))
	for _, s := range list {
		b = appendStr8(b, s)
	}
	return b
}

func (r *reader) strList() []string {
	n := int(r.u8())
	if n == 0 {
		return nil
	}
	out := make([]string, 0, n)
	for i := 0; i < n && r.err == nil; i++ {
		out = append(out, string(r.str8()))
	}
	return out
}
