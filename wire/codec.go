package wire

import (
	"runtime"
	"strconv"
	"sync"

	"github.com/klauspost/compress/s2"
	"github.com/klauspost/compress/zstd"
)

// Codec is the compression of a batch section, carried in flag bits 0–1 of
// PUBLISH and DELIVER frames.
type Codec uint8

const (
	CodecNone Codec = 0
	CodecS2   Codec = 1 // s2 block format (github.com/klauspost/compress/s2)
	CodecZstd Codec = 2 // one zstd frame (RFC 8878)

	flagCodecMask = 0x03
)

func (c Codec) String() string {
	switch c {
	case CodecNone:
		return "none"
	case CodecS2:
		return "s2"
	case CodecZstd:
		return "zstd"
	}
	return "codec(" + strconv.Itoa(int(c)) + ")"
}

var (
	zstdEncoder = sync.OnceValue(func() *zstd.Encoder {
		e, err := zstd.NewWriter(nil,
			zstd.WithEncoderLevel(zstd.SpeedFastest),
			zstd.WithEncoderConcurrency(runtime.GOMAXPROCS(0)),
			zstd.WithEncoderCRC(false))
		if err != nil {
			panic("wire: BUG: zstd encoder: " + err.Error())
		}
		return e
	})
	zstdDecoder = sync.OnceValue(func() *zstd.Decoder {
		// DecodeAll is bounded by cap(dst), which the Decompressor sets to
		// the declared raw length, and by HardMaxFrame in any case.
		d, err := zstd.NewReader(nil,
			zstd.WithDecoderConcurrency(runtime.GOMAXPROCS(0)),
			zstd.WithDecoderMaxMemory(HardMaxFrame),
			zstd.WithDecodeAllCapLimit(true))
		if err != nil {
			panic("wire: BUG: zstd decoder: " + err.Error())
		}
		return d
	})
)

// appendCompressed appends src compressed with c.
func appendCompressed(dst []byte, c Codec, src []byte) []byte {
	switch c {
	case CodecS2:
		n := len(dst)
		need := s2.MaxEncodedLen(len(src))
		if cap(dst)-n < need {
			grown := make([]byte, n, n+need)
			copy(grown, dst)
			dst = grown
		}
		out := s2.Encode(dst[n:n+need], src)
		return dst[:n+len(out)]
	case CodecZstd:
		return zstdEncoder().EncodeAll(src, dst)
	}
	panic("wire: BUG: appendCompressed with codec " + c.String())
}

// Decompressor holds the buffer that decompressed batch sections live in.
// A decoded batch that was compressed is a view of this buffer and is valid
// until the next Decode call with the same Decompressor. The zero value is
// ready to use; it is not safe for concurrent use.
type Decompressor struct{ buf []byte }

// decompress checks rawLen against limit before touching src, then decodes
// into a buffer of exactly rawLen bytes.
func (d *Decompressor) decompress(c Codec, src []byte, rawLen, limit uint32) ([]byte, *Error) {
	if rawLen > limit || rawLen > HardMaxFrame {
		return nil, errRawTooLarge
	}
	if d == nil {
		return nil, &Error{DecompressError, "compressed batch but no decompressor"}
	}
	if cap(d.buf) < int(rawLen) {
		d.buf = make([]byte, 0, rawLen)
	}
	dst := d.buf[:0:rawLen]
	switch c {
	case CodecS2:
		n, err := s2.DecodedLen(src)
		if err != nil {
			return nil, errDecompress
		}
		if n != int(rawLen) {
			return nil, errRawLenMismatch
		}
		out, err := s2.Decode(dst[:n], src)
		if err != nil {
			return nil, errDecompress
		}
		return out, nil
	case CodecZstd:
		out, err := zstdDecoder().DecodeAll(src, dst)
		if err != nil {
			return nil, errDecompress
		}
		if len(out) != int(rawLen) {
			return nil, errRawLenMismatch
		}
		return out, nil
	}
	return nil, errCodec
}
