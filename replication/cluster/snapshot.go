package cluster

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"runtime"
	"slices"
	"sync"
	"time"

	"github.com/warren-mq/warren/segment"
	"go.etcd.io/raft/v3/raftpb"
)

// Snapshot install over the transport (design §6.7): raft's MsgSnap
// carries only the descriptor; the leader's worker loads the snapshot's
// data and the live entries the follower lacks (replication.
// SnapshotMessage, here Snapshot: the entries are views of the leader's
// log files), and SendSnapshot sends them on the peer's data connection,
// encoded as
//
//	gid u64 | msgLen u32 | raftpb.Message (MsgSnap) | dataLen u32 | data |
//	n u32 | n × (index u64 | term u64 | len u32 | entry data)
//
// cut into frames of kind kindSnap, each `last u8 | bytes` of at most
// snapFrameBytes, written one after the other (forwards may go between
// them, no other snapshot's) straight from the message's data and
// entries: the sender never builds the whole. The receiver spools the frames to a file under
// Config.SpoolDir (one frame in memory at a time) and, at the last frame,
// decodes the file and hands the snapshot to Config.DeliverSnapshot (the
// group's Worker.StepSnapshot): the FSM image read into memory, and the
// live entries too when they total at most Config.SnapshotMemBytes;
// past that they stay in the file, read one at a time (Snapshot.
// ReadEntry) as the follower installs them. The file is removed once the
// snapshot is released (Snapshot.Release: installed, refused or replaced),
// when the connection breaks mid-snapshot (nothing partial is delivered:
// the leader hears the snapshot failed, or the follower never answers it,
// and raft sends it again), and at the next start (leftovers of a crash).
// Bounds: Config.MaxSnapshotBytes per snapshot on disk, Config.MaxSpools
// snapshots spooled or not yet released on the node and
// maxSpoolsPerPeer per sending peer; a snapshot over the spool counts is
// refused (logged; its frames are read and dropped) and raft sends it
// again later. One that cannot be spooled (no file, a write failed: a
// full or failing disk) is refused at once by closing the data
// connection, so that its sender stops sending it (its write fails; raft
// sends it again later), as one over MaxSnapshotBytes is. A sender queues at most maxQueuedSnaps per peer.

// Snapshot is a snapshot to install: raft's MsgSnap, the FSM image and
// the live entries the follower lacks. Its fields are those of
// replication.SnapshotMessage (convert a pointer to one; this package
// does not import replication, whose tests import it).
type Snapshot struct {
	Msg     raftpb.Message
	Data    []byte
	Entries []segment.Entry
	// ReadEntry, when set, reads the data of Entries[i] (whose Data is
	// then nil) into dst's space: a snapshot spooled to disk.
	ReadEntry func(i int, dst []byte) ([]byte, error)
	// Release, when set, frees what the snapshot holds (views of the
	// log, a spool file); its holder calls it once, when done with it.
	Release func()
}

const (
	// snapFrameBytes: the most snapshot bytes per frame (the window a
	// sender holds besides the message: it writes views of it).
	snapFrameBytes = 1 << 20
	// maxQueuedSnaps: snapshots queued for one peer and not yet written.
	maxQueuedSnaps = 4
	// maxSpoolsPerPeer: snapshots from one peer spooled or not yet
	// released here.
	maxSpoolsPerPeer = 2
	// spoolPattern names spool files (os.CreateTemp).
	spoolPattern = "warren-snapshot-*.spool"
)

// SendSnapshot queues s for peer s.Msg.To; done hears once whether it was
// written to the connection (true) or dropped (false: the queue full,
// the connection lost). It never blocks. The caller keeps s (and what it
// views) unchanged until done; its entries are in memory (or views: no
// ReadEntry).
func (t *Transport) SendSnapshot(gid uint64, s *Snapshot, done func(ok bool)) {
	p := t.peer(s.Msg.To)
	if p == nil {
		t.dropped.Add(1)
		done(false)
		return
	}
	p.mu.Lock()
	if len(p.snaps) >= maxQueuedSnaps {
		p.mu.Unlock()
		t.dropped.Add(1)
		p.dropped.Add(1)
		t.log.Warn("cluster: a snapshot not sent: this peer has snapshots queued already (raft sends it again)", "group", gid, "peer", p.id, "queued", maxQueuedSnaps)
		done(false)
		return
	}
	p.snaps = append(p.snaps, pendingSnap{gid: gid, s: s, done: done})
	p.mu.Unlock()
	select {
	case p.dat.wake <- struct{}{}:
	default:
	}
}

type pendingSnap struct {
	gid  uint64
	s    *Snapshot
	done func(ok bool)
}

// snapHeader is the encoding up to the data: gid, the message, dataLen.
func snapHeader(gid uint64, s *Snapshot) []byte {
	n := s.Msg.Size()
	b := make([]byte, 0, 16+n)
	b = binary.BigEndian.AppendUint64(b, gid)
	b = binary.BigEndian.AppendUint32(b, uint32(n))
	off := len(b)
	b = b[:off+n]
	if _, err := s.Msg.MarshalTo(b[off:]); err != nil {
		panic("cluster: BUG: a raft message that does not marshal: " + err.Error())
	}
	return binary.BigEndian.AppendUint32(b, uint32(len(s.Data)))
}

// writeSnaps writes queued snapshots, each in frames of at most
// snapFrameBytes (with the forwards queued meanwhile between them), and
// tells each sender; after a failed write the rest are dropped too.
func (p *peer) writeSnaps(conn net.Conn, snaps []pendingSnap) error {
	var err error
	for _, s := range snaps {
		if err == nil {
			err = p.writeSnap(conn, s.gid, s.s)
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

// writeSnap streams one snapshot: its pieces (views of the message) go
// into frames as they come, written with writev.
func (p *peer) writeSnap(conn net.Conn, gid uint64, s *Snapshot) error {
	if s.ReadEntry != nil {
		panic("cluster: BUG: SendSnapshot of a snapshot whose entries are not in memory")
	}
	w := snapWriter{conn: conn, max: min(p.t.cfg.MaxFrameBytes-2, snapFrameBytes), between: func() error { return p.writeFwds(conn) }}
	w.add(snapHeader(gid, s))
	w.add(s.Data)
	w.add(binary.BigEndian.AppendUint32(nil, uint32(len(s.Entries))))
	for _, e := range s.Entries {
		h := make([]byte, 0, 20)
		h = binary.BigEndian.AppendUint64(h, e.Index)
		h = binary.BigEndian.AppendUint64(h, e.Term)
		w.add(binary.BigEndian.AppendUint32(h, uint32(len(e.Data))))
		w.add(e.Data)
	}
	w.flush(true)
	return w.err
}

// snapWriter cuts a stream of pieces into snapshot frames.
type snapWriter struct {
	conn    net.Conn
	max     int
	between func() error // after each frame but the last
	bufs    net.Buffers
	pending int
	err     error
}

func (w *snapWriter) add(b []byte) {
	for len(b) > 0 && w.err == nil {
		n := min(len(b), w.max-w.pending)
		w.bufs = append(w.bufs, b[:n])
		w.pending += n
		b = b[n:]
		if w.pending == w.max {
			w.flush(false)
		}
	}
}

// flush writes what is pending as one frame (last: the snapshot's last).
func (w *snapWriter) flush(last bool) {
	if w.err != nil || w.pending == 0 && !last {
		return
	}
	l := byte(0)
	if last {
		l = 1
	}
	bufs := append(net.Buffers{append(appendFrameHeader(nil, kindSnap, w.pending+1), l)}, w.bufs...)
	w.conn.SetWriteDeadline(time.Now().Add(writeTimeout))
	_, w.err = bufs.WriteTo(w.conn)
	clear(w.bufs)
	w.bufs, w.pending = w.bufs[:0], 0
	if w.err == nil && !last && w.between != nil {
		w.err = w.between()
	}
}

func appendFrameHeader(b []byte, kind byte, n int) []byte {
	b = binary.BigEndian.AppendUint32(b, uint32(n+1))
	return append(b, kind)
}

// spool is a snapshot being received: its frames go to a file.
type spool struct {
	f    *os.File
	size int64
	skip bool // refused: its frames are read and dropped
}

// snapFrame takes one kindSnap frame from peer from into *sp (nil: none
// under way), and once it is the last one hands the snapshot on.
func (t *Transport) snapFrame(from uint64, pl []byte, sp **spool) error {
	if len(pl) < 1 || pl[0] > 1 {
		return errSnapFrame
	}
	last := pl[0] == 1
	if *sp == nil {
		var err error
		if *sp, err = t.startSpool(from); err != nil {
			return err
		}
	}
	s := *sp
	if s.skip {
		if last {
			*sp = nil
		}
		return nil
	}
	if s.size+int64(len(pl)-1) > t.cfg.MaxSnapshotBytes {
		t.dropSpool(from, s)
		*sp = nil
		return fmt.Errorf("cluster: node %d sent a snapshot over the %d-byte limit (MaxSnapshotBytes)", from, t.cfg.MaxSnapshotBytes)
	}
	if _, err := s.f.Write(pl[1:]); err != nil {
		// The disk is full, or failing: refused now, the connection
		// closed, so that the sender stops (its write fails) rather than
		// send all of it to be dropped here.
		t.dropSpool(from, s)
		*sp = nil
		t.refusedSnaps.Add(1)
		t.log.Error("cluster: a snapshot not spooled to disk: refused, the data connection closed so its sender stops (raft sends it again)", "peer", from, "file", s.f.Name(), "err", err)
		return fmt.Errorf("cluster: a snapshot from node %d not spooled to disk: %w", from, err)
	}
	s.size += int64(len(pl) - 1)
	if !last {
		return nil
	}
	*sp = nil
	return t.deliverSpool(from, s)
}

// startSpool opens a spool file for a snapshot from peer from, or
// refuses it: over MaxSpools or maxSpoolsPerPeer (its frames are read and
// dropped), or with an error when no file can be made (the disk full or
// failing: the connection closes, and its sender stops at once).
func (t *Transport) startSpool(from uint64) (*spool, error) {
	t.smu.Lock()
	total, mine := t.spools, t.spoolsBy[from]
	ok := total < t.cfg.MaxSpools && mine < maxSpoolsPerPeer
	if ok {
		t.spools++
		t.spoolsBy[from]++
	}
	t.smu.Unlock()
	if !ok {
		t.refusedSnaps.Add(1)
		t.log.Warn("cluster: a snapshot refused: too many being received or installed (raft sends it again)", "peer", from, "spooled", total, "from_peer", mine, "max_spools", t.cfg.MaxSpools, "max_per_peer", maxSpoolsPerPeer)
		return &spool{skip: true}, nil
	}
	create := t.createSpool
	if create == nil {
		create = func() (*os.File, error) { return os.CreateTemp(t.cfg.SpoolDir, spoolPattern) }
	}
	f, err := create()
	if err != nil {
		t.unspool(from)
		t.refusedSnaps.Add(1)
		t.log.Error("cluster: a snapshot refused: no spool file; the data connection closed so its sender stops (raft sends it again)", "peer", from, "dir", t.cfg.SpoolDir, "err", err)
		return nil, fmt.Errorf("cluster: a snapshot from node %d refused: no spool file: %w", from, err)
	}
	return &spool{f: f}, nil
}

func (t *Transport) unspool(from uint64) {
	t.smu.Lock()
	t.spools--
	if t.spoolsBy[from]--; t.spoolsBy[from] <= 0 {
		delete(t.spoolsBy, from)
	}
	t.smu.Unlock()
}

// dropSpool removes a spool file not delivered (a partial snapshot).
func (t *Transport) dropSpool(from uint64, s *spool) {
	if s == nil || s.skip {
		return
	}
	s.f.Close()
	os.Remove(s.f.Name())
	t.unspool(from)
}

// deliverSpool decodes a complete spooled snapshot from peer from and
// hands it on; its file goes when the snapshot is released.
func (t *Transport) deliverSpool(from uint64, s *spool) error {
	var once sync.Once
	release := func() {
		once.Do(func() { t.dropSpool(from, s) })
	}
	gid, snap, err := readSpool(s.f, s.size, t.cfg.SnapshotMemBytes)
	if err != nil {
		release()
		return err
	}
	if snap.Msg.From != from {
		release()
		return fmt.Errorf("cluster: node %d sent a snapshot from node %d", from, snap.Msg.From)
	}
	t.received.Add(1)
	if snap.ReadEntry == nil {
		release() // all in memory
	} else {
		snap.Release = release
		// A holder that drops it without Release: the file goes with it.
		runtime.AddCleanup(snap, func(r func()) { r() }, release)
	}
	if t.cfg.DeliverSnapshot == nil {
		if snap.Release != nil {
			snap.Release()
		}
		return nil
	}
	t.cfg.DeliverSnapshot(gid, snap)
	return nil
}

// readSpool decodes a spooled snapshot of size bytes: the message and
// the data into memory, the entries too when their data total at most
// memBytes, else their places in the file (Snapshot.ReadEntry).
func readSpool(f *os.File, size, memBytes int64) (uint64, *Snapshot, error) {
	r := bufio.NewReaderSize(io.NewSectionReader(f, 0, size), 64<<10)
	var off int64
	take := func(n int64) ([]byte, error) {
		if n < 0 || n > size-off {
			return nil, errSnapFrame
		}
		b := make([]byte, n)
		if _, err := io.ReadFull(r, b); err != nil {
			return nil, fmt.Errorf("%w: %w", errSnapFrame, err)
		}
		off += n
		return b, nil
	}
	u32 := func() (int64, error) {
		b, err := take(4)
		if err != nil {
			return 0, err
		}
		return int64(binary.BigEndian.Uint32(b)), nil
	}
	hdr, err := take(8)
	if err != nil {
		return 0, nil, err
	}
	gid := binary.BigEndian.Uint64(hdr)
	s := &Snapshot{}
	n, err := u32()
	if err != nil {
		return 0, nil, err
	}
	mb, err := take(n)
	if err != nil {
		return 0, nil, err
	}
	if err := s.Msg.Unmarshal(mb); err != nil {
		return 0, nil, fmt.Errorf("%w: %w", errSnapFrame, err)
	}
	if s.Msg.Type != raftpb.MsgSnap || s.Msg.Snapshot == nil {
		return 0, nil, fmt.Errorf("%w: a %v, not a MsgSnap", errSnapFrame, s.Msg.Type)
	}
	if n, err = u32(); err != nil {
		return 0, nil, err
	}
	if s.Data, err = take(n); err != nil {
		return 0, nil, err
	}
	k, err := u32()
	if err != nil {
		return 0, nil, err
	}
	if k > (size-off)/20 {
		return 0, nil, errSnapFrame
	}
	inMem := size-off <= memBytes
	s.Entries = make([]segment.Entry, 0, k)
	var offs []int64
	for range k {
		h, err := take(20)
		if err != nil {
			return 0, nil, err
		}
		e := segment.Entry{Index: binary.BigEndian.Uint64(h), Term: binary.BigEndian.Uint64(h[8:])}
		dn := int64(binary.BigEndian.Uint32(h[16:]))
		if inMem {
			if e.Data, err = take(dn); err != nil {
				return 0, nil, err
			}
		} else {
			if dn > size-off {
				return 0, nil, errSnapFrame
			}
			offs = append(offs, off, dn)
			if _, err := r.Discard(int(dn)); err != nil {
				return 0, nil, fmt.Errorf("%w: %w", errSnapFrame, err)
			}
			off += dn
		}
		s.Entries = append(s.Entries, e)
	}
	if off != size {
		return 0, nil, errSnapFrame
	}
	if !inMem {
		s.ReadEntry = func(i int, dst []byte) ([]byte, error) {
			at, dn := offs[2*i], offs[2*i+1]
			dst = slices.Grow(dst[:0], int(dn))[:dn]
			if _, err := f.ReadAt(dst, at); err != nil {
				return nil, fmt.Errorf("cluster: reading the spooled snapshot %s: %w", f.Name(), err)
			}
			return dst, nil
		}
	}
	return gid, s, nil
}

var errSnapFrame = errors.New("cluster: a snapshot frame that does not parse")
