package cluster

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/warren-mq/warren/segment"
	"go.etcd.io/raft/v3/raftpb"
)

// Snapshot install over the transport (design §6.7): raft's MsgSnap
// carries only the descriptor; the leader's worker loads the snapshot's
// data and the live entries the follower lacks (replication.
// SnapshotMessage, here Snapshot), and SendSnapshot sends them on the
// peer's connection, encoded as
//
//	gid u64 | msgLen u32 | raftpb.Message (MsgSnap) | dataLen u32 | data |
//	n u32 | n × (index u64 | term u64 | len u32 | entry data)
//
// cut into frames of kind kindSnap, each `last u8 | bytes`, written one
// after the other (no other frame between them). The receiver joins them
// and hands the snapshot to Config.DeliverSnapshot (the group's
// Worker.StepSnapshot). A snapshot is held whole in memory on both sides:
// one over Config.MaxSnapshotBytes (256 MiB by default: a queue holding
// more than that in messages) is not sent, and the follower stays behind
// (logged); streaming it from the log is not built.

// Snapshot is a snapshot to install: raft's MsgSnap, the FSM image and
// the live entries the follower lacks. Its fields are those of
// replication.SnapshotMessage (convert a pointer to one; this package
// does not import replication, whose tests import it).
type Snapshot struct {
	Msg     raftpb.Message
	Data    []byte
	Entries []segment.Entry
}

// SendSnapshot queues s for peer s.Msg.To; done hears once whether it was
// written to the connection (true) or dropped (false: too big, the queue
// full, the connection lost). It never blocks.
func (t *Transport) SendSnapshot(gid uint64, s *Snapshot, done func(ok bool)) {
	p := t.peer(s.Msg.To)
	if p == nil {
		t.dropped.Add(1)
		done(false)
		return
	}
	pl := appendSnapshot(nil, gid, s)
	if len(pl) > t.cfg.MaxSnapshotBytes {
		t.dropped.Add(1)
		p.dropped.Add(1)
		t.log.Warn("cluster: a snapshot too large to send: the follower stays behind", "group", gid, "peer", p.id, "bytes", len(pl), "max_snapshot_bytes", t.cfg.MaxSnapshotBytes)
		done(false)
		return
	}
	p.mu.Lock()
	if p.snapBytes+len(pl) > t.cfg.MaxSnapshotBytes {
		p.mu.Unlock()
		t.dropped.Add(1)
		p.dropped.Add(1)
		done(false)
		return
	}
	p.snaps = append(p.snaps, pendingSnap{payload: pl, done: done})
	p.snapBytes += len(pl)
	p.mu.Unlock()
	select {
	case p.dat.wake <- struct{}{}:
	default:
	}
}

type pendingSnap struct {
	payload []byte
	done    func(ok bool)
}

func appendSnapshot(b []byte, gid uint64, s *Snapshot) []byte {
	b = binary.BigEndian.AppendUint64(b, gid)
	n := s.Msg.Size()
	b = binary.BigEndian.AppendUint32(b, uint32(n))
	off := len(b)
	b = append(b, make([]byte, n)...)
	if _, err := s.Msg.MarshalTo(b[off:]); err != nil {
		panic("cluster: BUG: a raft message that does not marshal: " + err.Error())
	}
	b = binary.BigEndian.AppendUint32(b, uint32(len(s.Data)))
	b = append(b, s.Data...)
	b = binary.BigEndian.AppendUint32(b, uint32(len(s.Entries)))
	for _, e := range s.Entries {
		b = binary.BigEndian.AppendUint64(b, e.Index)
		b = binary.BigEndian.AppendUint64(b, e.Term)
		b = binary.BigEndian.AppendUint32(b, uint32(len(e.Data)))
		b = append(b, e.Data...)
	}
	return b
}

var errSnapFrame = errors.New("cluster: a snapshot frame that does not parse")

// parseSnapshot decodes a snapshot frame's payload into owned copies.
func parseSnapshot(p []byte) (uint64, *Snapshot, error) {
	take := func(n int) ([]byte, bool) {
		if n < 0 || n > len(p) {
			return nil, false
		}
		b := p[:n:n]
		p = p[n:]
		return b, true
	}
	u32 := func() (int, bool) {
		b, ok := take(4)
		if !ok {
			return 0, false
		}
		return int(binary.BigEndian.Uint32(b)), true
	}
	hdr, ok := take(8)
	if !ok {
		return 0, nil, errSnapFrame
	}
	gid := binary.BigEndian.Uint64(hdr)
	s := &Snapshot{}
	n, ok := u32()
	mb, ok2 := take(n)
	if !ok || !ok2 {
		return 0, nil, errSnapFrame
	}
	if err := s.Msg.Unmarshal(mb); err != nil {
		return 0, nil, fmt.Errorf("%w: %w", errSnapFrame, err)
	}
	n, ok = u32()
	data, ok2 := take(n)
	if !ok || !ok2 {
		return 0, nil, errSnapFrame
	}
	s.Data = append([]byte(nil), data...)
	k, ok := u32()
	if !ok || k > len(p)/20 {
		return 0, nil, errSnapFrame
	}
	s.Entries = make([]segment.Entry, 0, k)
	for range k {
		h, ok := take(20)
		if !ok {
			return 0, nil, errSnapFrame
		}
		d, ok := take(int(binary.BigEndian.Uint32(h[16:])))
		if !ok {
			return 0, nil, errSnapFrame
		}
		s.Entries = append(s.Entries, segment.Entry{Index: binary.BigEndian.Uint64(h), Term: binary.BigEndian.Uint64(h[8:]), Data: append([]byte(nil), d...)})
	}
	if len(p) != 0 {
		return 0, nil, errSnapFrame
	}
	if s.Msg.Type != raftpb.MsgSnap || s.Msg.Snapshot == nil {
		return 0, nil, fmt.Errorf("%w: a %v, not a MsgSnap", errSnapFrame, s.Msg.Type)
	}
	return gid, s, nil
}

// writeSnaps writes queued snapshots, one frame each, and tells each
// sender; after a failed write the rest are dropped too.
func (p *peer) writeSnaps(conn net.Conn, snaps []pendingSnap) error {
	var err error
	chunk := p.t.cfg.MaxFrameBytes - 2 // kind and the last flag
	for _, s := range snaps {
		for off := 0; err == nil && off < len(s.payload); off += chunk {
			end := min(off+chunk, len(s.payload))
			last := byte(0)
			if end == len(s.payload) {
				last = 1
			}
			conn.SetWriteDeadline(time.Now().Add(writeTimeout))
			bufs := net.Buffers{append(appendFrameHeader(nil, kindSnap, end-off+1), last), s.payload[off:end]}
			_, err = bufs.WriteTo(conn)
		}
		if err != nil {
			p.dropped.Add(1)
			p.t.dropped.Add(1)
		} else {
			p.t.frames.Add(1)
		}
		s.done(err == nil)
	}
	return err
}

func appendFrameHeader(b []byte, kind byte, n int) []byte {
	b = binary.BigEndian.AppendUint32(b, uint32(n+1))
	return append(b, kind)
}

// snapFrame takes one kindSnap frame from peer from into *joined, and
// once it is the last one decodes the snapshot and hands it on.
func (t *Transport) snapFrame(from uint64, pl []byte, joined *[]byte) error {
	if len(pl) < 1 || pl[0] > 1 {
		return errSnapFrame
	}
	if len(*joined)+len(pl)-1 > t.cfg.MaxSnapshotBytes {
		return fmt.Errorf("cluster: node %d sent a snapshot over the %d-byte limit", from, t.cfg.MaxSnapshotBytes)
	}
	*joined = append(*joined, pl[1:]...)
	if pl[0] == 0 {
		return nil
	}
	whole := *joined
	*joined = nil
	return t.deliverSnapshot(from, whole)
}

// deliverSnapshot decodes a snapshot from peer from and hands it on.
func (t *Transport) deliverSnapshot(from uint64, pl []byte) error {
	gid, s, err := parseSnapshot(pl)
	if err != nil {
		return err
	}
	if s.Msg.From != from {
		return fmt.Errorf("cluster: node %d sent a snapshot from node %d", from, s.Msg.From)
	}
	t.received.Add(1)
	if t.cfg.DeliverSnapshot != nil {
		t.cfg.DeliverSnapshot(gid, s)
	}
	return nil
}
