package segment

import (
	"encoding/binary"
	"errors"
	"hash/crc32"
)

// Record framing. Every record starts on an 8-byte boundary:
//
//	0        4        8            12     13        16
//	+--------+--------+------------+------+---------+==================+=====+
//	| crc32c | length | generation | type | write   | payload (length) | pad |
//	+--------+--------+------------+------+---------+==================+=====+
//
// crc32c (Castagnoli) covers bytes 4 .. 16+length: the rest of the header
// and the payload. write (u24, version 5, WAL files only; zero elsewhere)
// tags the record with the group-commit write that wrote it: bits 0-21
// the write's number in its file (1, 2, ... wrapping from 2^22-1 to 1),
// bit 22 set when the write started with no other in flight (every
// earlier one synced), bit 23 set on the write's last record, so recovery can tell a torn tail
// of writes still in flight from damage before synced records. pad zero-fills to the next multiple of 8. generation is
// the file's generation (from its header), so a record left over from an
// earlier use of the same bytes is never mistaken for a current one. A
// header of all zeros marks the end of the written part (a preallocated
// tail). These numbers are part of the on-disk format.
const (
	recordHeader = 16
	align        = 8
	// MaxRecord bounds one record's payload, so a corrupted length can never
	// make recovery allocate without limit.
	MaxRecord = 64 << 20
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// Record types. Part of the format.
const (
	recEntries   uint8 = 1 // group u64, count u32, count × (index u64, term u64, len u32, data)
	recHardState uint8 = 2 // group u64, term u64, vote u64, commit u64
	recTruncate  uint8 = 3 // group u64, from u64: entries ≥ from are gone
	recCompact   uint8 = 4 // group u64, upTo u64, term of upTo u64 (0: unknown): the raft log starts after upTo
	// recCheckpoint opens every WAL file, one per group: group u64,
	// first u64, last u64, term of first-1 u64, term u64, vote u64, commit
	// u64, flags u64 (bit 0: the hard state is set), n u64, then n ×
	// (segment seq u64, synced size u64): the group's segment files and how
	// much of each is promised.
	recCheckpoint uint8 = 5
	// recPromise: group u64, segment seq u64, size u64. The segment file's
	// first size bytes are synced: damage before that is corruption, never a
	// torn tail. Written after the mover syncs, before its source goes.
	// Segment sequence numbers start at 1: a promise of segment 0 (group
	// 0, size 0: appendEmptyPromise) promises nothing. It is a WAL file's
	// checkpoint when the log holds no group.
	recPromise uint8 = 6
	// recRemove: group u64. The group is gone: its entries, hard state and
	// segment files (deleted by the worker before any WAL file that could
	// hold the group's records). Format version 2.
	recRemove uint8 = 7
	// recLive: as recEntries, but the entries are stored below the group's
	// raft log, sparse (AppendLive: a snapshot install's live entries),
	// placed by recovery's rule (the higher term wins), not appended.
	// Format version 4.
	recLive uint8 = 9
)

// appendFileHeader appends a file's 16-byte header: magic, format
// version, generation, reserved zeros.
func appendFileHeader(dst []byte, magic string, gen uint32) []byte {
	dst = append(dst, magic...)
	dst = binary.LittleEndian.AppendUint16(dst, formatVersion)
	dst = binary.LittleEndian.AppendUint32(dst, gen)
	return binary.LittleEndian.AppendUint32(dst, 0)
}

// appendEmptyPromise appends a promise of nothing (segment 0, size 0),
// closed: a WAL file's checkpoint when the log holds no group (a
// checkpoint record would name one), so that its first write is never
// empty. Every build that reads version 5 replays it as a promise.
func appendEmptyPromise(dst []byte) []byte {
	var start int
	dst, start = beginRecord(dst)
	dst = append(dst, make([]byte, 24)...)
	return closeRecord(dst, start, recPromise)
}

// emptyPromise reports whether a record is appendEmptyPromise's.
func emptyPromise(typ uint8, p []byte) bool {
	return typ == recPromise && len(p) == 24 && binary.LittleEndian.Uint64(p[8:]) == 0
}

// ckptFixed is the size of a checkpoint record's fixed part.
const ckptFixed = 72

func padded(n int) int { return (n + align - 1) &^ (align - 1) }

// beginRecord reserves a record header at the end of dst; append the
// payload, then call endRecord. Encoding in place allocates nothing once
// dst has room.
func beginRecord(dst []byte) ([]byte, int) {
	start := len(dst)
	return append(dst, make([]byte, recordHeader)...), start
}

// endRecord fills in the header of the record begun at start and pads it.
func endRecord(dst []byte, start int, gen uint32, typ uint8) []byte {
	dst = closeRecord(dst, start, typ)
	r := dst[start:]
	n := binary.LittleEndian.Uint32(r[4:])
	binary.LittleEndian.PutUint32(r[8:], gen)
	binary.LittleEndian.PutUint32(r, crc32.Checksum(r[4:recordHeader+n], castagnoli))
	return dst
}

// closeRecord fills in the length and type of the record begun at start
// and pads it, leaving generation and checksum to seal: WAL records are
// encoded before it is known which file they go to.
func closeRecord(dst []byte, start int, typ uint8) []byte {
	return closeRecordN(dst, start, len(dst)-start-recordHeader, typ)
}

// closeRecordN is closeRecord for a record of n payload bytes, some of
// them extents (written from the callers' slices, not in dst).
func closeRecordN(dst []byte, start, n int, typ uint8) []byte {
	r := dst[start:]
	binary.LittleEndian.PutUint32(r[4:], uint32(n))
	r[12] = typ
	if pad := padded(recordHeader+n) - (recordHeader + n); pad > 0 {
		dst = append(dst, make([]byte, pad)...)
	}
	return dst
}

var (
	errEnd    = errors.New("segment: end of records")
	errBadRec = errors.New("segment: bad record")
)

// readRecord decodes the record at off in buf. It returns errEnd for a
// zero header or too few bytes for a whole record (the end, possibly torn),
// and errBadRec for a complete-looking record that fails its checks.
func readRecord(buf []byte, off int, gen uint32) (typ uint8, payload []byte, next int, err error) {
	if len(buf)-off < recordHeader {
		return 0, nil, 0, errEnd
	}
	h := buf[off : off+recordHeader]
	crc := binary.LittleEndian.Uint32(h)
	length := binary.LittleEndian.Uint32(h[4:])
	if crc == 0 && length == 0 && binary.LittleEndian.Uint64(h[8:]) == 0 {
		return 0, nil, 0, errEnd
	}
	if length > MaxRecord {
		return 0, nil, 0, errBadRec
	}
	end := off + padded(recordHeader+int(length))
	if end > len(buf) {
		return 0, nil, 0, errEnd
	}
	if crc32.Checksum(buf[off+4:off+recordHeader+int(length)], castagnoli) != crc {
		return 0, nil, 0, errBadRec
	}
	if binary.LittleEndian.Uint32(h[8:]) != gen {
		return 0, nil, 0, errBadRec
	}
	return h[12], buf[off+recordHeader : off+recordHeader+int(length)], end, nil
}

// Write tags (bytes 13..15 of a record header).
const (
	tagLast  = 1 << 23      // the last record of its write
	tagAlone = 1 << 22      // its write started with no other in flight
	tagMask  = tagAlone - 1 // the write's number
)

// nextWrite is the number of the write after write n (0: none yet).
func nextWrite(n uint32) uint32 {
	if n >= tagMask {
		return 1
	}
	return n + 1
}

// recTag is the write tag of the record at off.
func recTag(buf []byte, off int) uint32 {
	h := buf[off:]
	return uint32(h[13]) | uint32(h[14])<<8 | uint32(h[15])<<16
}

// inFlightTail reports whether damage at off in a tagged WAL file (version
// 5) lies in the last writes that may have been in flight together when
// the writer stopped: every intact record after it (the first at next)
// belongs to the write the damage is in, or to the one after it if that
// one started while the damaged one was in flight (maxInflight is 2). A
// write starts only once the one before the one before it is synced, and
// a write that started alone (tagAlone) once every earlier one is, so a
// record of any other write proves the damaged one was synced: damage,
// not a torn tail. prev is the tag of the last intact record before off
// (first: there is none). The file's first write (its checkpoint, which
// restates the state of the WAL files before it) was synced before any
// earlier WAL file could go, and a fresh log's first WAL file syncs it
// alone: damage in it is a torn tail only with afterWAL (an earlier WAL
// file is still there). That first write is never empty (a log with no
// group opens the file with an empty promise), so damage after its last
// record lies in a later write. A close mark (markLocked: Close, and Open
// once it synced the file) is a write started alone: damage before one is
// never taken for a torn tail.
func inFlightTail(buf []byte, off, next int, gen uint32, prev uint32, first, afterWAL bool) bool {
	var d uint32 // the damaged write
	switch {
	case first:
		d = 1 // the file's first write (its header or checkpoint) is damaged
	case prev&tagMask == 0:
		return false // untagged: unknown
	case prev&tagLast != 0:
		d = nextWrite(prev & tagMask) // the damage starts the next write
	default:
		d = prev & tagMask
	}
	if d == 1 && !afterWAL {
		return false
	}
	for o := next; o+recordHeader <= len(buf); {
		_, _, n, err := readRecord(buf, o, gen)
		if err != nil {
			o += align
			continue
		}
		t := recTag(buf, o)
		if w := t & tagMask; w != d && (w != nextWrite(d) || t&tagAlone != 0) {
			return false
		}
		o = n
	}
	return true
}

// validAfter reports whether a valid record of generation gen starts at any
// aligned offset after off: if one does, damage at off is corruption in the
// middle of the log, not a torn tail.
func validAfter(buf []byte, off int, gen uint32) (int, bool) {
	for o := off + align; o+recordHeader <= len(buf); o += align {
		if _, _, _, err := readRecord(buf, o, gen); err == nil {
			return o, true
		}
	}
	return 0, false
}

// seal sets the generation and write tag of every record in buf (closed
// by closeRecord) and computes their checksums; with last, the final
// record is tagged the write's last (tagLast). The group-commit writer
// calls it outside the lock, once it knows the file.
func seal(buf []byte, ext []extent, gen, tag uint32, last bool) {
	for off := 0; off < len(buf); {
		r := buf[off:]
		n := int(binary.LittleEndian.Uint32(r[4:]))
		binary.LittleEndian.PutUint32(r[8:], gen)
		t := tag
		if last && off+recordHeader+n-extIn(ext, off, n)+padded(recordHeader+n)-(recordHeader+n) == len(buf) {
			t |= tagLast
		}
		r[13], r[14], r[15] = byte(t), byte(t>>8), byte(t>>16)
		if len(ext) == 0 || ext[0].at >= off+recordHeader+n {
			binary.LittleEndian.PutUint32(r, crc32.Checksum(r[4:recordHeader+n], castagnoli))
			off += padded(recordHeader + n)
			continue
		}
		// The payload's bytes in order: buf's, with the extents at their
		// offsets (each before the byte of buf there).
		crc := crc32.Checksum(r[4:recordHeader], castagnoli)
		p, left := off+recordHeader, n
		for left > 0 {
			if len(ext) > 0 && ext[0].at == p {
				crc = crc32.Update(crc, castagnoli, ext[0].data)
				left -= len(ext[0].data)
				ext = ext[1:]
				continue
			}
			end := p + left
			if len(ext) > 0 && ext[0].at < end {
				end = ext[0].at
			}
			crc = crc32.Update(crc, castagnoli, buf[p:end])
			left -= end - p
			p = end
		}
		binary.LittleEndian.PutUint32(r, crc)
		off = p + padded(recordHeader+n) - (recordHeader + n)
	}
}

// extIn is how many payload bytes of the record at off (n payload bytes)
// come from extents rather than buf, walking ext as seal does.
func extIn(ext []extent, off, n int) int {
	if len(ext) == 0 || ext[0].at >= off+recordHeader+n {
		return 0
	}
	sum, p, left := 0, off+recordHeader, n
	for left > 0 {
		if len(ext) > 0 && ext[0].at == p {
			sum += len(ext[0].data)
			left -= len(ext[0].data)
			ext = ext[1:]
			continue
		}
		end := p + left
		if len(ext) > 0 && ext[0].at < end {
			end = ext[0].at
		}
		left -= end - p
		p = end
	}
	return sum
}
