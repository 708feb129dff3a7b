package cluster

// A peer and its two outbound connections (lanes): each lane's writer
// dials and redials with backoff (run, dial), then writes what is queued
// for it: raft messages as frames on the control lane (write), snapshots
// and forwards on the data lane (writeData, writeFwds).

import (
	"crypto/rand"
	"encoding/binary"
	"math/big"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

type peer struct {
	t    *Transport
	id   uint64
	addr string
	stop chan struct{} // closed when SetPeers drops the peer
	// The two connections: ctl writes pending (raft messages), dat writes
	// snaps and fwds.
	ctl, dat lane

	mu       sync.Mutex
	pending  []byte // entries: gid u64 | len u32 | message
	count    int    // messages in pending
	snaps    []pendingSnap
	fwds     [][]byte // forward.go
	fwdBytes int
	spare    []byte

	sent    atomic.Uint64
	dropped atomic.Uint64
}

// lane is one of a peer's connections and its writer.
type lane struct {
	id        byte // laneControl or laneData
	wake      chan struct{}
	conn      net.Conn // peer.mu
	connected atomic.Bool
}

func newPeer(t *Transport, id uint64, addr string) *peer {
	return &peer{t: t, id: id, addr: addr, stop: make(chan struct{}),
		ctl: lane{id: laneControl, wake: make(chan struct{}, 1)},
		dat: lane{id: laneData, wake: make(chan struct{}, 1)}}
}

// start starts the peer's writers (t.wg counts them: 2).
func (p *peer) start() {
	go p.run(&p.ctl)
	go p.run(&p.dat)
}

// closeConns closes both connections (their writers then dial again, or
// stop).
func (p *peer) closeConns() {
	p.mu.Lock()
	for _, l := range []*lane{&p.ctl, &p.dat} {
		if l.conn != nil {
			l.conn.Close()
		}
	}
	p.mu.Unlock()
}

// run is the writer of lane l: dial, then write what is queued for it,
// forever.
func (p *peer) run(l *lane) {
	defer p.t.wg.Done()
	if l.id == laneData {
		defer p.dropSnaps() // stopped or closed: raft hears the snapshots failed (ReportSnapshot)
	}
	name := "control"
	if l.id == laneData {
		name = "data"
	}
	backoff := minBackoff
	failing := false
	for {
		conn, err := p.dial(l.id)
		if err != nil {
			if p.isClosed() {
				return
			}
			if !failing {
				p.t.log.Warn("cluster: cannot reach peer; retrying with backoff", "peer", p.id, "addr", p.addr, "connection", name, "err", err)
				failing = true
			} else {
				p.t.log.Debug("cluster: cannot reach peer", "peer", p.id, "err", err)
			}
			j, _ := rand.Int(rand.Reader, big.NewInt(int64(backoff/2)+1))
			tm := time.NewTimer(backoff/2 + time.Duration(j.Int64()))
			select {
			case <-tm.C:
			case <-p.t.closed:
				tm.Stop()
				return
			case <-p.stop:
				tm.Stop()
				return
			}
			backoff = min(2*backoff, maxBackoff)
			continue
		}
		failing, backoff = false, minBackoff
		p.t.log.Info("cluster: connected to peer", "peer", p.id, "addr", p.addr, "connection", name)
		p.mu.Lock()
		l.conn = conn
		p.mu.Unlock()
		if p.isClosed() {
			conn.Close()
			return
		}
		l.connected.Store(true)
		// The listener sends nothing after OK but a refusal: reading
		// notices a connection the peer closed, and closes ours so the
		// next write fails at once.
		// It also wakes the writer (dead), which dials again at once:
		// otherwise an idle connection's loss is found by the next write,
		// and what that write carries is lost (a peer that restarted would
		// lose the first forwards sent to it).
		dead := make(chan struct{})
		go func() {
			var b [64]byte
			for {
				if _, err := conn.Read(b[:]); err != nil {
					conn.Close()
					close(dead)
					return
				}
			}
		}()
		if l.id == laneData {
			err = p.writeData(conn, dead)
		} else {
			err = p.write(conn, dead)
		}
		l.connected.Store(false)
		conn.Close()
		p.mu.Lock()
		l.conn = nil
		p.mu.Unlock()
		if p.isClosed() {
			return
		}
		p.t.log.Warn("cluster: lost the connection to peer; reconnecting", "peer", p.id, "connection", name, "err", err)
	}
}

func (p *peer) isClosed() bool {
	select {
	case <-p.t.closed:
		return true
	case <-p.stop:
		return true
	default:
		return false
	}
}

// writeData sends the snapshots and forwards queued each time
// SendSnapshot or SendForward wakes the data lane.
func (p *peer) writeData(conn net.Conn, dead <-chan struct{}) error {
	for {
		select {
		case <-dead:
			return errPeerClosed
		case <-p.dat.wake:
		case <-p.t.closed:
			return nil
		case <-p.stop:
			return nil
		}
		p.mu.Lock()
		snaps := p.snaps
		p.snaps = nil
		p.mu.Unlock()
		if err := p.writeSnaps(conn, snaps); err != nil {
			return err
		}
		if err := p.writeFwds(conn); err != nil {
			return err
		}
	}
}

// writeFwds writes the forwards queued (also between a snapshot's
// frames: a big snapshot does not hold them up).
func (p *peer) writeFwds(conn net.Conn) error {
	p.mu.Lock()
	fwds := p.fwds
	p.fwds, p.fwdBytes = nil, 0
	p.mu.Unlock()
	if len(fwds) == 0 {
		return nil
	}
	var bufs net.Buffers
	for _, f := range fwds {
		bufs = append(bufs, appendFrameHeader(nil, kindFwd, len(f)), f)
	}
	conn.SetWriteDeadline(time.Now().Add(writeTimeout))
	if _, err := bufs.WriteTo(conn); err != nil {
		p.dropped.Add(uint64(len(fwds)))
		p.t.dropped.Add(uint64(len(fwds)))
		return err
	}
	p.t.frames.Add(uint64(len(fwds)))
	return nil
}

// write sends the raft messages queued each time Send (or Flush) wakes
// the control lane: one frame per wake (several if it would pass the
// frame limit), with writev.
func (p *peer) write(conn net.Conn, dead <-chan struct{}) error {
	var hdrs []byte
	var bufs net.Buffers
	for {
		select {
		case <-dead:
			return errPeerClosed
		case <-p.ctl.wake:
		case <-p.t.closed:
			return nil
		case <-p.stop:
			return nil
		}
		p.mu.Lock()
		buf, n := p.pending, p.count
		p.pending, p.count = p.spare[:0], 0
		p.spare = nil
		p.mu.Unlock()
		if n == 0 {
			p.recycle(buf)
			continue
		}
		// Split into frames of at most MaxFrameBytes at entry bounds.
		hdrs, bufs = hdrs[:0], bufs[:0]
		frames := 0
		for start := 0; start < len(buf); {
			end := start
			for end < len(buf) {
				l := 12 + int(binary.BigEndian.Uint32(buf[end+8:]))
				if end > start && end-start+l+1 > p.t.cfg.MaxFrameBytes {
					break
				}
				end += l
			}
			hdrs = binary.BigEndian.AppendUint32(hdrs, uint32(end-start+1))
			hdrs = append(hdrs, kindRaft)
			start = end
			frames++
		}
		for i, start := 0, 0; i < frames; i++ {
			l := int(binary.BigEndian.Uint32(hdrs[5*i:])) - 1
			bufs = append(bufs, hdrs[5*i:5*i+5], buf[start:start+l])
			start += l
		}
		conn.SetWriteDeadline(time.Now().Add(writeTimeout))
		w := bufs
		_, err := w.WriteTo(conn)
		if err != nil {
			p.dropped.Add(uint64(n))
			p.t.dropped.Add(uint64(n))
			p.recycle(buf)
			return err
		}
		p.sent.Add(uint64(n))
		p.t.sent.Add(uint64(n))
		p.t.frames.Add(uint64(frames))
		p.recycle(buf)
	}
}

// recycle keeps buf as the next spare unless it is over 1 MiB.
func (p *peer) recycle(buf []byte) {
	if cap(buf) > 1<<20 {
		return
	}
	p.mu.Lock()
	p.spare = buf[:0]
	p.mu.Unlock()
}

// dial connects lane l to the peer and runs the dialer's side of the
// handshake.
func (p *peer) dial(l byte) (net.Conn, error) {
	d := net.Dialer{Timeout: handshakeTimeout}
	conn, err := d.DialContext(p.t.ctx, "tcp", p.addr)
	if err != nil {
		return nil, err
	}
	if _, err := p.t.handshake(conn, p.id, p.addr, l); err != nil {
		conn.Close()
		return nil, err
	}
	return conn, nil
}

// dropSnaps tells every snapshot still queued for p that it was not sent:
// raft then leaves the follower's snapshot state and may try again.
func (p *peer) dropSnaps() {
	p.mu.Lock()
	snaps := p.snaps
	p.snaps = nil
	p.mu.Unlock()
	for _, s := range snaps {
		s.done(false)
	}
}
