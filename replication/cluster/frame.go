package cluster

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
)

// Frames (design/replication.md §6.1): len u32 | kind u8 | payload, len
// counting kind and payload, big-endian.
const (
	kindHello  = 1  // dialer → listener: magic, version, from, to, nonce
	kindChall  = 2  // listener → dialer: version, from, nonce, mac
	kindProof  = 3  // dialer → listener: mac
	kindOK     = 4  // listener → dialer: authenticated
	kindRefuse = 5  // either way: a reason, then the connection closes
	kindRaft   = 6  // n × (gid u64 | len u32 | raftpb.Message)
	kindSnap   = 7  // a snapshot to install (snapshot.go)
	kindCall   = 8  // a call (call.go): op u8 | body
	kindReply  = 9  // its answer: status u8 (0 ok, 1 error) | body or the error's text
	kindFwd    = 10 // forwarded work, opaque to the transport (forward.go)

	// version 2 adds kindSnap, 3 calls (a hello to node 0: whichever
	// node listens, for one call) and the hello's "to" in the MACs, 4
	// kindFwd, 5 the hello's lane (two connections per peer: control and
	// data).
	version   = 5
	nonceSize = 32
	magic     = "WRNC"
)

// readFrame reads one frame into *buf (grown as needed, reused) and
// returns its kind and payload. A frame longer than max, empty, or of an
// unknown kind is refused before its payload is read.
func readFrame(r io.Reader, buf *[]byte, max int) (byte, []byte, error) {
	var hdr [5]byte
	if _, err := io.ReadFull(r, hdr[:4]); err != nil {
		return 0, nil, err
	}
	n := binary.BigEndian.Uint32(hdr[:4])
	if n == 0 {
		return 0, nil, errors.New("cluster: an empty frame")
	}
	if uint64(n) > uint64(max) {
		return 0, nil, fmt.Errorf("cluster: a frame of %d bytes, over the %d-byte limit", n, max)
	}
	if _, err := io.ReadFull(r, hdr[4:5]); err != nil {
		return 0, nil, err
	}
	kind := hdr[4]
	if kind < kindHello || kind > kindFwd {
		return 0, nil, fmt.Errorf("cluster: a frame of unknown kind %d", kind)
	}
	if cap(*buf) < int(n-1) {
		*buf = make([]byte, n-1)
	}
	p := (*buf)[:n-1]
	if _, err := io.ReadFull(r, p); err != nil {
		return 0, nil, err
	}
	return kind, p, nil
}

// appendFrame appends a frame of kind with payload p.
func appendFrame(b []byte, kind byte, p []byte) []byte {
	b = binary.BigEndian.AppendUint32(b, uint32(len(p)+1))
	b = append(b, kind)
	return append(b, p...)
}

type hello struct {
	version  byte
	from, to uint64
	nonce    [nonceSize]byte
	lane     byte // laneControl or laneData
}

// A peer's two connections (design §6.1): raft messages go on the
// control lane, forwards and snapshots on the data lane, so megabytes of
// bodies never sit in front of a heartbeat.
const (
	laneControl = 0
	laneData    = 1
)

// appendHello appends the dialer's hello frame.
func appendHello(b []byte, h hello) []byte {
	p := make([]byte, 0, 4+1+16+nonceSize+1)
	p = append(p, magic...)
	p = append(p, h.version)
	p = binary.BigEndian.AppendUint64(p, h.from)
	p = binary.BigEndian.AppendUint64(p, h.to)
	p = append(p, h.nonce[:]...)
	p = append(p, h.lane)
	return appendFrame(b, kindHello, p)
}

func parseHello(p []byte) (hello, error) {
	var h hello
	if len(p) < 5 || string(p[:4]) != magic {
		return h, errors.New("cluster: not a Warren cluster hello (a client on the cluster port?)")
	}
	h.version = p[4]
	if h.version != version {
		return h, fmt.Errorf("cluster: peer speaks cluster protocol version %d, this node %d: run the same Warren version on every node", h.version, version)
	}
	if len(p) != 5+16+nonceSize+1 {
		return h, fmt.Errorf("cluster: a hello of %d bytes", len(p))
	}
	h.from = binary.BigEndian.Uint64(p[5:])
	h.to = binary.BigEndian.Uint64(p[13:])
	copy(h.nonce[:], p[21:])
	h.lane = p[21+nonceSize]
	if h.lane > laneData {
		return h, fmt.Errorf("cluster: a hello for lane %d", h.lane)
	}
	return h, nil
}

// eachMessage walks a raft batch payload: gid u64 | len u32 | message.
func eachMessage(p []byte, fn func(gid uint64, m []byte) error) error {
	for len(p) > 0 {
		if len(p) < 12 {
			return errors.New("cluster: a raft batch cut inside an entry header")
		}
		gid := binary.BigEndian.Uint64(p)
		n := binary.BigEndian.Uint32(p[8:])
		p = p[12:]
		if uint64(n) > uint64(len(p)) {
			return fmt.Errorf("cluster: a raft message of %d bytes runs past its frame (%d left)", n, len(p))
		}
		if err := fn(gid, p[:n]); err != nil {
			return err
		}
		p = p[n:]
	}
	return nil
}
