package loadtest

import "encoding/binary"

// Every message starts with a tracking header: producer id, sequence
// number (from 1, in publish order) and the send time, so consumers can
// account for every message and measure end-to-end latency.
const headerSize = 4 + 8 + 8

func putHeader(b []byte, producer uint32, seq uint64, sentNs int64) {
	binary.LittleEndian.PutUint32(b, producer)
	binary.LittleEndian.PutUint64(b[4:], seq)
	binary.LittleEndian.PutUint64(b[12:], uint64(sentNs))
}

func readHeader(b []byte) (producer uint32, seq uint64, sentNs int64, ok bool) {
	if len(b) < headerSize {
		return 0, 0, 0, false
	}
	return binary.LittleEndian.Uint32(b), binary.LittleEndian.Uint64(b[4:]), int64(binary.LittleEndian.Uint64(b[12:])), true
}
